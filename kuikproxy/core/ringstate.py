"""What of a ring survives a restart (P13), as plain values.

A ring's persistent state is its header — cursor, lap counter, ``cycleStarted``,
``cycleDuration`` — and, per image, when it was last asked for (P8's retention), last answered
to the resource (R1's "previous read") and the lap it was last done in. An image's lap is
relative to the ring's: done in the lap in progress when equal, done for the next lap (answered
behind the cursor) when one more, due when less. Nothing about waiting requests is here: they
do not survive their process, and their clients ask again.

Times are in the clock of whoever holds the values: the core's (the runtime's event loop) when
they come out of or go into a ring, wall-clock time in a store. The runtime converts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EntryState:
    """One image of a ring."""

    image: str
    asked: float
    answered: float | None
    lap: int


@dataclass(frozen=True, slots=True)
class RingHeader:
    cursor: str | None
    lap: int
    cycle_started: float | None
    cycle_duration: float | None


@dataclass(frozen=True, slots=True)
class RingState:
    """A whole ring; ``entries`` in the order they were last asked for."""

    header: RingHeader
    entries: tuple[EntryState, ...]


@dataclass(frozen=True, slots=True)
class RingChanges:
    """What changed in a ring since its changes were last handed out.

    ``header`` None: the ring is gone (its last image expired), entries and all. ``replace``:
    the ring was made in this process, so what a store held for it before is replaced, not
    updated (``entries`` then holds every image it has). ``dropped``: images that left it (P8).
    """

    header: RingHeader | None
    entries: tuple[EntryState, ...]
    dropped: tuple[str, ...]
    replace: bool

    @classmethod
    def whole(cls, state: RingState) -> RingChanges:
        """A whole ring as changes that replace whatever a store held for it."""
        return cls(header=state.header, entries=state.entries, dropped=(), replace=True)
