"""RedisFleet against a real redis-server: shared origins, windows taken by at most
one proxy in turns, blocks that never shorten, the fleet's size, and an outage that every call
reports at once and that ends when the server is back.

Windows are claimed directly by index (no waiting for them); the real clock matters only where
Redis' own clock does: a proxy leaving the turns, and blocks and heartbeats expiring."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import redis.asyncio

from kuikproxy.core.fleetturns import Claim
from kuikproxy.core.quota import SharedBucket
from kuikproxy.fleet import redis as redis_fleet
from kuikproxy.fleet.backend import FleetUnavailable
from kuikproxy.fleet.redis import RedisFleet
from tests.fleet.conftest import FleetFactory, RedisServer, TlsFiles

HOST = "registry.test:5000"
LONG = 60.0  # an interval no test outlives: turns never expire on their own
ORIGIN = 1_800_000_000.125  # a wall time, with a fraction that must survive the round trip


async def winners(proxies: list[RedisFleet], window: int, repeat: int = 1) -> set[str]:
    """Every proxy claims ``window`` ``repeat`` times, all at once, in random order: the names
    of those told yes."""
    calls = [(p, p.claim(HOST, "check", window, LONG)) for p in proxies for _ in range(repeat)]
    random.shuffle(calls)
    answers = await asyncio.gather(*(call for _, call in calls))
    return {p.name for (p, _), claim in zip(calls, answers, strict=True) if claim.won}


async def raw(url: str) -> redis.asyncio.Redis:
    return redis.asyncio.from_url(url, decode_responses=True)


# -- origins --------------------------------------------------------------------------------


async def test_origin_is_set_once_and_restarted_by_a_new_interval(fleet: FleetFactory) -> None:
    a, b = await fleet("a"), await fleet("b")
    assert await a.origin(HOST, "check", 10.0, ORIGIN) == ORIGIN
    # the fleet's origin, not b's proposal; 10 and 10.0001 are one interval (whole ms)
    assert await b.origin(HOST, "check", 10, ORIGIN + 7) == ORIGIN
    assert await b.origin(HOST, "check", 10.0001, ORIGIN + 7) == ORIGIN
    # each series and each host has its own
    assert await b.origin(HOST, "copy", 10.0, ORIGIN + 7) == ORIGIN + 7
    assert await b.origin("other.test", "check", 10.0, ORIGIN + 8) == ORIGIN + 8
    # a reload with another interval restarts the series from the proposal (P12) ...
    assert await b.origin(HOST, "check", 20.0, ORIGIN + 30) == ORIGIN + 30
    # ... which is then the fleet's for that interval
    assert await a.origin(HOST, "check", 20.0, ORIGIN + 99) == ORIGIN + 30


# -- claims ---------------------------------------------------------------------------------


async def test_a_proxy_alone_gets_every_window(fleet: FleetFactory) -> None:
    a = await fleet("a")
    await a.origin(HOST, "check", LONG, ORIGIN)
    assert [(await a.claim(HOST, "check", k, LONG)).won for k in range(1, 21)] == [True] * 20
    assert (await a.claim(HOST, "check", 5, LONG)).won  # asking again for its window: still its


async def test_two_proxies_due_take_turns(fleet: FleetFactory) -> None:
    a, b = await fleet("a"), await fleet("b")
    for proxy in (a, b):
        await proxy.origin(HOST, "check", LONG, ORIGIN)
    assert (await a.claim(HOST, "check", 1, LONG)).won  # alone so far: a's
    assert not (await b.claim(HOST, "check", 1, LONG)).won  # taken; b is due from now on
    for k in range(2, 32):
        # window k to the (k mod 2)-th by name, whoever asks first
        assert await winners([a, b], k) == {"ab"[k % 2]}


async def test_ten_proxies_at_once_never_share_a_window(fleet: FleetFactory) -> None:
    proxies = [await fleet(f"proxy-{i}") for i in range(10)]
    # all due for the first time at once: the turns are still being made, so a window may go
    # unused, but never to two
    assert len(await winners(proxies, 0, repeat=5)) <= 1
    names = sorted(p.name for p in proxies)
    for k in range(1, 41):
        assert await winners(proxies, k, repeat=5) == {names[k % 10]}


async def test_a_proxy_no_longer_due_leaves_the_turns_after_two_intervals(
    fleet: FleetFactory,
) -> None:
    interval = 0.5
    a, b = await fleet("a"), await fleet("b")
    await a.claim(HOST, "check", 0, interval)
    await b.claim(HOST, "check", 0, interval)
    # b stops asking. Its turns are lost, not given to a, while b may still be due ...
    assert (await a.claim(HOST, "check", 2, interval)).won
    assert not (await a.claim(HOST, "check", 3, interval)).won
    # ... and after two intervals without a claim b is out: every window is a's
    await asyncio.sleep(2 * interval + 0.1)
    assert [(await a.claim(HOST, "check", k, interval)).won for k in range(5, 11)] == [True] * 6
    # b is back: turns again
    assert not (await b.claim(HOST, "check", 10, interval)).won  # a's already
    assert (await b.claim(HOST, "check", 13, interval)).won
    assert not (await a.claim(HOST, "check", 13, interval)).won


async def test_a_taken_window_expires_after_two_intervals(
    redis_server: RedisServer, fleet: FleetFactory
) -> None:
    a = await fleet("a")
    client = await raw(redis_server.url)
    try:
        assert (await a.claim(HOST, "check", 7, 0.5)).won
        key = f"kuikproxy:{{{HOST}}}:check:window:7"
        assert await client.get(key) == "a"
        assert 1500 < await client.pttl(key) <= 2000  # 2 intervals + 1 s
    finally:
        await client.aclose()


async def test_a_proxy_off_the_fleets_grid_gets_no_window(fleet: FleetFactory) -> None:
    a, b = await fleet("a"), await fleet("b")
    await a.origin(HOST, "check", 10.0, ORIGIN)
    await b.origin(HOST, "check", 10.0, ORIGIN)
    # b's config changed the interval (a reload, P12): the series restarts on b's new grid;
    # a, still on the old one, would use windows between the fleet's: it gets none
    await b.origin(HOST, "check", 20.0, ORIGIN + 30)
    assert not (await a.claim(HOST, "check", 2, 10.0)).won
    assert (await b.claim(HOST, "check", 2, 20.0)).won
    # a reloads too: it is on the fleet's grid again, and takes turns
    assert await a.origin(HOST, "check", 20.0, ORIGIN + 40) == ORIGIN + 30
    assert not (await a.claim(HOST, "check", 3, 20.0)).won  # b's turn (3 mod 2 = 1)
    assert (await a.claim(HOST, "check", 4, 20.0)).won


async def test_an_origin_lost_by_the_store_is_put_back_by_the_next_claim(
    redis_server: RedisServer, fleet: FleetFactory
) -> None:
    a = await fleet("a")
    await a.origin(HOST, "check", 10.0, ORIGIN)
    redis_server.stop()  # nothing is persisted: the server comes back empty
    redis_server.start()
    assert await a.claim(HOST, "check", 1, 10.0) == Claim(True, 0, 1, forming=True)
    # a proxy starting now gets the grid the fleet was on, not one of its own; the turns are
    # forming for two intervals and the store's timeout, for every proxy that claims
    b = await fleet("b")
    assert await b.origin(HOST, "check", 10.0, ORIGIN + 1234) == ORIGIN
    assert await b.claim(HOST, "check", 2, 10.0) == Claim(False, 1, 2, forming=True)


async def test_a_claim_tells_the_proxys_place_among_those_due(fleet: FleetFactory) -> None:
    b, a, c = await fleet("b"), await fleet("a"), await fleet("c")
    assert await b.claim(HOST, "check", 1, LONG) == Claim(True, 0, 1)
    assert await c.claim(HOST, "check", 2, LONG) == Claim(False, 1, 2)
    assert await a.claim(HOST, "check", 3, LONG) == Claim(True, 0, 3)  # 3 mod 3: a's, first
    assert await b.claim(HOST, "check", 4, LONG) == Claim(True, 1, 3)
    assert await c.claim(HOST, "check", 4, LONG) == Claim(False, 2, 3)


# -- blocks ---------------------------------------------------------------------------------


async def test_blocks_are_the_fleets_never_shorten_and_end(fleet: FleetFactory) -> None:
    a, b = await fleet("a"), await fleet("b")
    now = time.time()
    assert await a.blocked_until(HOST) is None
    assert await a.block(HOST, now + 5.5) == now + 5.5
    assert await b.blocked_until(HOST) == now + 5.5  # the whole fleet's
    assert await b.block(HOST, now + 2) == now + 5.5  # never shortened
    assert await a.blocked_until(HOST) == now + 5.5
    assert await b.block(HOST, now + 8.25) == now + 8.25  # lengthened
    assert await a.blocked_until(HOST) == now + 8.25
    assert await a.blocked_until("other.test") is None  # per host
    # a block ends at its end, for everyone
    await a.block("short.test", time.time() + 0.5)
    assert await b.blocked_until("short.test") is not None
    await asyncio.sleep(0.65)
    assert await b.blocked_until("short.test") is None
    # a block already over is no block
    assert await a.block("past.test", now - 1) == now - 1
    assert await a.blocked_until("past.test") is None


# -- size -----------------------------------------------------------------------------------


async def test_kept_answers_are_the_fleets_until_their_time_is_up(fleet: FleetFactory) -> None:
    """What one proxy keeps, another finds, by key, until the ``ttl`` it was kept for."""
    a, b = await fleet("a"), await fleet("b")
    await a.keep("reg.test", "app:v1|GET|-", b"answer", 0.3)
    assert await b.kept("reg.test", ["app:v1|GET|-", "app:v1|HEAD|-"]) == [b"answer", None]
    assert await b.kept("other.test", ["app:v1|GET|-"]) == [None]
    await asyncio.sleep(0.4)
    assert await b.kept("reg.test", ["app:v1|GET|-"]) == [None]


async def test_content_is_read_by_one_proxy_of_the_fleet_at_a_time(fleet: FleetFactory) -> None:
    """The first proxy to ask for content by digest is its reader; another asking meanwhile is
    told to wait, finds the answer once the reader keeps it, and a late reader's end never
    takes away another's mark."""
    a, b = await fleet("a"), await fleet("b")
    assert await a.reading("reg.test", "app@d|content", 5) is True
    assert await a.reading("reg.test", "app@d|content", 5) is True  # still its own
    assert await b.reading("reg.test", "app@d|content", 5) is False
    await b.read("reg.test", "app@d|content", None, 5)  # not b's mark: a's stays
    assert await b.reading("reg.test", "app@d|content", 5) is False
    await a.read("reg.test", "app@d|content", b"answer", 0.3)
    assert await b.reading("reg.test", "app@d|content", 5) == b"answer"
    await asyncio.sleep(0.4)  # the answer lapsed: the next to ask reads it again
    assert await b.reading("reg.test", "app@d|content", 5) is True
    await b.read("reg.test", "app@d|content", None, 5)  # a read that kept nothing unmarks
    assert await a.reading("reg.test", "app@d|content", 0.2) is True
    await asyncio.sleep(0.3)  # a reader that died: its mark lapses
    assert await b.reading("reg.test", "app@d|content", 5) is True


async def test_quota_buckets_are_the_fleets_all_or_none(fleet: FleetFactory) -> None:
    """Two proxies take from one bucket of 10 tokens a second (burst 2): the third token in a
    row waits about 0.1 s, for whoever asks; a refused take takes nothing from any bucket."""
    a, b = await fleet("a"), await fleet("b")
    reads = SharedBucket("DataplaneRead/registry", rate=10.0, burst=2.0)
    mine = SharedBucket("DataplaneRead/identity/alice", rate=10.0, burst=1.0)
    assert await a.take("reg.test", [reads, mine]) == 0.0
    assert await b.take("reg.test", [reads]) == 0.0
    wait = await b.take("reg.test", [reads])
    assert 0.0 < wait <= 0.1
    refused = await a.take("reg.test", [reads, mine])
    assert 0.0 < refused <= 0.1
    await asyncio.sleep(0.15)
    assert await a.take("reg.test", [reads, mine]) == 0.0


async def test_size_counts_the_proxies_seen_within_a_minute(
    redis_server: RedisServer, fleet: FleetFactory
) -> None:
    a = await fleet("a")
    assert await a.size() == 1  # itself
    b, c = await fleet("b"), await fleet("c")
    assert [await p.size() for p in (a, b, c)] == [3, 3, 3]
    # c last seen 61 s ago (by Redis' clock): no longer counted, and forgotten
    client = await raw(redis_server.url)
    try:
        seconds, micros = await client.time()
        await client.zadd("kuikproxy:fleet", {"c": seconds * 1000 + micros // 1000 - 61_000})
        assert await a.size() == 2
        assert sorted(await client.zrange("kuikproxy:fleet", 0, -1)) == ["a", "b"]
        # any call of c's says it is there again
        await c.claim(HOST, "check", 1, LONG)
        assert await a.size() == 3
    finally:
        await client.aclose()


async def test_a_proxy_with_nothing_to_do_keeps_its_heartbeat(
    redis_server: RedisServer, fleet: FleetFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(redis_fleet, "HEARTBEAT_EVERY", 0.05)
    await fleet("a")
    client = await raw(redis_server.url)
    try:
        first = await client.zscore("kuikproxy:fleet", "a")
        await asyncio.sleep(0.3)
        later = await client.zscore("kuikproxy:fleet", "a")
        assert first is not None and later is not None and later > first
    finally:
        await client.aclose()


async def test_a_key_prefix_keeps_fleets_apart(fleet: FleetFactory) -> None:
    a, b = await fleet("a"), await fleet("b", key_prefix="other:")
    assert await a.origin(HOST, "check", 10.0, ORIGIN) == ORIGIN
    assert await b.origin(HOST, "check", 10.0, ORIGIN + 1) == ORIGIN + 1
    assert (await b.claim(HOST, "check", 1, 10.0)).won
    assert (await a.claim(HOST, "check", 1, 10.0)).won
    assert await a.size() == 1


# -- outages --------------------------------------------------------------------------------


def calls(proxy: RedisFleet) -> dict[str, Callable[[], Awaitable[object]]]:
    return {
        "origin": lambda: proxy.origin(HOST, "check", 10.0, ORIGIN),
        "claim": lambda: proxy.claim(HOST, "check", 3, 10.0),
        "block": lambda: proxy.block(HOST, time.time() + 30),
        "blocked_until": lambda: proxy.blocked_until(HOST),
        "size": proxy.size,
    }


async def test_an_outage_is_reported_at_once_and_ends_with_it(
    redis_server: RedisServer, fleet: FleetFactory
) -> None:
    a = await fleet("a")
    for call in calls(a).values():
        await call()
    redis_server.stop()
    for what, call in calls(a).items():
        started = time.monotonic()
        with pytest.raises(FleetUnavailable, match=r"fleet store 127\.0\.0\.1:\d+ unavailable"):
            await call()
        assert time.monotonic() - started < 2.0, what
    redis_server.start()  # same port, empty
    answers = {what: await call() for what, call in calls(a).items()}
    assert answers["origin"] == ORIGIN
    # the origin it had is put back, and the turns are said to be forming again
    assert answers["claim"] == Claim(won=True, place=0, of=1, forming=True)
    assert answers["size"] == 1


async def test_an_unresponsive_server_is_reported_within_the_timeout(
    redis_server: RedisServer, fleet: FleetFactory
) -> None:
    a = await fleet("a")
    client = await raw(redis_server.url)
    try:
        # the server holds every command for 1.5 s: longer than a command's timeout
        await client.client_pause(1500)
        started = time.monotonic()
        with pytest.raises(FleetUnavailable, match=r"fleet store 127\.0\.0\.1:\d+ unavailable"):
            await a.claim(HOST, "check", 1, LONG)
        assert time.monotonic() - started < 2.0
        await asyncio.sleep(1.6 - (time.monotonic() - started))
        assert (await a.claim(HOST, "check", 1, LONG)).won  # and works again once it answers
    finally:
        await client.aclose()


async def test_a_proxy_started_during_an_outage_joins_when_it_ends(
    redis_server: RedisServer, fleet: FleetFactory
) -> None:
    redis_server.stop()
    a = await fleet("a")  # starting is not refused: the proxy paces alone meanwhile
    with pytest.raises(FleetUnavailable):
        await a.size()
    redis_server.start()
    assert await a.size() == 1
    assert (await a.claim(HOST, "check", 1, LONG)).won


# -- connection options ---------------------------------------------------------------------


async def test_a_password_from_the_option_or_the_url(
    redis_server_factory: Callable[..., RedisServer], fleet: FleetFactory
) -> None:
    server = redis_server_factory("--requirepass", "s3cret")
    anonymous = await fleet("a", url=server.url)
    with pytest.raises(FleetUnavailable, match=r"(?i)auth"):
        await anonymous.size()
    wrong = await fleet("b", url=server.url, password="nope")
    with pytest.raises(FleetUnavailable, match=r"(?i)password|auth"):
        await wrong.size()
    by_option = await fleet("c", url=server.url, password="s3cret")
    by_url = await fleet("d", url=f"redis://:s3cret@127.0.0.1:{server.port}/0")
    assert await by_option.size() == 2
    assert await by_url.size() == 2


async def test_a_tls_ca_file_needs_a_rediss_url(fleet: FleetFactory) -> None:
    with pytest.raises(ValueError, match="rediss://"):
        await fleet("a", tls_ca_file="/nonexistent/ca.pem")


async def test_tls_with_a_ca_file(
    tmp_path: Path, redis_server_factory: Callable[..., RedisServer], fleet: FleetFactory
) -> None:
    files = TlsFiles.issued(tmp_path)
    server = redis_server_factory(tls=files)
    assert server.url.startswith("rediss://")
    trusted = await fleet("a", url=server.url, tls_ca_file=str(files.ca))
    assert await trusted.size() == 1
    # without the CA the server's certificate is not trusted: unavailable, and why
    untrusted = await fleet("b", url=server.url)
    with pytest.raises(FleetUnavailable, match=r"(?i)certificate"):
        await untrusted.size()
