"""The acceptance of bounded state: a flood of names kuikproxy must not keep.

kuikproxy runs as a process of its own (its RSS is then its own) before the distribution
registry, with limits low enough for a flood to pass them and a retention short enough to wait
for. The flood is 200,000 checks with distinct resource names and 50,000 with distinct host
names under an allowed wildcard; meanwhile ``/status`` and ``/metrics`` are scraped every
second and a kept-answer HEAD is timed every half second. Then it is quiet for the retention.

Hosts under the wildcard are IP literals (``127.x.y.z`` under ``allowedHosts: ["127.*"]``):
never resolved, and never connected to — the address guard refuses loopback literals when
their window reads them (403) — so the flood never leaves the machine, not even as a DNS
query.

"Before the flood" is after a first, smaller flood and a quiet retention: by then kuikproxy's
bounded caches are full — its 8,192 request lines (``web/classify.py``), 4,096 host names
(``config/models.py``) — as in any proxy that has run for a while, and the allocator has been
through a flood once. What the test then pins is what bounded state is about: another flood, ten
times larger, leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable

import pytest

from tests.e2e.conftest import REGISTRY, StartProxy
from tests.e2e.peers import (
    FAST,
    LOOPBACK,
    OCI_INDEX,
    DistributionRegistry,
    Kuikproxy,
    SeededImage,
    cpu_seconds,
    registry_block,
    rss_kib,
)

pytestmark = pytest.mark.e2e

RETENTION = 15.0
LIMITS = {"maxHosts": 200, "maxResources": 2_000}
CONNECTIONS = 16
MAX_WAIT = 0.100  # what a kept-answer HEAD may take during the flood
MAX_GROWTH = 1.20  # RSS after the flood and the quiet, against before


def check_line(host: str, resource: str) -> bytes:
    """A HEAD of ``app:v1`` on ``host`` (by ``ns``) for ``resource``, keep-alive."""
    return (
        f"HEAD /v2/app/manifests/v1?ns={host} HTTP/1.1\r\nHost: {LOOPBACK}\r\n"
        f"Accept: {OCI_INDEX}\r\nKuik-Resource: {resource}\r\n\r\n"
    ).encode()


async def flood(proxy: Kuikproxy, lines: Callable[[int], bytes], count: int) -> Counter[str]:
    """``count`` HEADs over :data:`CONNECTIONS` keep-alive connections: statuses answered."""
    statuses: Counter[str] = Counter()
    todo = iter(range(count))

    async def connection() -> None:
        reader, writer = await asyncio.open_connection(LOOPBACK, proxy.port)
        for i in todo:
            writer.write(lines(i))
            statuses[(await reader.readuntil(b"\r\n\r\n"))[9:12].decode()] += 1
        writer.close()

    await asyncio.gather(*(connection() for _ in range(CONNECTIONS)))
    return statuses


async def head(proxy: Kuikproxy, resource: str) -> tuple[str, float]:
    """One check of ``app:v1`` on the registry for ``resource``: its status and its time."""
    reader, writer = await asyncio.open_connection(LOOPBACK, proxy.port)
    started = time.perf_counter()
    writer.write(check_line(REGISTRY, resource))
    status = (await reader.readuntil(b"\r\n\r\n"))[9:12].decode()
    writer.close()
    return status, time.perf_counter() - started


async def get(proxy: Kuikproxy, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection(LOOPBACK, proxy.port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {LOOPBACK}\r\nConnection: close\r\n\r\n".encode())
    answer = await reader.read()
    writer.close()
    head_, _, body = answer.partition(b"\r\n\r\n")
    return int(head_[9:12]), body


def wildcard(i: int, block: int) -> str:
    return f"127.{block}.{i // 256}.{i % 256}"


async def both_floods(
    proxy: Kuikproxy, resources: int, hosts: int, block: int, resource: str
) -> None:
    """Distinct resources on the registry, then ``resource`` (one with state: the census is
    full) on distinct hosts under the wildcard."""
    checks = await flood(
        proxy, lambda i: check_line(REGISTRY, f"ImageMonitor/flood/{block}-{i}"), resources
    )
    assert set(checks) == {"200", "503"}, checks  # kept answers, then refusals (maxResources)
    named = await flood(proxy, lambda i: check_line(wildcard(i, block), resource), hosts)
    assert set(named) == {"403", "503"}, named  # the guard refused the admitted, or maxHosts


def rss_mib(proxy: Kuikproxy) -> float:
    return rss_kib(proxy.pid) / 1024


async def test_a_flood_of_names_leaves_nothing_behind(
    registry: DistributionRegistry, app_image: SeededImage, start_proxy: StartProxy
) -> None:
    """200,000 checks with distinct resource names and 50,000 with distinct hosts under an
    allowed wildcard, ``/status`` and ``/metrics`` scraped every second meanwhile, then a
    quiet retention: RSS is back within 20 % of before the flood, no host under the wildcard
    and no resource is left, the proxy spends no CPU when quiet (no timer is left for a host
    without requests), and no kept-answer HEAD waited more than 100 ms during the flood."""
    _ = app_image
    top = {
        "allowedHosts": ["127.*"],
        "unusedImageRetention": f"{RETENTION:g}s",
        "limits": LIMITS,
        # hosts under the wildcard take the default block: windows as short as the registry's
        "registries": {"default": FAST, REGISTRY: registry_block(registry.url)},
    }
    with start_proxy(registry.url, top=top) as proxy:
        assert (await head(proxy, "warm"))[0] == "200"  # its window reads it: kept (R1)
        fresh = rss_mib(proxy)
        await both_floods(proxy, 20_000, 10_000, block=1, resource="warm")
        await asyncio.sleep(RETENTION + 2)
        before = rss_mib(proxy)

        # the probe's answer is kept for it whenever the refresher's read is newer than its
        # own previous one (R1): the refresher waits for a window, the probe never should
        assert (await head(proxy, "refresher"))[0] == "200"
        assert (await head(proxy, "probe"))[0] == "200"
        waits: list[float] = []
        scraped: Counter[int] = Counter()
        flooding = True

        async def probe() -> None:
            while flooding:
                assert (await head(proxy, "refresher"))[0] == "200"
                status, seconds = await head(proxy, "probe")
                assert status == "200"
                waits.append(seconds)
                await asyncio.sleep(0.5)

        async def scrape() -> None:
            while flooding:
                for path in ("/status", "/metrics"):
                    scraped[(await get(proxy, path))[0]] += 1
                await asyncio.sleep(1.0)

        watchers = [asyncio.ensure_future(probe()), asyncio.ensure_future(scrape())]
        started = time.monotonic()
        try:
            await both_floods(proxy, 200_000, 50_000, block=2, resource="probe")
        finally:
            flooding = False
            await asyncio.gather(*watchers)
        flood_seconds = time.monotonic() - started

        await asyncio.sleep(RETENTION + 2)
        after = rss_mib(proxy)
        cpu = cpu_seconds([proxy.pid])
        await asyncio.sleep(3.0)
        quiet_cpu = cpu_seconds([proxy.pid]) - cpu
        status = json.loads((await get(proxy, "/status"))[1])

    print(
        f"flood {flood_seconds:.1f}s; RSS fresh {fresh:.1f}, before {before:.1f}, after "
        f"{after:.1f} MiB; kept-answer HEAD "
        f"max {max(waits) * 1000:.1f} ms over {len(waits)}; scrapes {dict(scraped)}; "
        f"quiet CPU {quiet_cpu:.2f}s/3s; refused {status['refused']}, "
        f"{status['registries'][REGISTRY]['refused']}"
    )
    assert after <= before * MAX_GROWTH, (before, after)
    assert max(waits) <= MAX_WAIT, sorted(waits)[-5:]
    assert len(waits) >= 10 and scraped == {200: scraped[200]} and scraped[200] >= 10
    assert set(status["registries"]) == {REGISTRY}  # every host under the wildcard forgotten
    assert status["resources"] == {} and status["resourcesTotal"] == 0
    assert status["refused"]["maxHosts"] > 0
    assert status["registries"][REGISTRY]["refused"]["maxResources"] > 0
    assert quiet_cpu < 0.05  # nothing is due anywhere: no window fires, no timer runs
