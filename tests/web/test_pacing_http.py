"""The proxy paces real HTTP requests: acceptance 3 of the pacing issue, on virtual time.

Every test runs under ``looptime``: the event loop's clock is virtual, so a 200 ms window is
asserted to the millisecond and the suite does not sleep through it.
"""

from __future__ import annotations

import asyncio

import pytest

from kuikproxy.web.keys import PACER
from tests.conftest import HOST, ProxyFactory, head
from tests.upstream_app import Registry

pytestmark = pytest.mark.looptime

INTERVAL = 0.2


async def test_p1_p5_heads_reach_upstream_one_per_window_in_lexicographic_order(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """N concurrent HEADs of one resource reach the upstream one per window, in byte-wise order
    of their references, the first a full interval after start."""
    fake, _ = registry
    client = await proxy()
    start = asyncio.get_running_loop().time()
    refs = ["v3", "v10", "v1", "v2", "latest"]
    responses = await asyncio.gather(*(head(client, ref) for ref in refs))
    assert [r.status for r in responses] == [200] * len(refs)
    reads = fake.reads()
    assert [r.path.rsplit("/", 1)[1] for r in reads] == sorted(refs)
    assert [round(r.at - start, 3) for r in reads] == [
        round(INTERVAL * k, 3) for k in range(1, len(refs) + 1)
    ]
    assert all(r.method == "HEAD" for r in reads)


async def test_r1_r2_two_resources_cause_one_upstream_read_per_image_per_lap(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """Two resources asking for the same images: one upstream read per image per lap, both
    answered (R2 for those waiting together, R1 for the one that comes later)."""
    fake, _ = registry
    client = await proxy()
    refs = [f"v{i}" for i in range(4)]
    first = await asyncio.gather(
        *(head(client, ref, "monitor-a") for ref in refs),
        *(head(client, ref, "monitor-b") for ref in refs),
    )
    assert all(r.status == 200 for r in first)
    assert len(fake.reads()) == len(refs)
    # a third resource arriving later is answered from the kept answers, without a window
    loop = asyncio.get_running_loop()
    before = loop.time()
    late = await asyncio.gather(*(head(client, ref, "monitor-c") for ref in refs))
    assert all(r.status == 200 for r in late)
    assert loop.time() - before < INTERVAL / 10
    assert len(fake.reads()) == len(refs)
    # the next lap: every resource asks again, each image is read once more
    second = await asyncio.gather(
        *(head(client, ref, name) for ref in refs for name in ("monitor-a", "monitor-b"))
    )
    assert all(r.status == 200 for r in second)
    assert len(fake.reads()) == 2 * len(refs)


async def test_p11_a_client_that_goes_away_leaves_a_standing_ask_its_retry_finds_answered(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """A client that goes away stops waiting at once (nothing of it is held, no task left);
    its image stays asked: the next window reads it, once, and the client's retry is answered
    at once from that read, without a second read."""
    fake, _ = registry
    client = await proxy()
    request = asyncio.ensure_future(head(client, "gone"))
    await asyncio.sleep(INTERVAL / 2)
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    pacer = client.server.app[PACER]
    await asyncio.sleep(0.01)  # the server hears the connection close
    assert pacer.held() == 0
    await asyncio.sleep(INTERVAL * 3)
    assert len(fake.reads()) == 1  # the standing ask, read at the first window
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert (await head(client, "gone")).status == 200
    assert loop.time() == started  # from the kept answer (R1): no window
    assert len(fake.reads()) == 1
    status = await (await client.get("/status")).json()
    assert status["registries"][HOST]["check"]["waiting"] == 0
    assert status["registries"][HOST]["check"]["windows"]["idle"] >= 2
    assert pacer.tasks == set()
    assert pacer.held() == 0


async def test_status_shows_rings_and_window_counters(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """/status carries the registries and resources parts of SPEC §8."""
    client = await proxy()
    await asyncio.gather(*(head(client, ref) for ref in ("a", "b")))
    status = await (await client.get("/status")).json()
    check = status["registries"][HOST]["check"]
    assert check["interval"] == "200ms"
    assert check["mode"] == "hold"
    assert check["windows"]["used"] == 2
    ring = status["resources"]["web"]["checks"]["registries"][0]
    assert ring["registry"] == HOST
    assert ring["images"] == 2
    assert ring["cursor"] == "app:b"
    assert ring["cycleStarted"].endswith("Z")
    assert ring["cycleDuration"] is None
