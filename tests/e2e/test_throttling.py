"""A registry that says stop, for real (SPEC §11, P3 (c)): nginx's ``limit_req`` in front of the
distribution registry, kuikproxy reading manifests through it.

nginx rations manifest reads in fixed five-second windows of the wall clock: ``limit_req`` keys
its zone on the window (``$quota_window``, from ``$msec``), with a rate so low that nothing
comes back within one window and ``burst=2 nodelay``, so each window lets ``QUOTA`` = 3 reads
through and refuses the rest with ``429`` until the next window starts. nginx cannot count down
by itself, so the 429 is made by ``error_page 429 = @throttled``, whose ``Retry-After`` is a
``map`` of ``$msec``: the whole seconds until the next multiple of five (5 in the window's first
second, then 4, 3, 2, 1). ``t + Retry-After`` thus always lands in the next window's first
second: a client that waits as it is told is let through.

kuikproxy knows the registry by two names, both sent to that nginx: ``registry.test:5000``
(``check.maxHold`` unset: its clients wait as long as it takes) and ``hurry.test:5000``
(``maxHold: 300ms``). maxHold is a host's setting, and blocks are a host's (kuikproxy's blocks
are host-wide, per its names, not per upstream), so each name is blocked by the 429s of its own
reads. The scenario, started at the beginning of a five-second window:

1. ``WILLING`` clients HEAD one image each (``willing/app-<i>``, resource ``willing-<i>``) on
   ``registry.test``: three windows read three images, the fourth read is refused (429,
   ``Retry-After`` R); kuikproxy blocks the host and relays the registry's 429 to the client
   whose read it was, which asks again at once and is held through the block like the others.
2. During the block, clients HEAD ``hurry/app`` on ``hurry.test``, one after another, each with
   a resource of its own: the first one's read is refused by nginx too (the window's reads are
   spent), which blocks ``hurry.test``; the next ones are held 300 ms and refused by kuikproxy
   itself, with a ``Retry-After`` that counts down to that block's end.
3. After the block the willing clients' images are read in nginx's next window: all 200.

``/status`` is read throughout. The fixture runs the scenario once (about 10 s, up to five of
them waiting for a five-second window to begin), stops every peer, and hands the record to the
tests; nginx's access log (``$msec $request_time $status $sent_http_retry_after ...
$request``) and the registry's own log are the evidence.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime as dt
import itertools
import math
import re
import shutil
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.e2e.peers import (
    OCI_INDEX,
    DistributionRegistry,
    Kuikproxy,
    LoggedRequest,
    Nginx,
    RegistryClient,
    build_image,
    http,
    push_image,
    registry_block,
)

pytestmark = pytest.mark.e2e

REGISTRY = "registry.test:5000"
"""Where clients wait as long as it takes (no ``check.maxHold``)."""
HURRY = "hurry.test:5000"
"""The same registry for clients that wait ``MAX_HOLD`` at most."""
WILLING = 5
PERIOD = 5  # seconds: nginx's quota window, and what its Retry-After counts down to
QUOTA = 3  # reads nginx lets through per window
INTERVAL = 0.2  # kuikproxy's check windows
MAX_HOLD = 0.3  # hurry.test's check.maxHold
START_PHASE = 0.02  # clients start this far into a PERIOD window (wall clock)
STOP_BEFORE_END = 0.8  # no hurried client is sent this close to its host's block end
TOLERANCE = 0.005  # seconds: nginx's cached clock, log resolution (ms)
THROTTLED_BY = "X-Throttled-By"  # set on nginx's own 429s, so a relayed one is recognised

NGINX_HTTP = r"""    map $msec $quota_window {
        "~^(?<window_head>\d+)[0-4]\." "${window_head}a";
        "~^(?<window_head>\d+)[5-9]\." "${window_head}b";
    }
    map $msec $retry_after {
        "~[05]\." 5;
        "~[16]\." 4;
        "~[27]\." 3;
        "~[38]\." 2;
        "~[49]\." 1;
    }
    limit_req_zone $quota_window zone=manifests:1m rate=1r/m;
    log_format timeline '$msec $request_time $status "$sent_http_retry_after" '
                        '$quota_window "$request"';"""


def nginx_server(registry: DistributionRegistry) -> str:
    """Manifests rationed as the module says, everything else straight to the registry."""
    return f"""        location ~ ^/v2/.+/manifests/ {{
            limit_req zone=manifests burst={QUOTA - 1} nodelay;
            limit_req_status 429;
            limit_req_log_level warn;
            error_page 429 = @throttled;
            proxy_pass {registry.url};
        }}
        location @throttled {{
            add_header Retry-After $retry_after always;
            add_header {THROTTLED_BY} nginx always;
            return 429 '{{"errors":[{{"code":"TOOMANYREQUESTS","message":"limit_req"}}]}}';
        }}
        location / {{
            proxy_pass {registry.url};
        }}"""


# --- what happened ----------------------------------------------------------------------------


@dataclass(frozen=True)
class NginxRow:
    """One line of nginx's access log."""

    started: float
    finished: float
    status: int
    retry_after: int | None
    window: str
    method: str
    path: str

    @property
    def host(self) -> str:
        """The kuikproxy host the read was for (each name reads its own repositories)."""
        return HURRY if self.path.startswith("/v2/hurry/") else REGISTRY

    @property
    def manifest(self) -> bool:
        return "/manifests/" in self.path

    @property
    def block_end(self) -> float:
        """``t + Retry-After`` of a 429: the earliest kuikproxy may ask again."""
        assert self.retry_after is not None
        return self.finished + self.retry_after


_ACCESS = re.compile(r'^(\S+) (\S+) (\d+) "([^"]*)" (\S+) "(\S+) (\S+) [^"]*"$')


def parse_access_log(lines: list[str]) -> list[NginxRow]:
    rows = []
    for line in lines:
        found = _ACCESS.match(line)
        assert found, f"unexpected access log line {line!r}"
        msec, took, status, after, window, method, uri = found.groups()
        rows.append(
            NginxRow(
                started=float(msec) - float(took),
                finished=float(msec),
                status=int(status),
                retry_after=int(after) if after.isdigit() else None,
                window=window,
                method=method,
                path=uri.partition("?")[0],
            )
        )
    return rows


@dataclass(frozen=True)
class Asked:
    """One client request to kuikproxy and its answer."""

    host: str
    repository: str
    resource: str
    sent: float
    received: float
    status: int
    retry_after: int | None
    by_registry: bool  # a 429 of nginx's, relayed (it carries THROTTLED_BY)

    @property
    def own_429(self) -> bool:
        """kuikproxy's own refusal (P7's maxHold, §11), not the registry's."""
        return self.status == 429 and not self.by_registry


@dataclass
class Timeline:
    t0: float  # when the willing clients were sent (wall clock)
    nginx: list[NginxRow]
    registry: list[LoggedRequest]
    willing: list[list[Asked]]  # per client: its request, and its retry if it made one
    hurried: list[Asked]
    snapshots: list[tuple[float, dict[str, Any]]]  # (when asked, /status) during the scenario
    final: dict[str, Any] = field(default_factory=dict)  # /status once everyone was answered

    def manifests(self, host: str) -> list[NginxRow]:
        return sorted((r for r in self.nginx if r.manifest and r.host == host), key=_started)

    def refusals(self, host: str) -> list[NginxRow]:
        return [r for r in self.manifests(host) if r.status == 429]

    def at(self, t: float) -> str:
        return f"{t - self.t0:+7.3f}s"

    def describe(self) -> str:
        """The whole scenario as lines, times relative to the willing clients' start."""
        lines = [f"t0 = {self.t0:.3f} (phase {self.t0 % PERIOD:.3f} s in nginx's window)"]
        lines += ["nginx:"] + [
            f"  {self.at(r.started)} {r.method} {r.path} -> {r.status}"
            + (
                f" Retry-After {r.retry_after} (until {self.at(r.block_end)})"
                if r.retry_after
                else ""
            )
            for r in sorted(self.nginx, key=_started)
            if r.manifest
        ]
        asked = [a for tries in self.willing for a in tries] + self.hurried
        lines += ["clients:"] + [
            f"  {self.at(a.sent)}..{self.at(a.received)} {a.resource} {a.host} -> {a.status}"
            + (f" Retry-After {a.retry_after}" if a.retry_after is not None else "")
            + (" (the registry's, relayed)" if a.by_registry else "")
            for a in sorted(asked, key=lambda a: a.sent)
        ]
        lines += ["/status blockedUntil:"] + [
            f"  {self.at(t)} {host}: {doc['registries'][host]['blockedUntil']}"
            for t, doc in self.snapshots
            for host in (REGISTRY, HURRY)
            if doc["registries"][host]["blockedUntil"]
        ]
        return "\n".join(lines)


def _started(row: NginxRow) -> float:
    return row.started


def wall(rfc3339: str) -> float:
    return dt.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()


# --- the scenario -----------------------------------------------------------------------------


def head(proxy: Kuikproxy, host: str, repository: str, resource: str) -> Asked:
    url = f"{proxy.url}/v2/{repository}/manifests/v1?ns={host}"
    sent = time.time()
    status, headers, _ = http(
        url, "HEAD", headers={"Kuik-Resource": resource, "Accept": OCI_INDEX}, timeout=30
    )
    after = headers.get("Retry-After")
    return Asked(
        host=host,
        repository=repository,
        resource=resource,
        sent=sent,
        received=time.time(),
        status=status,
        retry_after=int(after) if after is not None else None,
        by_registry=headers.get(THROTTLED_BY) == "nginx",
    )


def willing_client(proxy: Kuikproxy, i: int) -> list[Asked]:
    """A client that waits as long as it takes; told 429 by the registry, it asks again at once
    (kuikproxy holds the retry through the block)."""
    tries = [head(proxy, REGISTRY, f"willing/app-{i}", f"willing-{i}")]
    if tries[0].status == 429 and tries[0].by_registry:
        tries.append(head(proxy, REGISTRY, f"willing/app-{i}", f"willing-{i}"))
    return tries


def blocked_until(doc: dict[str, Any], host: str) -> float | None:
    until = doc["registries"][host]["blockedUntil"]
    return None if until is None else wall(until)


def run_scenario(proxy: Kuikproxy, pool: concurrent.futures.Executor) -> Timeline:
    # start at the beginning of one of nginx's windows: its QUOTA reads, then the 429, all
    # within the window's first second (Retry-After 5)
    time.sleep((START_PHASE - time.time()) % PERIOD)
    t0 = time.time()
    willing = [pool.submit(willing_client, proxy, i) for i in range(WILLING)]
    timeline = Timeline(t0, [], [], [], [], [])

    def status() -> dict[str, Any]:
        asked = time.time()
        doc = proxy.status()
        timeline.snapshots.append((asked, doc))
        return doc

    deadline = time.monotonic() + 3
    while blocked_until(status(), REGISTRY) is None:
        assert time.monotonic() < deadline, f"{REGISTRY} was never blocked"
        time.sleep(0.05)
    deadline = time.monotonic() + 8
    for j in itertools.count():
        until = blocked_until(status(), HURRY)
        if until is not None and until - time.time() < STOP_BEFORE_END:
            break
        assert time.monotonic() < deadline, f"{HURRY} was never blocked long enough"
        timeline.hurried.append(head(proxy, HURRY, "hurry/app", f"hurry-{j}"))
        time.sleep(0.1)
    for future in willing:
        timeline.willing.append(future.result(timeout=20))
    timeline.final = status()
    return timeline


def proxy_config(nginx: Nginx) -> dict[str, Any]:
    return {
        "defaultRegistry": REGISTRY,
        "allowedHosts": [],
        "registries": {
            REGISTRY: registry_block(nginx.url),
            HURRY: registry_block(nginx.url, check={"maxHold": f"{MAX_HOLD * 1000:.0f}ms"}),
        },
    }


@pytest.fixture(scope="module")
def timeline(tmp_path_factory: pytest.TempPathFactory) -> Timeline:
    """The scenario of the module docstring, run once; every peer stopped before the tests."""
    for binary in (DistributionRegistry.binary, Nginx.binary):
        if shutil.which(binary) is None:
            pytest.skip(f"{binary} is not installed (apt-get install docker-registry nginx-light)")
    root = tmp_path_factory.mktemp("throttling")
    # the pool is left last: the peers stop first, which ends any request still held
    with concurrent.futures.ThreadPoolExecutor(WILLING) as pool, contextlib.ExitStack() as peers:
        registry = peers.enter_context(DistributionRegistry(root / "registry"))
        client = RegistryClient(registry.url)
        for i in range(WILLING):
            push_image(client, build_image(f"willing/app-{i}", "v1"))
        push_image(client, build_image("hurry/app", "v1"))
        nginx = Nginx(
            root / "nginx", http=NGINX_HTTP, server=nginx_server(registry), access_log="timeline"
        )
        peers.enter_context(nginx)
        proxy = peers.enter_context(Kuikproxy(root / "kuikproxy", proxy_config(nginx)))
        since = time.time()
        result = run_scenario(proxy, pool)
        time.sleep(0.1)  # the registry's log trails its answers
        result.nginx = parse_access_log(nginx.access_lines())
        result.registry = [r for r in registry.requests(since) if r.kind == "manifests"]
    (root / "timeline.txt").write_text(result.describe() + "\n")
    print(result.describe())
    return result


# --- the tests --------------------------------------------------------------------------------


def the_block(timeline: Timeline, host: str) -> NginxRow:
    """The one 429 nginx gave ``host``'s reads (the scenario trips each host once)."""
    refusals = timeline.refusals(host)
    assert len(refusals) == 1, f"{host}: {len(refusals)} refusals\n{timeline.describe()}"
    assert refusals[0].retry_after is not None, timeline.describe()
    return refusals[0]


@pytest.mark.parametrize("host", [REGISTRY, HURRY])
def test_nothing_reaches_the_registry_until_its_retry_after_has_passed(
    timeline: Timeline, host: str
) -> None:
    """After nginx answered a read of ``host`` 429 with ``Retry-After`` R at t, kuikproxy sent
    nginx nothing for that host before t + R (nginx's log, to the millisecond it keeps), and the
    registry behind it saw no manifest read of that host's repositories meanwhile (its own log).
    Each name is a host of its own to kuikproxy, blocked by its own reads' 429s."""
    block = the_block(timeline, host)
    later = [r for r in timeline.manifests(host) if r.started > block.started]
    early = [r for r in later if r.started < block.block_end - TOLERANCE]
    assert not early, timeline.describe()
    assert block.status == 429 and all(r.status == 200 for r in later), timeline.describe()
    prefix = "/v2/hurry/" if host == HURRY else "/v2/willing/"
    behind = [
        r
        for r in timeline.registry
        if r.path.startswith(prefix) and block.finished < r.started < block.block_end - TOLERANCE
    ]
    assert not behind, (behind, timeline.describe())
    passed = [r for r in timeline.manifests(host) if r.status == 200]
    read = [r for r in timeline.registry if r.path.startswith(prefix)]
    assert len(read) == len(passed), "the registry saw exactly the reads nginx let through"


def test_reads_resume_at_the_first_window_after_the_block(timeline: Timeline) -> None:
    """The block over, kuikproxy reads again at its first window (INTERVAL apart): the images
    still owed (the refused one included) are read in nginx's next quota window, all 200."""
    block = the_block(timeline, REGISTRY)
    after = [r for r in timeline.manifests(REGISTRY) if r.started > block.started]
    assert len(after) == WILLING - QUOTA, timeline.describe()
    assert block.block_end - TOLERANCE <= after[0].started, timeline.describe()
    assert after[0].started <= block.block_end + INTERVAL + 0.1, timeline.describe()
    assert all(r.status == 200 and r.window != block.window for r in after), timeline.describe()
    refused = next(r for r in timeline.manifests(REGISTRY) if r.status == 429)
    assert refused.path in {r.path for r in after}, "the refused image is read again"


def test_every_client_willing_to_wait_is_answered_200(timeline: Timeline) -> None:
    """No request of a client that waits is lost: each willing client ends with a 200. Those
    whose image was not read before the block waited through it (answered after its end, never
    refused by kuikproxy) — the one whose read nginx refused included."""
    block = the_block(timeline, REGISTRY)
    assert len(timeline.willing) == WILLING
    for tries in timeline.willing:
        assert tries[-1].status == 200, timeline.describe()
        assert not any(a.own_429 for a in tries), timeline.describe()
    waited = [tries[-1] for tries in timeline.willing if tries[-1].received > block.finished]
    assert len(waited) == WILLING - QUOTA, timeline.describe()
    assert all(a.received >= block.block_end - TOLERANCE for a in waited), timeline.describe()


def test_no_client_willing_to_wait_sees_the_registrys_429(timeline: Timeline) -> None:
    """SPEC §11's stronger reading: a block is a run of lost windows, nothing more, and paced
    requests are served after it — the request whose read the registry refused included, so a
    client that waits never sees a 429 at all."""
    assert all(tries[0].status == 200 for tries in timeline.willing), timeline.describe()


def test_kuikproxys_own_429s_count_down_to_the_blocks_end(timeline: Timeline) -> None:
    """Clients of ``hurry.test`` (``check.maxHold`` 300 ms) asking during its block are refused
    by kuikproxy with a ``Retry-After`` that counts down: never increasing from one to the next,
    at least ceil(T − now) for the block's end T, and no more than the block's rest (it is the
    block, not a guess, that they are told)."""
    block = the_block(timeline, HURRY)
    own = timeline.hurried  # the first too: its read was refused, the block outlasts its maxHold
    assert len(own) >= 5 and all(a.own_429 for a in own), timeline.describe()
    afters = [a.retry_after for a in own if a.retry_after is not None]
    assert len(afters) == len(own), timeline.describe()
    assert afters == sorted(afters, reverse=True), timeline.describe()
    assert len(set(afters)) >= 3, timeline.describe()
    for a in own:
        assert a.retry_after is not None
        assert a.retry_after >= math.ceil(block.block_end - a.received), timeline.describe()
        assert a.retry_after <= math.ceil(block.block_end + TOLERANCE - a.sent), timeline.describe()


def test_a_request_the_block_outlasts_is_refused_at_once(timeline: Timeline) -> None:
    """SPEC §11: a request that cannot be served within its ``check.maxHold`` (the block ends
    later than that) is refused at once rather than held in vain."""
    _, *own = timeline.hurried  # the first waited for the read that started the block
    held = sorted(round(a.received - a.sent, 3) for a in own)
    # Held in vain would mean held MAX_HOLD at least; the typical refusal takes a millisecond.
    # One answer may be late by a stall of the test process or the machine (seen once in CI:
    # 137 ms among 1 ms answers), which is why the bound on the slowest is maxHold itself.
    assert held[len(held) // 2] < MAX_HOLD / 10, held
    assert held[-1] < MAX_HOLD, held


def test_status_shows_the_block_and_counts_its_windows_blocked(timeline: Timeline) -> None:
    """``/status`` during a block shows ``blockedUntil`` (the host's and its ``quota``'s) at the
    end nginx's 429 set, and nothing once it is over; every window of both series within the
    block, one per INTERVAL, is counted ``blocked``."""
    for host in (REGISTRY, HURRY):
        block = the_block(timeline, host)
        during = [
            doc["registries"][host]
            for t, doc in timeline.snapshots
            if block.finished < t < block.block_end - 0.5
        ]
        assert during, timeline.describe()
        for entry in during:
            assert entry["blockedUntil"] is not None, entry
            assert abs(wall(entry["blockedUntil"]) - block.block_end) < 0.05, entry
            assert entry["quota"]["blockedUntil"] == entry["blockedUntil"], entry
        final = timeline.final["registries"][host]
        assert final["blockedUntil"] is None, final
        assert block.retry_after is not None
        expected = block.retry_after / INTERVAL
        for series in ("check", "copy"):
            blocked = final[series]["windows"]["blocked"]
            assert expected - 1 <= blocked <= expected + 1, (host, series, final)
