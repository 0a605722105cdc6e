"""The flow-control state machine: seats of every level, their queues, decisions.

See the package's docstring for the model; this module holds :class:`FlowMachine`; its
decisions and views are in :mod:`.decisions`. Its levels are valid ones (:mod:`.validation`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Generic, TypeVar

from kuikproxy.core.flowcontrol.decisions import (
    SEATED,
    Condition,
    Decision,
    LevelView,
    Place,
    Queued,
    Rejected,
    RejectReason,
)
from kuikproxy.core.flowcontrol.queueset import QueueSet
from kuikproxy.core.flowcontrol.seats import Allocator, Seats, seats
from kuikproxy.core.flowcontrol.spec import LevelType, PriorityLevel

T = TypeVar("T", bound=Hashable)

GAP_WEIGHT = 0.2  # weight of the newest sample in a level's mean time between finishes


class _Level(Generic[T]):
    __slots__ = (
        "busy_finish",
        "conditions",
        "config",
        "dispatched",
        "executing",
        "gap",
        "index",
        "limit",
        "parked",
        "places",
        "queueset",
        "rejected",
        "seats",
    )

    def __init__(self, config: PriorityLevel, index: int, seats: Seats) -> None:
        self.config = config
        self.index = index
        self.seats = seats
        queuing = config.queuing
        self.queueset: QueueSet[T] | None = None if queuing is None else QueueSet(queuing)
        # the places handed out, one object per queue (a parked request keeps a reference)
        queues = range(-1, 0) if queuing is None else range(queuing.queues)
        self.places = tuple(Place(config.name, queue) for queue in queues)
        self.parked = 0
        self.executing = 0
        self.limit = 0
        self.dispatched = 0
        self.rejected = dict.fromkeys(RejectReason, 0)
        self.gap: float | None = None  # mean time between finishes while busy
        self.busy_finish: float | None = None  # the last finish that found the level busy
        self.conditions: dict[str, Condition] = {}

    @property
    def exempt(self) -> bool:
        return self.config.type is LevelType.EXEMPT

    @property
    def waiting(self) -> int:
        return 0 if self.queueset is None else self.queueset.waiting


class FlowMachine(Generic[T]):
    """Seats, queues and decisions of every priority level (SPEC §10), fed events with ``now``.

    Tickets are the caller's opaque, hashable objects, each waiting at most once at a time.
    """

    def __init__(
        self,
        levels: Sequence[PriorityLevel],
        server_concurrency_limit: int,
        now: float,
        *,
        default_retry_after: float = 1.0,
    ) -> None:
        self.server_concurrency_limit = server_concurrency_limit
        self.default_retry_after = default_retry_after
        table = seats(levels, server_concurrency_limit)
        self._levels: dict[str, _Level[T]] = {
            level.name: _Level(level, i, table[level.name]) for i, level in enumerate(levels)
        }
        self._order = list(self._levels.values())
        self._allocator = Allocator(levels, server_concurrency_limit)
        self._demand = [0] * len(levels)  # seats wanted: executing + waiting
        self._where: dict[T, tuple[_Level[T], int]] = {}  # waiting ticket → level, queue
        for level, limit in zip(self._order, self._allocator.limits(self._demand), strict=True):
            level.limit = limit
            self._conditions(level, now)

    # -- events --------------------------------------------------------------------------------

    def arrive(self, level: str, flow: str, ticket: T, now: float) -> Decision:
        """A request of ``flow`` (:func:`~kuikproxy.core.flowcontrol.sharding.flow_id`) for
        ``level``: run it, queue it, or refuse it. Never releases another ticket."""
        lv = self._level(level)
        if ticket in self._where:
            raise ValueError(f"ticket {ticket!r} is already waiting")
        i = lv.index
        if lv.exempt:  # P14: never queued, never waits, limits nobody
            lv.executing += 1
            lv.dispatched += 1
            self._demand[i] += 1
            self._arrived(lv, now)
            return SEATED
        qs = lv.queueset
        if qs is None or qs.waiting == 0:  # nothing waits here: a free seat takes it
            self._demand[i] += 1
            limits = self._allocator.limits(self._demand)
            if lv.executing < limits[i]:
                lv.executing += 1
                lv.dispatched += 1
                self._arrived(lv, now, limits)
                return SEATED
            self._demand[i] -= 1
            if qs is None:
                return self._reject(lv, RejectReason.CONCURRENCY_LIMIT, 1)
        # no free seat, or others wait already: queue behind them, fairly
        index, length = qs.choose(flow)
        if qs.full(length):
            return self._reject(lv, RejectReason.QUEUE_FULL, qs.active_queues())
        self._demand[i] += 1
        qs.enqueue(index, ticket)
        self._where[ticket] = (lv, index)
        self._arrived(lv, now)
        return Queued(index)

    def park(self, level: str, flow: str) -> Place | Rejected:
        """A request of ``flow`` for ``level`` is about to wait for its window: it takes a place
        in the least-loaded queue of the flow's hand, or is refused when that queue is full, so
        a flow parks at most ``handSize × queueLengthLimit`` (SPEC §10). A parked request wants
        no seat: parking moves no limit and dispatches nothing.

        A ``Reject`` level has no queues; it lets as many requests wait for their windows as it
        has seats now (it is for traffic that should not wait). An Exempt level never refuses.
        """
        lv = self._level(level)
        qs = lv.queueset
        if qs is None:
            if not lv.exempt and lv.parked >= lv.limit:
                return self._reject(lv, RejectReason.CONCURRENCY_LIMIT, 1)
            lv.parked += 1
            return lv.places[0]
        index, length = qs.choose(flow)
        if qs.full(length):
            return self._reject(lv, RejectReason.QUEUE_FULL, qs.active_queues())
        qs.park(index)
        lv.parked += 1
        return lv.places[index]

    def unpark(self, place: Place) -> None:
        """A parked request stopped waiting for its window (released, refused, or its client
        left): its place is free. If it goes upstream next, it ``arrive``s for a seat."""
        lv = self._level(place.level)
        if lv.parked <= 0:
            raise ValueError(f"priority level {place.level!r} has nothing parked")
        lv.parked -= 1
        if lv.queueset is not None:
            lv.queueset.unpark(place.queue)

    def finish(self, level: str, now: float) -> list[T]:
        """A request of ``level`` that was admitted or dispatched ended (answered, failed, or
        its client left while it ran): its seat is free. Returns the tickets that may run now,
        of any level (seats lent and borrowed move with demand), in level order."""
        lv = self._level(level)
        if lv.executing <= 0:
            raise ValueError(f"priority level {level!r} has nothing executing")
        if lv.waiting > 0 or lv.executing >= lv.limit:  # busy: finishes measure throughput
            if lv.busy_finish is not None:
                sample = now - lv.busy_finish
                lv.gap = sample if lv.gap is None else lv.gap + GAP_WEIGHT * (sample - lv.gap)
            lv.busy_finish = now
        else:
            lv.busy_finish = None
        lv.executing -= 1
        self._demand[lv.index] -= 1
        return self._rebalance(now, lv)

    def cancel(self, ticket: T, now: float) -> list[T]:
        """A waiting client went away: its ticket leaves its queue. A ticket that is not
        waiting (dispatched already, rejected, unknown) is ignored — one that runs ends with
        :meth:`finish`. Returns the tickets that may run now (demand fell, seats may move)."""
        where = self._where.pop(ticket, None)
        if where is None:
            return []
        lv, index = where
        assert lv.queueset is not None
        lv.queueset.remove(index, ticket)
        self._demand[lv.index] -= 1
        return self._rebalance(now, lv)

    # -- limits ----------------------------------------------------------------------------------

    def _arrived(self, lv: _Level[T], now: float, limits: list[int] | None = None) -> None:
        """An arrival raised ``lv``'s demand: limits may fall anywhere, but rise only where
        nothing waits — so an arrival never releases a waiting ticket (those rises come at the
        next ``finish``/``cancel``, which dispatch), and the total stays within the seats."""
        if limits is None:
            limits = self._allocator.limits(self._demand)
        for level, limit in zip(self._order, limits, strict=True):
            if limit != level.limit and (limit < level.limit or level.waiting == 0):
                level.limit = limit
                self._conditions(level, now)
        self._conditions(lv, now)

    def _rebalance(self, now: float, touched: _Level[T]) -> list[T]:
        """Demand fell: apply the new limits and dispatch whatever they allow, level by level."""
        limits = self._allocator.limits(self._demand)
        released: list[T] = []
        for level, limit in zip(self._order, limits, strict=True):
            changed = limit != level.limit or level is touched
            level.limit = limit
            qs = level.queueset
            while qs is not None and qs.waiting and level.executing < level.limit:
                ticket = qs.dispatch()
                assert ticket is not None
                del self._where[ticket]
                level.executing += 1
                level.dispatched += 1
                released.append(ticket)
                changed = True
            if changed:
                self._conditions(level, now)
        return released

    def _reject(self, lv: _Level[T], reason: RejectReason, turns: int) -> Rejected:
        lv.rejected[reason] += 1
        return Rejected(reason, self._estimate(lv, turns))

    def _estimate(self, lv: _Level[T], turns: int) -> float:
        """Seconds until ``turns`` more finishes at the level's recent pace (a guess from the
        mean time between finishes while busy; ``default_retry_after`` before any)."""
        gap = self.default_retry_after if lv.gap is None else lv.gap
        return gap * max(1, turns)

    # -- conditions ----------------------------------------------------------------------------

    def _conditions(self, lv: _Level[T], now: float) -> None:
        nominal, limit, executing = lv.seats.nominal, lv.limit, lv.executing
        if executing > nominal and not lv.exempt:
            shared = (
                "True",
                "Borrowing",
                f"{executing} executing: NominalCL {nominal} + {executing - nominal} borrowed "
                f"(current limit {limit})",
            )
        elif limit < nominal:
            shared = (
                "True",
                "Lending",
                f"current limit {limit} = NominalCL {nominal} − {nominal - limit} lent",
            )
        else:
            shared = ("False", "NotShared", f"current limit {limit}, NominalCL {nominal}")
        waiting = lv.waiting
        if lv.exempt:
            saturated = ("False", "Exempt", f"{lv.executing} executing, never limited")
        elif waiting:
            saturated = (
                "True",
                "RequestsQueued",
                f"{lv.executing} executing of {limit}, {waiting} waiting",
            )
        elif lv.executing and lv.executing >= limit:
            saturated = ("True", "AllSeatsBusy", f"{lv.executing} executing of {limit}")
        else:
            saturated = ("False", "SeatsAvailable", f"{lv.executing} executing of {limit}")
        for kind, (status, reason, message) in (
            ("ConcurrencyShared", shared),
            ("Saturated", saturated),
        ):
            old = lv.conditions.get(kind)
            if old is None or (old.status, old.reason, old.message) != (status, reason, message):
                since = now if old is None or old.status != status else old.last_transition_time
                lv.conditions[kind] = Condition(kind, status, reason, message, since)

    # -- reading -------------------------------------------------------------------------------

    def _level(self, name: str) -> _Level[T]:
        try:
            return self._levels[name]
        except KeyError:
            raise ValueError(f"unknown priority level {name!r}") from None

    def limit(self, level: str) -> int:
        return self._level(level).limit

    def executing(self, level: str) -> int:
        return self._level(level).executing

    def waiting(self, level: str) -> int:
        return self._level(level).waiting

    def stored(self) -> int:
        """Entries held for waiting requests (queued tickets, their index, turn-heap entries):
        at most about ``2 · queues · queueLengthLimit + 3 · queues`` per level."""
        return len(self._where) + sum(
            lv.queueset.stored() for lv in self._order if lv.queueset is not None
        )

    def snapshot(self) -> tuple[LevelView, ...]:
        out: list[LevelView] = []
        for lv in self._order:
            limited = lv.config.limited
            out.append(
                LevelView(
                    name=lv.config.name,
                    type=lv.config.type,
                    limit_response=None if limited is None else limited.limit_response.type,
                    nominal_cl=lv.seats.nominal,
                    lendable_cl=lv.seats.lendable,
                    borrowing_cl=lv.seats.borrowing,
                    current_cl=lv.limit,
                    in_queue=lv.waiting,
                    parked=lv.parked,
                    executing=lv.executing,
                    dispatched=lv.dispatched,
                    rejected=dict(lv.rejected),
                    conditions=tuple(lv.conditions.values()),
                )
            )
        return tuple(out)
