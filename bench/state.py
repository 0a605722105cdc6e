"""What kuikproxy's state costs in memory, and what reading it costs the event loop.

Everything runs in this process, on 127.0.0.1 only: kuikproxy (``build_app``) before the test
registry (``tests/upstream_app.py``), both on ``aiohttp.web`` runners, and a raw-socket client
(one HEAD in flight per connection). Hosts under the wildcard are IP literals (``127.x.y.z``
under ``allowedHosts: ["127.*"]``): never resolved, and never connected to — the address guard
refuses loopback literals when their window reads them, so they are answered 403.

* **ring image**: one ring grown image by image through the core (:meth:`HostScheduler.check`,
  each answered from a kept answer, R1), bytes per image, its key (``team/app-0000042:1.0``)
  included (tracemalloc);
* **resource**: ``--resources`` resources each asking the one kept image over HTTP: bytes per
  resource (its ring of one image, its census entry), tracemalloc after a full collection;
* **host**: ``--hosts`` hosts under the wildcard, one request each: bytes per host while it
  has state, and the timers left once their windows have passed (there should be none);
* **reading it**: with those resources and hosts in place, what ``/status`` (its default page,
  and its largest), ``/metrics`` and ``/`` cost: the longest the event loop was held while one
  was answered (the largest gap between the ticks of a 1 ms ticker on the same loop), and the
  time to the answer, which includes what a worker thread did off the loop. ``--rounds`` each.

Run: ``.venv/bin/python bench/state.py`` (``--resources 10000 --hosts 1000``, the defaults).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import statistics
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from aiohttp import web  # noqa: E402

from kuikproxy.app import build_app  # noqa: E402
from kuikproxy.config import parse_config  # noqa: E402
from kuikproxy.core.hoststate import HostPacing  # noqa: E402
from kuikproxy.core.images import Image  # noqa: E402
from kuikproxy.core.limits import Census, Limits  # noqa: E402
from kuikproxy.core.scheduler import HostScheduler  # noqa: E402
from kuikproxy.runtime.series import SeriesTimers  # noqa: E402
from kuikproxy.server import tune_garbage_collection  # noqa: E402
from kuikproxy.web.keys import PACER  # noqa: E402
from tests.upstream_app import Registry  # noqa: E402

LOOPBACK = "127.0.0.1"
HOST = "registry.bench"
CONNECTIONS = 16


def traced(action: Callable[[], object]) -> int:
    """Bytes still allocated after ``action`` (and a full collection) that were not before."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    action()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return after - before


def ring_image_bytes(images: int) -> float:
    census = Census(Limits(max_images=images + 1, max_ring_images=images + 1))
    scheduler = HostScheduler(HOST, HostPacing(60.0, 300.0), 0.0, census=census)

    def ask() -> None:  # each request's image made here: its key is what the ring keeps
        for i in range(images):
            image = Image(HOST, f"team/app-{i:07d}", "1.0")
            scheduler.check("monitor", image, 1.0, auth=None, kept_at=1.0)

    return traced(ask) / images


async def heads(port: int, lines: list[bytes]) -> dict[str, int]:
    """Send every HEAD in ``lines`` over :data:`CONNECTIONS` keep-alive connections."""
    statuses: dict[str, int] = {}
    todo = iter(lines)

    async def connection() -> None:
        reader, writer = await asyncio.open_connection(LOOPBACK, port)
        for line in todo:
            writer.write(line)
            head = await reader.readuntil(b"\r\n\r\n")
            status = head[9:12].decode()
            statuses[status] = statuses.get(status, 0) + 1
        writer.close()

    await asyncio.gather(*(connection() for _ in range(CONNECTIONS)))
    return statuses


def head(path: str, resource: str) -> bytes:
    return f"HEAD {path} HTTP/1.1\r\nHost: {LOOPBACK}\r\nKuik-Resource: {resource}\r\n\r\n".encode()


async def get(port: int, path: str) -> tuple[float, float, int]:
    """One GET over loopback: how long it took, the longest the event loop was held meanwhile
    (the largest gap between ticks of a 1 ms ticker), and the answer's size."""
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    held = 0.0
    done = False

    async def ticker() -> None:
        nonlocal held
        last = time.perf_counter()
        while not done:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            held = max(held, now - last - 0.001)
            last = now

    ticking = asyncio.ensure_future(ticker())
    started = time.perf_counter()
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {LOOPBACK}\r\nConnection: close\r\n\r\n".encode())
    body = await reader.read()
    seconds = time.perf_counter() - started
    done = True
    await ticking
    writer.close()
    return seconds, held, len(body)


async def traced_async(action: Callable[[], Awaitable[object]]) -> int:
    """:func:`traced` of a coroutine's work, the loop's connections closed after it."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    await action()
    await asyncio.sleep(0.5)  # closed connections let go of their buffers
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return after - before


def window_timers(loop: asyncio.AbstractEventLoop) -> int:
    """Timers on the loop that fire a host's window."""
    scheduled = loop._scheduled  # type: ignore[attr-defined]
    return sum(
        1
        for handle in scheduled
        if not handle.cancelled()
        and getattr(handle._callback, "__func__", None) is SeriesTimers.window
    )


async def main(args: argparse.Namespace) -> None:
    logging.disable(logging.WARNING)  # the hosts' refused reads would log one line each
    print(f"ring image: {ring_image_bytes(args.images):,.0f} bytes ({args.images:,} images)")

    registry = web.AppRunner(Registry().app())
    await registry.setup()
    registry_site = web.TCPSite(registry, LOOPBACK, 0)
    await registry_site.start()
    registry_port = registry_site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    config = parse_config(
        f"""
        allowedHosts: ["127.*"]
        defaultRegistry: {HOST}
        limits: {{maxHosts: {args.hosts}, maxResources: {args.resources + 10}}}
        registries:
          default: {{check: {{interval: 10ms}}}}
          {HOST}: {{upstream: "http://{LOOPBACK}:{registry_port}"}}
        """
    )
    app = build_app(config)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, LOOPBACK, 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    tune_garbage_collection()  # as `kuikproxy serve` does once it is up
    pacer = app[PACER]
    path = f"/v2/app/manifests/v1?ns={HOST}"
    await heads(port, [head(path, "warm")])  # its window reads it: the answer is kept

    lines = [head(path, f"ImageMonitor/bench/r{i:06d}") for i in range(args.resources)]
    grown = await traced_async(lambda: heads(port, lines))
    print(
        f"resource: {grown / args.resources:,.0f} bytes ({args.resources:,} resources, one "
        f"kept image each; {len(pacer.census):,} in the census)"
    )

    def host(i: int) -> str:
        return f"127.1.{i // 256}.{i % 256}"

    lines = [head(f"/v2/app/manifests/v1?ns={host(i)}", "warm") for i in range(args.hosts)]
    statuses: dict[str, int] = {}

    async def hosts() -> None:
        statuses.update(await heads(port, lines))

    grown = await traced_async(hosts)
    await asyncio.sleep(0.1)
    print(
        f"host: {grown / args.hosts:,.0f} bytes ({args.hosts:,} hosts under the wildcard, "
        f"answered {statuses}); window timers left: {window_timers(pacer.loop)}"
    )

    print(f"reading it, {len(pacer.census):,} resources and {len(pacer.hosts):,} hosts:")
    for what in ("/status", "/status?limit=1000", "/metrics", "/"):
        times, stalls, size = [], [], 0
        for _ in range(args.rounds):
            seconds, held, size = await get(port, what)
            times.append(seconds * 1000)
            stalls.append(held * 1000)
        print(
            f"  {what:<20} loop held at most {max(stalls):5.1f} ms (median "
            f"{statistics.median(stalls):5.1f}); answered in {statistics.median(times):6.1f} ms "
            f"(max {max(times):6.1f}), {size / 1024:,.0f} KiB"
        )
    await runner.cleanup()
    await registry.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--resources", type=int, default=10_000)
    parser.add_argument("--hosts", type=int, default=1_000)
    parser.add_argument("--images", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(parser.parse_args()))
