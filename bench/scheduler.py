"""The pure core's decision cost: how long :meth:`HostScheduler.check_window` takes to decide.

Two shapes, each on one host:

* ``rings``: 1,000 resources × 10,000 images each (10M ring entries), built in bulk with
  :meth:`HostScheduler.join`;
* ``big``: one resource whose ring holds 1,000,000 images.

Each shape runs in both modes, on one scheduler built once: first ``prefetch`` (every ring image
is due), then — switched in place with :meth:`HostScheduler.reconfigure`, which keeps the rings —
``hold``, where requests wait on a fraction of each ring's images (``--hold-fraction``, 1 % by
default) through :meth:`HostScheduler.check`. Windows fire at successive window times; after each
:class:`Read` the bench calls ``check_read_done(read, now, served=list(read.tickets),
digest=None, kept=True)`` as the runtime does, and in hold mode the served resources ask again
for what they were answered (a monitor asking every lap), so the number of waiting requests stays
constant.

Image sets (``--images``): ``distinct`` (default) gives each resource its own 10,000 images
(``ns-0042/app-01234:1.5``): ten million distinct keys, and resources never serve each other, so
the cost measured is the ring's own. (A ring keeps its own copy of each key, as bytes, so shared
key strings would save no memory either: ``Image.key`` is built per request anyway.) ``shared``
gives every resource the *same* 10,000 images: every read of an image is credited to every ring
(R1/R2, P7), which is the worst case for the prefetch walk (see RESULTS.md).

Figures: build time (GC enabled, as in the runtime) and the VmRSS it added, also per ring entry
(``B/entry``: VmRSS, not tracemalloc, so allocator overhead and the interpreter's arenas count;
the target is ≤ 120 B at 1,000 × 10,000 distinct images: the last line says whether it is met);
one full ``gc.collect()`` (the pause a gen-2 collection costs the event loop with that many ring
entries); per mode, decisions per second (windows over the time spent in ``check_window`` plus
``check_read_done``), the median, p99 and max of ``check_window`` alone
(``time.perf_counter_ns`` around the call) and the median of ``check_read_done``.

``--scale`` prints how the cost grows instead: for 10³ … 10⁶ ring entries spread over 1 … 1,000
hosts (rings of at most 1,000 distinct images, prefetch), the bytes per entry (tracemalloc after a
full collection, the hosts' schedulers included: VmRSS moves by whole arenas, too coarse for
small sets), the median ``check_window`` (windows fired on every host in turn), the core's
share of a restart (every ring exported as plain values, then restored into a fresh scheduler:
what ``state.path`` writes and reads, without the disk) and of ``/status`` (``view`` of every
host, its first 100 rings).

Run: ``.venv/bin/python bench/scheduler.py`` (``--quick`` for a small run, ``--profile`` to
print a cProfile of the decision loops, ``--scale`` for the cost curve).
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass

from kuikproxy.core.hoststate import HostPacing
from kuikproxy.core.images import Image
from kuikproxy.core.scheduler import HostScheduler
from kuikproxy.core.tickets import Operation, Read, Ticket

HOST = "registry.bench"
INTERVAL = 1.0  # window times are k × 1 s; the scheduler never reads a clock
TARGET_MEDIAN_US = 50.0
TARGET_BYTES_PER_ENTRY = 120.0  # VmRSS added per ring entry, at 1,000 × 10,000 distinct images


def vm_rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


@dataclass(frozen=True)
class Shape:
    name: str
    resources: int
    images: int


@dataclass
class Built:
    scheduler: HostScheduler
    # per resource, its images as (repository, tag): the ring key is "repository:tag"
    images: Callable[[int], list[tuple[str, str]]]
    names: list[str]
    build_s: float
    rss_added_mb: float
    rss_mb: float
    gc_pause_s: float


@dataclass
class ModeResult:
    mode: str
    windows: int
    used: int
    waiting: int
    decide_ns: list[int]
    done_ns: list[int]

    def decisions_per_s(self) -> float:
        return self.windows / ((sum(self.decide_ns) + sum(self.done_ns)) / 1e9)


def quantile(sorted_ns: list[int], q: float) -> float:
    """The q-quantile (nearest rank) in µs."""
    if not sorted_ns:
        return float("nan")
    i = min(len(sorted_ns) - 1, max(0, round(q * len(sorted_ns)) - 1))
    return sorted_ns[i] / 1000


def image_set(count: int) -> list[tuple[str, str]]:
    """``count`` plausible images: 97 repositories' worth of apps, tags spread over them."""
    return [(f"team-{i % 97:02d}/app-{i:05d}", f"1.{i % 13}") for i in range(count)]


def build(shape: Shape, shared: bool) -> Built:
    base = image_set(shape.images)
    names = [f"ImageMonitor/ns-{r:04d}/web" for r in range(shape.resources)]
    shared_keys = [f"{repo}:{tag}" for repo, tag in base]

    def images_of(r: int) -> list[tuple[str, str]]:
        if shared:
            return base
        return [(f"ns-{r:04d}/{repo}", tag) for repo, tag in base]

    scheduler = HostScheduler(HOST, HostPacing(INTERVAL, INTERVAL, prefetch=True), 0.0)
    gc.collect()
    before = vm_rss_mb()
    start = time.perf_counter()
    for r, name in enumerate(names):
        keys = shared_keys if shared else [f"{repo}:{tag}" for repo, tag in images_of(r)]
        scheduler.join(name, keys, 0.0)
    build_s = time.perf_counter() - start
    rss = vm_rss_mb()
    rss_added = rss - before
    start = time.perf_counter()
    gc.collect()
    gc_pause = time.perf_counter() - start
    return Built(scheduler, images_of, names, build_s, rss_added, rss, gc_pause)


def run_windows(
    scheduler: HostScheduler,
    *,
    first_window: int,
    windows: int,
    seconds: float,
    ask_again: bool,
) -> tuple[int, list[int], list[int], int]:
    """Fire up to ``windows`` windows (or ``seconds`` of wall time) from window ``first_window``;
    returns the next window index, check_window costs, check_read_done costs, reads."""
    decide: list[int] = []
    done: list[int] = []
    used = 0
    clock = time.perf_counter_ns
    deadline = clock() + int(seconds * 1e9)
    k = first_window
    for k in range(first_window, first_window + windows):
        now = k * INTERVAL
        t0 = clock()
        result = scheduler.check_window(now)
        t1 = clock()
        decide.append(t1 - t0)
        read: Read | None = result.read
        if read is not None:
            used += 1
            served: list[Ticket] = list(read.tickets)
            t0 = clock()
            scheduler.check_read_done(read, now, served=served, digest=None, kept=True)
            done.append(clock() - t0)
            if ask_again:  # the served resources ask again: they wait for their next lap
                for ticket in served:
                    scheduler.check(ticket.resource, ticket.image, now, auth=None, kept_at=now)
        if t1 > deadline:
            break
    return k + 1, decide, done, used


def run_shape(
    shape: Shape,
    *,
    shared: bool,
    windows: int,
    seconds: float,
    hold_fraction: float,
    profile: cProfile.Profile | None,
) -> tuple[Built, list[ModeResult], float]:
    built = build(shape, shared)
    s = built.scheduler
    results: list[ModeResult] = []

    if profile is not None:
        profile.enable()
    k, decide, done, used = run_windows(
        s, first_window=1, windows=windows, seconds=seconds, ask_again=False
    )
    if profile is not None:
        profile.disable()
    results.append(ModeResult("prefetch", len(decide), used, 0, decide, done))

    # hold mode on the same rings: a request waits on every (1 / hold_fraction)-th image
    s.reconfigure(HostPacing(INTERVAL, INTERVAL, prefetch=False), k * INTERVAL)
    step = max(1, round(1 / hold_fraction))
    now = (k - 1) * INTERVAL
    for r, name in enumerate(built.names):
        for repo, tag in built.images(r)[r % step :: step]:
            s.check(name, Image(HOST, repo, tag), now, auth=None, kept_at=None)
    waiting = s.waiting(Operation.CHECK)
    rss_after_hold = vm_rss_mb()
    if profile is not None:
        profile.enable()
    _, decide, done, used = run_windows(
        s, first_window=k, windows=windows, seconds=seconds, ask_again=True
    )
    if profile is not None:
        profile.disable()
    results.append(ModeResult("hold", len(decide), used, waiting, decide, done))
    return built, results, rss_after_hold


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="100 × 1,000 and 100,000 images")
    parser.add_argument("--images", choices=("distinct", "shared"), default="distinct")
    parser.add_argument("--shape", choices=("rings", "big", "both"), default="both")
    parser.add_argument("--windows", type=int, default=0, help="windows per mode (max)")
    parser.add_argument("--seconds", type=float, default=0.0, help="wall time cap per mode")
    parser.add_argument("--hold-fraction", type=float, default=0.01)
    parser.add_argument("--profile", action="store_true", help="cProfile the decision loops")
    parser.add_argument("--scale", action="store_true", help="the cost curve (see above)")
    return parser.parse_args(argv)


def print_memory_target(measured: float | None) -> None:
    verdict = (
        "not measured by this run"
        if measured is None
        else f"{measured:.0f} B, " + ("met" if measured <= TARGET_BYTES_PER_ENTRY else "MISSED")
    )
    print(
        f"target: ≤ {TARGET_BYTES_PER_ENTRY:g} B of VmRSS per ring entry at 1,000 × 10,000 "
        f"distinct images: {verdict}"
    )


def scale_point(entries: int, hosts: int, windows: int = 2_000) -> str:
    """One row of ``--scale``: ``entries`` ring entries over ``hosts`` hosts."""
    per_host = max(1, entries // hosts)
    ring = min(per_host, 1_000)
    pacing = HostPacing(INTERVAL, INTERVAL, prefetch=True)
    base = image_set(ring)
    gc.collect()
    tracemalloc.start()
    schedulers = []
    for h in range(hosts):
        s = HostScheduler(f"registry-{h:04d}.bench", pacing, 0.0)
        for r in range(per_host // ring):
            s.join(f"ImageMonitor/ns-{r:04d}/web", [f"h{h}-r{r}/{i}:{t}" for i, t in base], 0.0)
        schedulers.append(s)
    gc.collect()
    per_entry = tracemalloc.get_traced_memory()[0] / entries
    tracemalloc.stop()
    decide = []
    clock = time.perf_counter_ns
    for k in range(1, windows + 1):
        s = schedulers[k % hosts]
        t0 = clock()
        result = s.check_window(k * INTERVAL)
        decide.append(clock() - t0)
        if result.read is not None:
            s.check_read_done(result.read, k * INTERVAL, served=[], digest=None, kept=True)
    t0 = clock()
    saved = [s.export() for s in schedulers]
    exported = clock() - t0
    t0 = clock()
    for h, rings in enumerate(saved):
        fresh = HostScheduler(f"registry-{h:04d}.bench", pacing, 0.0)
        for resource, state in rings:
            fresh.restore(resource, state)
    restored = clock() - t0
    t0 = clock()
    for s in schedulers:
        names = sorted(r for r, _, _ in s.ring_stats())[:100]  # /status's default page
        s.view(windows * INTERVAL, names)
    viewed = clock() - t0
    return (
        f"| {entries:,} | {hosts:,} | {per_entry:,.0f} | {quantile(sorted(decide), 0.5):.1f} | "
        f"{exported / 1e6:,.0f} | {restored / 1e6:,.0f} | {viewed / 1e6:,.1f} |"
    )


def scale() -> None:
    print(
        "| ring entries | hosts | B/entry (tracemalloc) | median decision µs | export ms "
        "| restore ms | view of every host ms |"
    )
    print("|---|---|---|---|---|---|---|")
    for entries in (1_000, 10_000, 100_000, 1_000_000):
        for hosts in (1, 10, 100, 1_000):
            if hosts <= entries:
                print(scale_point(entries, hosts), flush=True)
                gc.collect()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.scale:
        scale()
        return 0

    if args.quick:
        shapes = [Shape("rings", 100, 1_000), Shape("big", 1, 100_000)]
    else:
        shapes = [Shape("rings", 1_000, 10_000), Shape("big", 1, 1_000_000)]
    if args.shape != "both":
        shapes = [s for s in shapes if s.name == args.shape]
    windows = args.windows or (2_000 if args.quick else 20_000)
    seconds = args.seconds or (2.0 if args.quick else 6.0)
    shared = args.images == "shared"

    print(f"images: {args.images}; windows per mode ≤ {windows:,} or {seconds:g} s of wall time")
    print(f"hold mode: a request waits on {args.hold_fraction:.0%} of each ring's images")
    print()
    header = (
        f"{'shape':<26} {'mode':<9} {'windows':>8} {'used':>7} {'waiting':>8} "
        f"{'decisions/s':>12} {'median µs':>10} {'p99 µs':>8} {'max µs':>9} "
        f"{'read_done µs':>13} {'target':>7}"
    )
    build_rows: list[str] = []
    mode_rows: list[str] = []
    ok = True
    per_entry: dict[str, float] = {}
    for shape in shapes:
        profile = cProfile.Profile() if args.profile else None
        start = time.perf_counter()
        built, results, rss_hold = run_shape(
            shape,
            shared=shared,
            windows=windows,
            seconds=seconds,
            hold_fraction=args.hold_fraction,
            profile=profile,
        )
        entries = shape.resources * shape.images
        label = f"{shape.resources:,} × {shape.images:,}"
        per_entry[label] = built.rss_added_mb * 2**20 / entries
        build_rows.append(
            f"{label:<26} {entries:>12,} {built.build_s:>9.1f} {built.rss_added_mb:>10.0f} "
            f"{built.rss_added_mb * 2**20 / entries:>11.0f} {built.gc_pause_s * 1000:>10.0f} "
            f"{built.rss_mb:>10.0f} {rss_hold - built.rss_mb:>+10.0f}"
        )
        for r in results:
            decide = sorted(r.decide_ns)
            done = sorted(r.done_ns)
            median = quantile(decide, 0.5)
            met = median < TARGET_MEDIAN_US
            ok &= met
            mode_rows.append(
                f"{label:<26} {r.mode:<9} {r.windows:>8,} {r.used:>7,} {r.waiting:>8,} "
                f"{r.decisions_per_s():>12,.0f} {median:>10.1f} {quantile(decide, 0.99):>8.1f} "
                f"{decide[-1] / 1000:>9.1f} {quantile(done, 0.5):>13.1f} "
                f"{'ok' if met else 'MISSED':>7}"
            )
        print(f"[{label}: {time.perf_counter() - start:.1f} s]", file=sys.stderr, flush=True)
        if profile is not None:
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(15)
            print(f"--- cProfile of the decision loops, {label} ---")
            print(out.getvalue())
        del built, results
        gc.collect()

    print(
        f"{'shape':<26} {'ring entries':>12} {'build s':>9} {'RSS +MB':>10} {'B/entry':>11} "
        f"{'full GC ms':>10} {'RSS MB':>10} {'+hold MB':>10}"
    )
    print("\n".join(build_rows))
    print()
    print(header)
    print("\n".join(mode_rows))
    print()
    print(f"target: median check_window < {TARGET_MEDIAN_US:g} µs: {'met' if ok else 'MISSED'}")
    print_memory_target(None if shared else per_entry.get("1,000 × 10,000"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
