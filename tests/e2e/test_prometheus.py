"""A real Prometheus scraping kuikproxy (SPEC §9): the pacing document's health query answers
about 1 for a ring alone on its registry and about 2 for two rings sharing one, the
KuikRingLapSlow alert is pending for the shared rings only, and every dashboard query has data.

kuikproxy runs as a subprocess before the recording registry of ``tests/upstream_app.py``
(served in a thread, on loopback) under two names, ``shared.test`` and ``alone.test``, with a
check window every 200 ms. Prometheus runs the example config of ``examples/monitoring/`` with
its target and intervals (1s) swapped in. Real time throughout: the test polls, never sleeps
longer than a poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from tests.e2e.peers import (
    LOOPBACK,
    Kuikproxy,
    Prometheus,
    free_port,
    http,
    registry_block,
)
from tests.monitoring import APT, MONITORING, PACING_RATIO, dashboard_queries
from tests.upstream_app import Registry

pytestmark = pytest.mark.e2e

INTERVAL = 0.2  # check.interval of both hosts (registry_block's FAST)
IMAGES = 4  # per resource
RINGS = {  # resource → its registry
    "team-a": "shared.test",
    "team-b": "shared.test",
    "solo": "alone.test",
}
EXPECTED = {"team-a": 2.0, "team-b": 2.0, "solo": 1.0}
# One window gained or lost in a lap moves a ring's ratio by 1/IMAGES = 0.25: a request
# re-sent a little late on a loaded machine can cost a lone ring a window, or hand a shared ring
# its neighbour's turn. The tolerance admits one such hiccup in the last lap, not two, and keeps
# the lone ring (1) and the shared ones (2) far apart.
TOLERANCE = 0.35
LAPS = 3  # completed laps of every ring before the query is trusted
DEADLINE = 25.0  # seconds, from the first request to every expectation met


class ThreadedRegistry:
    """``tests/upstream_app.py``'s recording registry, served by aiohttp on 127.0.0.1 in a
    thread with its own event loop."""

    def __init__(self) -> None:
        self.fake = Registry()
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner = web.AppRunner(self.fake.app())

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    async def _start(self) -> None:
        await self._runner.setup()
        await web.TCPSite(self._runner, LOOPBACK, self.port).start()

    def __enter__(self) -> ThreadedRegistry:
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        except BaseException:
            self._close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._close()

    def _close(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


class Askers:
    """One thread per image of every ring: a check (HEAD with ``Kuik-Resource``) of it, sent
    again as soon as it is answered, until ``stop``. ``answers`` counts 200s per resource."""

    def __init__(self, proxy: Kuikproxy) -> None:
        self.answers: Counter[str] = Counter()
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._ask, args=(proxy.url, resource, registry, i))
            for resource, registry in RINGS.items()
            for i in range(IMAGES)
        ]

    def _ask(self, base: str, resource: str, registry: str, i: int) -> None:
        url = f"{base}/v2/{resource}/app/manifests/v{i}?ns={registry}"
        headers = {"Kuik-Resource": resource}
        while not self._stop.is_set():
            try:
                status: object = http(url, "HEAD", headers=headers, timeout=10)[0]
            except OSError as error:
                status = f"error {error}"
            with self._lock:
                if status == 200:
                    self.answers[resource] += 1
                elif not self._stop.is_set():
                    self.failures.append(f"{resource} v{i}: {status}")
                    return

    def __enter__(self) -> Askers:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        # a held request is answered at its ring's next turn: within a lap (1.6 s)
        self._stop.set()
        for thread in self._threads:
            thread.join(10)


def example_config(target: str) -> dict[str, Any]:
    """``examples/monitoring/prometheus.yml`` scraping ``target`` and evaluating its rules
    every second (the rule file by absolute path)."""
    config: dict[str, Any] = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(MONITORING / name) for name in config["rule_files"]]
    (job,) = config["scrape_configs"]
    job["static_configs"] = [{"targets": [target]}]
    return config


def poll(what: str, check: Callable[[], Any], deadline: float, explain: Callable[[], str]) -> Any:
    """``check()`` every 100 ms until it is truthy (returned) or ``deadline`` (monotonic)."""
    while not (result := check()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not met in time:\n{explain()}")
        time.sleep(0.1)
    return result


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[ThreadedRegistry, Kuikproxy, Prometheus]]:
    """The fake registry, kuikproxy before it as both hosts, and Prometheus scraping kuikproxy;
    all stopped at teardown, in reverse, whatever happened."""
    if shutil.which(Prometheus.binary) is None:
        pytest.skip(f"prometheus is not installed ({APT})")
    with contextlib.ExitStack() as stack:
        upstream = stack.enter_context(ThreadedRegistry())
        config = {
            "defaultRegistry": "alone.test",
            "allowedHosts": [],
            "registries": {host: registry_block(upstream.url) for host in set(RINGS.values())},
        }
        proxy = stack.enter_context(Kuikproxy(tmp_path / "kuikproxy", config))
        prometheus = stack.enter_context(
            Prometheus(tmp_path / "prometheus", example_config(proxy.host_port))
        )
        yield upstream, proxy, prometheus


def ratios(prometheus: Prometheus) -> dict[str, tuple[str, float]]:
    """The pacing document's query now: resource → (registry, ratio)."""
    return {
        r["metric"]["resource"]: (r["metric"]["registry"], float(r["value"][1]))
        for r in prometheus.query(PACING_RATIO)
    }


def used_windows(prometheus: Prometheus) -> dict[str, float]:
    """Check windows used so far, per registry, as last scraped."""
    query = 'kuik_registry_windows_total{operation="Check",outcome="used"}'
    return {r["metric"]["registry"]: float(r["value"][1]) for r in prometheus.query(query)}


def test_pacing_ratio_through_prometheus(
    stack: tuple[ThreadedRegistry, Kuikproxy, Prometheus],
) -> None:
    """Two resources sharing ``shared.test`` lap in about twice their best case, one alone on
    ``alone.test`` in about its best case, as Prometheus computes the pacing document's query
    from kuikproxy's scraped metrics; KuikRingLapSlow is pending (``for: 30m``) for the shared
    rings and not for the lone one; every dashboard query returns data."""
    upstream, proxy, prometheus = stack
    # a lap ends at the turn after the ring's last image: LAPS laps take LAPS·IMAGES + 1 turns,
    # and a ring sharing its registry with another gets every other window
    enough = {"alone.test": LAPS * IMAGES + 1, "shared.test": 2 * (LAPS * IMAGES + 1)}
    with Askers(proxy) as askers:
        deadline = time.monotonic() + DEADLINE

        def explain() -> str:
            return (
                f"answers {dict(askers.answers)}, failures {askers.failures[:5]}\n"
                f"used windows {used_windows(prometheus)}, ratios {ratios(prometheus)}\n"
                f"kuikproxy log:\n{proxy.log()[-3000:]}"
            )

        def laps_done() -> bool:
            assert not askers.failures, explain()
            used = used_windows(prometheus)
            return all(used.get(host, 0) >= count for host, count in enough.items())

        poll(f"{LAPS} laps of every ring scraped", laps_done, deadline, explain)
        measured = ratios(prometheus)
        assert {resource: registry for resource, (registry, _) in measured.items()} == RINGS
        for resource, (_, ratio) in measured.items():
            assert ratio == pytest.approx(EXPECTED[resource], abs=TOLERANCE), (measured, explain())

        def pending() -> set[str]:
            alerts = prometheus.api("/api/v1/alerts")["alerts"]
            return {
                a["labels"]["resource"]
                for a in alerts
                if a["labels"]["alertname"] == "KuikRingLapSlow" and a["state"] == "pending"
            }

        slow = poll("KuikRingLapSlow pending", pending, deadline, explain)
        assert slow == {"team-a", "team-b"}, explain()

        # every panel of the dashboard has data ($__rate_interval: 4 scrapes at least)
        queries = dashboard_queries(rate_interval="5s")

        def empty_panels() -> str:
            return "panels without data: " + ", ".join(
                f"{panel}: {expr}" for panel, expr in queries.items() if not prometheus.query(expr)
            )

        poll("data in every panel", lambda: empty_panels().endswith(": "), deadline, empty_panels)

    # what the registry saw: checks of every image of every ring, and nothing else
    heads = {s.path for s in upstream.fake.seen if s.method == "HEAD"}
    assert heads == {
        f"/v2/{resource}/app/manifests/v{i}" for resource in RINGS for i in range(IMAGES)
    }
    assert {s.method for s in upstream.fake.seen} <= {"HEAD", "GET"}
