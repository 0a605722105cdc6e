"""The models of ``/status`` (SPEC §8), as pydantic: the document and its JSON Schema come from
one definition. Times are RFC 3339 UTC, durations Go-style strings, as kuik's own status writes
them. :mod:`kuikproxy.observe.status` fills them from a snapshot."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True)


class WindowCounts(_Model):
    used: int
    idle: int
    busy: int
    blocked: int
    fleet: int = Field(0, description="used by another proxy of the fleet")
    away: int = Field(0, description="the fleet's store could not be reached: waited for it")


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
    rejected: int = Field(
        0, description="files found not to be their blob when opened, dropped and read again"
    )


class ReadsStatus(_Model):
    """Reads by kind (manifest-tag, manifest-digest, blob, referrers, tags)."""

    shared: dict[str, int] = Field(
        description="requests served by another request's registry read: one in flight they "
        "followed, or their window's (R2)"
    )
    registry: dict[str, int] = Field(
        description="requests sent to the registries, a read signed in after a challenge "
        "counted twice: what a registry's own access log counts"
    )


class UpstreamStatus(_Model):
    framing_faults: int = Field(
        alias="framingFaults",
        description="registry answers carrying more or fewer bytes than their framing said: "
        "failed, their connection never reused",
    )


class CacheStatus(_Model):
    entries: int
    bytes: int
    hits: int
    misses: int
    store: StoreStatus | None = None


class BoundStatus(_Model):
    limit: int = Field(description="items (bytes where each is 1) the bound admits")
    each: int = Field(description="bytes one item is priced at")
    bytes: int = Field(description="the bound's share of the budget")
    used: int | None = Field(description="items held now; None: not counted (a reserve)")
    set: bool = Field(description="written in the config rather than sized from the budget")


class BudgetStatus(_Model):
    memory: int = Field(description="bytes every bound a client can fill must fit in, together")
    source: str = Field(description="limits.memory, the cgroup file read, or default")
    base: int = Field(description="bytes kept for the process itself")
    headroom: int
    bounds: dict[str, BoundStatus] = Field(description="by the setting that overrides each")


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


class FleetStoreStatus(_Model):
    mode: str = Field(
        description="single (one server or a replicated primary), sentinel, or cluster"
    )
    address: str | None = Field(
        description="the server; on Sentinel the master it named at this proxy's last "
        "connection (None: none yet); None on a cluster"
    )
    nodes: int | None = Field(description="a Redis Cluster's primaries, as last learnt")


class FleetStatus(_Model):
    name: str
    connected: bool = Field(description="false: pacing alone, on one window in `size`")
    size: int = Field(description="proxies in the fleet, as last seen, this one included")
    since: str = Field(description="when `connected` last changed")
    last_error: str | None = Field(alias="lastError")
    store: FleetStoreStatus = Field(description="the fleet's Redis")
    windows_away: int = Field(
        alias="windowsAway",
        description="windows with something due not used since start: the store out of reach, "
        "or answering too late (every host's, counted `away` in its series too)",
    )


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
    client_errors: dict[str, int] = Field(
        default_factory=dict,
        alias="clientErrors",
        description="malformed requests aiohttp's parser refused, by reason (line-too-long, "
        "header-too-large, bad-header, bad-framing, bad-path, bad-method, bad-version, other)",
    )
    cache: CacheStatus
    budget: BudgetStatus
    reads: ReadsStatus
    upstream: UpstreamStatus
    flow_control: FlowControlStatus = Field(alias="flowControl")
    fleet: FleetStatus | None = Field(None, description="None: this proxy paces alone")
