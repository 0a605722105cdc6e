"""Whether a proxy of a fleet may use a window of a series it shares: the store's turns, and its
own turns while the store cannot be reached or the fleet is forming again.

The store gives each window to at most one proxy, in turns among the proxies that have
something due: window *k* to the *k mod n*-th of them by name (``Claim``). A proxy that cannot
reach the store waits for it, using no window (``fleet.whenCutOff: wait``, the default: exact,
whoever else still reaches the store), or paces **alone** on the turn it last learnt while the
fleet was settled (``ownTurns``): the windows *k* with *k mod of = place* (:class:`Turns`).
Those turns are disjoint across the fleet's proxies, so proxies alone never read in one window
— until the others take over the turns of one cut off for two intervals, which only a
partition of some proxies (not an outage of the store) makes. And the store's turns are not
theirs while the fleet forms again (the store restarted without its data, or a proxy has just
come back and others may still be alone), and a proxy following the store then could read in a
window a proxy still alone takes as its own. So for a while after either (two intervals and
``STORE_TIMEOUT``: every proxy with work tries the store at its next window, and a call gives up
after that timeout), a proxy uses a window only when both say so: the store gave it, and it is
its own turn. Windows may be lost then; none is read twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

STORE_TIMEOUT = 1.0  # seconds a call to the fleet's store may take before it gives up
LATE = 0.1
"""Of an interval: a won window whose read would go out later than that after its time (its
claim's round trips, and the one more the read makes first) is not used, counted ``away``: read
that late, it would come closer than an interval before the next window's read, which another
proxy may make on time."""


def careful_for(interval: float) -> float:
    """How long the fleet may take to form again: every proxy alone has tried the store."""
    return 2 * interval + STORE_TIMEOUT


@dataclass(frozen=True, slots=True)
class Claim:
    """The store's answer to a claim of window *k*."""

    won: bool  # the window is this proxy's (no other proxy of the fleet has it)
    place: int  # this proxy's place, by name, among the proxies with something due
    of: int  # how many have something due, this one included; 0: not on the fleet's grid
    forming: bool = False  # the store lost the fleet's turns lately (it restarted empty)


@dataclass(slots=True)
class Turns:
    """One proxy's own turns on one series: window *k* is its own when *k mod of = place*."""

    place: int
    of: int
    careful_until: float = -math.inf  # until then, a window must also be its own turn
    away: bool = False  # the store could not be reached at the last claim

    def own(self, window: int) -> bool:
        of = max(1, self.of)
        return window % of == self.place % of

    def alone(self, window: int, *, wait: bool) -> bool:
        """The store cannot be reached: whether to use ``window`` all the same. Waiting
        (``fleet.whenCutOff: wait``), never: only the store gives windows, so a proxy cut off
        while the others still reach it, whose turns they take over, reads in none of theirs.
        Else (``ownTurns``) when it is this proxy's own turn: right while every proxy is cut
        off, a window read twice by one cut off alone once the others have taken its turns."""
        self.away = True
        return not wait and self.own(window)

    def claimed(self, claim: Claim, window: int, interval: float, now: float) -> bool:
        """Whether to use ``window``, which the store answered ``claim`` for at ``now``."""
        if self.away or claim.forming:
            self.away = False
            self.careful_until = max(self.careful_until, now + careful_for(interval))
        if now < self.careful_until:
            return claim.won and self.own(window)
        if claim.of:  # settled: the store's turns are the ones to keep when alone
            self.place, self.of = claim.place, claim.of
        return claim.won
