"""Several proxies pacing one registry as a fleet, in one process on virtual time.

Each proxy is a whole application before the same recording registry; they share a fleet
through :class:`~kuikproxy.fleet.memory.MemoryFleet` (the seam's reference implementation: the
Redis one is tested against a real server in ``tests/fleet``). The registry's own record is the
evidence: what reached it, and when.
"""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from kuikproxy.core.fleetturns import Claim
from kuikproxy.fleet.memory import FleetState, MemoryFleet
from kuikproxy.web.keys import PACER
from tests.conftest import HOST, head
from tests.upstream_app import MANIFEST_TYPE, Registry, digest_of, manifest_of

pytestmark = pytest.mark.looptime

ROOT = Path(__file__).resolve().parents[2]
INTERVAL = 0.2
JITTER = 0.01  # the registry stamps a read when it arrives: a few virtual ms after its window
Client = TestClient[Any, Any]
Start = Callable[..., Awaitable[list[Client]]]


@pytest.fixture
def fleet(
    registry: tuple[Registry, TestServer],
    aiohttp_client: Callable[..., Awaitable[Client]],
    monkeypatch: pytest.MonkeyPatch,
) -> Start:
    """``fleet(n)``: n proxies of one fleet; ``fleet(n, state)`` on a given shared state,
    ``fleet(n, state, host)`` with more YAML for the host's block, ``kind`` the store's
    handles (a :class:`MemoryFleet` that misbehaves), ``cut_off`` ``fleet.whenCutOff``,
    ``skews`` how far ahead each proxy's clock is (seconds) as it starts, ``top`` more YAML at
    the config's top level.

    The wall clock is made to run with the loop's virtual one, as it does with a real loop:
    each proxy converts the fleet's wall times with its own offset, and real milliseconds
    spent starting the next proxy would otherwise shift its grid from the first one's."""
    _, server = registry

    async def start(
        count: int,
        state: FleetState | None = None,
        host: str = "",
        *,
        kind: type = MemoryFleet,
        cut_off: str = "wait",
        skews: tuple[float, ...] = (),
        top: str = "",
    ) -> list[Client]:
        loop = asyncio.get_running_loop()
        state = state or FleetState(clock=loop.time)
        clients = []
        for n in range(count):
            skew = skews[n] if n < len(skews) else 0.0  # this proxy's clock, that far ahead
            monkeypatch.setattr(time, "time", lambda skew=skew: 1.8e9 + loop.time() + skew)
            config = parse_config(
                f"fleet: {{redis: {{url: 'redis://127.0.0.1:1'}}, name: p{n}, "
                f"whenCutOff: {cut_off}}}\n{top}\n"
                f"registries:\n  {HOST}:\n    upstream: http://127.0.0.1:{server.port}\n"
                f"    check: {{interval: {INTERVAL * 1000:g}ms}}\n{host}"
            )
            app = build_app(config, fleet=kind(state, f"p{n}"))
            clients.append(await aiohttp_client(app, server_kwargs={"handler_cancellation": True}))
        monkeypatch.setattr(time, "time", lambda: 1.8e9 + loop.time())
        await asyncio.sleep(0)  # each proxy's series take the fleet's grid
        return clients

    return start


def asking(clients: Iterable[Client], count: int, prefix: str = "") -> list[asyncio.Future[Any]]:
    """Each client's resource (``r<n>``) asking for ``count`` images of its own, at once."""
    return [
        asyncio.ensure_future(head(client, f"{prefix}{n}-{i:02}", f"r{n}"))
        for n, client in enumerate(clients)
        for i in range(count)
    ]


def gaps(times: list[float]) -> list[float]:
    return [round(b - a, 3) for a, b in itertools.pairwise(sorted(times))]


async def test_three_proxies_read_at_most_one_image_per_interval_in_all(
    fleet: Start, registry: tuple[Registry, TestServer]
) -> None:
    """Three proxies, each with a resource of its own asking for 20 images of one host: every
    request is answered, and the registry sees at most one read per window of the fleet's
    series, never two in one; windows are lost only as a proxy runs out of work (its turns
    stay its own for two intervals)."""
    fake, _ = registry
    proxies = await fleet(3)
    requests = [
        head(client, f"p{n}-{i:02}", f"r{n}") for n, client in enumerate(proxies) for i in range(20)
    ]
    responses = await asyncio.gather(*requests)
    assert {r.status for r in responses} == {200}
    times = [s.at for s in fake.reads()]
    assert len(times) == 60
    assert min(gaps(times)) >= INTERVAL - JITTER
    assert max(times) - min(times) <= (59 + 2 * 2) * INTERVAL + JITTER


async def test_two_proxies_with_work_always_due_take_turns(
    fleet: Start, registry: tuple[Registry, TestServer]
) -> None:
    """Over 50 windows, each of two always-busy proxies gets between 40 % and 60 % of them;
    the windows it does not get count ``fleet`` in its /status."""
    fake, _ = registry
    first, second = await fleet(2)
    loop = asyncio.get_running_loop()
    start = loop.time()
    requests = asking((first, second), 60)
    await asyncio.sleep(50 * INTERVAL + INTERVAL / 2)
    reads = [s for s in fake.reads() if s.at <= start + 50 * INTERVAL + 1e-6]
    assert len(reads) == 50
    share = sum(1 for s in reads if s.path.rsplit("/", 1)[1].startswith("0-")) / 50
    assert 0.4 <= share <= 0.6, share
    status = await (await first.get("/status")).json()
    assert status["registries"][HOST]["check"]["windows"]["fleet"] >= 20
    assert status["fleet"]["connected"] and status["fleet"]["size"] == 2
    for request in requests:
        request.cancel()
    await asyncio.gather(*requests, return_exceptions=True)


async def test_a_block_seen_by_one_proxy_blocks_the_host_for_all(
    fleet: Start, registry: tuple[Registry, TestServer]
) -> None:
    """The registry answers one proxy's read 429 with ``Retry-After: 1``: until the block ends
    the other proxy sends nothing either, and its windows count ``blocked``."""
    fake, _ = registry
    fake.fail["/v2/app/manifests/stop"], fake.retry_after = 429, "1"
    first, second = await fleet(2)
    stopped = asyncio.ensure_future(head(first, "stop", "a"))
    await asyncio.sleep(2 * INTERVAL)
    (refused,) = fake.reads()
    loop = asyncio.get_running_loop()
    until = first.server.app[PACER].blocked_until(HOST, loop.time())
    assert until is not None
    waiting = asyncio.ensure_future(head(second, "go", "b"))
    await asyncio.sleep(0.5)
    assert fake.reads() == [refused]  # nothing from the second proxy while the host is blocked
    status = await (await second.get("/status")).json()
    assert status["registries"][HOST]["check"]["windows"]["blocked"] >= 1
    assert status["registries"][HOST]["blockedUntil"] is not None
    fake.fail.clear()
    assert (await waiting).status == 200
    assert (await stopped).status == 200
    assert fake.reads()[1].at >= until - JITTER  # nothing before the block's end


async def test_without_the_fleets_store_each_proxy_paces_alone_on_its_share(
    fleet: Start, registry: tuple[Registry, TestServer]
) -> None:
    """``whenCutOff: ownTurns``: the store goes down: each of two proxies uses one window in
    two (the fleet's size it knew), so the registry never sees more than one read per
    interval; /status says so; when the store is back they rejoin, and no request was lost."""
    fake, _ = registry
    state = FleetState(clock=asyncio.get_running_loop().time)
    first, second = await fleet(2, state, cut_off="ownTurns")
    requests = asking((first, second), 20)
    await asyncio.sleep(4 * INTERVAL + INTERVAL / 2)
    state.up = False
    before = len(fake.reads())
    await asyncio.sleep(10 * INTERVAL)
    alone = fake.reads()[before:]
    assert alone and min(gaps([s.at for s in alone])) >= INTERVAL - JITTER
    status = await (await first.get("/status")).json()
    assert status["fleet"]["connected"] is False and status["fleet"]["lastError"]
    metrics = await (await first.get("/metrics")).text()
    assert "kuik_proxy_fleet_connected 0.0" in metrics
    state.up = True
    responses = await asyncio.gather(*requests)
    assert {r.status for r in responses} == {200}
    assert len(fake.reads()) == 40
    assert min(gaps([s.at for s in fake.reads()])) >= INTERVAL - JITTER
    assert (await (await first.get("/status")).json())["fleet"]["connected"] is True
    assert first.server.app[PACER].held() == 0


async def test_without_the_fleets_store_the_proxies_wait_for_it(
    fleet: Start, registry: tuple[Registry, TestServer]
) -> None:
    """``whenCutOff: wait`` (the default): the store goes down and neither proxy reads while it
    is away — each window with something due counts ``away`` — and when it is back every
    request is answered, one read per interval."""
    fake, _ = registry
    state = FleetState(clock=asyncio.get_running_loop().time)
    first, second = await fleet(2, state)
    requests = asking((first, second), 20)
    await asyncio.sleep(4 * INTERVAL + INTERVAL / 2)
    state.up = False
    await asyncio.sleep(INTERVAL / 2)  # a claim sent just before may land meanwhile
    before = len(fake.reads())
    await asyncio.sleep(10 * INTERVAL)
    assert len(fake.reads()) == before
    status = await (await first.get("/status")).json()
    assert status["fleet"]["connected"] is False
    assert status["registries"][HOST]["check"]["windows"]["away"] >= 9
    assert status["fleet"]["windowsAway"] >= 9  # every host's
    metrics = await (await first.get("/metrics")).text()
    assert 'operation="Check",outcome="away",registry="' + HOST + '"} ' in metrics
    assert "kuik_proxy_fleet_windows_away_total " in metrics
    state.up = True
    responses = await asyncio.gather(*requests)
    assert {r.status for r in responses} == {200}
    assert len(fake.reads()) == 40
    assert min(gaps([s.at for s in fake.reads()])) >= INTERVAL - JITTER


async def test_cut_off_a_proxy_answers_the_tags_its_store_holds_stale_and_waits_for_the_rest(
    fleet: Start, registry: tuple[Registry, TestServer], tmp_path: Path
) -> None:
    """``serveStale`` while a proxy is cut off from the fleet's store (``whenCutOff: wait``):
    a node's pull of a tag the store holds is answered stale — held when the store went away,
    at the window it lost; arriving later, at once — and the registry is asked nothing; a kuik
    check (``serveStale: true``, not ``checks``) and a tag never read wait for the store."""
    fake, _ = registry
    state = FleetState(clock=asyncio.get_running_loop().time)
    store = f"cache: {{maxAge: 100ms, blobs: {{path: {str(tmp_path)!r}}}}}"
    copy = f"    copy: {{interval: {INTERVAL * 1000:g}ms, idle: 100ms}}\n    serveStale: true\n"
    [proxy] = await fleet(1, state, copy, top=store)
    url = f"/v2/app/manifests/v1?ns={HOST}"
    fresh = await proxy.get(url)
    assert fresh.status == 200 and "Warning" not in fresh.headers
    body = await fresh.read()
    await asyncio.sleep(3 * INTERVAL)  # the kept answer past maxAge (R1), the copy closed
    state.up = False
    reads = len(fake.reads())
    held = asyncio.ensure_future(proxy.head(url))  # a node's: parked for the next window
    kuik = asyncio.ensure_future(proxy.head(url, headers={"Kuik-Resource": "ImageMonitor/a"}))
    never = asyncio.ensure_future(proxy.head(f"/v2/app/manifests/v9?ns={HOST}"))
    await asyncio.sleep(1.5 * INTERVAL)
    assert held.done() and (await held).status == 200
    assert (await held).headers["Warning"].startswith("110")
    start = asyncio.get_running_loop().time()
    later = await proxy.get(url)
    assert asyncio.get_running_loop().time() - start < INTERVAL / 10  # not held
    assert later.status == 200 and later.headers["Warning"].startswith("110")
    assert await later.read() == body
    await asyncio.sleep(5 * INTERVAL)
    assert not kuik.done() and not never.done()
    assert len(fake.reads()) == reads
    status = await (await proxy.get("/status")).json()
    assert status["cache"]["store"]["stale"] == 2
    state.up = True
    assert [(await r).status for r in (kuik, never)] == [200, 200]
    assert "Warning" not in (await kuik).headers
    assert len(fake.reads()) == reads + 2


@pytest.mark.parametrize("cut_off", ["wait", "ownTurns"])
async def test_one_proxy_cut_off_while_the_others_reach_the_store(
    fleet: Start, registry: tuple[Registry, TestServer], cut_off: str
) -> None:
    """Three proxies with work due at every window; one of them loses the store for 20
    intervals while the other two still reach it. Waiting (the default), it reads nothing
    meanwhile, and the registry never sees two reads in one interval. On its own turns
    (``ownTurns``) its clients are served meanwhile, and once the others have taken its turns
    over (two intervals on) a window is read twice: the price of that choice, measured."""
    fake, _ = registry
    state = FleetState(clock=asyncio.get_running_loop().time)
    proxies = await fleet(3, state, cut_off=cut_off)
    requests = asking(proxies, 20, prefix="p")
    await asyncio.sleep(6 * INTERVAL + INTERVAL / 2)
    state.cut.add("p2")
    cut_at = asyncio.get_running_loop().time()
    await asyncio.sleep(20 * INTERVAL)
    state.cut.clear()
    responses = await asyncio.gather(*requests)
    assert {r.status for r in responses} == {200}
    times = [s.at for s in fake.reads()]
    during = [t for t in times if cut_at < t < cut_at + 20 * INTERVAL]
    if cut_off == "wait":
        assert min(gaps(times)) >= INTERVAL - JITTER
    else:
        assert min(gaps(during)) < INTERVAL / 2  # two proxies in one window


async def test_a_store_back_empty_while_a_proxy_still_paces_alone_never_doubles_a_window(
    fleet: Start, registry: tuple[Registry, TestServer]
) -> None:
    """Three busy proxies; the store goes away and comes back empty (Redis without
    persistence), but one proxy cannot reach it for a few windows more and still paces alone
    on its turns. The two that are back find turns among fewer proxies than before: they keep
    to their own turns until every proxy alone has had time to come back, so the registry
    never sees two reads in one window, before, during or after."""
    fake, _ = registry
    state = FleetState(clock=asyncio.get_running_loop().time)
    proxies = await fleet(3, state)
    requests = asking(proxies, 25)
    await asyncio.sleep(6 * INTERVAL + INTERVAL / 2)
    state.up = False
    await asyncio.sleep(5 * INTERVAL)
    state.restart()
    state.cut.add("p2")
    state.up = True
    await asyncio.sleep(3 * INTERVAL)
    state.cut.clear()
    responses = await asyncio.gather(*requests)
    assert {r.status for r in responses} == {200}
    times = [s.at for s in fake.reads()]
    assert len(times) == 75
    assert min(gaps(times)) >= INTERVAL - JITTER


async def test_an_image_read_by_one_proxy_serves_the_others_resources(
    fleet: Start, registry: tuple[Registry, TestServer]
) -> None:
    """Three proxies, a resource on each asking for the same ten images at once: the registry
    reads each image once for the whole fleet (R1, R2 across proxies), every request is
    answered, and a later request on any proxy is served from what the fleet keeps."""
    fake, _ = registry
    proxies = await fleet(3)
    refs = [f"s{i}" for i in range(10)]
    responses = await asyncio.gather(
        *(head(client, ref, f"r{n}") for n, client in enumerate(proxies) for ref in refs)
    )
    assert {r.status for r in responses} == {200}
    assert sorted(s.path.rsplit("/", 1)[1] for s in fake.reads()) == refs
    again = await head(proxies[2], "s3", "someone-else")
    assert again.status == 200
    assert len(fake.reads()) == 10


async def test_a_quota_bucket_is_the_fleets(
    fleet: Start, registry: tuple[Registry, TestServer]
) -> None:
    """A host rationed at 6 reads a minute (burst 1), shared: one proxy's read takes the
    fleet's token, and the other's waits the 10 s until the bucket has one again — and while
    the store is down each proxy has half the rate (20 s a token)."""
    fake, _ = registry
    state = FleetState(clock=asyncio.get_running_loop().time)
    quota = (
        "    paced: false\n    quota:\n      buckets:\n"
        "        - {category: DataplaneRead, scope: registry, ratePerMinute: 6, burst: 1}\n"
    )
    first, second = await fleet(2, state, quota)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert (await head(first, "a", "r0")).status == 200
    assert (await head(second, "b", "r1")).status == 200
    assert (await head(first, "c", "r0")).status == 200
    times = [round(s.at - t0, 1) for s in fake.reads()]
    assert times == [0.0, 10.0, 20.0]
    state.up = False
    assert (await head(first, "d", "r0")).status == 200
    assert (await head(first, "e", "r0")).status == 200
    (d, e) = fake.reads()[-2:]
    assert round(e.at - d.at, 1) == 20.0  # alone, a token every 20 s: half the rate


@pytest.mark.parametrize("fleet_config", ["", "fleet: {redis: {url: 'redis://127.0.0.1:1'}}\n"])
def test_redis_is_imported_only_by_a_fleets_proxy(fleet_config: str) -> None:
    """Without ``fleet``, redis-py is never loaded; with it, only when the app starts."""
    code = (
        "import sys\n"
        "from kuikproxy.config import parse_config\n"
        "from kuikproxy.app import build_app\n"
        f"build_app(parse_config({fleet_config!r}))\n"
        "print('redis' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert result.stdout.strip() == "False"


async def test_r5_a_shared_refusal_read_by_one_proxy_is_not_given_to_a_client_with_credentials(
    fleet: Start, registry: tuple[Registry, TestServer]
) -> None:
    """R5 across the fleet: a 404 one proxy read anonymously serves anonymous clients of the
    others, but a client that brings its own credentials is read for, as on one proxy."""
    fake, _ = registry
    fake.fail["/v2/app/manifests/gone"] = 404
    first, second = await fleet(2)
    assert (await head(first, "gone", "r0")).status == 404
    assert (await head(second, "gone", "r1")).status == 404
    assert len(fake.reads()) == 1  # shared with the anonymous client of the other proxy
    signed = await head(second, "gone", "r2", Authorization="Basic YWxpY2U6cHc=")
    assert signed.status == 404
    assert len(fake.reads()) == 2  # its own read, with its own credentials
    assert fake.reads()[1].headers["authorization"] == ["Basic YWxpY2U6cHc="]


async def test_a_manifest_by_digest_two_proxies_windows_read_at_once_is_read_once_for_the_fleet(
    fleet: Start, registry: tuple[Registry, TestServer]
) -> None:
    """Each proxy's copy window takes a GET of one manifest by digest (P9: a window reads it for
    its queue); the first proxy's read is slow, so the second proxy's window comes while it is
    in flight and waits for it instead of reading: the registry reads it once for the fleet
    (R2 across proxies), and both clients get its bytes."""
    fake, _ = registry
    proxies = await fleet(2, host="    copy: {interval: 200ms, idle: 0s}\n")
    body = manifest_of("app", "v1")
    digest = digest_of(body)
    fake.delay = 3 * INTERVAL  # the first window's read is still in flight at the next window
    answers = await asyncio.gather(
        *(
            client.get(
                f"/v2/app/manifests/{digest}?ns={HOST}",
                headers={"Kuik-Resource": f"node-{n}", "Accept": MANIFEST_TYPE},
            )
            for n, client in enumerate(proxies)
        )
    )
    assert [(a.status, await a.read()) for a in answers] == [(200, body)] * 2
    assert [s.path for s in fake.reads()] == [f"/v2/app/manifests/{digest}"]


class SlowToTell(MemoryFleet):
    """A fleet's store that takes a second to be told a read of content landed (Redis
    answering slowly): the proxy's own mark stays the fleet's that long."""

    async def read(self, host: str, key: str, answer: bytes | None, ttl: float) -> None:
        await asyncio.sleep(1.0)
        await super().read(host, key, answer, ttl)


async def test_a_manifest_by_digest_asked_again_while_the_fleet_is_told_of_it_is_not_read_again(
    fleet: Start, registry: tuple[Registry, TestServer]
) -> None:
    """A proxy read a manifest by digest for the fleet and is still telling the fleet's store
    of it when another resource's window asks for it: the fleet's mark is still this proxy's
    own, which must not send it to the registry again — it waits for the telling, then finds
    the answer kept for the fleet. The registry's record is the count."""
    fake, _ = registry
    (client,) = await fleet(1, host="    copy: {interval: 200ms, idle: 0s}\n", kind=SlowToTell)
    body = manifest_of("app", "v1")
    digest = digest_of(body)
    for node in ("node-0", "node-1"):
        answer = await client.get(
            f"/v2/app/manifests/{digest}?ns={HOST}",
            headers={"Kuik-Resource": node, "Accept": MANIFEST_TYPE},
        )
        assert (answer.status, await answer.read()) == (200, body)
    assert [s.path for s in fake.reads()] == [f"/v2/app/manifests/{digest}"]


class SlowToClaim(MemoryFleet):
    """A fleet's store that answers every third claim only after ``late`` intervals (Redis
    answering slowly at times)."""

    late = 1.5
    claims = 0

    async def claim(self, host: str, series: str, window: int, interval: float) -> Claim:
        SlowToClaim.claims += 1
        if SlowToClaim.claims % 3 == 0:
            await asyncio.sleep(self.late * interval)
        return await super().claim(host, series, window, interval)


class SlowerThanAWindow(SlowToClaim):
    late = 1.5  # after the next window's time


class SlowWithinAWindow(SlowToClaim):
    late = 0.5  # before the next window, long after its own


@pytest.mark.parametrize("kind", [SlowerThanAWindow, SlowWithinAWindow])
async def test_claims_answered_late_never_bring_two_reads_closer_than_an_interval(
    fleet: Start, registry: tuple[Registry, TestServer], kind: type
) -> None:
    """Some claims are answered late: after the next window's time, or half an interval after
    their own. A late answer is never taken for the window due when it lands (which the other
    proxy may have been given), nor read half an interval late (the next window's read, on
    time, would come half an interval after it): the window is lost, and every request is
    still answered, one read per interval at most."""
    fake, _ = registry
    proxies = await fleet(2, kind=kind)
    requests = [
        head(client, f"p{n}-{i:02}", f"r{n}") for n, client in enumerate(proxies) for i in range(6)
    ]
    responses = await asyncio.gather(*requests)
    assert {r.status for r in responses} == {200}
    assert min(gaps([s.at for s in fake.reads()])) >= INTERVAL - JITTER
    windows = [
        (await (await p.get("/status")).json())["registries"][HOST]["check"]["windows"]
        for p in proxies
    ]
    # half an interval late: away; after the next window's time: busy, as a window the next
    # one's firing found past
    lost = "away" if kind is SlowWithinAWindow else "busy"
    assert sum(w[lost] for w in windows) > 0, windows


async def test_proxies_whose_clocks_differ_share_one_grid(
    fleet: Start, registry: tuple[Registry, TestServer]
) -> None:
    """The second proxy's clock is 80 ms ahead (two fifths of an interval): the fleet's grid is
    read on the store's clock, so its windows are the first one's, and the registry never sees
    two reads closer than an interval (on its own clock, its windows would come 80 ms before the
    first proxy's, 120 ms after the last)."""
    fake, _ = registry
    proxies = await fleet(2, skews=(0.0, 0.08))
    requests = [
        head(client, f"p{n}-{i:02}", f"r{n}") for n, client in enumerate(proxies) for i in range(10)
    ]
    responses = await asyncio.gather(*requests)
    assert {r.status for r in responses} == {200}
    assert min(gaps([s.at for s in fake.reads()])) >= INTERVAL - JITTER
