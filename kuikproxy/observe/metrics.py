"""Prometheus metrics (SPEC §9), on a registry of kuikproxy's own.

Two kinds. The pacing state — ring sizes, laps, intervals, window outcomes, waiting requests,
blocks, priority levels, quota buckets, refusals — is read at scrape time from one
:class:`~kuikproxy.runtime.snapshot.Snapshot`, never kept twice (the collectors of
:mod:`kuikproxy.observe.collectors`). Events the edge sees — requests answered, reloads — are
counted as they happen (:class:`Metrics`).

Three names are the pacing document's own, so its health query works unchanged::

    kuik_check_cycle_duration_seconds / (kuik_check_ring_images * on(registry) group_left
        kuik_registry_interval_seconds{operation="Check"})

Labels are bounded: registries and resources, never an image reference. A host under an
allowed wildcard has series of its own while it has state (``limits.maxHosts`` of them at most),
and loses them when it is forgotten; requests to hosts without state count under
``registry="-"``. A scrape takes its snapshot on the event loop and renders the text in a
worker thread (:meth:`Metrics.render`); the per-ring series are those of at most
:data:`RING_SERIES` rings.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    disable_created_metrics,
    generate_latest,
)

from kuikproxy.observe.collectors import (
    BudgetCollector,
    FaultCollector,
    FleetCollector,
    FlowControlCollector,
    PacingCollector,
    QuotaCollector,
    ReadCollector,
    RefusalCollector,
    StoreCollector,
    WaitCollector,
    ring_families,
)
from kuikproxy.runtime.egress import NO_HOST
from kuikproxy.runtime.snapshot import Snapshot

RING_SERIES = 20_000
"""Rings with series of their own in one scrape, host by host (what a scrape asks its snapshot
for). Past it the rest are left out (``kuik_check_rings`` still counts every ring): that many
series of one target are past what a Prometheus is comfortable with anyway, and copying them
holds the loop (~0.3 µs a ring)."""


class Metrics:
    """kuikproxy's metrics registry and the event counters the runtime and edge update.

    The ``operation`` label is ``Check`` or ``Copy`` everywhere, as the pacing document spells
    it. No ``*_created`` series: they would double every labelled counter for a start time
    nobody queries (a process-wide switch of prometheus-client's; kuikproxy owns its process).
    """

    def __init__(
        self, *, snapshot: Callable[[int], Snapshot], known: Callable[[str], bool]
    ) -> None:
        """``snapshot(rings)`` reads the live state, on the event loop, once per scrape
        (:meth:`render`): every host's view and quota, and the stats of the first ``rings``
        rings (:data:`RING_SERIES`). ``known(host)``: whether the host has series of its own
        (configured, or with state); the others count under :data:`NO_HOST`."""
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self._snapshot = snapshot
        self._scraped: Snapshot | None = None
        self._scraping = asyncio.Lock()
        self._known = known
        self.registry = CollectorRegistry(auto_describe=True)
        for collector in (
            BudgetCollector,
            PacingCollector,
            RefusalCollector,
            FlowControlCollector,
            QuotaCollector,
            FleetCollector,
            ReadCollector,
            StoreCollector,
            WaitCollector,
            FaultCollector,
        ):
            self.registry.register(collector(self._scrape))
        self.requests = Counter(
            "kuik_proxy_requests",
            "Registry requests answered by kuikproxy; cache is hit (a kept answer), miss (read "
            "upstream) or none (refused, or not a read).",
            ["registry", "operation", "code", "cache"],
            registry=self.registry,
        )
        # children by registry label, then the other labels: a host's go with it at once
        self._answered: dict[str, dict[tuple[str, ...], Counter]] = {}
        self.reloads = Counter(
            "kuik_proxy_config_reloads",
            "Config reloads (§7.2) by result: success (applied) or error (refused, the running "
            "config stays).",
            ["result"],
            registry=self.registry,
        )
        for result in ("success", "error"):  # both series exist from the start, at 0
            self.reloads.labels(result)

    def answered(self, host: str, operation: str, code: str, cache: str) -> None:
        """One request answered."""
        self._child(self._answered, self.requests, host, (operation, code, cache)).inc()

    def reloaded(self, result: str) -> None:
        """A config reload's ``result``: ``success`` or ``error`` (§7.2)."""
        self.reloads.labels(result).inc()

    def _child(
        self,
        children_by_host: dict[str, dict[tuple[str, ...], Counter]],
        family: Counter,
        host: str,
        key: tuple[str, ...],
    ) -> Counter:
        """``family``'s counter for ``host`` (or :data:`NO_HOST`) and ``key``, found once per
        label set: ``labels()`` costs more than the rest of a kept answer's bookkeeping, and
        this runs for every request."""
        children = children_by_host.get(host)
        child = None if children is None else children.get(key)
        if child is None:
            registry = self._registry(host)
            children = children_by_host.setdefault(registry, {})
            child = children.get(key)
            if child is None:
                child = children[key] = family.labels(registry, *key)
        return child

    def _registry(self, host: str) -> str:
        """The ``registry`` label of a request to ``host``: its own while it has series."""
        return host if self._known(host) else NO_HOST

    def _forget_gone(self) -> None:
        """Hosts whose state was let go of since the last scrape lose their series, or a proxy
        that sees a new host under a wildcard every day would grow a series for each for ever."""
        for host in [h for h in self._answered if h != NO_HOST and not self._known(h)]:
            for answered in self._answered.pop(host):
                self.requests.remove(host, *answered)

    def _scrape(self) -> Snapshot:
        """The snapshot of the scrape under way, which the collectors read."""
        assert self._scraped is not None  # collected only by render, once it is taken
        return self._scraped

    async def render(self) -> bytes:
        """The text of one scrape: the live state read on the loop (one snapshot), the text
        made in a worker thread — with a thousand hosts and ten thousand rings that is a
        quarter of a second of prometheus-client, which the loop must never wait for. One
        scrape at a time: the collectors read the snapshot taken for them."""
        async with self._scraping:
            self._forget_gone()
            self._scraped = self._snapshot(RING_SERIES)
            return await asyncio.to_thread(self._text)

    def _text(self) -> bytes:
        """In a worker thread: counters and histograms lock their own values."""
        return generate_latest(self.registry) + ring_families(self._scrape().ring_stats)
