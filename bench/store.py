"""The pull-through store (docs/spec.md §15) in ``bench/proxy.py``'s run: ``--only store`` and
``--only fanout`` there (both are in its default run). Everything on 127.0.0.1.

(c) **A blob from the store**: a kuikproxy of its own with ``cache.blobs`` (a fresh store under
    the run's temp dir, ``paced: false`` before the bench registry) reads the blob once (a
    hashed ``curl``: the fill), then serves it from the disk. Side by side, interleaved, with
    the same client as (a) (``curl -o /dev/null``, one at a time; ``--store-gets`` each, 9 by
    default: a transfer takes under half a second): the registry itself, and
    nginx serving *the store's own file* as static content (``sendfile on; tcp_nopush on``,
    ``root`` at the store's directory). MiB/s from curl, RSS growth as in (a), and each
    server's CPU per transfer (curl is the bottleneck: the servers idle most of it). Afterwards
    kuikproxy's ``/status`` must say ``reads.registry == 1``: every measured GET came from the
    disk.
(d) **Ten clients, one blob**: ``--clients`` curls at once (each ``-o`` a file on /dev/shm,
    hashed once all are done, so no client pays for hashing or for a disk) GET the blob through
    a fresh kuikproxy: with a fresh, empty store, and without a store (the baseline), alternately,
    ``--rounds`` times each. The upstream is a second registry process on the same storage with
    its combined access log on: the bytes it sent for the blob are summed from that log (Go's
    count of the bytes written), and checked against kuikproxy's ``/status`` ``cache.store``.
    Total time is from starting the curls to the last one ending.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.proxy import (
    BENCH_HOST,
    BLOB_REPO,
    CURL,
    CURL_OUT,
    BlobPath,
    MiB,
    Peer,
    QuietRegistry,
    RssSampler,
    Setup,
    blob_table,
    check_bytes,
    children,
    measure_blobs,
    serve_kuikproxy,
)
from tests.e2e.peers import (
    LOOPBACK,
    Nginx,
    clean_env,
    free_port,
    http,
)

TARGET_STORE_RATIO = 1.0  # of nginx's MiB/s serving the same file with sendfile
STORE_MAX = "10Gi"
CLIENT_DIR = Path("/dev/shm")  # the fan-out clients' files: memory, no disk between them
# a line of the combined access log: "GET /v2/.../blobs/sha256:... HTTP/1.1" 200 536870912
ACCESS = re.compile(r'"(GET|HEAD) (\S+) HTTP/[\d.]+" (\d{3}) (\d+|-)')


# --- peers ----------------------------------------------------------------------------------


class CountingRegistry(QuietRegistry):
    """A second registry process on ``storage`` (read only here) with its combined access log
    on (to stdout, so in its log file): how many bytes of the blob it sent, and how often."""

    def __init__(self, workdir: Path, storage: Path) -> None:
        super().__init__(workdir)
        self.storage = storage

    def config(self) -> dict[str, Any]:
        config = super().config()
        config["storage"]["filesystem"]["rootdirectory"] = str(self.storage)
        config["log"] = {"level": "error", "accesslog": {"disabled": False}}
        return config

    def sent(self, digest: str, since: int) -> tuple[int, int]:
        """(GETs answered 200, bytes sent) for ``digest``'s blob, in the log past offset
        ``since``; waits up to 2 s for lines to settle (the log trails the answer)."""
        last: tuple[int, int] | None = None
        deadline = time.monotonic() + 2
        while True:
            with self.log_file.open("rb") as f:
                f.seek(since)
                text = f.read().decode(errors="replace")
            gets = sent = 0
            for m in ACCESS.finditer(text):
                if m[1] == "GET" and m[2].endswith(f"/blobs/{digest}") and m[3] == "200":
                    gets += 1
                    sent += int(m[4]) if m[4] != "-" else 0
            if (gets, sent) == last or time.monotonic() > deadline:
                return gets, sent
            last = (gets, sent)
            time.sleep(0.2)

    def log_size(self) -> int:
        try:
            return self.log_file.stat().st_size
        except FileNotFoundError:
            return 0


def start_kuikproxy(workdir: Path, upstream: str, store: Path | None) -> Peer:
    """A kuikproxy of its own before ``upstream`` (``paced: false``), with a store at ``store``
    (absent: none), logging at ``warning`` as bench/proxy.py's does."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config: dict[str, Any] = {
        "listen": f"{LOOPBACK}:{port}",
        "registries": {BENCH_HOST: {"upstream": upstream, "paced": False}},
    }
    if store is not None:
        config["cache"] = {"blobs": {"path": str(store), "maxBytes": STORE_MAX}}
    return serve_kuikproxy(workdir, port, config)


def store_status(kuik: Peer) -> dict[str, Any]:
    code, _, body = http(kuik.url + "/status")
    if code != 200:
        raise RuntimeError(f"/status: {code}")
    store: dict[str, Any] | None = json.loads(body)["cache"].get("store")
    if store is None:
        raise RuntimeError("kuikproxy's /status has no cache.store: is the store on?")
    return store


def start_static_nginx(workdir: Path, root: Path, workers: int) -> Peer:
    """nginx serving files under ``root`` as they are, with ``sendfile``."""
    nginx = Nginx(
        workdir,
        http="    sendfile on;\n    tcp_nopush on;\n    default_type application/octet-stream;",
        server=f"""        location /blobs/ {{
            root {root};
        }}""",
        workers=workers,
        access_log="combined buffer=64k",
    ).start()
    return Peer("nginx", nginx.url, nginx.process, nginx.log_file)


def blob_file(store: Path, digest: str) -> Path:
    algorithm, _, hexpart = digest.partition(":")
    return store / "blobs" / algorithm / hexpart


# --- (c) a blob from the store --------------------------------------------------------------


def measure_store(setup: Setup, digest: str, args: argparse.Namespace) -> list[str]:
    workdir = setup.workdir / "store-row"
    store = workdir / "store"
    size = args.blob_mib * MiB
    blob = f"/v2/{BLOB_REPO}/blobs/{digest}"
    peers: list[Peer] = []
    try:
        kuik = start_kuikproxy(workdir / "kuikproxy", setup.registry.url, store)
        peers.append(kuik)
        url = f"{kuik.url}{blob}?ns={BENCH_HOST}"
        t0 = time.monotonic()
        check_bytes(url, digest)  # the fill: read from the registry into the store, once
        filled = time.monotonic() - t0
        deadline = time.monotonic() + 10
        while store_status(kuik)["blobs"] < 1 or not blob_file(store, digest).exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the blob never reached the store:\n{kuik.log}")
            time.sleep(0.05)
        nginx = start_static_nginx(workdir / "nginx", store, args.nginx_workers)
        peers.append(nginx)
        paths = [
            BlobPath("registry", setup.registry.url + blob, lambda: [setup.registry_pid]),
            BlobPath("nginx-sendfile", f"{nginx.url}/blobs/{digest.replace(':', '/')}",
                     lambda: children(nginx.pid)),
            BlobPath("kuikproxy-store", url, lambda: [kuik.pid]),
        ]  # fmt: skip
        measure_blobs(paths, digest, size, args.store_gets)
        status = store_status(kuik)
    finally:
        for peer in reversed(peers):
            peer.stop()
    reads, served = status["reads"], status["servedBytes"]
    gets = 1 + 1 + args.store_gets  # the fill, check_bytes's transfer, the measured ones
    from_disk = reads.get("registry") == 1 and reads.get("store") == gets - 1
    title = (
        f"(c) a {args.blob_mib} MiB blob already in kuikproxy's store (filled by one GET, "
        f"{filled:.1f} s) vs nginx serving the store's own file (sendfile on, tcp_nopush on); "
        f"curl -o /dev/null, {args.store_gets} GETs per path, interleaved"
    )
    return [
        *blob_table(paths, title, TARGET_STORE_RATIO, size),
        f"kuikproxy /status cache.store: reads {json.dumps(reads)}, servedBytes "
        f"{json.dumps(served)}: " + ("every measured GET from the disk" if from_disk
                                      else "NOT all from the disk"),
    ]  # fmt: skip


# --- (d) ten clients, one blob ---------------------------------------------------------------


@dataclass
class FanoutRun:
    seconds: float  # from starting the clients to the last one ending
    client_seconds: list[float]  # each client's curl time_total
    upstream_gets: int
    upstream_bytes: int
    rss_growth_mib: float
    status: dict[str, Any] | None  # /status cache.store after, with a store


def fanout_run(
    workdir: Path, registry: CountingRegistry, digest: str, size: int, *, clients: int,
    store: Path | None,
) -> FanoutRun:  # fmt: skip
    kuik = start_kuikproxy(workdir, registry.url, store)
    url = f"{kuik.url}/v2/{BLOB_REPO}/blobs/{digest}?ns={BENCH_HOST}"
    out = Path(tempfile.mkdtemp(prefix="kuik-bench-fanout-", dir=CLIENT_DIR))
    try:
        since = registry.log_size()
        with RssSampler(lambda: [kuik.pid]) as rss:
            t0 = time.perf_counter()
            procs = [
                subprocess.Popen(
                    [*CURL, "-o", str(out / str(i)), "-w", CURL_OUT, url],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    env=clean_env(),
                    text=True,
                )
                for i in range(clients)
            ]
            results = [p.communicate(timeout=300) for p in procs]
            seconds = time.perf_counter() - t0
        times = []
        for i, (stdout, stderr) in enumerate(results):
            code, got, took = stdout.split()
            if code != "200" or int(got) != size:
                raise RuntimeError(f"client {i}: {code}, {got} of {size} bytes; {stderr}")
            times.append(float(took))
        with ThreadPoolExecutor(2) as pool:  # hashlib lets go of the GIL
            digests = list(pool.map(file_digest, (out / str(i) for i in range(clients))))
        wrong = [i for i, d in enumerate(digests) if d != digest]
        if wrong:
            raise RuntimeError(f"clients {wrong} got bytes of another digest")
        status = store_status(kuik) if store is not None else None
        gets, sent = registry.sent(digest, since)
        return FanoutRun(seconds, times, gets, sent, rss.growth_mib, status)
    finally:
        kuik.stop()
        shutil.rmtree(out, ignore_errors=True)
        if store is not None:
            shutil.rmtree(store, ignore_errors=True)


def file_digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(4 * MiB):
            sha.update(chunk)
    return "sha256:" + sha.hexdigest()


def measure_fanout(setup: Setup, digest: str, args: argparse.Namespace) -> list[str]:
    workdir = setup.workdir / "fanout"
    size, clients = args.blob_mib * MiB, args.clients
    registry = CountingRegistry(workdir / "registry", setup.registry.workdir / "storage")
    runs: dict[str, list[FanoutRun]] = {"kuikproxy-store": [], "kuikproxy-nostore": []}
    with registry:
        for r in range(args.rounds):
            for name, runs_of in runs.items():
                store = workdir / f"store-{r}" if name == "kuikproxy-store" else None
                runs_of.append(
                    fanout_run(
                        workdir / f"{name}-{r}",
                        registry,
                        digest,
                        size,
                        clients=clients,
                        store=store,
                    )
                )
    return fanout_table(runs, args, size)


def fanout_table(
    runs: dict[str, list[FanoutRun]], args: argparse.Namespace, size: int
) -> list[str]:
    clients = args.clients
    lines = [
        f"(d) {clients} clients GET one {args.blob_mib} MiB blob at once (curl -o /dev/shm, "
        f"hashed after: all {clients} right in every run), {args.rounds} rounds, alternating; "
        "a fresh kuikproxy per run, with a fresh store or none; upstream bytes from the "
        "registry's access log",
        "",
        f"{'path':<18} {'runs total s':<20} {'median s':>8} {'agg MiB/s':>9} "
        f"{'slowest client s':>16} {'upstream GETs':>13} {'upstream ×blob':>14} "
        f"{'RSS growth MiB':>14}",
    ]
    medians: dict[str, float] = {}
    for name, of in runs.items():
        median = statistics.median(r.seconds for r in of)
        medians[name] = median
        gets = "/".join(str(r.upstream_gets) for r in of)
        times = " ".join(f"{r.seconds:.2f}" for r in of)
        ratio = "/".join(f"{r.upstream_bytes / size:.2f}" for r in of)
        slowest = statistics.median(max(r.client_seconds) for r in of)
        growth = max(r.rss_growth_mib for r in of)
        lines.append(
            f"{name:<18} {times:<20} {median:>8.2f} {clients * size / MiB / median:>9.0f} "
            f"{slowest:>16.2f} {gets:>13} {ratio:>14} {growth:>14.2f}"
        )
    stored = runs["kuikproxy-store"]
    once = all(r.upstream_gets == 1 and r.upstream_bytes == size for r in stored)
    status_ok = all(
        r.status is not None
        and r.status["reads"].get("registry") == 1
        and sum(r.status["servedBytes"].values()) == clients * size
        for r in stored
    )
    last = stored[-1].status or {}
    lines += [
        "",
        f"store's /status after each run: reads {json.dumps(last.get('reads'))}, servedBytes "
        f"{json.dumps(last.get('servedBytes'))} (last run); reads.registry == 1 and "
        f"{clients}× the blob served in every run: " + ("yes" if status_ok else "NO"),
        "target: with the store the registry sends the blob once (1.00×): "
        + ("met" if once else "MISSED")
        + "; total time store/no store: "
        + f"{medians['kuikproxy-store'] / medians['kuikproxy-nostore']:.2f}×",
    ]
    return lines
