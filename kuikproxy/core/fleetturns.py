"""Whether a proxy of a fleet may use a window of a series it shares: the store's turns, and its
own turns while the store cannot be reached or the fleet is forming again.

The store gives each window to at most one proxy, in turns among the proxies that have
something due: window *k* to the *k mod n*-th of them by name (``Claim``). A proxy that cannot
reach the store paces **alone** on the turn it last learnt while the fleet was settled: the
windows *k* with *k mod of = place* (:class:`Turns`). Those turns are disjoint across the
fleet's proxies, so proxies alone never read in one window — but the store's turns are not
theirs while the fleet forms again (the store restarted without its data, or a proxy has just
come back and others may still be alone), and a proxy following the store then could read in a
window a proxy still alone takes as its own. So for a while after either (two intervals and
``STORE_TIMEOUT``: every proxy with work tries the store at its next window, and a call gives up
after that timeout), a proxy uses a window only when both say so: the store gave it, and
it is its own turn. Windows may be lost then; none is read twice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

STORE_TIMEOUT = 1.0  # seconds a call to the fleet's store may take before it gives up


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

    def alone(self, window: int) -> bool:
        """The store cannot be reached: whether ``window`` is this proxy's own turn."""
        self.away = True
        return self.own(window)

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
