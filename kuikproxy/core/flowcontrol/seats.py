"""Seat arithmetic of priority levels (SPEC §10): NominalCL, LendableCL, BorrowingCL, and
current limits that move with demand.

:func:`seats` computes NominalCL, LendableCL and BorrowingCL exactly (integer arithmetic: Go's
``math.Ceil`` and ``math.Round`` — half away from zero — without float drift), and
:func:`current_limits` turns each level's demand into current limits (see
:class:`Allocator` for the rule). The levels are valid ones (:mod:`.validation`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kuikproxy.core.flowcontrol.spec import LevelType, PriorityLevel

# -- seats -------------------------------------------------------------------------------------


def _round_half_up(numerator: int, denominator: int) -> int:
    """Go's ``math.Round(n / d)`` for n ≥ 0, d > 0, exactly: halves go away from zero."""
    return (2 * numerator + denominator) // (2 * denominator)


@dataclass(frozen=True, slots=True)
class Seats:
    """A level's fixed seat numbers. ``borrowing`` None: unlimited (the API's nil)."""

    nominal: int
    lendable: int
    borrowing: int | None

    @property
    def floor(self) -> int:
        """``NominalCL − LendableCL``: the least the current limit may fall to."""
        return self.nominal - self.lendable

    def ceiling(self, server_concurrency_limit: int) -> int:
        """``NominalCL + BorrowingCL``; an unlimited BorrowingCL counts as ServerCL (as
        Kubernetes does: nothing can borrow more than there is)."""
        borrowing = server_concurrency_limit if self.borrowing is None else self.borrowing
        return self.nominal + borrowing


def seats(levels: Sequence[PriorityLevel], server_concurrency_limit: int) -> dict[str, Seats]:
    """NominalCL, LendableCL, BorrowingCL of each level (SPEC §10)::

    NominalCL(i)   = ceil(ServerCL · NCS(i) / Σ NCS)          (0 when Σ NCS is 0)
    LendableCL(i)  = round(NominalCL(i) · lendablePercent(i) / 100)
    BorrowingCL(i) = round(NominalCL(i) · borrowingLimitPercent(i) / 100)   (nil: unlimited)

    Σ NCS runs over every level, Exempt ones included (their NCS reserves seats they may lend).
    Exempt levels have BorrowingCL 0: they are never limited, so borrowing means nothing to them.
    """
    total = sum(level.shares for level in levels)
    out: dict[str, Seats] = {}
    for level in levels:
        nominal = 0 if total == 0 else -(-server_concurrency_limit * level.shares // total)
        lendable = _round_half_up(nominal * level.lendable_percent, 100)
        borrowing: int | None = 0
        if level.limited is not None:
            percent = level.limited.borrowing_limit_percent
            borrowing = None if percent is None else _round_half_up(nominal * percent, 100)
        out[level.name] = Seats(nominal, lendable, borrowing)
    return out


# -- current limits ----------------------------------------------------------------------------

MIN_TARGET = 0.001  # Kubernetes' MinTarget: a zero target would make a level's share undefined


def fair_allocation(
    required: int, bounds: Sequence[tuple[int, int]], targets: Sequence[float]
) -> tuple[list[float], float]:
    """Kubernetes' ``computeConcurrencyAllocation``: the unique allocation that sums to
    ``required`` with ``alloc[i] = clamp(fair_prop · target[i], low[i], high[i])``.

    ``bounds[i]`` is ``(low, high)``; ``Σ low ≤ required ≤ Σ high`` is the caller's to ensure.
    The sum of clamps is continuous, piecewise linear and non-decreasing in ``fair_prop``; this
    sweeps its breakpoints in order (O(n log n)) and solves the linear piece that crosses
    ``required``. Returns the allocations and ``fair_prop``.
    """
    n = len(bounds)
    tgt = [max(t, MIN_TARGET) for t in targets]
    low_sum = sum(low for low, _ in bounds)
    high_sum = sum(high for _, high in bounds)
    if required <= low_sum:
        return [float(low) for low, _ in bounds], min(
            (bounds[i][0] / tgt[i] for i in range(n)), default=0.0
        )
    if required >= high_sum:
        return [float(high) for _, high in bounds], max(
            (bounds[i][1] / tgt[i] for i in range(n)), default=0.0
        )
    # events: (point, kind, i) — kind 0: item starts following fair_prop, 1: it stops
    events = sorted(
        [(bounds[i][0] / tgt[i], 0, i) for i in range(n)]
        + [(bounds[i][1] / tgt[i], 1, i) for i in range(n)]
    )
    constant = float(low_sum)  # Σ of the bounds of items clamped at the current point
    slope = 0.0  # Σ of the targets of the items that follow fair_prop
    prop = events[0][0]
    for point, kind, i in events:
        if point > prop and slope > 0 and constant + slope * point >= required:
            break
        prop = point
        low, high = bounds[i]
        if kind == 0:
            constant -= low
            slope += tgt[i]
        else:
            constant += high
            slope -= tgt[i]
    prop = (required - constant) / slope if slope > 0 else prop
    allocs = [min(max(prop * tgt[i], bounds[i][0]), bounds[i][1]) for i in range(n)]
    return allocs, prop


def round_allocation(
    allocs: Sequence[float], bounds: Sequence[tuple[int, int]], required: int
) -> list[int]:
    """Whole seats summing to exactly ``required``, each within its bounds and within one of its
    allocation: floors, then the seats left over to the largest fractional parts (ties: the
    earlier level). Kubernetes rounds each level alone, which can overshoot the sum."""
    out = [
        min(max(math.floor(a + 1e-9), low), high)
        for a, (low, high) in zip(allocs, bounds, strict=True)
    ]
    left = required - sum(out)
    order = sorted(range(len(out)), key=lambda i: (out[i] - allocs[i], i))  # largest frac first
    while left > 0:
        moved = False
        for i in order:
            if left > 0 and out[i] < bounds[i][1]:
                out[i] += 1
                left -= 1
                moved = True
        if not moved:
            break
    while left < 0:
        moved = False
        for i in reversed(order):
            if left < 0 and out[i] > bounds[i][0]:
                out[i] -= 1
                left += 1
                moved = True
        if not moved:
            break
    return out


class Allocator:
    """Current limits from demand, for a fixed set of levels.

    The rule (Kubernetes' ``computeConcurrencyAllocation``, fed instantaneous demand):

    * each level ``i`` has bounds ``[NominalCL − LendableCL, NominalCL + BorrowingCL]`` (an
      unlimited BorrowingCL counts as ServerCL) and a target ``max(floor, demand)``, where demand
      is the seats it wants now: executing + queued;
    * an Exempt level is never limited; its bounds are ``[max(floor, min(demand, NominalCL)),
      NominalCL]`` and its target the low bound: it lends the part of its LendableCL it is not
      using, and never borrows (borrowing would take seats from Limited levels, which P14 and the
      API forbid: Exempt requests "do not reduce the capacity available to other levels");
    * the allocations sum to ``R = ServerCL`` — raised to Σ floors when the ceilings in NominalCL
      make the floors alone exceed ServerCL (the only case the total exceeds it, by less than a
      seat per level), lowered to Σ ceilings when borrowing limits cannot take it all;
    * ``alloc(i) = clamp(fairProp · target(i), floor(i), ceiling(i))`` for the one ``fairProp``
      that makes them sum to R: a level with little demand keeps its floor and lends the rest;
      levels that want more share what is lent in proportion to their demand, each up to its
      BorrowingCL; when nobody wants anything, seats fall in proportion to the floors;
    * whole seats by largest remainders (:func:`round_allocation`), so the sum is exactly R.

    Kubernetes smooths demand over 10 s periods and sums to Σ NominalCL; a pure core recomputes
    at every event instead, which :meth:`limits` makes cheap: targets that did not move give the
    previous answer without solving anything.
    """

    __slots__ = ("_exempt", "_floors", "_last", "_nominal", "_required", "_static", "names")

    def __init__(self, levels: Sequence[PriorityLevel], server_concurrency_limit: int) -> None:
        table = seats(levels, server_concurrency_limit)
        self.names = tuple(level.name for level in levels)
        self._exempt = tuple(level.type is LevelType.EXEMPT for level in levels)
        self._nominal = tuple(table[n].nominal for n in self.names)
        self._floors = tuple(table[n].floor for n in self.names)
        self._static = tuple(
            (s.floor, s.nominal if ex else s.ceiling(server_concurrency_limit))
            for s, ex in zip((table[n] for n in self.names), self._exempt, strict=True)
        )
        self._required = server_concurrency_limit
        self._last: tuple[tuple[float, ...], list[int]] | None = None

    def limits(self, demand: Sequence[int]) -> list[int]:
        """Current limits, in level order, for each level's demand (seats wanted)."""
        bounds: list[tuple[int, int]] = []
        targets: list[float] = []
        for i, want in enumerate(demand):
            low, high = self._static[i]
            if self._exempt[i]:
                low = max(low, min(want, self._nominal[i]))
                targets.append(low)
            else:
                targets.append(max(low, want))
            bounds.append((low, high))
        key = tuple(targets)
        if self._last is not None and self._last[0] == key:
            return list(self._last[1])
        low_sum = sum(low for low, _ in bounds)
        high_sum = sum(high for _, high in bounds)
        required = min(max(self._required, low_sum), high_sum)
        allocs, _ = fair_allocation(required, bounds, targets)
        out = round_allocation(allocs, bounds, required)
        self._last = (key, out)
        return list(out)


def current_limits(
    levels: Sequence[PriorityLevel],
    server_concurrency_limit: int,
    demand: Mapping[str, int],
) -> dict[str, int]:
    """Each level's current limit for the given demand (missing levels want nothing).

    See :class:`Allocator` for the rule. For an Exempt level the number is the share of seats
    it keeps from lending, not a limit: Exempt requests are never limited.
    """
    allocator = Allocator(levels, server_concurrency_limit)
    limits = allocator.limits([demand.get(name, 0) for name in allocator.names])
    return dict(zip(allocator.names, limits, strict=True))
