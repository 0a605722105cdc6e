"""A series of windows (P1–P3): fixed instants, one image each, lost rather than saved.

A series has an origin ``t0`` and an ``interval``; window *k* opens at ``t0 + k·interval`` for
k = 1, 2, … — the first a full interval after the origin, so a process that restarts faster
than its interval never sends anything. Window times depend on the origin and the interval
only: the time an image takes never moves them (P2). If the runtime wakes late (a stalled event
loop), the windows it slept through are lost, counted ``busy``, and never fired in a burst.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum

_TOLERANCE = 1e-6


class Outcome(StrEnum):
    """What became of a window (P3), as counted in ``/status`` and metrics."""

    USED = "used"
    IDLE = "idle"  # nothing was due
    BUSY = "busy"  # the previous image of the series was still being read (or the loop was late)
    BLOCKED = "blocked"  # the registry asked us to stop (§11)
    FLEET = "fleet"  # another proxy of the fleet used it
    AWAY = "away"  # the fleet's store could not be reached, and this proxy waited for it


@dataclass(slots=True)
class Series:
    origin: float
    interval: float
    fired: int = 0  # index k of the last window that fired
    outcomes: dict[Outcome, int] = field(default_factory=lambda: dict.fromkeys(Outcome, 0))

    def next_window(self) -> float:
        return self.origin + (self.fired + 1) * self.interval

    def fire(self, now: float) -> float:
        """Advance to the latest window due at ``now`` and return its time.

        Windows skipped because ``now`` is past them are counted ``busy``; the caller counts
        the outcome of the returned window with :meth:`count`. Raises if no window is due.
        """
        k = self.last_due(now)
        if k <= self.fired:
            raise ValueError(f"no window due at {now}: next is {self.next_window()}")
        self.outcomes[Outcome.BUSY] += k - self.fired - 1
        self.fired = k
        return self.origin + k * self.interval

    def last_due(self, now: float) -> int:
        """The index of the latest window at or before ``now``. A timer may fire a clock tick
        before the float time it was set for, and must still find its window due: hence the
        microsecond of tolerance."""
        return math.floor((now - self.origin + _TOLERANCE) / self.interval)

    def pass_idle(self, now: float, blocked_until: float | None = None) -> None:
        """The windows up to ``now`` found nothing to do (a host nobody had asked for yet, a
        series asleep): idle — or blocked, those before ``blocked_until`` (P3 counts a block
        first: those windows were lost to it whether or not anything was due)."""
        k = self.last_due(now)
        if k <= self.fired:
            return
        blocked = 0
        if blocked_until is not None:
            # the last window strictly before the block's end
            last = math.ceil((blocked_until - self.origin - _TOLERANCE) / self.interval) - 1
            blocked = max(0, min(k, last) - self.fired)
        self.outcomes[Outcome.BLOCKED] += blocked
        self.outcomes[Outcome.IDLE] += k - self.fired - blocked
        self.fired = k

    def count(self, outcome: Outcome) -> None:
        self.outcomes[outcome] += 1

    def align(self, origin: float, now: float) -> None:
        """Take the fleet's grid: windows at ``origin + k·interval``, the next one the
        first after ``now``. The windows skipped to get there are not counted: they were the
        fleet's, never this proxy's."""
        self.origin = origin
        self.fired = max(0, self.last_due(now))

    def index(self, at: float) -> int:
        """The index ``k`` of the window at ``at`` (a time :meth:`next_window` gave)."""
        return round((at - self.origin) / self.interval)

    def restart(self, now: float, interval: float) -> None:
        """A new origin at ``now`` (P12): the first window is a full ``interval`` later."""
        self.origin = now
        self.interval = interval
        self.fired = 0
