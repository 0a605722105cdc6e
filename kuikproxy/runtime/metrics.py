"""Prometheus metrics (SPEC §9), on a registry of kuikproxy's own.

Two kinds. The pacing state — ring sizes, laps, intervals, window outcomes, waiting requests,
blocks — is the scheduler's, read at scrape time from its snapshots (:class:`PacingCollector`),
never kept twice; so are the priority levels' (:class:`FlowControlCollector`) and the quota
buckets' (:class:`QuotaCollector`). Events — requests answered, upstream requests, waits — are
counted as they happen (:class:`Metrics`).

Three names are the pacing document's own, so its health query works unchanged::

    kuik_check_cycle_duration_seconds / (kuik_check_ring_images * on(registry) group_left
        kuik_registry_interval_seconds{operation="Check"})

Labels are bounded: registries and resources, never an image reference. A host under an
allowed wildcard has series of its own while it has state (``limits.maxHosts`` of them at most),
and loses them when it is forgotten; requests to hosts without state count under
``registry="-"``. A scrape copies what it reads on the event loop and renders the text in a
worker thread (:meth:`Metrics.render`); the per-ring series are rendered by hand
(:func:`ring_families`, ~0.5 µs a sample against prometheus-client's ~5), for at most
:data:`RING_SERIES` rings.
"""

from __future__ import annotations

import asyncio
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from kuikproxy.core.flowcontrol import LevelView
from kuikproxy.core.quota import BucketView, QuotaSnapshot
from kuikproxy.core.scheduler import HostView
from kuikproxy.runtime.fleet import FleetView

# waits range from a kept answer (none) through a window (seconds to minutes) to a lap (hours)
WAIT_BUCKETS = (0.01, 0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600)
Views = Callable[[], tuple[Mapping[str, HostView], float]]  # (views, wall − loop offset)
Levels = Callable[[], tuple[LevelView, ...]]
Quotas = Callable[[], Mapping[str, QuotaSnapshot]]  # each host's quota now
RingStat = tuple[str, int, float | None]  # (resource, images, cycleDuration)
RingStats = Iterable[RingStat]
Rings = Callable[[], Iterable[tuple[str, RingStats]]]  # each host's rings, read at once
Refused = Callable[[], Iterable[tuple[str, Mapping[str, int]]]]  # (registry, reason → count)

NO_HOST = "-"
"""The ``registry`` label of what no host's state answers for: a host refused under
``limits.maxHosts``, or not allowed at all (one series, however many names clients send)."""
RING_SERIES = 20_000
"""Rings with series of their own in one scrape, host by host. Past it the rest are left out
(``kuik_check_rings`` still counts every ring): that many series of one target are past what a
Prometheus is comfortable with anyway, and copying them holds the loop (~0.3 µs a ring)."""


class PacingCollector(Collector):
    """The scheduler's state as metrics, read from its snapshots at each scrape."""

    def __init__(self, views: Views) -> None:
        self._views = views

    def describe(self) -> list[Metric]:
        """The families, without samples: what the registry checks names against."""
        return list(_Families().all())

    def collect(self) -> Iterator[Metric]:
        views, wall_offset = self._views()
        f = _Families()
        for host, view in sorted(views.items()):
            for series, name, held in (
                (view.check, "Check", view.check_waiting),
                (view.copy, "Copy", view.copy_waiting),
            ):
                f.interval.add_metric([host, name], series.interval)
                f.waiting.add_metric([host, name], held)
                for outcome, count in series.windows.items():
                    f.windows.add_metric([host, name, outcome], count)
            until = view.blocked_until
            f.blocked.add_metric([host], 0.0 if until is None else until + wall_offset)
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
            "Windows of a registry's series by what became of them (used, idle, busy, blocked).",
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


def ring_families(rings: Iterable[tuple[str, RingStats]]) -> bytes:
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


class RefusalCollector(Collector):
    """kuikproxy's own refusals by registry and reason (SPEC §12), read at each scrape."""

    def __init__(self, refused: Refused) -> None:
        self._refused = refused

    def describe(self) -> list[Metric]:
        return [self._family(())]

    def collect(self) -> Iterator[Metric]:
        yield self._family(self._refused())

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


class FlowControlCollector(Collector):
    """The priority levels' seats and queues (SPEC §10), read from the flow-control machine's
    snapshot at each scrape; names follow Kubernetes' ``apiserver_flowcontrol_*``."""

    def __init__(self, levels: Levels) -> None:
        self._levels = levels

    def describe(self) -> list[Metric]:
        return list(self._families(()))

    def collect(self) -> Iterator[Metric]:
        return iter(self._families(self._levels()))

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


class QuotaCollector(Collector):
    """Each host's token buckets and the last ``ratelimit-remaining`` it sent (SPEC §9, §11),
    read from the quota snapshots at each scrape."""

    def __init__(self, quotas: Quotas) -> None:
        self._quotas = quotas

    def describe(self) -> list[Metric]:
        return list(self._families({}))

    def collect(self) -> Iterator[Metric]:
        return iter(self._families(self._quotas()))

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


class Metrics:
    """kuikproxy's metrics registry and the event counters the runtime and edge update.

    The ``operation`` label is ``Check`` or ``Copy`` everywhere, as the pacing document spells
    it. No ``*_created`` series: they would double every labelled counter for a start time
    nobody queries (a process-wide switch of prometheus-client's; kuikproxy owns its process).
    """

    def __init__(
        self,
        views: Views,
        levels: Levels,
        quotas: Quotas,
        fleet: Callable[[], FleetView] | None = None,
        *,
        rings: Rings,
        refused: Refused,
        known: Callable[[str], bool],
    ) -> None:
        """The callables read the live state, on the event loop, once per scrape
        (:meth:`render`). ``known(host)``: whether the host has series of its own
        (configured, or with state); the others count under :data:`NO_HOST`."""
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self._sources = (views, levels, quotas, rings, refused, fleet)
        self._scrape = Scrape()
        self._scraping = asyncio.Lock()
        self._known = known
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(PacingCollector(lambda: (self._scrape.views, self._scrape.offset)))
        self.registry.register(RefusalCollector(lambda: self._scrape.refused))
        self.registry.register(FlowControlCollector(lambda: self._scrape.levels))
        self.registry.register(QuotaCollector(lambda: self._scrape.quotas))
        if fleet is not None:  # whether the fleet is reached, and how large it is
            connected = Gauge(
                "kuik_proxy_fleet_connected",
                "1 while the fleet's store is reached; 0 while this proxy paces alone, on one "
                "window in kuik_proxy_fleet_size.",
                registry=self.registry,
            )
            connected.set_function(lambda: float(self._fleet().connected))
            size = Gauge(
                "kuik_proxy_fleet_size",
                "Proxies in the fleet as last seen, this one included.",
                registry=self.registry,
            )
            size.set_function(lambda: float(self._fleet().size))
        self.requests = Counter(
            "kuik_proxy_requests",
            "Registry requests answered by kuikproxy; cache is hit (a kept answer), miss (read "
            "upstream) or none (refused, or not a read).",
            ["registry", "operation", "code", "cache"],
            registry=self.registry,
        )
        # children by registry label, then the other labels: a host's go with it at once
        self._answered: dict[str, dict[tuple[str, str, str], Counter]] = {}
        self._sent: dict[str, dict[tuple[str, str], Counter]] = {}  # upstream requests'
        self.wait = Histogram(
            "kuik_proxy_wait_seconds",
            "How long requests were held before their window released them.",
            ["registry", "operation"],
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self.reloads = Counter(
            "kuik_proxy_config_reloads",
            "Config reloads (§7.2) by result: success (applied) or error (refused, the running "
            "config stays).",
            ["result"],
            registry=self.registry,
        )
        for result in ("success", "error"):  # both series exist from the start, at 0
            self.reloads.labels(result)
        self.upstream = Counter(
            "kuik_registry_upstream_requests",
            "Requests kuikproxy sent to registries, by their answer's status (or error).",
            ["registry", "method", "code"],
            registry=self.registry,
        )

    def answered(self, host: str, operation: str, code: str, cache: str) -> None:
        """One request answered. Its counter is found once per label set: ``labels()`` costs
        more than the rest of a kept answer's bookkeeping, and this runs for every request."""
        key = (operation, code, cache)
        children = self._answered.get(host)
        child = None if children is None else children.get(key)
        if child is None:
            registry = self._registry(host)
            children = self._answered.setdefault(registry, {})
            child = children.get(key)
            if child is None:
                child = children[key] = self.requests.labels(registry, *key)
        child.inc()

    def upstream_answered(
        self, host: str, method: str, status: int | None, headers: tuple[tuple[str, str], ...]
    ) -> None:
        key = (method, "error" if status is None else str(status))
        children = self._sent.get(host)
        child = None if children is None else children.get(key)
        if child is None:
            registry = self._registry(host)
            children = self._sent.setdefault(registry, {})
            child = children.get(key)
            if child is None:
                child = children[key] = self.upstream.labels(registry, *key)
        child.inc()

    def _registry(self, host: str) -> str:
        """The ``registry`` label of a request to ``host``: its own while it has series."""
        return host if self._known(host) else NO_HOST

    def forget(self, host: str) -> None:
        """The host's state was let go of: so are its series, or a proxy that sees
        a new host under a wildcard every day would grow a series for each for ever."""
        for answered in self._answered.pop(host, {}):
            self.requests.remove(host, *answered)
        for sent in self._sent.pop(host, {}):
            self.upstream.remove(host, *sent)
        for operation in ("Check", "Copy"):
            self.wait.remove(host, operation)

    def _fleet(self) -> FleetView:
        fleet = self._scrape.fleet
        assert fleet is not None  # its gauges exist only with a fleet, whose view is taken
        return fleet

    async def render(self) -> bytes:
        """The text of one scrape: the live state read on the loop (:meth:`_take`), the text
        made in a worker thread — with a thousand hosts and ten thousand rings that is a
        quarter of a second of prometheus-client, which the loop must never wait for. One
        scrape at a time: the collectors read the scrape taken for them."""
        async with self._scraping:
            self._scrape = self._take()
            return await asyncio.to_thread(self._text)

    def _take(self) -> Scrape:
        views, levels, quotas, rings, refused, fleet = self._sources
        shown, taken = 0, []
        for host, stats in rings():  # no more than RING_SERIES rings copied
            if shown >= RING_SERIES:
                break
            few = list(itertools.islice(stats, RING_SERIES - shown))
            shown += len(few)
            taken.append((host, few))
        host_views, offset = views()
        return Scrape(
            views=host_views,
            offset=offset,
            rings=taken,
            levels=levels(),
            quotas=quotas(),
            refused=[(registry, dict(counts)) for registry, counts in refused()],
            fleet=None if fleet is None else fleet(),
        )

    def _text(self) -> bytes:
        """In a worker thread: counters and histograms lock their own values."""
        return generate_latest(self.registry) + ring_families(self._scrape.rings)


@dataclass(frozen=True, slots=True)
class Scrape:
    """What one scrape reads of the live state, copied on the event loop."""

    views: Mapping[str, HostView] = field(default_factory=dict)
    offset: float = 0.0  # wall − loop time
    rings: list[tuple[str, list[RingStat]]] = field(default_factory=list)
    levels: tuple[LevelView, ...] = ()
    quotas: Mapping[str, QuotaSnapshot] = field(default_factory=dict)
    refused: list[tuple[str, dict[str, int]]] = field(default_factory=list)
    fleet: FleetView | None = None
