"""``/status`` (SPEC §8): a :class:`~kuikproxy.runtime.snapshot.Snapshot` rendered as one
JSON document, in the models of :mod:`kuikproxy.observe.statusmodels`. Nothing here computes
pacing state: it renders the snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from kuikproxy.core.flowcontrol import LevelView
from kuikproxy.core.limits import Census
from kuikproxy.core.quota import QuotaSnapshot
from kuikproxy.core.views import HostView, SeriesView
from kuikproxy.durations import format_duration
from kuikproxy.observe.statusmodels import (
    BoundStatus,
    BucketStatus,
    BudgetStatus,
    CacheStatus,
    CheckSeries,
    ConditionStatus,
    ConfigStatus,
    CopySeries,
    FleetStatus,
    FleetStoreStatus,
    FlowControlStatus,
    PriorityLevelStatus,
    Queues,
    QueueStatus,
    QuotaStatus,
    ReadsStatus,
    RegistryStatus,
    ResourceStatus,
    Rings,
    RingStatus,
    Status,
    StoreStatus,
    UpstreamStatus,
    WindowCounts,
)
from kuikproxy.runtime.fleetlink import FleetView
from kuikproxy.runtime.snapshot import BudgetStats, Snapshot


class Clock:
    """Loop time → wall time, for display only (decisions use the loop's clock)."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def rfc3339(self, loop_time: float) -> str:
        moment = datetime.fromtimestamp(loop_time + self.offset, UTC)
        return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _windows(view: SeriesView) -> WindowCounts:
    return WindowCounts.model_validate(view.windows)


def quota_status(quota: QuotaSnapshot, clock: Clock) -> QuotaStatus | None:
    if not quota.buckets and quota.blocked_until is None and quota.ratelimit_remaining is None:
        return None
    until = quota.blocked_until
    return QuotaStatus(
        buckets=[
            BucketStatus(
                category=b.category.value,
                scope=b.scope.value,
                identity=b.identity,
                tokens=None if b.tokens is None else round(b.tokens, 3),
                ratePerMinute=b.rate_per_minute,
                burst=b.burst,
                learnt=b.learnt,
            )
            for b in quota.buckets
        ],
        blockedUntil=None if until is None else clock.rfc3339(until),
        backoffAttempts=quota.backoff_attempts,
        ratelimitRemaining=quota.ratelimit_remaining,
    )


@dataclass(frozen=True, slots=True)
class ResourcePage:
    """The resources one ``/status`` lists: a page of those with state, in name order — so
    that a status costs what it shows, however many resources there are."""

    names: list[str]
    total: int
    next: str | None  # the ``after`` of the next page; None on the last


DEFAULT_PAGE = 100
"""Resources a ``/status`` lists unless ``?limit=`` says otherwise (~5 ms to build)."""
MAX_PAGE = 1_000
"""The most resources one ``/status`` lists (~50 ms)."""


def resource_page(
    census: Census, *, resource: str | None, after: str | None, limit: int
) -> ResourcePage:
    """The page ``?resource=`` (that one alone), or ``?after=`` and ``?limit=``, ask for."""
    if resource is not None:
        return ResourcePage([resource] if resource in census else [], len(census), None)
    names, more = census.page(after, limit)
    return ResourcePage(names, len(census), names[-1] if more else None)


def registry_status(
    view: HostView,
    clock: Clock,
    quota: QuotaSnapshot | None,
    refused: dict[str, int] | None,
) -> RegistryStatus:
    return RegistryStatus(
        check=CheckSeries(
            interval=format_duration(view.check.interval),
            mode="prefetch" if view.prefetch else "hold",
            origin=clock.rfc3339(view.check.origin),
            nextWindow=clock.rfc3339(view.check.next_window),
            busy=view.check.busy,
            waiting=view.check_waiting,
            windows=_windows(view.check),
        ),
        copy=CopySeries(
            interval=format_duration(view.copy.interval),
            origin=clock.rfc3339(view.copy.origin),
            nextWindow=clock.rfc3339(view.copy.next_window),
            open=view.copy_open,
            queued=view.copy_queued,
            windows=_windows(view.copy),
        ),
        blockedUntil=None if view.blocked_until is None else clock.rfc3339(view.blocked_until),
        quota=None if quota is None else quota_status(quota, clock),
        refused=refused or {},
    )


def build_status(
    snap: Snapshot, *, config: ConfigStatus, page: ResourcePage, registry: str | None = None
) -> Status:
    """The document from a snapshot taken with the rings of ``page``'s resources: every host
    viewed (only ``registry``, if given), and each resource of ``page`` with state there."""
    clock = Clock(snap.wall_offset)
    rings: dict[str, list[RingStatus]] = {}
    queues: dict[str, list[QueueStatus]] = {}
    registries = {}
    for host, view in snap.views.items():
        if registry is not None and host != registry:
            continue
        registries[host] = registry_status(
            view, clock, snap.quotas.get(host), snap.refused.get(host)
        )
        for ring in view.rings:
            rings.setdefault(ring.resource, []).append(
                RingStatus(
                    registry=host,
                    images=ring.images,
                    cursor=ring.cursor,
                    cycleStarted=None
                    if ring.cycle_started is None
                    else clock.rfc3339(ring.cycle_started),
                    cycleDuration=None
                    if ring.cycle_duration is None
                    else format_duration(ring.cycle_duration),
                )
            )
        for name, queued in view.copy_queues.items():
            queues.setdefault(name, []).append(QueueStatus(registry=host, queued=queued))
    kept = snap.kept
    return Status(
        startedAt=clock.rfc3339(snap.started),
        config=config,
        registries=registries,
        resources={
            name: ResourceStatus(
                checks=Rings(registries=rings.get(name, [])),
                copies=Queues(registries=queues.get(name, [])),
            )
            for name in page.names
            if name in rings or name in queues
        },
        resourcesTotal=page.total,
        resourcesNext=page.next,
        refused=snap.refused_elsewhere,
        clientErrors=snap.client_errors,
        cache=CacheStatus(
            entries=kept.entries,
            bytes=kept.bytes,
            hits=kept.hits,
            misses=kept.misses,
            store=None
            if (s := snap.store) is None
            else StoreStatus(
                blobs=s.blobs,
                bytes=s.bytes,
                maxBytes=s.max_bytes,
                evictions=s.evictions,
                servedBytes=s.served_bytes,
                reads=s.reads,
                stale=s.stale,
                rejected=s.rejected,
            ),
        ),
        budget=_budget(snap.budget),
        reads=ReadsStatus(shared=snap.reads.shared, registry=snap.reads.registry),
        upstream=UpstreamStatus(framingFaults=snap.framing_faults),
        flowControl=flow_control_status(snap.server_concurrency_limit, snap.levels, clock),
        fleet=None if snap.fleet is None else fleet_status(snap.fleet, clock),
    )


def fleet_status(view: FleetView, clock: Clock) -> FleetStatus:
    return FleetStatus(
        name=view.name,
        connected=view.connected,
        size=view.size,
        since=clock.rfc3339(view.since),
        lastError=view.error,
        store=FleetStoreStatus(
            mode=view.store.mode, address=view.store.address, nodes=view.store.nodes
        ),
        windowsAway=view.away,
    )


def flow_control_status(
    server_concurrency_limit: int, levels: tuple[LevelView, ...], clock: Clock
) -> FlowControlStatus:
    return FlowControlStatus(
        serverConcurrencyLimit=server_concurrency_limit,
        priorityLevels=[
            PriorityLevelStatus(
                name=level.name,
                type=level.type.value,
                limitResponse=None if level.limit_response is None else level.limit_response.value,
                nominalCL=level.nominal_cl,
                lendableCL=level.lendable_cl,
                borrowingCL=level.borrowing_cl,
                currentCL=level.current_cl,
                inQueue=level.in_queue + level.parked,
                parked=level.parked,
                executing=level.executing,
                dispatched=level.dispatched,
                rejected=sum(level.rejected.values()),
                rejectedByReason={str(k): v for k, v in level.rejected.items()},
                conditions=[
                    ConditionStatus(
                        type=c.type,
                        status=c.status,
                        reason=c.reason,
                        message=c.message,
                        lastTransitionTime=clock.rfc3339(c.last_transition_time),
                    )
                    for c in level.conditions
                ],
            )
            for level in levels
        ],
    )


def _budget(stats: BudgetStats) -> BudgetStatus:
    budget = stats.budget
    return BudgetStatus(
        memory=stats.memory,
        source=stats.source,
        base=budget.base,
        headroom=budget.headroom,
        bounds={
            str(share.bound): BoundStatus(
                limit=share.value,
                each=share.each,
                bytes=share.bytes,
                used=stats.used[share.bound],
                set=share.set,
            )
            for share in budget.shares
        },
    )
