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

from collections.abc import Iterable
from dataclasses import dataclass

UNSET = float("-inf")
"""How a ring stores a time never set (never answered, never walked past): below every time, so
``read <= passed`` is false for it, as it must be (any read for everyone spares an image never
walked past)."""

Row = tuple[str, int, float, float]  # key, lap, asked, answered: an image as a ring is built from

SLOW_LAP = 1.5
"""A lap this many times its best case, or more, is slow (the example alert's threshold)."""


def lap_ratio(cycle_duration: float | None, images: int, interval: float) -> float | None:
    """How much longer than its best case a ring's last lap took: ``cycleDuration / (images ×
    check.interval)``, the pacing document's "Watching the pace" (None before a lap). Above 1,
    the ring shares its host or loses windows."""
    if cycle_duration is None or not images or not interval:
        return None
    return cycle_duration / (images * interval)


@dataclass(frozen=True, slots=True)
class EntryState:
    """One image of a ring."""

    image: str
    asked: float
    answered: float | None
    lap: int

    @classmethod
    def stored(cls, image: str, asked: float, answered: float, lap: int) -> EntryState:
        """From what a ring stores (``answered`` :data:`UNSET`: never)."""
        return cls(image, asked, None if answered == UNSET else answered, lap)


def rows_of(entries: Iterable[EntryState]) -> list[Row]:
    """Saved images as a ring is built from them: in last-asked order, which is their asks'."""
    return [
        (e.image, e.lap, e.asked, UNSET if e.answered is None else e.answered)
        for e in sorted(entries, key=lambda e: e.asked)
    ]


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
