"""Reload and shutdown of a real ``kuikproxy serve`` process (SPEC §7.2, P12).

**Edit storm** (acceptance 3). kuikproxy reads ``registry.test:5000`` (the suite's distribution
registry) with checks every 400 ms and copies every 700 ms. Clients keep a check and a copy due
at all times (each request names a tag nobody asked for before, so no kept answer serves it).
Then the config file is rewritten 50 times in 10 s, ``check.interval`` going through 300 ms to
1.2 s, ``copy.interval`` left alone. The registry's own request log is the evidence:

* after the last edit, check reads come no faster than one per the last interval, the first a
  full interval after the last edit (P12: each changed interval restarts the check series);
* copy reads keep the copy series' times throughout: every gap between two of them is a whole
  number of 700 ms intervals.

**Graceful shutdown**: SIGTERM answers a request held for its window at once with ``503
UNAVAILABLE`` (not after a grace period), and the process exits 0.
"""

from __future__ import annotations

import itertools
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import REGISTRY, StartProxy
from tests.e2e.peers import DistributionRegistry, Kuikproxy, http

pytestmark = pytest.mark.e2e

CHECK, COPY = 0.4, 0.7
EDITS, STORM = 50, 10.0
TOLERANCE = 0.06  # the registry's clock stamps a request a little after kuikproxy's window


def rewrite(proxy: Kuikproxy, check: float) -> None:
    """The config file, rewritten whole with a new ``check.interval`` (what an operator's
    editor or a ConfigMap update does); everything else as it was."""
    settings = json.loads(json.dumps(proxy.settings))
    settings["registries"][REGISTRY]["check"]["interval"] = f"{round(check * 1000)}ms"
    text = yaml.safe_dump({"listen": proxy.host_port, **settings})
    path = proxy.workdir / "kuikproxy.yaml"
    fresh = path.with_suffix(".tmp")
    fresh.write_text(text)
    fresh.replace(path)


class Load:
    """Threads that keep a check and a copy due at every window of ``proxy``'s host."""

    def __init__(self, proxy: Kuikproxy, repository: str) -> None:
        self.proxy, self.repository = proxy, repository
        self.stop = threading.Event()
        self._tags = itertools.count()
        self.threads = [
            threading.Thread(target=self._loop, args=(method,), daemon=True)
            for method in ("HEAD", "HEAD", "GET", "GET")
        ]

    def _loop(self, method: str) -> None:
        while not self.stop.is_set():
            url = (
                f"{self.proxy.url}/v2/{self.repository}/manifests/t{next(self._tags)}?ns={REGISTRY}"
            )
            http(url, method, headers={"Kuik-Resource": f"load-{method}"}, timeout=30)

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()


def test_an_edit_storm_never_bursts_the_registry_and_leaves_the_copy_series_alone(
    registry: DistributionRegistry, start_proxy: StartProxy
) -> None:
    repository = f"storm/app{time.time_ns()}"
    block: dict[str, Any] = {"check": {"interval": "400ms"}, "copy": {"interval": "700ms"}}
    with start_proxy(registry.url, **block) as proxy, Load(proxy, repository):
        time.sleep(2.0)  # a few windows of each series before the storm
        intervals = [0.3 + 0.9 * (i % 7) / 6 for i in range(1, EDITS + 1)]  # ends at 0.45
        for check in intervals:
            time.sleep(STORM / EDITS)
            rewrite(proxy, check)
        last_edit, last = time.time(), intervals[-1]
        time.sleep(2.0)
        status = proxy.status()
        log = proxy.log()
    rows = [r for r in registry.requests() if r.repository == repository]
    checks = sorted(r.started for r in rows if r.method == "HEAD")
    copies = sorted(r.started for r in rows if r.method == "GET")
    assert status["config"]["generation"] > 1 and status["config"]["lastError"] is None, log
    assert status["registries"][REGISTRY]["check"]["interval"] == f"{round(last * 1000)}ms"

    after = [t for t in checks if t > last_edit]
    assert after, "no check read after the storm"
    assert after[0] >= last_edit + last - TOLERANCE, (after[0] - last_edit, last)
    gaps = [b - a for a, b in itertools.pairwise(after)]
    assert all(gap >= last - TOLERANCE for gap in gaps), gaps
    assert len(after) <= (time.time() - last_edit) / last + 1

    assert len(copies) >= 10, copies
    for a, b in itertools.pairwise(copies):
        windows = (b - a) / COPY
        assert abs(windows - round(windows)) * COPY <= TOLERANCE, (a, b, windows)


def test_sigterm_answers_held_requests_at_once_and_exits_cleanly(
    registry: DistributionRegistry, start_proxy: StartProxy, tmp_path: Path
) -> None:
    with start_proxy(registry.url, check={"interval": "1m"}) as proxy:
        answer: list[tuple[int, Any, bytes]] = []
        url = f"{proxy.url}/v2/held/app/manifests/v1?ns={REGISTRY}"
        client = threading.Thread(target=lambda: answer.append(http(url, "HEAD")), daemon=True)
        client.start()
        deadline = time.monotonic() + 5
        while not proxy.status()["registries"][REGISTRY]["check"]["waiting"]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        process = proxy._process
        assert process is not None
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        client.join(timeout=5)
        assert answer and answer[0][0] == 503
        assert process.wait(timeout=10) == 0
        assert time.monotonic() - sent < 5
