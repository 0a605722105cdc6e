"""Restarts of a real ``kuikproxy serve`` process with ``state.path`` (P13). The registry's own
request log (or nginx's, for the 429) is the evidence.

**Crash** (acceptance 1). Two resources track eight images each on ``registry.test:5000``, with
a check window every 200 ms; each image has a client that asks again as soon as it is answered,
and retries while kuikproxy is down. In the middle of a lap — between two windows, so no read
is on the wire — the process is killed with SIGKILL, and started again on the same file:

* each ring resumes after its cursor: the first image the registry is asked for, per resource,
  is the one after the last it was asked for before the kill;
* the lap in progress keeps its ``cycleStarted``, and when it wraps its ``cycleDuration`` is
  the time from that start, the downtime included;
* no image of that lap is read twice: the registry saw each image of the ring exactly once,
  in order, between the lap's start and its end;
* nothing reaches the registry during the first interval after the restart (P1).

**Block** (acceptance 2). nginx answers one repository ``429`` with ``Retry-After: 120``; the
block kuikproxy puts on the host is still there after a SIGKILL and a restart, to the
millisecond, and nothing reaches nginx after the restart.
"""

from __future__ import annotations

import datetime as dt
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest

from kuikproxy.durations import parse_duration
from tests.e2e.conftest import REGISTRY, StartProxy
from tests.e2e.peers import (
    DistributionRegistry,
    Kuikproxy,
    LoggedRequest,
    Nginx,
    clean_env,
    free_port,
    http,
)

pytestmark = pytest.mark.e2e

INTERVAL = 0.2
IMAGES = 8
TOLERANCE = 0.05  # the registry stamps a request a little after kuikproxy's window


def wall(rfc3339: str) -> float:
    return dt.datetime.fromisoformat(rfc3339).timestamp()


class Clients:
    """One client per (resource, tag): a HEAD through kuikproxy, again as soon as it is
    answered; on a connection error (kuikproxy down) again 50 ms later. The proxy's address is
    read at each request: a restarted proxy listens on a new port."""

    def __init__(self, proxy: Kuikproxy, repository: str, tags: dict[str, list[str]]) -> None:
        self.proxy, self.repository = proxy, repository
        self.stop = threading.Event()
        self.threads = [
            threading.Thread(target=self._loop, args=(resource, tag), daemon=True)
            for resource, resource_tags in tags.items()
            for tag in resource_tags
        ]

    def _loop(self, resource: str, tag: str) -> None:
        while not self.stop.is_set():
            url = f"{self.proxy.url}/v2/{self.repository}/manifests/{tag}?ns={REGISTRY}"
            try:
                http(url, "HEAD", headers={"Kuik-Resource": resource}, timeout=30)
            except Exception:  # down, or killed mid-request
                self.stop.wait(0.05)

    def __enter__(self) -> Clients:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()


def rings(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: resource["checks"]["registries"][0]
        for name, resource in status["resources"].items()
        if resource["checks"]["registries"]
    }


def kill(proxy: Kuikproxy) -> float:
    """SIGKILL, and when it happened."""
    process = proxy._process
    assert process is not None
    process.send_signal(signal.SIGKILL)
    killed = time.time()
    process.wait(10)
    proxy._process = None
    return killed


def between_windows(proxy: Kuikproxy) -> None:
    """Sleep until half-way between two check windows: no read is on the wire then."""
    next_window = wall(proxy.status()["registries"][REGISTRY]["check"]["nextWindow"])
    delay = next_window - INTERVAL / 2 - time.time()
    time.sleep(delay if delay > 0 else delay + INTERVAL)


def wait_for(condition: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return found


def test_a_process_killed_mid_lap_resumes_every_ring_after_its_cursor(
    registry: DistributionRegistry, start_proxy: StartProxy, tmp_path: Path
) -> None:
    repository = f"crash/app{time.time_ns()}"
    tags = {r: [f"{r.lower()}{i}" for i in range(IMAGES)] for r in ("A", "B")}
    top = {"state": {"path": str(tmp_path / "state.db")}}
    with start_proxy(registry.url, top=top) as proxy, Clients(proxy, repository, tags):
        # a first lap of each ring, then a few windows into the second
        wait_for(
            lambda: all(r["cycleDuration"] for r in rings(proxy.status()).values()),
            timeout=10,
            what="a first lap",
        )
        time.sleep(5 * INTERVAL)
        between_windows(proxy)
        before = rings(proxy.status())
        killed = kill(proxy)
        time.sleep(1.0)  # down
        proxy.start()
        after_restart = rings(proxy.status())
        origin = wall(proxy.status()["registries"][REGISTRY]["check"]["origin"])
        wrapped = wait_for(
            lambda: (
                (now := rings(proxy.status()))
                and all(now[r]["cycleStarted"] != before[r]["cycleStarted"] for r in tags)
                and now
            ),
            timeout=15,
            what="the interrupted laps to end",
        )
        log = proxy.log()
    rows = [
        r
        for r in registry.wait_for_requests(0)
        if r.repository == repository and r.method == "HEAD"
    ]

    def reads(resource: str, start: float, end: float) -> list[LoggedRequest]:
        return sorted(
            (
                r
                for r in rows
                if r.reference.startswith(resource.lower())
                and start - TOLERANCE <= r.started < end - TOLERANCE
            ),
            key=lambda r: r.started,
        )

    # nothing between the kill and the first window of the new process (P1)
    assert not [r for r in rows if killed < r.started < origin + INTERVAL - TOLERANCE], log
    first_after = min(r.started for r in rows if r.started > killed)
    assert abs(first_after - (origin + INTERVAL)) < TOLERANCE, (first_after, origin)
    for resource, ring_tags in tags.items():
        lap_start = wall(before[resource]["cycleStarted"])
        assert after_restart[resource]["cycleStarted"] == before[resource]["cycleStarted"], log
        assert after_restart[resource]["cursor"] == before[resource]["cursor"]
        lap_end = wall(wrapped[resource]["cycleStarted"])
        # resumed after the cursor: the next image in ring order
        cursor = before[resource]["cursor"].rpartition(":")[2]
        last_before = reads(resource, 0.0, killed)[-1].reference
        assert last_before == cursor
        first_after_restart = reads(resource, killed, float("inf"))[0].reference
        assert first_after_restart == ring_tags[(ring_tags.index(cursor) + 1) % IMAGES]
        # the interrupted lap read each image once, in order, and counted the downtime
        lap = reads(resource, lap_start, lap_end)
        assert [r.reference for r in lap] == ring_tags, log
        assert lap[0].started < killed < lap[-1].started
        duration = parse_duration(wrapped[resource]["cycleDuration"])
        assert duration == pytest.approx(lap_end - lap_start, abs=0.002)
        assert duration > 2 * IMAGES * INTERVAL + 1.0  # a lap of two rings, and the downtime


NGINX_SERVER = """        location ~ ^/v2/stop/ {{
            add_header Retry-After 120 always;
            return 429 '{{"errors":[{{"code":"TOOMANYREQUESTS","message":"stop"}}]}}';
        }}
        location / {{
            proxy_pass {upstream};
        }}"""


@contextmanager
def throttling_nginx(workdir: Path, registry: DistributionRegistry) -> Iterator[Nginx]:
    """nginx before the registry, answering ``/v2/stop/...`` 429 with ``Retry-After: 120``."""
    with Nginx(workdir, server=NGINX_SERVER.format(upstream=registry.url)) as nginx:
        yield nginx


def in_background(url: str) -> None:
    """A HEAD whose answer nobody waits for (held through a block, or cut by the kill)."""

    def ask() -> None:
        with suppress(Exception):
            http(url, "HEAD", timeout=5)

    threading.Thread(target=ask, daemon=True).start()


def upstream_reads(nginx: Nginx) -> list[str]:
    """nginx's access log, without the launcher's health checks."""
    return [line for line in nginx.access_lines() if " /v2/" in line]


def test_a_host_blocked_by_a_429_stays_blocked_across_a_restart(
    registry: DistributionRegistry, start_proxy: StartProxy, tmp_path: Path
) -> None:
    top = {"state": {"path": str(tmp_path / "state.db")}}
    with (
        throttling_nginx(tmp_path / "nginx", registry) as nginx,
        start_proxy(nginx.url, top=top) as proxy,
    ):
        in_background(f"{proxy.url}/v2/stop/app/manifests/v1?ns={REGISTRY}")
        blocked = wait_for(
            lambda: proxy.status()["registries"][REGISTRY]["blockedUntil"],
            timeout=5,
            what="the 429's block",
        )
        assert 119 < wall(blocked) - time.time() <= 120
        time.sleep(0.2)  # the block is written at once; give the write its few milliseconds
        seen = upstream_reads(nginx)
        assert len(seen) == 1 and " 429 " in seen[0], seen
        kill(proxy)
        proxy.start()
        status = proxy.status()["registries"][REGISTRY]
        assert status["blockedUntil"] == blocked
        # requests keep waiting through the block: their windows are lost, nothing is sent
        for tag in ("v1", "v2"):
            in_background(f"{proxy.url}/v2/go/app/manifests/{tag}?ns={REGISTRY}")
        time.sleep(6 * INTERVAL)
        windows = proxy.status()["registries"][REGISTRY]["check"]["windows"]
        assert windows["blocked"] >= 4 and windows["used"] == 0, windows
        assert upstream_reads(nginx) == seen


def test_serve_refuses_an_unusable_state_file_with_one_clear_line(tmp_path: Path) -> None:
    """A state file that is not a database: ``serve`` exits 1 with the reason and what to do,
    not a traceback, and leaves the file as it was."""
    state = tmp_path / "state.db"
    state.write_bytes(b"not SQLite " * 400)
    config = tmp_path / "kuikproxy.yaml"
    config.write_text(f"listen: 127.0.0.1:{free_port()}\nstate: {{path: {state}}}\n")
    done = subprocess.run(
        [sys.executable, "-m", "kuikproxy", "serve", "--config", str(config)],
        capture_output=True,
        env=clean_env(),
        timeout=30,
        check=False,
    )
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"state file {state}: not a database, or corrupt (file is not a database); "
        "move it away to start with no saved pacing state"
    )
    assert state.read_bytes() == b"not SQLite " * 400
