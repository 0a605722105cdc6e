"""Held requests: what 10,000 requests parked on one host cost kuikproxy, and how late windows
fire while they wait.

Layout (everything on 127.0.0.1, nothing else is ever contacted):

* this process runs kuikproxy in-process (``build_app`` under an ``AppRunner`` with
  ``handler_cancellation=True``) before a tiny upstream registry app, as
  ``registries: {registry.test: {upstream: http://127.0.0.1:PORT, check: {interval: 100ms}}}``,
  with ``limits.maxHeld`` the connections (more than the default memory budget's share);
* a second process (this file, ``--client``) opens ``--connections`` raw TCP connections
  (asyncio streams) and sends on each ``HEAD /v2/app/manifests/v{i:05d}?ns=registry.test`` with
  ``Kuik-Resource: bench-{i % 100}``, then waits. When a window answers one, that connection asks
  again (a monitor asking every lap: the request waits for its next lap), so the number held
  stays at ``--connections`` while windows are measured;
* for comparison, a third process (``--baseline-server``) serves stock aiohttp whose handler awaits
  a future that is never set, and the same client parks the same connections there.

Figures: the server's VmRSS (``/proc/<pid>/status``) before the connections and once all are
held (``Pacer.held()``; the baseline counts its parked handlers), as KB per held request; for
kuikproxy, the lateness of its check windows (``now - window time``, from the host's recent
windows, ``Host.history``) over ``--seconds`` while all are held, p50/p99/max; and how long
it takes kuikproxy to let go of every held request once the client's connections close (P11).

Run: ``/tmp/v/bin/python bench/held.py`` (``--connections 2000 --seconds 3`` for a quick run;
``--tracemalloc`` prints where kuikproxy's memory per held request goes, at the cost of speed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import hashlib
import os
import resource
import signal
import statistics
import sys
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from aiohttp import web

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from kuikproxy.core.tickets import Operation
from kuikproxy.web.keys import PACER

LOOPBACK = "127.0.0.1"
HOST = "registry.test"
RESOURCES = 100
CONNECT_BATCH = 500
CLIENT_LIFETIME = 150.0  # the client stops by itself after this, whatever happens to us
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
TARGET_KB = 12.0
TARGET_LATE_MS = 20.0


def raise_nofile() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def vm_rss_kb(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def site_port(runner: web.AppRunner) -> int:
    address = runner.addresses[0]
    return int(address[1])


@contextlib.asynccontextmanager
async def serve(app: web.Application, backlog: int = 4096) -> AsyncIterator[web.AppRunner]:
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, LOOPBACK, 0, backlog=backlog).start()
    try:
        yield runner
    finally:
        await runner.cleanup()


# -- the upstream registry ---------------------------------------------------------------------


def upstream_app() -> web.Application:
    """Any manifest exists; HEAD answers its headers, GET its body."""

    async def manifest(request: web.Request) -> web.Response:
        name, reference = request.match_info["name"], request.match_info["reference"]
        body = f'{{"schemaVersion":2,"mediaType":"{MANIFEST_TYPE}","ref":"{name}:{reference}"}}'
        data = body.encode()
        headers = {
            "Content-Type": MANIFEST_TYPE,
            "Docker-Content-Digest": "sha256:" + hashlib.sha256(data).hexdigest(),
        }
        if request.method == "HEAD":
            headers["Content-Length"] = str(len(data))
            return web.Response(headers=headers)
        return web.Response(body=data, headers=headers)

    async def ping(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/v2/", ping)
    app.router.add_route("*", "/v2/{name:.+}/manifests/{reference}", manifest)
    return app


# -- the client process ------------------------------------------------------------------------


def request_bytes(port: int, i: int) -> bytes:
    return (
        f"HEAD /v2/app/manifests/v{i:05d}?ns={HOST} HTTP/1.1\r\n"
        f"Host: {LOOPBACK}:{port}\r\n"
        f"Kuik-Resource: bench-{i % RESOURCES}\r\n"
        "\r\n"
    ).encode()


async def client_main(port: int, connections: int) -> None:
    """Open the connections, send on each, ask again after every answer; stop when stdin
    closes (the bench is done or gone) or after ``CLIENT_LIFETIME``."""
    loop = asyncio.get_running_loop()
    answers = 0
    writers: list[asyncio.StreamWriter] = []

    async def converse(i: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal answers
        request = request_bytes(port, i)
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            while True:
                await reader.readuntil(b"\r\n\r\n")  # a HEAD answer: headers only
                answers += 1
                writer.write(request)

    async def open_one(i: int) -> asyncio.Task[None]:
        for attempt in range(5):
            try:
                reader, writer = await asyncio.open_connection(LOOPBACK, port)
                break
            except OSError:
                if attempt == 4:
                    raise
                await asyncio.sleep(0.2)
        writer.write(request_bytes(port, i))
        writers.append(writer)
        return asyncio.create_task(converse(i, reader, writer))

    tasks: list[asyncio.Task[None]] = []
    for start in range(0, connections, CONNECT_BATCH):
        batch = range(start, min(start + CONNECT_BATCH, connections))
        tasks += await asyncio.gather(*(open_one(i) for i in batch))
    print(f"open {len(tasks)}", flush=True)

    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stdin.read(), CLIENT_LIFETIME)
    print(f"answers {answers}", flush=True)
    for writer in writers:
        writer.transport.abort()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class Client:
    process: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)

    @classmethod
    async def start(cls, port: int, connections: int) -> Client:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--client",
            str(port),
            "--connections",
            str(connections),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(process)

    async def stop(self) -> None:
        """Close its stdin (it aborts its connections and exits); kill it if it lingers."""
        process = self.process
        if process.stdin is not None and not process.stdin.is_closing():
            process.stdin.close()
        try:
            out, _ = await asyncio.wait_for(process.communicate(), 10)
            self.lines += out.decode().splitlines()
        except TimeoutError:
            process.kill()
            await process.wait()


async def wait_until(condition: Callable[[], Awaitable[bool]], timeout: float, what: str) -> float:
    start = time.perf_counter()
    while not await condition():
        if time.perf_counter() - start > timeout:
            raise TimeoutError(f"{what} not reached in {timeout:g} s")
        await asyncio.sleep(0.05)
    return time.perf_counter() - start


# -- kuikproxy ---------------------------------------------------------------------------------


@dataclass
class Figures:
    rss_before_kb: int
    rss_held_kb: int
    held: int
    connect_s: float
    late_ms: list[float] = field(default_factory=list)
    outcomes: dict[str, int] = field(default_factory=dict)
    drain_s: float = float("nan")

    @property
    def kb_per_held(self) -> float:
        return (self.rss_held_kb - self.rss_before_kb) / self.held


async def bench_kuikproxy(connections: int, seconds: float, trace: bool) -> Figures:
    async with serve(upstream_app()) as upstream:
        config = parse_config(
            # every connection held: more than the default budget's share holds (limits.maxHeld)
            f"limits: {{maxHeld: {connections}}}\n"
            "registries:\n"
            f"  {HOST}:\n"
            f"    upstream: http://{LOOPBACK}:{site_port(upstream)}\n"
            "    check: {interval: 100ms}\n"
        )
        async with serve(build_app(config)) as proxy:
            pacer = proxy.app[PACER]
            port = site_port(proxy)
            late: list[float] = []
            outcomes: dict[str, int] = {}

            async def windows_for(span: float) -> None:
                """The check windows of ``span`` seconds from now, read from the host's recent
                windows every second (it keeps the last 60: six seconds of them here)."""
                runtime = pacer.runtime_of(HOST)
                assert runtime is not None
                since, end = pacer.loop.time(), pacer.loop.time() + span
                while (left := end - pacer.loop.time()) > 0:
                    await asyncio.sleep(min(1.0, left))
                    for at, outcome, lag in runtime.history.recent(Operation.CHECK):
                        if since < at <= end:
                            since = at
                            late.append(lag * 1000)
                            outcomes[outcome] = outcomes.get(outcome, 0) + 1

            async def held_all() -> bool:
                return pacer.held() >= connections

            await asyncio.sleep(0.5)
            gc.collect()
            if trace:
                tracemalloc.start(16)
                before_snapshot = tracemalloc.take_snapshot()
            rss_before = vm_rss_kb()
            client = await Client.start(port, connections)
            try:
                connect_s = await wait_until(held_all, 60, f"{connections} held")
                await asyncio.sleep(1.0)  # let the last connections settle
                rss_held = vm_rss_kb()
                held = pacer.held()
                if trace:
                    snapshot = tracemalloc.take_snapshot()
                    tracemalloc.stop()
                    print_trace(snapshot.compare_to(before_snapshot, "traceback"), held)
                late.clear()
                outcomes.clear()
                await windows_for(seconds)
                figures = Figures(rss_before, rss_held, held, connect_s, list(late), dict(outcomes))
            finally:
                stopping = time.perf_counter()
                await client.stop()

            async def none_held() -> bool:
                return pacer.held() == 0

            await wait_until(none_held, 30, "all released")
            figures.drain_s = time.perf_counter() - stopping
            return figures


def print_trace(stats: list[tracemalloc.StatisticDiff], held: int) -> None:
    """Memory grown while the requests were parked, per held request: each allocation is put
    on the innermost kuikproxy line of its traceback (a coroutine's frame is put on the line
    that called it), or, with no kuikproxy frame, on aiohttp/asyncio's own line."""
    by_line: dict[str, list[int]] = {}
    ours = theirs = 0
    for stat in stats:
        frames = list(stat.traceback)  # oldest first
        mine = [f for f in frames if "/kuikproxy/" in f.filename]
        frame = mine[-1] if mine else frames[-1]
        where = f"{frame.filename.rsplit('site-packages/', 1)[-1]}:{frame.lineno}"
        where = where.replace(os.getcwd() + "/", "")
        if mine:
            ours += stat.size_diff
        else:
            theirs += stat.size_diff
            where = "(no kuikproxy frame) " + where
        sizes = by_line.setdefault(where, [0, 0])
        sizes[0] += stat.size_diff
        sizes[1] += stat.count_diff
    print(
        f"--- tracemalloc, per held request: {(ours + theirs) / held:,.0f} B traced, "
        f"{ours / held:,.0f} B under a kuikproxy frame, {theirs / held:,.0f} B not ---"
    )
    top = sorted(by_line.items(), key=lambda item: -item[1][0])[:30]
    for where, (size, count) in top:
        print(f"{size / held:>8.0f} B {count / held:>6.2f} blocks  {where}")
    print()


# -- the stock aiohttp baseline -----------------------------------------------------------------


async def baseline_server_main() -> None:
    """Stock aiohttp: every request parks on a future that is never set. ``/parked`` (GET)
    answers how many are parked. Stops when stdin closes."""
    parked = 0

    async def park(request: web.Request) -> web.StreamResponse:
        nonlocal parked
        if request.path == "/parked":
            return web.Response(text=str(parked))
        parked += 1
        try:
            await asyncio.get_running_loop().create_future()
        finally:
            parked -= 1
        raise AssertionError("unreachable")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", park)
    async with serve(app) as runner:
        print(f"port {site_port(runner)}", flush=True)
        stdin = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stdin.read(), CLIENT_LIFETIME)


async def parked_count(port: int) -> int:
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    try:
        writer.write(
            f"GET /parked HTTP/1.1\r\nHost: {LOOPBACK}\r\nConnection: close\r\n\r\n".encode()
        )
        data = await reader.read()
    finally:
        writer.close()
    return int(data.rsplit(b"\r\n\r\n", 1)[1])


async def bench_baseline(connections: int) -> Figures:
    server = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--baseline-server",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert server.stdout is not None
        port = int((await server.stdout.readline()).split()[1])
        await parked_count(port)  # warm the request path, as kuikproxy's is by its startup
        await asyncio.sleep(0.5)
        rss_before = vm_rss_kb(server.pid)
        client = await Client.start(port, connections)
        try:

            async def parked_all() -> bool:
                return await parked_count(port) >= connections

            connect_s = await wait_until(parked_all, 60, f"{connections} parked")
            await asyncio.sleep(1.0)
            rss_held = vm_rss_kb(server.pid)
            held = await parked_count(port)
        finally:
            await client.stop()
        return Figures(rss_before, rss_held, held, connect_s)
    finally:
        if server.stdin is not None:
            server.stdin.close()
        try:
            await asyncio.wait_for(server.wait(), 10)
        except TimeoutError:
            server.kill()
            await server.wait()


# -- report ------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def report(kuik: Figures, base: Figures, connections: int, seconds: float) -> bool:
    kb_ok = kuik.kb_per_held <= TARGET_KB
    p99 = percentile(kuik.late_ms, 0.99)
    late_ok = p99 <= TARGET_LATE_MS
    print(f"{connections:,} requests held on one host ({RESOURCES} resources), check every 100 ms")
    print()
    print(
        f"{'server':<18} {'held':>7} {'connect s':>10} {'RSS before MB':>14} "
        f"{'RSS held MB':>12} {'KB/held':>8} {'target':>10}"
    )
    for name, f, target in (
        ("kuikproxy", kuik, f"≤ {TARGET_KB:g} {'ok' if kb_ok else 'MISSED'}"),
        ("stock aiohttp", base, "(baseline)"),
    ):
        print(
            f"{name:<18} {f.held:>7,} {f.connect_s:>10.1f} {f.rss_before_kb / 1024:>14.1f} "
            f"{f.rss_held_kb / 1024:>12.1f} {f.kb_per_held:>8.2f} {target:>10}"
        )
    print(f"kuikproxy over stock aiohttp: {kuik.kb_per_held - base.kb_per_held:+.2f} KB per held")
    print()
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(kuik.outcomes.items()))
    print(f"check windows over {seconds:g} s with all held: {len(kuik.late_ms)} ({outcomes})")
    print(f"{'lateness ms':<18} {'p50':>7} {'p99':>7} {'max':>7} {'mean':>7} {'target p99':>12}")
    print(
        f"{'':<18} {percentile(kuik.late_ms, 0.5):>7.2f} {p99:>7.2f} {max(kuik.late_ms):>7.2f} "
        f"{statistics.fmean(kuik.late_ms):>7.2f} "
        f"{'≤ ' + format(TARGET_LATE_MS, 'g') + (' ok' if late_ok else ' MISSED'):>12}"
    )
    print()
    print(
        f"kuikproxy let go of all {kuik.held:,} held requests {kuik.drain_s:.2f} s after "
        "their connections closed"
    )
    return kb_ok and late_ok


async def main_async(args: argparse.Namespace) -> int:
    kuik = await bench_kuikproxy(args.connections, args.seconds, args.tracemalloc)
    gc.collect()
    base = await bench_baseline(args.connections)
    report(kuik, base, args.connections, args.seconds)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=10.0, help="window measurement time")
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--client", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--baseline-server", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    raise_nofile()
    if args.client is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the bench stops us through stdin
        asyncio.run(client_main(args.client, args.connections))
        return 0
    if args.baseline_server:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        asyncio.run(baseline_server_main())
        return 0
    if os.environ.get("PYTHONASYNCIODEBUG"):
        print("warning: asyncio debug mode makes every figure worse", file=sys.stderr)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    raise SystemExit(main())
