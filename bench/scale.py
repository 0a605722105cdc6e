"""The cost curve of kuikproxy with a state file: disk, restart and ``/status`` as rings grow.

For 10³ … 10⁶ ring entries spread evenly over 1 … 1,000 hosts (rings of at most 1,000 distinct
images, one resource per ring, resource names ``ImageMonitor/ns-0000/web`` … repeated on every
host: the shape of ``bench/scheduler.py --scale``), each point runs in processes of its own:

* **fill** (``--fills`` processes, each on a new file): kuikproxy built in-process
  (``build_app``, ``AppRunner``, ``TCPSite`` on 127.0.0.1, ``state: {path: FILE}``), every host a
  configured registry whose upstream is the test registry (``tests/upstream_app.py``) on
  127.0.0.1 (``check.interval: 1h``, hold mode: no window fires while the bench runs). The rings
  are filled through the hosts' schedulers (:meth:`HostScheduler.join`, then each image answered,
  as a kept answer or a window answers it): they are the tracked rings the durable layer
  attached, so every image is marked changed as a request's ask marks it. Then one
  :meth:`Durable.flush` writes it all: how long it takes, the longest the event loop was held
  meanwhile (the batch is built on the loop, the SQLite transaction runs on the store's
  thread), the file's size after the shutdown's checkpoint, and its rows, counted with sqlite3
  (the run stops unless every entry is there, answered).
* **restart** (``--runs`` processes, one after the other, on the last fill's file): a fresh
  kuikproxy, ``tune_garbage_collection()`` first as ``kuikproxy serve`` does. Time from
  ``runner.setup()`` to the site listening, and of it ``Durable.open`` (SQLite's quick check),
  the file read on the store's thread, and the rest of ``Durable.restore`` (the rings built in
  the pacer, on the loop); the run stops unless the census counts every entry. VmRSS added
  once up (after a full collection) and VmHWM's rise (the peak). One more restart with
  tracemalloc on gives the live bytes (all a start makes: config, hosts, rings) and the traced
  peak (the file's rows as plain values next to the rings). Then ``GET /status`` (its default
  page), ``GET /status?registry=<one host>`` and ``GET /metrics``, ``--gets`` times each: time to
  the answer and the longest loop stall (the largest gap between ticks of a 1 ms ticker), as
  ``bench/state.py`` measures them.

Only 127.0.0.1 is contacted. Run: ``.venv/bin/python bench/scale.py`` (~4 min on 2 cores;
``--max`` to stop at fewer entries, ``--quick`` for 10³…10⁴ only). Prints a markdown table:
medians, and (min–max) of the fills or restarts.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from aiohttp import web  # noqa: E402

from kuikproxy.app import build_app  # noqa: E402
from kuikproxy.config import parse_config  # noqa: E402
from kuikproxy.runtime.durable import Durable  # noqa: E402
from kuikproxy.server import tune_garbage_collection  # noqa: E402
from kuikproxy.state.threaded import ThreadedStore  # noqa: E402
from kuikproxy.web.keys import PACER  # noqa: E402
from tests.upstream_app import Registry  # noqa: E402

LOOPBACK = "127.0.0.1"
RING = 1_000  # at most this many images a ring
ENTRIES = (1_000, 10_000, 100_000, 1_000_000)
HOSTS = (1, 10, 100, 1_000)


def host_name(h: int) -> str:
    return f"registry-{h:04d}.bench"


def image_set(count: int) -> list[tuple[str, str]]:  # bench/scheduler.py's
    return [(f"team-{i % 97:02d}/app-{i:05d}", f"1.{i % 13}") for i in range(count)]


def vm(field: str) -> float:
    """A ``/proc/self/status`` figure, MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


async def start(hosts: int, path: str) -> tuple[web.AppRunner, web.AppRunner, int]:
    """The test registry, then kuikproxy on ``path``: their runners and kuikproxy's port."""
    registry = web.AppRunner(Registry().app())
    await registry.setup()
    registry_site = web.TCPSite(registry, LOOPBACK, 0)
    await registry_site.start()
    upstream = f"http://{LOOPBACK}:{registry_site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    blocks = "\n".join(f'  {host_name(h)}: {{upstream: "{upstream}"}}' for h in range(hosts))
    config = parse_config(
        f"""
state: {{path: "{path}"}}
defaultRegistry: {host_name(0)}
limits: {{memory: 32Gi, maxResources: 10000000, maxImages: 10000000}}
registries:
  default: {{check: {{interval: 1h}}}}
{blocks}
"""
    )
    app = build_app(config)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, LOOPBACK, 0)
    await site.start()
    return runner, registry, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


class Ticker:
    """The longest the loop was held while it ran (a 1 ms ticker's largest gap beyond 1 ms)."""

    def __init__(self) -> None:
        self.held = 0.0
        self._done = False
        self._task = asyncio.ensure_future(self._tick())

    async def _tick(self) -> None:
        last = time.perf_counter()
        while not self._done:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            self.held = max(self.held, now - last - 0.001)
            last = now

    async def stop(self) -> float:
        self._done = True
        await self._task
        return self.held


async def get(port: int, path: str) -> tuple[float, float, int]:
    """One GET over loopback: seconds to the whole answer, longest loop stall, bytes."""
    reader, writer = await asyncio.open_connection(LOOPBACK, port)
    await asyncio.sleep(0.01)
    ticker = Ticker()
    started = time.perf_counter()
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {LOOPBACK}\r\nConnection: close\r\n\r\n".encode())
    body = await reader.read()
    seconds = time.perf_counter() - started
    held = await ticker.stop()
    writer.close()
    if not body.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"GET {path}: {body[:200]!r}")
    return seconds, held, len(body)


def file_bytes(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


async def fill(entries: int, hosts: int, path: str) -> dict[str, float]:
    logging.disable(logging.WARNING)
    runner, registry, _ = await start(hosts, path)
    pacer = runner.app[PACER]
    durable = pacer.durable
    assert durable is not None
    schedulers = pacer.hosts
    per_host = max(1, entries // hosts)
    ring = min(per_host, RING)
    base = image_set(ring)
    started = time.perf_counter()
    now = pacer.loop.time()
    for h in range(hosts):
        s = schedulers[host_name(h)]
        for r in range(per_host // ring):
            resource = f"ImageMonitor/ns-{r:04d}/web"
            keys = [f"h{h}-r{r}/{i}:{t}" for i, t in base]
            # tracked rings: every key marked changed, as an ask marks it; then answered, as a
            # served request is
            s.join(resource, keys, now)
            tracked = s._rings[resource]
            for key in keys:
                tracked.answer(key, now)
    filled = time.perf_counter() - started
    # nothing awaited since the fill: the durable ticker has not drained a change yet
    ticker = Ticker()
    started = time.perf_counter()
    await durable.flush()
    flushed = time.perf_counter() - started
    held = await ticker.stop()
    size_flushed = file_bytes(path)
    await runner.cleanup()  # the last (empty) write, the file closed: WAL checkpointed
    await registry.cleanup()
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT count(*) FROM entries").fetchone()[0]
        rings = db.execute("SELECT count(*) FROM rings").fetchone()[0]
        answered = db.execute(
            "SELECT count(*) FROM entries WHERE answered_wall IS NOT NULL"
        ).fetchone()[0]
    db.close()
    return {
        "fill_s": filled,
        "flush_s": flushed,
        "flush_held_ms": held * 1000,
        "wal_mb": size_flushed / 2**20,
        "file_mb": file_bytes(path) / 2**20,
        "rows": rows,
        "answered": answered,
        "rings": rings,
    }


def time_restore(timed: dict[str, float]) -> None:
    """Record in ``timed`` how long opening the file, reading it (on the store's thread) and
    the whole :meth:`Durable.restore` take, by wrapping them (this process only)."""
    open_, restore, load = Durable.open, Durable.restore, ThreadedStore.load

    async def timed_open(cls: type[Durable], p: str) -> Durable:
        t0 = time.perf_counter()
        try:
            opened: Durable = await open_.__func__(cls, p)  # type: ignore[attr-defined]
            return opened
        finally:
            timed["open_s"] = time.perf_counter() - t0

    async def timed_restore(self: Durable, pacer: object) -> None:
        t0 = time.perf_counter()
        try:
            await restore(self, pacer)  # type: ignore[arg-type]
        finally:
            timed["restore_s"] = time.perf_counter() - t0

    def timed_load(self: ThreadedStore, offset: float) -> asyncio.Future[object]:
        t0 = time.perf_counter()
        future = load(self, offset)
        future.add_done_callback(lambda _: timed.__setitem__("load_s", time.perf_counter() - t0))
        return future  # type: ignore[return-value]

    Durable.open = classmethod(timed_open)  # type: ignore[method-assign,assignment]
    Durable.restore = timed_restore  # type: ignore[method-assign]
    ThreadedStore.load = timed_load  # type: ignore[method-assign,assignment]


async def pages(port: int, hosts: int, gets: int) -> dict[str, object]:
    """Each page ``gets`` times: median time and stall, the largest stall, the size."""
    out: dict[str, object] = {}
    for name, what in (
        ("status", "/status"),
        ("status_host", f"/status?registry={host_name(hosts // 2)}"),
        ("metrics", "/metrics"),
    ):
        times, stalls, size = [], [], 0
        for _ in range(gets):
            seconds, held, size = await get(port, what)
            times.append(seconds * 1000)
            stalls.append(held * 1000)
        out[name] = {
            "ms": statistics.median(times),
            "held_ms": statistics.median(stalls),
            "held_max_ms": max(stalls),
            "kib": size / 1024,
        }
    return out


async def restart(
    entries: int, hosts: int, path: str, gets: int, traced: bool
) -> dict[str, object]:
    logging.disable(logging.WARNING)
    timed: dict[str, float] = {}
    time_restore(timed)
    tune_garbage_collection()  # as `kuikproxy serve` does before its loop starts
    gc.collect()
    rss0 = vm("VmRSS")
    if traced:
        tracemalloc.start()
    t0 = time.perf_counter()
    runner, registry, port = await start(hosts, path)
    serving = time.perf_counter() - t0
    pacer = runner.app[PACER]
    images = pacer.census.images
    if images != entries:
        raise RuntimeError(f"restored {images:,} images, not {entries:,}")
    gc.collect()
    rss = vm("VmRSS") - rss0
    peak = vm("VmHWM") - rss0
    out: dict[str, object] = {"serving_s": serving, "rss_mb": rss, "peak_mb": peak, **timed}
    if traced:
        live, most = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out |= {"live_mb": live / 2**20, "live_peak_mb": most / 2**20}
    if gets:
        out |= await pages(port, hosts, gets)
    await runner.cleanup()
    await registry.cleanup()
    return out


def child(args: list[str]) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, __file__, *args], capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise RuntimeError(f"{args}: {done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def spread(values: list[float], fmt: str) -> str:
    median = format(statistics.median(values), fmt)
    if len(values) < 2:
        return median
    return f"{median} ({format(min(values), fmt)}–{format(max(values), fmt)})"


def remove(path: str) -> None:
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)


def point(entries: int, hosts: int, args: argparse.Namespace, where: str) -> str:
    gets = args.gets
    path = os.path.join(where, f"state-{entries}-{hosts}.db")
    fs = []
    for _ in range(args.fills):  # each on a new file; the restarts read the last one
        remove(path)
        f = child(["--fill", str(entries), str(hosts), path])
        if f["rows"] != entries or f["answered"] != entries:
            raise RuntimeError(f"the file holds {f['rows']:,} entries ({f['answered']:,} answered)")
        fs.append(f)
    r = [
        child(["--restart", str(entries), str(hosts), path, str(gets), "0"])
        for _ in range(args.runs)
    ]
    t = child(["--restart", str(entries), str(hosts), path, "0", "1"])  # tracemalloc on
    remove(path)

    def web(name: str) -> str:
        ms = [x[name]["ms"] for x in r]
        held = [x[name]["held_ms"] for x in r]
        return f"{spread(ms, ',.1f')} / {spread(held, ',.1f')}"

    return (
        f"| {entries:,} | {hosts:,} | {f['file_mb']:,.2f} "
        f"| {spread([x['flush_s'] * 1000 for x in fs], ',.0f')} "
        f"/ {spread([x['flush_held_ms'] for x in fs], ',.0f')} "
        f"| {spread([x['serving_s'] * 1000 for x in r], ',.0f')} "
        f"| {statistics.median(x['open_s'] * 1000 for x in r):,.0f} "
        f"/ {statistics.median(x['load_s'] * 1000 for x in r):,.0f} "
        f"/ {statistics.median((x['restore_s'] - x['load_s']) * 1000 for x in r):,.0f} "
        f"| {spread([x['rss_mb'] for x in r], ',.1f')} "
        f"| {statistics.median(x['peak_mb'] for x in r):,.0f} "
        f"| {t['live_mb']:,.1f} ({t['live_mb'] * 2**20 / entries:,.0f} B/entry) "
        f"/ {t['live_peak_mb']:,.0f} "
        f"| {web('status')} | {web('status_host')} | {web('metrics')} "
        f"| {r[0]['status']['kib']:,.0f} / {r[0]['metrics']['kib']:,.0f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fills", type=int, default=3, help="fills and flushes per point")
    parser.add_argument("--runs", type=int, default=3, help="restarts per point")
    parser.add_argument("--gets", type=int, default=3, help="GETs of each page per restart")
    parser.add_argument("--max", type=int, default=ENTRIES[-1], help="the most entries")
    parser.add_argument("--quick", action="store_true", help="10³ and 10⁴ entries only")
    parser.add_argument("--fill", nargs=3, metavar=("ENTRIES", "HOSTS", "PATH"))
    parser.add_argument(
        "--restart", nargs=5, metavar=("ENTRIES", "HOSTS", "PATH", "GETS", "TRACED")
    )
    args = parser.parse_args()
    if args.fill:
        e, h, p = args.fill
        print(json.dumps(asyncio.run(fill(int(e), int(h), p))))
        return
    if args.restart:
        e, h, p, g, traced = args.restart
        print(json.dumps(asyncio.run(restart(int(e), int(h), p, int(g), traced == "1"))))
        return
    top = 10_000 if args.quick else args.max
    print(
        "| ring entries | hosts | file MB | flush ms / loop held ms | restart ms "
        "| of which open / read / restore ms | RSS +MB | peak +MB | traced +MB / peak MB "
        "| /status ms / held ms | /status?registry= ms / held ms | /metrics ms / held ms "
        "| /status / /metrics KiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    where = tempfile.mkdtemp(prefix="kuik-scale-")
    started = time.perf_counter()
    try:
        for entries in (e for e in ENTRIES if e <= top):
            for hosts in HOSTS:
                if hosts <= entries:
                    print(point(entries, hosts, args, where), flush=True)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    print(f"[{time.perf_counter() - started:.0f} s]", file=sys.stderr)


if __name__ == "__main__":
    main()
