"""The collectors of ``/metrics`` (SPEC §9): the pacing state as metric families, each read
from the :class:`~kuikproxy.runtime.snapshot.Snapshot` of the scrape.

The pacing state — ring sizes, laps, intervals, window outcomes, waiting requests, blocks — is
the scheduler's, never kept twice (:class:`PacingCollector`); so are the priority levels'
(:class:`FlowControlCollector`), the quota buckets' (:class:`QuotaCollector`), the refusals'
(:class:`RefusalCollector`), the fleet's (:class:`FleetCollector`), the pull-through
store's (:class:`StoreCollector`) and the faults of the wire (:class:`FaultCollector`). The
per-ring series are
rendered by hand (:func:`ring_families`, ~0.5 µs a sample against prometheus-client's ~5).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from kuikproxy.core.flowcontrol import LevelView
from kuikproxy.core.quota import BucketView, QuotaSnapshot
from kuikproxy.core.tickets import Operation
from kuikproxy.runtime.egress import NO_HOST
from kuikproxy.runtime.fleetlink import FleetView
from kuikproxy.runtime.snapshot import BudgetStats, ReadStats, RingStat, Snapshot, StoreStats
from kuikproxy.runtime.waittimes import WAIT_BUCKETS, Buckets

Scraped = Callable[[], Snapshot]
"""The snapshot of the scrape under way."""

"""The ``registry`` label of what no host's state answers for: a host refused under
``limits.maxHosts``, or not allowed at all (one series, however many names clients send)."""


class _Scraping(Collector):
    """A collector of what the scrape's snapshot holds."""

    def __init__(self, scraped: Scraped) -> None:
        self._scraped = scraped


class PacingCollector(_Scraping):
    """The scheduler's state as metrics, read from its host views at each scrape."""

    def describe(self) -> list[Metric]:
        """The families, without samples: what the registry checks names against."""
        return list(_Families().all())

    def collect(self) -> Iterator[Metric]:
        snap = self._scraped()
        f = _Families()
        for host, view in sorted(snap.views.items()):
            for series, name, held in (
                (view.check, "Check", view.check_waiting),
                (view.copy, "Copy", view.copy_waiting),
            ):
                f.interval.add_metric([host, name], series.interval)
                f.waiting.add_metric([host, name], held)
                for outcome, count in series.windows.items():
                    f.windows.add_metric([host, name, outcome], count)
            until = view.blocked_until
            f.blocked.add_metric([host], 0.0 if until is None else until + snap.wall_offset)
            f.rings.add_metric([host], view.ring_count)
        yield from f.all()


class _Families:
    """One scrape's families of the pacing state."""

    def __init__(self) -> None:
        self.rings = GaugeMetricFamily(
            "kuik_check_rings",
            "How many rings (resources asking for images) a registry holds, each counted here "
            "even past the rings that have series of their own.",
            labels=["registry"],
        )
        self.interval = GaugeMetricFamily(
            "kuik_registry_interval_seconds",
            "The interval between windows of a registry's series.",
            labels=["registry", "operation"],
        )
        self.windows = CounterMetricFamily(
            "kuik_registry_windows",
            "Windows of a registry's series by what became of them (used, idle, busy, blocked; "
            "in a fleet, fleet: another proxy's, away: its store out of reach).",
            labels=["registry", "operation", "outcome"],
        )
        self.waiting = GaugeMetricFamily(
            "kuik_proxy_waiting_requests",
            "Requests held for a window.",
            labels=["registry", "operation"],
        )
        self.blocked = GaugeMetricFamily(
            "kuik_registry_blocked_until_timestamp_seconds",
            "Until when the registry asked kuikproxy to stop (Unix time; 0: not blocked).",
            labels=["registry"],
        )

    def all(self) -> Iterator[Metric]:
        yield from (self.rings, self.interval, self.windows, self.waiting, self.blocked)


_LAP_HELP = "How long the last lap of a ring took (measured), per resource and registry."
_IMAGES_HELP = "How many images a resource's ring holds on a registry."


def ring_families(rings: Iterable[tuple[str, Iterable[RingStat]]]) -> bytes:
    """``kuik_check_cycle_duration_seconds`` and ``kuik_check_ring_images`` (the pacing
    document's names) in the text format, host by host."""
    laps: list[str] = []
    images: list[str] = []
    for host, stats in rings:
        registry = _label(host)
        for resource, size, lap in stats:
            labels = f'{{resource="{_label(resource)}",registry="{registry}"}}'
            images.append(f"kuik_check_ring_images{labels} {size}.0\n")
            if lap is not None:
                value = floatToGoString(lap)  # type: ignore[no-untyped-call]
                laps.append(f"kuik_check_cycle_duration_seconds{labels} {value}\n")
    return "".join(
        (
            f"# HELP kuik_check_cycle_duration_seconds {_LAP_HELP}\n",
            "# TYPE kuik_check_cycle_duration_seconds gauge\n",
            *laps,
            f"# HELP kuik_check_ring_images {_IMAGES_HELP}\n",
            "# TYPE kuik_check_ring_images gauge\n",
            *images,
        )
    ).encode()


def _label(value: str) -> str:
    """A label value as the text format writes it: backslash, newline and quote escaped."""
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return value


class RefusalCollector(_Scraping):
    """kuikproxy's own refusals by registry and reason (SPEC §12), read at each scrape."""

    def describe(self) -> list[Metric]:
        return [self._family(())]

    def collect(self) -> Iterator[Metric]:
        snap = self._scraped()
        yield self._family([(NO_HOST, snap.refused_elsewhere), *snap.refused.items()])

    @staticmethod
    def _family(refused: Iterable[tuple[str, Mapping[str, int]]]) -> Metric:
        family = CounterMetricFamily(
            "kuik_proxy_refusals",
            "Requests kuikproxy refused itself, by registry and reason: notAllowed, "
            "addressGuard, ambiguous, maxHold, flowControl, blocked, shutdown, or a limit "
            f"(maxHosts, maxResources, maxImages, maxRingImages); registry {NO_HOST} for "
            "hosts without state (a host not allowed among them).",
            labels=["registry", "reason"],
        )
        for registry, counts in refused:
            for reason, count in sorted(counts.items()):
                family.add_metric([registry, reason], count)
        return family


class FlowControlCollector(_Scraping):
    """The priority levels' seats and queues (SPEC §10), read from the flow-control machine's
    snapshot at each scrape; names follow Kubernetes' ``apiserver_flowcontrol_*``."""

    def describe(self) -> list[Metric]:
        return list(self._families(()))

    def collect(self) -> Iterator[Metric]:
        return iter(self._families(self._scraped().levels))

    @staticmethod
    def _families(levels: tuple[LevelView, ...]) -> list[Metric]:
        def gauge(name: str, help: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(
                f"kuik_proxy_flowcontrol_{name}", help, labels=["priority_level"]
            )

        nominal = gauge("nominal_limit_seats", "NominalCL: the seats a level is entitled to.")
        current = gauge("current_limit_seats", "The seats a level may use now (lent or borrowed).")
        queued = gauge("current_inqueue_requests", "Requests waiting for a seat.")
        parked = gauge(
            "current_parked_requests",
            "Requests holding a place in a level's queues while they wait for their window.",
        )
        executing = gauge("current_executing_requests", "Requests holding a seat.")
        dispatched = CounterMetricFamily(
            "kuik_proxy_flowcontrol_dispatched_requests",
            "Requests given a seat.",
            labels=["priority_level"],
        )
        rejected = CounterMetricFamily(
            "kuik_proxy_flowcontrol_rejected_requests",
            "Requests refused (429): queue-full or concurrency-limit.",
            labels=["priority_level", "reason"],
        )
        for level in levels:
            name = [level.name]
            nominal.add_metric(name, level.nominal_cl)
            current.add_metric(name, level.current_cl)
            queued.add_metric(name, level.in_queue)
            parked.add_metric(name, level.parked)
            executing.add_metric(name, level.executing)
            dispatched.add_metric(name, level.dispatched)
            for reason, count in level.rejected.items():
                rejected.add_metric([level.name, str(reason)], count)
        return [nominal, current, queued, parked, executing, dispatched, rejected]


class QuotaCollector(_Scraping):
    """Each host's token buckets and the last ``ratelimit-remaining`` it sent (SPEC §9, §11),
    read from the quota snapshots at each scrape."""

    def describe(self) -> list[Metric]:
        return list(self._families({}))

    def collect(self) -> Iterator[Metric]:
        return iter(self._families(self._scraped().quotas))

    @staticmethod
    def _families(quotas: Mapping[str, QuotaSnapshot]) -> list[Metric]:
        tokens = GaugeMetricFamily(
            "kuik_registry_quota_tokens",
            "Tokens a registry's quota bucket holds now, by category and scope; for identity "
            "buckets, those of the identity with the fewest.",
            labels=["registry", "category", "scope"],
        )
        remaining = GaugeMetricFamily(
            "kuik_registry_ratelimit_remaining",
            "The last ratelimit-remaining a registry's answers carried.",
            labels=["registry"],
        )
        for host, quota in sorted(quotas.items()):
            for (category, scope), level in _fewest(quota.buckets).items():
                tokens.add_metric([host, category, scope], level)
            # no sample until a registry says it: 0 would read as "exhausted"
            if quota.ratelimit_remaining is not None:
                remaining.add_metric([host], quota.ratelimit_remaining)
        return [tokens, remaining]


def _fewest(buckets: Iterable[BucketView]) -> dict[tuple[str, str], float]:
    """The fewest tokens any bucket of each (category, scope) holds.

    A registry-scoped bucket is the only one of its key. Identity buckets are one per active
    identity, so a label per identity would be unbounded; of them the one with the fewest
    tokens is the one about to make its requests wait, which is what an alert on exhaustion
    wants (a sum would grow with the number of identities and hide one that is empty). Identity
    buckets appear with an identity's first request (until then every one is full). A learnt
    bucket that has learnt nothing (``tokens`` None) refuses nothing: it has no level to show.
    """
    fewest: dict[tuple[str, str], float] = {}
    for bucket in buckets:
        if bucket.tokens is not None:
            key = (bucket.category.value, bucket.scope.value)
            fewest[key] = min(fewest.get(key, math.inf), bucket.tokens)
    return fewest


class FleetCollector(_Scraping):
    """Whether the fleet's store is reached, and how large the fleet is: no family at all for
    a proxy that paces alone."""

    def describe(self) -> list[Metric]:
        return self._families(None)

    def collect(self) -> Iterator[Metric]:
        fleet = self._scraped().fleet
        return iter([] if fleet is None else self._families(fleet))

    @staticmethod
    def _families(fleet: FleetView | None) -> list[Metric]:
        connected = GaugeMetricFamily(
            "kuik_proxy_fleet_connected",
            "1 while the fleet's store is reached; 0 while this proxy paces alone, on one "
            "window in kuik_proxy_fleet_size.",
        )
        size = GaugeMetricFamily(
            "kuik_proxy_fleet_size", "Proxies in the fleet as last seen, this one included."
        )
        away = CounterMetricFamily(
            "kuik_proxy_fleet_windows_away",
            "Windows with something due this proxy did not use: the fleet's store out of reach, "
            "or answering too late (fleet.whenCutOff: wait).",
        )
        if fleet is not None:
            connected.add_metric([], float(fleet.connected))
            size.add_metric([], float(fleet.size))
            away.add_metric([], float(fleet.away))
        return [connected, size, away]


class ReadCollector(_Scraping):
    """Reads by kind: those served by another's read (R2), those sent to the registries; and
    every request sent, by registry, method and status."""

    def describe(self) -> list[Metric]:
        return self._families(None)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families(self._scraped().reads))

    @staticmethod
    def _families(reads: ReadStats | None) -> list[Metric]:
        shared = CounterMetricFamily(
            "kuik_proxy_reads_shared",
            "Requests served by another request's registry read, by kind: a read in flight "
            "they followed, or their window's (R2).",
            labels=["kind"],
        )
        registry = CounterMetricFamily(
            "kuik_proxy_registry_reads",
            "Requests sent to the registries, by kind (manifest-tag, manifest-digest, blob, "
            "referrers, tags): what a registry's own access log counts.",
            labels=["kind"],
        )
        upstream = CounterMetricFamily(
            "kuik_registry_upstream_requests",
            "Requests kuikproxy sent to registries, by their answer's status (or error).",
            labels=["registry", "method", "code"],
        )
        if reads is not None:
            for kind, count in reads.shared.items():
                shared.add_metric([kind], count)
            for kind, count in reads.registry.items():
                registry.add_metric([kind], count)
            for labels, count in reads.sent.items():
                upstream.add_metric(list(labels), count)
        return [shared, registry, upstream]


class WaitCollector(_Scraping):
    """How long held reads waited for their windows (``kuik_proxy_wait_seconds``)."""

    def describe(self) -> list[Metric]:
        return [self._family({})]

    def collect(self) -> Iterator[Metric]:
        yield self._family(self._scraped().waits)

    @staticmethod
    def _family(waits: Mapping[tuple[str, Operation], Buckets]) -> Metric:
        family = HistogramMetricFamily(
            "kuik_proxy_wait_seconds",
            "How long requests were held before their window released them.",
            labels=["registry", "operation"],
        )
        bounds = [*(floatToGoString(b) for b in WAIT_BUCKETS), "+Inf"]  # type: ignore[no-untyped-call]
        for (host, operation), (counts, total) in waits.items():
            cumulative, running = [], 0
            for bound, count in zip(bounds, counts, strict=True):
                running += count
                cumulative.append((bound, running))
            family.add_metric([host, operation.value.capitalize()], cumulative, total)
        return family


class StoreCollector(_Scraping):
    """The pull-through store (§15): bytes and reads by source, its size, evictions, stale
    answers. No samples without a store: a proxy without one has nothing to show."""

    def describe(self) -> list[Metric]:
        return list(self._families(None))

    def collect(self) -> Iterator[Metric]:
        return iter(self._families(self._scraped().store))

    @staticmethod
    def _families(store: StoreStats | None) -> list[Metric]:
        served = CounterMetricFamily(
            "kuik_proxy_cache_bytes",
            "Bytes of blobs and manifests by digest given to clients, by source: store (from "
            "the disk), shared (another client's registry read, followed as it arrived) or "
            "registry (read from the registry for this client).",
            labels=["source"],
        )
        reads = CounterMetricFamily(
            "kuik_proxy_cache_reads",
            "Reads of content by digest given to clients, by source: store, shared, registry.",
            labels=["source"],
        )
        size = GaugeMetricFamily("kuik_proxy_store_bytes", "Bytes in the store on disk.")
        limit = GaugeMetricFamily("kuik_proxy_store_max_bytes", "cache.blobs.maxBytes.")
        blobs = GaugeMetricFamily("kuik_proxy_store_blobs", "Blobs and manifests in the store.")
        evictions = CounterMetricFamily(
            "kuik_proxy_store_evictions", "Blobs evicted from the store, least recently used."
        )
        stale = CounterMetricFamily(
            "kuik_proxy_stale_answers",
            "Manifests answered from the store while their registry was blocked or unreachable "
            "(serveStale).",
        )
        rejected = CounterMetricFamily(
            "kuik_proxy_store_rejected_files",
            "Store files found not to be their blob when opened: dropped, read again.",
        )
        if store is not None:
            for source in ("store", "shared", "registry"):
                served.add_metric([source], store.served_bytes.get(source, 0))
                reads.add_metric([source], store.reads.get(source, 0))
            size.add_metric([], store.bytes)
            limit.add_metric([], store.max_bytes)
            blobs.add_metric([], store.blobs)
            evictions.add_metric([], store.evictions)
            stale.add_metric([], store.stale)
            rejected.add_metric([], store.rejected)
        return [served, reads, size, limit, blobs, evictions, stale, rejected]


class FaultCollector(_Scraping):
    """What was wrong on the wire, either way: malformed requests by reason (§12), and
    registry answers whose framing lied."""

    def describe(self) -> list[Metric]:
        return self._families({}, 0)

    def collect(self) -> Iterator[Metric]:
        snap = self._scraped()
        return iter(self._families(snap.client_errors, snap.framing_faults))

    @staticmethod
    def _families(client_errors: Mapping[str, int], framing_faults: int) -> list[Metric]:
        malformed = CounterMetricFamily(
            "kuik_proxy_client_errors",
            "Requests aiohttp's parser refused, answered with an OCI error, by reason: "
            "line-too-long, header-too-large, bad-header, bad-framing, bad-path, bad-method, "
            "bad-version, other.",
            labels=["reason"],
        )
        for reason, count in sorted(client_errors.items()):
            malformed.add_metric([reason], count)
        lied = CounterMetricFamily(
            "kuik_proxy_upstream_framing_faults",
            "Registry answers carrying more or fewer bytes than their framing said: failed, "
            "their connection never reused.",
        )
        lied.add_metric([], framing_faults)
        return [malformed, lied]


class BudgetCollector(_Scraping):
    """The memory budget's bounds: what each admits and holds (``kuik_proxy_bound_*``)."""

    def describe(self) -> list[Metric]:
        return self._families(None)

    def collect(self) -> Iterator[Metric]:
        return iter(self._families(self._scraped().budget))

    @staticmethod
    def _families(stats: BudgetStats | None) -> list[Metric]:
        memory = GaugeMetricFamily(
            "kuik_proxy_memory_budget_bytes",
            "The memory every bound a client can fill fits in, together (limits.memory).",
        )
        limit = GaugeMetricFamily(
            "kuik_proxy_bound_limit",
            "Items (bytes where an item is a byte) a bound admits, by the setting naming it.",
            labels=["bound"],
        )
        used = GaugeMetricFamily(
            "kuik_proxy_bound_used",
            "Items a bound holds now; a bound reached refuses (or evicts, for kept answers).",
            labels=["bound"],
        )
        if stats is not None:
            memory.add_metric([], stats.memory)
            for share in stats.budget.shares:
                limit.add_metric([str(share.bound)], share.value)
                held = stats.used[share.bound]
                if held is not None:
                    used.add_metric([str(share.bound)], held)
        return [memory, limit, used]
