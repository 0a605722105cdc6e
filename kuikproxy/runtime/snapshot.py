"""The pacing state at one moment, as ``/status``, ``/metrics`` and the status page show it.

:func:`snapshot` reads the runtime once, on the event loop, into a :class:`Snapshot`; every
renderer works from that alone (the JSON document and the metrics text in a worker thread), so
the four views of kuikproxy — ``/status``, ``kuikproxy status`` (which renders ``/status``),
``/metrics`` and ``/`` — can never disagree on what they read, nor read it twice. What is costly
to read is read only when asked for: the rings and copy queues of ``resources``, the hosts of
``hosts``, the quotas, the rings' series of a scrape, the cursors' places of the page, the
recent windows — so that each view costs what it shows, not what the proxy holds.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection
from dataclasses import dataclass

from kuikproxy.core.flowcontrol import LevelView
from kuikproxy.core.memorybudget import Bound, MemoryBudget
from kuikproxy.core.quota import QuotaSnapshot
from kuikproxy.core.scheduler import HostScheduler
from kuikproxy.core.tickets import Operation
from kuikproxy.core.views import HostView
from kuikproxy.runtime.fleetlink import FleetView
from kuikproxy.runtime.pacer import Pacer
from kuikproxy.runtime.waittimes import Buckets

RingStat = tuple[str, int, float | None]
"""A ring as a scrape reads it: (resource, images, cycleDuration)."""


@dataclass(frozen=True, slots=True)
class KeptStats:
    """The kept answers' counts (``/status.cache``)."""

    entries: int
    bytes: int
    hits: int
    misses: int


@dataclass(frozen=True, slots=True)
class BudgetStats:
    """The memory budget (``/status.budget``): each bound's share, with what it holds now
    (None where nothing counts it, the relays' reserve)."""

    memory: int
    source: str  # limits.memory, the cgroup file it was read from, or "default"
    budget: MemoryBudget
    used: dict[Bound, int | None]


@dataclass(frozen=True, slots=True)
class StoreStats:
    """The pull-through store (§15, ``/status.cache.store``): what it holds, what it saved."""

    blobs: int
    bytes: int  # on disk, blobs being written included
    max_bytes: int
    evictions: int
    served_bytes: dict[str, int]  # source (store, registry) → bytes given to clients
    reads: dict[str, int]  # source → reads
    stale: int  # answers given stale while their registry could not be asked
    rejected: int  # files found not to be their blob, and dropped (each logged at warning)


@dataclass(frozen=True, slots=True)
class ReadStats:
    """Reads by kind (``core.images.READ_KINDS``): requests served by another's read in flight
    or of their window (R2), and requests sent to the registries (what their logs count)."""

    shared: dict[str, int]
    registry: dict[str, int]
    # requests sent, by (registry label, method, status or "error"): redirects and realms too
    sent: dict[tuple[str, str, str], int]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The runtime at ``now`` (loop time); ``wall_offset`` turns loop time into wall time, for
    display only. Parts that were not asked of :func:`snapshot` are empty."""

    now: float
    wall_offset: float
    started: float
    views: dict[str, HostView]  # the hosts viewed, in host order
    hosts_total: int  # hosts with state, viewed or not
    resources_total: int  # resources with state, whether their rings are in ``views`` or not
    quotas: dict[str, QuotaSnapshot]  # every host's, when asked for
    levels: tuple[LevelView, ...]  # flow control's priority levels (§10)
    server_concurrency_limit: int
    fleet: FleetView | None  # None: this proxy paces alone
    refused: dict[str, dict[str, int]]  # host → reason → count, for hosts with state (§12)
    refused_elsewhere: dict[str, int]  # reason → count, for what no host's state answers for
    client_errors: dict[str, int]  # reason → requests aiohttp's parser refused (§12)
    framing_faults: int  # registry answers whose framing lied (upstream/framing.py)
    kept: KeptStats
    budget: BudgetStats
    store: StoreStats | None  # None: no pull-through store configured
    reads: ReadStats
    ring_stats: list[tuple[str, list[RingStat]]]  # host → its rings, for a scrape
    progress: dict[tuple[str, str], tuple[int | None, int]]  # (host, resource) → (place, waiting)
    # the viewed hosts' recent windows: time, outcome, seconds late (with ``recent``)
    recent: dict[tuple[str, Operation], list[tuple[float, str, float]]]
    waits: dict[tuple[str, Operation], Buckets]  # held reads' waits, by host and series


def snapshot(
    pacer: Pacer,
    now: float,
    *,
    resources: Collection[str] = (),
    hosts: Collection[str] | None = None,
    quotas: bool = True,
    ring_stats: int = 0,
    progress: int = 0,
    recent: bool = False,
) -> Snapshot:
    """The runtime at ``now``: the views of ``hosts`` (None: every host), each with the rings
    and copy queues of ``resources`` only; every host's quota unless ``quotas`` is False; the
    first ``ring_stats`` rings' sizes and laps, host by host (a scrape's per-ring series); with
    ``progress``, the cursor's place in each ring viewed, counting no more than that many
    images of hold rings in all (past it a ring has no place); with ``recent``, the recent
    windows of the hosts viewed."""
    views = pacer.views(now, resources, hosts)
    # the schedulers' map only where it is needed: it costs a sort of every host
    schedulers = pacer.hosts if hosts is not None or progress else {}
    fleet, kept = pacer.fleet, pacer.kept
    return Snapshot(
        now=now,
        wall_offset=pacer.wall_offset,
        started=pacer.started,
        views=views,
        hosts_total=len(schedulers) if hosts is not None else len(views),
        resources_total=len(pacer.census),
        quotas=pacer.quotas(now) if quotas else {},
        levels=pacer.levels(),
        server_concurrency_limit=pacer.flow.settings.server_concurrency_limit,
        fleet=None if fleet is None else fleet.view(),
        refused=pacer.refusals(),
        refused_elsewhere=_elsewhere(pacer),
        client_errors=dict(pacer.client_errors.counts),
        framing_faults=pacer.registries.transport.framing_faults,
        kept=KeptStats(len(kept), kept.bytes, kept.hits, kept.misses),
        budget=_budget(pacer),
        store=_store(pacer),
        reads=ReadStats(
            dict(pacer.flights.shared),
            dict(pacer.registries.reads),
            dict(pacer.services.egress.sent),
        ),
        ring_stats=_ring_stats(pacer, ring_stats),
        progress=_progress(views, schedulers, progress),
        recent=_recent(pacer, views) if recent else {},
        waits=pacer.services.waits.copy(),
    )


def _elsewhere(pacer: Pacer) -> dict[str, int]:
    """The refusals no host's state answers for, the runtime's and the others' it reads."""
    counts = dict(pacer.refused.counts)
    for log in pacer.refused_also:
        for reason, count in log.counts.items():
            counts[reason] = counts.get(reason, 0) + count
    return counts


def _budget(pacer: Pacer) -> BudgetStats:
    config, census, kept, cache = pacer.config, pacer.census, pacer.kept, pacer.cache
    memory, source = config.memory()
    used: dict[Bound, int | None] = {
        Bound.IMAGES: census.images,
        Bound.RESOURCES: len(census),
        Bound.HOSTS: pacer.wildcard_hosts,
        Bound.HELD: census.held,
        Bound.KEPT_BYTES: kept.bytes,
        Bound.KEPT_ENTRIES: len(kept),
        Bound.REFUSALS: kept.refusals,
        Bound.CATALOG: 0 if cache is None else cache.store.catalog_entries,
        Bound.RELAYS: pacer.services.relays.used,
    }
    return BudgetStats(memory, source, config.budget(), used)


def _store(pacer: Pacer) -> StoreStats | None:
    cache = pacer.cache
    if cache is None:
        return None
    store, counts = cache.store, cache.counts
    return StoreStats(
        store.count, store.used, store.max_bytes, store.evictions,
        dict(counts.bytes), dict(counts.reads), counts.stale, store.rejected,
    )  # fmt: skip


def _ring_stats(pacer: Pacer, limit: int) -> list[tuple[str, list[RingStat]]]:
    """The first ``limit`` rings, host by host: past that many series of one target, a
    Prometheus is past what it is comfortable with, and copying them holds the loop."""
    if not limit:  # not even the hosts' sort
        return []
    shown, taken = 0, []
    for host, stats in pacer.ring_stats():
        if shown >= limit:
            break
        few = list(itertools.islice(stats, limit - shown))
        shown += len(few)
        taken.append((host, few))
    return taken


def _progress(
    views: dict[str, HostView], schedulers: dict[str, HostScheduler], budget: int
) -> dict[tuple[str, str], tuple[int | None, int]]:
    """Each viewed ring's cursor place and waiting requests, for the page's lap bars; once
    ``budget`` images of hold rings are counted, the next ones get no place."""
    if not budget:
        return {}
    progress = {}
    for host, view in views.items():
        for ring in view.rings:
            position, waiting = schedulers[host].ring_progress(ring.resource, budget)
            if position is not None:
                budget -= ring.images  # an upper bound of what was counted
            progress[(host, ring.resource)] = (position, waiting)
    return progress


def _recent(
    pacer: Pacer, views: dict[str, HostView]
) -> dict[tuple[str, Operation], list[tuple[float, str, float]]]:
    recent = {}
    for host in views:
        runtime = pacer.runtime_of(host)
        if runtime is not None:
            for operation in (Operation.CHECK, Operation.COPY):
                recent[(host, operation)] = runtime.history.recent(operation)
    return recent
