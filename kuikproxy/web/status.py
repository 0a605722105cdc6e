"""``/status`` (SPEC §8): a :class:`~kuikproxy.runtime.snapshot.Snapshot` rendered as one
JSON document.

The models are pydantic, so the document and its JSON Schema come from one definition. Times
are RFC 3339 UTC, durations Go-style strings, as kuik's own status writes them. Nothing here
computes pacing state: it renders the snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field

from kuikproxy.core.flowcontrol import LevelView
from kuikproxy.core.limits import Census
from kuikproxy.core.quota import QuotaSnapshot
from kuikproxy.core.views import HostView, SeriesView
from kuikproxy.durations import format_duration
from kuikproxy.runtime.fleet import FleetView
from kuikproxy.runtime.snapshot import Snapshot


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True)


class WindowCounts(_Model):
    used: int
    idle: int
    busy: int
    blocked: int
    fleet: int = Field(0, description="used by another proxy of the fleet")


class CheckSeries(_Model):
    interval: str
    mode: str
    origin: str
    next_window: str = Field(alias="nextWindow")
    busy: bool
    waiting: int
    windows: WindowCounts


class CopySeries(_Model):
    interval: str
    origin: str
    next_window: str = Field(alias="nextWindow")
    open: str | None = Field(description="the image of the open copy, if one is open")
    queued: int
    windows: WindowCounts


class BucketStatus(_Model):
    category: str
    scope: str
    identity: str | None = Field(description="the identity of an identity-scoped bucket")
    tokens: float | None = Field(description="None: a learnt bucket that has learnt nothing")
    rate_per_minute: float | None = Field(alias="ratePerMinute")
    burst: float | None
    learnt: bool = Field(description="the rate follows the registry's ratelimit-* headers")


class QuotaStatus(_Model):
    buckets: list[BucketStatus]
    blocked_until: str | None = Field(alias="blockedUntil")
    backoff_attempts: int = Field(alias="backoffAttempts")
    ratelimit_remaining: int | None = Field(
        alias="ratelimitRemaining", description="the last ratelimit-remaining header seen"
    )


class RegistryStatus(_Model):
    check: CheckSeries
    copy_: CopySeries = Field(alias="copy")
    blocked_until: str | None = Field(alias="blockedUntil")
    quota: QuotaStatus | None = Field(description="None: the host rations nothing")
    refused: dict[str, int] = Field(
        default_factory=dict,
        description="requests kuikproxy refused itself, by reason (a limit: maxResources, "
        "maxImages, maxRingImages)",
    )


class RingStatus(_Model):
    registry: str
    images: int
    cursor: str | None
    cycle_started: str | None = Field(alias="cycleStarted")
    cycle_duration: str | None = Field(alias="cycleDuration")


class QueueStatus(_Model):
    registry: str
    queued: int


class Rings(_Model):
    registries: list[RingStatus]


class Queues(_Model):
    registries: list[QueueStatus]


class ResourceStatus(_Model):
    checks: Rings
    copies: Queues


class StoreStatus(_Model):
    """The pull-through store (§15): what it holds, and what it saved the registries."""

    blobs: int
    bytes: int
    max_bytes: int = Field(alias="maxBytes")
    evictions: int
    served_bytes: dict[str, int] = Field(alias="servedBytes")
    reads: dict[str, int]
    stale: int


class CacheStatus(_Model):
    entries: int
    bytes: int
    hits: int
    misses: int
    store: StoreStatus | None = None


class ConfigStatus(_Model):
    generation: int
    loaded_at: str = Field(alias="loadedAt")
    last_error: str | None = Field(alias="lastError")


class ConditionStatus(_Model):
    """A ``PriorityLevelConfigurationCondition``."""

    type: str
    status: str
    reason: str
    message: str
    last_transition_time: str = Field(alias="lastTransitionTime")


class PriorityLevelStatus(_Model):
    name: str
    type: str
    limit_response: str | None = Field(alias="limitResponse", description="None when Exempt")
    nominal_cl: int = Field(alias="nominalCL")
    lendable_cl: int = Field(alias="lendableCL")
    borrowing_cl: int | None = Field(alias="borrowingCL", description="None: unlimited")
    current_cl: int = Field(alias="currentCL", description="the seats it may use now")
    in_queue: int = Field(
        alias="inQueue",
        description="requests holding a place in its queues: waiting for a seat or, parked, "
        "for their window",
    )
    parked: int = Field(description="of inQueue, those waiting for their window")
    executing: int
    dispatched: int = Field(description="requests given a seat since start")
    rejected: int = Field(description="requests refused (429) since start")
    rejected_by_reason: dict[str, int] = Field(alias="rejectedByReason")
    conditions: list[ConditionStatus]


class FlowControlStatus(_Model):
    server_concurrency_limit: int = Field(alias="serverConcurrencyLimit")
    priority_levels: list[PriorityLevelStatus] = Field(alias="priorityLevels")


class FleetStatus(_Model):
    name: str
    connected: bool = Field(description="false: pacing alone, on one window in `size`")
    size: int = Field(description="proxies in the fleet, as last seen, this one included")
    since: str = Field(description="when `connected` last changed")
    last_error: str | None = Field(alias="lastError")


class Status(_Model):
    started_at: str = Field(alias="startedAt")
    config: ConfigStatus
    registries: dict[str, RegistryStatus]
    resources: dict[str, ResourceStatus] = Field(
        description="a page of the resources with state, in name order (?after=, ?limit=)"
    )
    resources_total: int = Field(
        alias="resourcesTotal", description="resources with state, over every page"
    )
    resources_next: str | None = Field(
        alias="resourcesNext",
        description="the ?after= of the next page of resources; None: this page is the last",
    )
    refused: dict[str, int] = Field(
        description="requests refused for a host kuikproxy holds no state for, by reason (maxHosts)"
    )
    cache: CacheStatus
    flow_control: FlowControlStatus = Field(alias="flowControl")
    fleet: FleetStatus | None = Field(None, description="None: this proxy paces alone")


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
            ),
        ),
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
