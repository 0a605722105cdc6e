"""kuikproxy as a proxy: blob throughput and kept-answer HEADs, side by side with the registry
itself, a tuned nginx ``proxy_pass`` and (for HEADs) a bare aiohttp handler, in one run.

Layout (everything on 127.0.0.1, nothing else is ever contacted; all under one temp dir):

* one CNCF distribution registry (Debian ``docker-registry``, logs at ``error`` so that its log
  does not slow it) holding ``bench/big``: a 512 MiB blob of random bytes, uploaded as one
  streamed ``PATCH`` (never held whole in memory), and a small OCI image ``bench/app:v1``;
* nginx (``daemon off``, 1 worker by default: kuikproxy is one process) with ``proxy_pass`` to an
  ``upstream`` block with ``keepalive 64``, ``proxy_buffering on; proxy_buffers 16 256k;
  proxy_max_temp_file_size 0; proxy_http_version 1.1; proxy_set_header Connection ""``;
* kuikproxy as a subprocess (``python -m kuikproxy serve --config FILE --log-level warning``)
  with two names for the same registry: ``registry.bench:5000`` (``paced: false``: straight
  through) and ``registry.kept:5000`` (paced, ``check: {interval: 100ms}``);
* a bare aiohttp app (this file, ``--bare-server``) answering ``HEAD`` from a dict, for the
  HEAD measurement only;
* the TLS-upstream case (real registries are HTTPS): a second registry process on the same
  storage serving TLS (a leaf for ``127.0.0.1`` and ``registry.tls`` from a throwaway CA), a
  second nginx with ``proxy_pass https://`` (``proxy_ssl_verify on`` against that CA, TLS
  sessions reused, ``keepalive 64``) and kuikproxy's ``registry.tls:5000`` (``paced: false``,
  ``tls: {caFile: ...}``); clients still speak plain HTTP to both proxies.

(a) **Blob**: ``curl -o /dev/null`` (a separate process) reads the blob through each path
    (direct, nginx, kuikproxy; then the same three with a TLS upstream), ``--rounds`` times,
    all six paths interleaved; MiB/s from curl's own ``time_total``. A thread samples
    the proxy's VmRSS every 10 ms (nginx: its workers summed); growth is the peak during the
    transfer minus the value just before it. One unmeasured transfer per path first, hashed, to
    check the bytes and warm the page cache and connection pools.
(b) **HEAD**: the load generator (this file, ``--load``: asyncio protocols on raw keep-alive
    sockets, one request in flight per connection) runs ``--concurrency`` connections for
    ``--seconds`` (after 1 s of warm-up) against each target. Through kuikproxy it HEADs the
    manifest on the paced ``registry.kept:5000`` after one HEAD (``Kuik-Resource: warm``) has
    waited for its window and left a kept answer. R1 lets a kept answer serve a resource only
    if it is newer than that resource's previous read of the image, so a resource that asks
    again is held for its next lap: to measure the kept-answer path (``Reuse``) every request
    names a new resource (``Kuik-Resource: b<conn>-<n>``), which also makes a new ring per
    request (``--same-resource`` sends ``Kuik-Resource: bench`` instead, to see the held path).

(c), (d) **The pull-through store** (``bench/store.py``): a blob from kuikproxy's store against
    nginx serving the same file with ``sendfile``; ten clients of one blob not yet stored, with
    a store and without, the bytes the registry sent counted.

Run: ``/tmp/v/bin/python bench/proxy.py`` (``--blob-mib 64 --seconds 3`` for a quick run;
``--only blob,head,store,fanout`` picks cases, all by default; ``--py-spy DIR`` records py-spy
flame graphs of kuikproxy during its HEAD runs when py-spy exists; ``--baseline TREE`` adds a
second kuikproxy, imported from another source tree, to the blob rows, side by side).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import hashlib
import http.client
import json
import os
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import aiohttp  # noqa: E402
import yaml  # noqa: E402
from aiohttp import web  # noqa: E402

from tests.certs import Authority, cert_pem, certificate, key_pem, new_key  # noqa: E402
from tests.e2e.peers import (  # noqa: E402
    LOOPBACK,
    OCI_INDEX,
    DistributionRegistry,
    Nginx,
    RegistryClient,
    build_image,
    clean_env,
    cpu_seconds,
    free_port,
    push_image,
    rss_kib,
    spawn,
    stop_process,
    tail,
    wait_until_http,
)

MiB = 1024 * 1024
UPLOAD_CHUNK = MiB
BENCH_HOST = "registry.bench:5000"  # paced: false
KEPT_HOST = "registry.kept:5000"  # paced, check every 100 ms
STEADY_HOST = "registry.steady:5000"  # paced, check every 1 ms: warms thousands of tags fast
TLS_HOST = "registry.tls:5000"  # paced: false, upstream over TLS
TLS_NAME = "registry.tls"  # the TLS registry's certificate names it and 127.0.0.1
BLOB_REPO = "bench/big"
IMAGE_REPO, IMAGE_TAG = "bench/app", "v1"
CURL = ("curl", "-sS", "--noproxy", "*")
CURL_OUT = "%{http_code} %{size_download} %{time_total}"
SAMPLE_EVERY = 0.010
WARMUP_SECONDS = 1.0
LOAD_LIFETIME = 120.0  # a load generator or bare server stops by itself after this
TARGET_BLOB_RATIO = 0.9  # of tuned nginx's MiB/s
TARGET_TLS_RATIO = 0.85  # of tuned nginx's MiB/s, both with a TLS upstream
TARGET_RSS_MIB = 4.0
TARGET_RPS = 20_000
TARGET_P99_MS = 5.0


# --- processes ------------------------------------------------------------------------------


def children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(p) for p in f.read().split()]
    return found


class RssSampler:
    """Samples the summed VmRSS of ``pids()`` every 10 ms in a thread; ``peak`` since start."""

    def __init__(self, pids: Callable[[], Sequence[int]]) -> None:
        self._pids = pids
        self._stop = threading.Event()
        self.before = 0
        self.peak = 0
        self.samples = 0
        self._thread = threading.Thread(target=self._run, daemon=True)

    def current(self) -> int:
        return sum(rss_kib(p) for p in self._pids())

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.current())
            self.samples += 1
            self._stop.wait(SAMPLE_EVERY)

    def __enter__(self) -> RssSampler:
        self.before = self.peak = self.current()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.current())

    @property
    def growth_mib(self) -> float:
        return (self.peak - self.before) / 1024


@dataclass
class Peer:
    """A process this bench started, stopped by :func:`stop_process` (SIGTERM, then SIGKILL)."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self) -> None:
        stop_process(self.process)


class QuietRegistry(DistributionRegistry):
    """The e2e registry with its logs at ``error``: a log line per request would slow it."""

    def config(self) -> dict[str, Any]:
        config = super().config()
        config["log"] = {"level": "error", "accesslog": {"disabled": True}}
        return config


class TLSRegistry(QuietRegistry):
    """A second registry process on ``storage`` (another registry's, read only here), serving
    TLS with a leaf that ``ca`` signed for 127.0.0.1 and :data:`TLS_NAME`."""

    def __init__(self, workdir: Path, storage: Path, ca: Path) -> None:
        super().__init__(workdir)
        self.storage, self.ca = storage, ca

    @property
    def url(self) -> str:
        return f"https://{self.host_port}"

    def config(self) -> dict[str, Any]:
        config = super().config()
        config["storage"]["filesystem"]["rootdirectory"] = str(self.storage)
        cert, key = self.workdir / "cert.pem", self.workdir / "key.pem"
        config["http"]["tls"] = {"certificate": str(cert), "key": str(key)}
        return config

    def start(self) -> TLSRegistry:
        self.workdir.mkdir(parents=True, exist_ok=True)
        authority = Authority("kuikproxy bench CA")
        leaf_key = new_key()
        leaf = certificate(
            TLS_NAME, leaf_key, issuer=(authority.cert, authority.key), ips=[LOOPBACK],
            dns=[TLS_NAME],
        )  # fmt: skip
        (self.workdir / "cert.pem").write_bytes(cert_pem(leaf))
        (self.workdir / "key.pem").write_bytes(key_pem(leaf_key))
        self.ca.write_bytes(cert_pem(authority.cert))
        self.port = free_port()
        self._process = self.launch()
        context = ssl.create_default_context(cafile=str(self.ca))
        deadline = time.monotonic() + 20
        while True:  # wait_until_http trusts the system roots only
            try:
                with urllib.request.urlopen(self.url + "/v2/", timeout=1, context=context):
                    return self
            except urllib.error.HTTPError:
                return self  # answering, if only with a refusal
            except OSError as error:
                if self._process.poll() is not None or time.monotonic() > deadline:
                    log = tail(self.log_file)
                    raise RuntimeError(f"TLS registry did not start:\n{log}") from error
                time.sleep(0.05)


def start_nginx(workdir: Path, upstream_port: int, workers: int, ca: Path | None = None) -> Peer:
    """nginx before the registry at ``upstream_port``: over TLS, verified against ``ca``,
    when ``ca`` is given."""
    scheme, tls = "http", ""
    if ca is not None:
        scheme = "https"
        tls = f"""
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate {ca};
            proxy_ssl_name {TLS_NAME};
            proxy_ssl_server_name on;
            proxy_ssl_session_reuse on;"""
    nginx = Nginx(
        workdir,
        http=f"""    upstream registry {{
        server {LOOPBACK}:{upstream_port};
        keepalive 64;
    }}""",
        server=f"""        client_max_body_size 0;
        location / {{
            proxy_pass {scheme}://registry;{tls}
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $http_host;
            proxy_buffering on;
            proxy_buffers 16 256k;
            proxy_max_temp_file_size 0;
        }}""",
        workers=workers,
        access_log="combined buffer=64k",
    ).start()
    return Peer("nginx", nginx.url, nginx.process, nginx.log_file)


def start_kuikproxy(
    workdir: Path, upstream: str, tls_upstream: str, ca: Path, tree: str | None = None
) -> Peer:
    """kuikproxy with the bench's registries; from the source tree ``tree`` if given."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = {
        "listen": f"{LOOPBACK}:{port}",
        # the worst case makes a new resource (a ring) per request, hundreds of thousands of
        # them: past the default limits on purpose, to measure the kept-answer path they take
        "limits": {"memory": "32Gi", "maxResources": 10_000_000, "maxImages": 10_000_000},
        "registries": {
            BENCH_HOST: {"upstream": upstream, "paced": False},
            KEPT_HOST: {"upstream": upstream, "check": {"interval": "100ms"}},
            STEADY_HOST: {"upstream": upstream, "check": {"interval": "1ms"}},
            TLS_HOST: {"upstream": tls_upstream, "paced": False, "tls": {"caFile": str(ca)}},
        },
    }
    return serve_kuikproxy(workdir, port, config, tree)


def serve_kuikproxy(
    workdir: Path, port: int, config: dict[str, Any], tree: str | None = None
) -> Peer:
    """``kuikproxy serve`` in a process of its own with ``config`` (listening on ``port``),
    logging at ``warning``, once it answers ``/healthz``; kuikproxy imported from ``tree``
    (``PYTHONPATH``) when given."""
    path = workdir / "kuikproxy.yaml"
    path.write_text(yaml.safe_dump(config))
    log = workdir / "kuikproxy.log"
    # -P: not the working directory first on sys.path (``-m`` puts it there), or a checkout
    # run from would win over ``tree``
    python = [sys.executable, "-P"] if tree else [sys.executable]
    args = [*python, "-m", "kuikproxy", "serve", "--config", str(path)]
    env = clean_env(PYTHONUNBUFFERED="1", **({"PYTHONPATH": tree} if tree else {}))
    process = spawn([*args, "--log-level", "warning"], log, env)
    url = f"http://{LOOPBACK}:{port}"
    wait_until_http(url + "/healthz", process, log)
    return Peer("kuikproxy", url, process, log)


def start_self(workdir: Path, name: str, *args: str) -> subprocess.Popen[bytes]:
    """This file in another process (stdout piped; stops when its stdin closes)."""
    with (workdir / f"{name}.err").open("ab") as err:
        return subprocess.Popen(
            [sys.executable, __file__, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            env=clean_env(),
        )


def start_bare(workdir: Path, headers: dict[str, str]) -> Peer:
    port = free_port()
    path = f"/v2/{IMAGE_REPO}/manifests/{IMAGE_TAG}"
    answers = workdir / "bare.json"
    answers.write_text(json.dumps({path: headers}))
    process = start_self(workdir, "bare", "--bare-server", str(port), str(answers))
    url = f"http://{LOOPBACK}:{port}"
    wait_until_http(url + "/", process, workdir / "bare.err")
    return Peer("bare aiohttp", url, process, workdir / "bare.err")


# --- seeding --------------------------------------------------------------------------------


def push_big_blob(base: str, repository: str, mib: int) -> str:
    """Upload ``mib`` MiB of random bytes as one streamed PATCH; returns the digest."""
    parts = urllib.parse.urlsplit(base)
    connection = http.client.HTTPConnection(parts.hostname or LOOPBACK, parts.port, timeout=300)
    try:
        connection.request("POST", f"/v2/{repository}/blobs/uploads/")
        answer = connection.getresponse()
        answer.read()
        if answer.status != 202:
            raise RuntimeError(f"upload start: {answer.status}")
        location = urllib.parse.urlsplit(answer.headers["Location"])
        sha = hashlib.sha256()
        connection.putrequest("PATCH", f"{location.path}?{location.query}")
        connection.putheader("Content-Type", "application/octet-stream")
        connection.putheader("Content-Length", str(mib * MiB))
        connection.endheaders()
        for _ in range(mib):
            chunk = os.urandom(UPLOAD_CHUNK)
            sha.update(chunk)
            connection.send(chunk)
        answer = connection.getresponse()
        answer.read()
        if answer.status != 202:
            raise RuntimeError(f"upload PATCH: {answer.status}")
        digest = "sha256:" + sha.hexdigest()
        location = urllib.parse.urlsplit(answer.headers["Location"])
        query = urllib.parse.urlencode({"digest": digest})
        connection.request("PUT", f"{location.path}?{location.query}&{query}", body=b"")
        answer = connection.getresponse()
        answer.read()
        if answer.status != 201:
            raise RuntimeError(f"upload PUT: {answer.status}")
        return digest
    finally:
        connection.close()


# --- (a) blob throughput --------------------------------------------------------------------


@dataclass
class BlobRun:
    mib_s: float
    rss_growth_mib: float
    cpu_s: float  # the server's CPU seconds (every thread) during the transfer


@dataclass
class BlobPath:
    name: str
    url: str
    pids: Callable[[], Sequence[int]]
    curl: tuple[str, ...] = ()  # more options for curl (the TLS registry's CA)
    runs: list[BlobRun] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(r.mib_s for r in self.runs)

    @property
    def best(self) -> float:
        return max(r.mib_s for r in self.runs)

    @property
    def growth(self) -> float:
        return max(r.rss_growth_mib for r in self.runs)

    def cpu_ms_per_mib(self, size: int) -> float:
        return statistics.median(r.cpu_s for r in self.runs) * 1000 / (size / MiB)


def curl(url: str, size: int, options: Sequence[str] = ()) -> float:
    """Read ``url`` with curl into /dev/null; MiB/s."""
    out = subprocess.run(
        [*CURL, *options, "-o", "/dev/null", "-w", CURL_OUT, url],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=120,
        check=False,
    )
    code, got, seconds = out.stdout.split()
    if code != "200" or int(got) != size:
        raise RuntimeError(f"curl {url}: {code}, {got} of {size} bytes; {out.stderr}")
    return size / MiB / float(seconds)


def check_bytes(url: str, digest: str, options: Sequence[str] = ()) -> None:
    """One unmeasured transfer: the bytes must be the blob's."""
    sha = hashlib.sha256()
    args = [*CURL, *options, url]
    with subprocess.Popen(args, stdout=subprocess.PIPE, env=clean_env()) as process:
        assert process.stdout is not None
        while chunk := process.stdout.read(MiB):
            sha.update(chunk)
    if "sha256:" + sha.hexdigest() != digest:
        raise RuntimeError(f"{url}: wrong bytes")


def measure_blobs(paths: list[BlobPath], digest: str, size: int, rounds: int) -> None:
    for path in paths:
        check_bytes(path.url, digest, path.curl)
    for _ in range(rounds):
        for path in paths:
            pids = path.pids()
            cpu = cpu_seconds(pids)
            with RssSampler(path.pids) as rss:
                speed = curl(path.url, size, path.curl)
            path.runs.append(BlobRun(speed, rss.growth_mib, cpu_seconds(pids) - cpu))


def blob_table(paths: list[BlobPath], title: str, target: float, size: int) -> list[str]:
    """The rows of ``paths`` (direct, nginx, kuikproxy, then a baseline kuikproxy if any),
    kuikproxy judged against ``target``× nginx. CPU: the server process's (every thread; the
    receiving side's TCP work on loopback included), median of the runs, per MiB."""
    direct, nginx = paths[0], paths[1]
    lines = [
        title,
        "",
        f"{'path':<16} {'runs MiB/s':<26} {'CPU ms/MiB':>10} {'median':>8} {'best':>8} "
        f"{'/direct':>8} {'/nginx':>7} {'RSS growth MiB (max)':>21}",
    ]
    for p in paths:
        runs = " ".join(f"{r.mib_s:.0f}" for r in p.runs)
        growth = "—" if p is direct else f"{p.growth:.2f}"
        lines.append(
            f"{p.name:<16} {runs:<26} {p.cpu_ms_per_mib(size):>10.2f} {p.median:>8.0f} "
            f"{p.best:>8.0f} {p.median / direct.median:>8.2f} {p.median / nginx.median:>7.2f} "
            f"{growth:>21}"
        )
    for p in paths[3:]:  # a baseline: its ratio per round, too
        pairs = zip(p.runs, nginx.runs, strict=True)
        rounds = " ".join(f"{k.mib_s / n.mib_s:.2f}" for k, n in pairs)
        lines.append(f"{p.name}: {p.median / nginx.median:.2f}× nginx (per round: {rounds})")
    kuik = paths[2]
    ratio = kuik.median / nginx.median
    pairs = zip(kuik.runs, nginx.runs, strict=True)
    per_round = [f"{k.mib_s / n.mib_s:.2f}" for k, n in pairs]
    lines += [
        "",
        f"RSS growth per run, MiB: nginx {' '.join(f'{r.rss_growth_mib:.2f}' for r in nginx.runs)}"
        f"; kuikproxy {' '.join(f'{r.rss_growth_mib:.2f}' for r in kuik.runs)}",
        f"target: {kuik.name} ≥ {target}× {nginx.name} (median): {ratio:.2f}× "
        + ("met" if ratio >= target else "MISSED")
        + f" (per round, same round's nginx: {' '.join(per_round)})",
        f"target: kuikproxy RSS growth < {TARGET_RSS_MIB:g} MiB: {kuik.growth:.2f} MiB "
        + ("met" if kuik.growth < TARGET_RSS_MIB else "MISSED"),
    ]
    return lines


# --- (b) HEAD load --------------------------------------------------------------------------


@dataclass
class LoadResult:
    name: str
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    statuses: dict[str, int]
    errors: int
    cpu_s: float = 0.0
    rss_before_mib: float = 0.0
    rss_after_mib: float = 0.0

    @property
    def rps(self) -> float:
        return self.requests / self.seconds


def run_load(
    workdir: Path,
    name: str,
    *,
    url: str,
    path: str,
    headers: dict[str, str],
    args: argparse.Namespace,
    vary_resource: bool,
    pids: Sequence[int],
    py_spy: Path | None = None,
    walk_images: int = 0,
) -> LoadResult:
    """The load generator in another process against ``url``; the server's CPU and RSS too."""
    spec = json.dumps(
        {
            "port": urllib.parse.urlsplit(url).port,
            "path": path,
            "headers": headers,
            "concurrency": args.concurrency,
            "seconds": args.seconds,
            "vary_resource": vary_resource,
            "walk_images": walk_images,
        }
    )
    rss_before = sum(rss_kib(p) for p in pids) / 1024
    label = f"load-{name.replace(' ', '-')}"
    process = start_self(workdir, label, "--load", spec)
    profiler: subprocess.Popen[bytes] | None = None
    try:
        assert process.stdout is not None
        ready = process.stdout.readline()  # "measuring" after the warm-up
        if not ready:
            raise RuntimeError(
                f"load generator for {name} failed: {tail(workdir / f'{label}.err')}"
            )
        cpu_start = cpu_seconds(pids)
        if py_spy is not None:
            svg = py_spy / f"{name.replace(' ', '-')}.svg"
            profiler = subprocess.Popen(
                [
                    *(py_spy_binary() or "py-spy", "record", "-p", str(pids[0]), "-o", str(svg)),
                    *("-d", str(int(args.seconds)), "-r", "200", "--nonblocking"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        out, _ = process.communicate(timeout=args.seconds + 60)
        cpu = cpu_seconds(pids) - cpu_start
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        if profiler is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                profiler.wait(30)
            stop_process(profiler)
    data = json.loads(out)
    return LoadResult(
        name,
        data["requests"],
        data["seconds"],
        data["p50_ms"],
        data["p99_ms"],
        data["max_ms"],
        data["statuses"],
        data["errors"],
        cpu,
        rss_before,
        sum(rss_kib(p) for p in pids) / 1024,
    )


def py_spy_binary() -> str | None:
    return shutil.which("py-spy") or (
        str(Path(sys.executable).with_name("py-spy"))
        if Path(sys.executable).with_name("py-spy").exists()
        else None
    )


def head_table(
    results: list[LoadResult], args: argparse.Namespace, note: str, steady: str
) -> list[str]:
    by = {r.name: r for r in results}
    direct, nginx = by["direct"], by["nginx"]
    lines = [
        f"(b) HEAD of one manifest: {args.concurrency} keep-alive connections, "
        f"{args.seconds:g} s each (after {WARMUP_SECONDS:g} s of warm-up)",
        f"    kuikproxy: {note}",
        f"    kuikproxy steady: {steady}",
        "",
        f"{'target':<14} {'requests':>9} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'max ms':>7} {'/direct':>8} {'/nginx':>7} {'server CPU':>11} {'RSS MiB':>15}  statuses",
    ]
    for r in results:
        statuses = ",".join(f"{k}×{v}" for k, v in sorted(r.statuses.items()))
        if r.errors:
            statuses += f" errors×{r.errors}"
        lines.append(
            f"{r.name:<14} {r.requests:>9,} {r.rps:>8,.0f} {r.p50_ms:>7.2f} {r.p99_ms:>7.2f} "
            f"{r.max_ms:>7.1f} {r.rps / direct.rps:>8.2f} {r.rps / nginx.rps:>7.2f} "
            f"{r.cpu_s / r.seconds:>10.0%} {r.rss_before_mib:>6.1f}→{r.rss_after_mib:<6.1f}"
            f"  {statuses}"
        )
    lines.append("")
    for name in ("kuikproxy", "kuikproxy steady"):
        kuik = by[name]
        met = (
            kuik.rps >= TARGET_RPS and kuik.p99_ms < TARGET_P99_MS and set(kuik.statuses) == {"200"}
        )
        lines.append(
            f"target: {name} ≥ {TARGET_RPS:,} req/s with p99 < {TARGET_P99_MS:g} ms: "
            f"{kuik.rps:,.0f} req/s, p99 {kuik.p99_ms:.2f} ms " + ("met" if met else "MISSED")
        )
    # the ratio targets: against the bare handler in the same run, which the load moves too
    bare = by["bare aiohttp"]
    for name, ratio, p99 in (("kuikproxy steady", 0.8, TARGET_P99_MS), ("kuikproxy", 0.6, None)):
        kuik = by[name]
        met = kuik.rps >= ratio * bare.rps and set(kuik.statuses) == {"200"}
        met = met and (p99 is None or kuik.p99_ms < p99)
        latency = "" if p99 is None else f" with p99 < {p99:g} ms"
        lines.append(
            f"target: {name} ≥ {ratio:g}× bare aiohttp{latency}: {kuik.rps / bare.rps:.2f}×"
            + (f", p99 {kuik.p99_ms:.2f} ms" if p99 is not None else "")
            + (" met" if met else " MISSED")
        )
    return lines


# --- the load generator (a separate process) ------------------------------------------------


class _Connection(asyncio.Protocol):
    """One keep-alive connection, one HEAD in flight; a HEAD answer has no body."""

    def __init__(self, load: _Load, index: int) -> None:
        self.load = load
        self.index = index
        self.sent = 0
        self.count = 0
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.closed = load.loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.send()

    def send(self) -> None:
        assert self.transport is not None
        self.count += 1
        self.sent = time.perf_counter_ns()
        self.transport.write(self.load.request(self.index, self.count))

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if b"\r\n\r\n" not in self.buffer:
            return
        now = time.perf_counter_ns()
        self.load.done(self.buffer[9:12].decode(), now - self.sent, now)
        self.buffer = b""
        if self.load.stopping:
            assert self.transport is not None
            self.transport.close()
        else:
            self.send()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.load.stopping:
            self.load.errors += 1
        if not self.closed.done():
            self.closed.set_result(None)


class _Load:
    def __init__(self, spec: dict[str, Any]) -> None:
        self.loop = asyncio.get_running_loop()
        self.spec = spec
        host = f"{LOOPBACK}:{spec['port']}"
        fixed = "".join(f"{k}: {v}\r\n" for k, v in spec["headers"].items())
        self.head = f"HEAD {spec['path']} HTTP/1.1\r\nHost: {host}\r\n{fixed}".encode()
        self.vary = bool(spec["vary_resource"])
        # the steady walk: connection i is resource r<i> and asks for tags t0, t1, ... in turn
        self.walk: int = int(spec.get("walk_images", 0))
        self.walk_head = spec["path"].split("{n}")
        self.plain = self.head + b"\r\n"
        self.measuring_from = 0
        self.measuring_until = 0
        self.stopping = False
        self.latencies: list[int] = []
        self.statuses: dict[str, int] = {}
        self.errors = 0

    def request(self, index: int, count: int) -> bytes:
        if self.walk:
            host = f"{LOOPBACK}:{self.spec['port']}"
            path = f"t{(count - 1) % self.walk}".join(self.walk_head)
            return (
                f"HEAD {path} HTTP/1.1\r\nHost: {host}\r\n"
                f"Accept: {OCI_INDEX}\r\nKuik-Resource: r{index}\r\n\r\n"
            ).encode()
        if self.vary:
            return self.head + f"Kuik-Resource: b{index}-{count}\r\n\r\n".encode()
        return self.plain

    def done(self, status: str, latency_ns: int, now_ns: int) -> None:
        if self.measuring_from and not self.measuring_until:
            self.latencies.append(latency_ns)
            self.statuses[status] = self.statuses.get(status, 0) + 1

    async def run(self) -> dict[str, Any]:
        connections = []
        for i in range(int(self.spec["concurrency"])):
            _, c = await self.loop.create_connection(
                lambda i=i: _Connection(self, i), LOOPBACK, int(self.spec["port"])
            )
            connections.append(c)
        await asyncio.sleep(WARMUP_SECONDS)
        self.measuring_from = time.perf_counter_ns()
        sys.stdout.write("measuring\n")
        sys.stdout.flush()
        await asyncio.sleep(float(self.spec["seconds"]))
        self.measuring_until = time.perf_counter_ns()
        seconds = (self.measuring_until - self.measuring_from) / 1e9
        self.stopping = True
        requests = len(self.latencies)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(c.closed for c in connections)), 5)
        ordered = sorted(self.latencies)
        if not ordered:
            ordered = [0]

        def pct(q: float) -> float:
            return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e6

        return {
            "requests": requests,
            "seconds": seconds,
            "p50_ms": pct(0.50),
            "p99_ms": pct(0.99),
            "max_ms": ordered[-1] / 1e6,
            "statuses": self.statuses,
            "errors": self.errors,
        }


def load_main(spec: dict[str, Any]) -> int:
    signal.alarm(int(LOAD_LIFETIME))

    async def main() -> dict[str, Any]:
        return await _Load(spec).run()

    result = asyncio.run(main())
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


def bare_main(port: int, answers_file: str) -> int:
    """A bare aiohttp app answering HEAD (and GET, without a body) from a dict."""
    answers: dict[str, dict[str, str]] = json.loads(Path(answers_file).read_text())
    signal.alarm(int(LOAD_LIFETIME * 3))

    async def handler(request: web.Request) -> web.StreamResponse:
        headers = answers.get(request.path)
        if headers is None:
            return web.Response(status=404)
        return web.StreamResponse(status=200, headers=headers)

    def watch() -> None:  # the bench closed our stdin (or died): stop
        sys.stdin.read()
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True).start()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    web.run_app(
        app, host=LOOPBACK, port=port, print=None, handler_cancellation=True, access_log=None
    )
    return 0


# --- the run --------------------------------------------------------------------------------


def head_headers(url: str, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or LOOPBACK, parts.port, timeout=30)
    try:
        connection.request("HEAD", path, headers=headers)
        answer = connection.getresponse()
        answer.read()
        return answer.status, dict(answer.headers.items())
    finally:
        connection.close()


@contextlib.contextmanager
def stopping(peers: list[Peer]) -> Iterator[list[Peer]]:
    try:
        yield peers
    finally:
        for peer in reversed(peers):
            with contextlib.suppress(Exception):
                if peer.process.stdin is not None:
                    peer.process.stdin.close()
            peer.stop()


@dataclass
class Setup:
    workdir: Path
    registry: QuietRegistry
    nginx: Peer
    kuik: Peer
    peers: list[Peer]
    tls_registry: TLSRegistry
    tls_nginx: Peer
    base: Peer | None = None  # --baseline: another kuikproxy, measured alongside

    @property
    def registry_pid(self) -> int:
        process = self.registry._process
        return process.pid if process is not None else 0


def measure_blob(setup: Setup, digest: str, args: argparse.Namespace) -> list[str]:
    registry, nginx, kuik = setup.registry, setup.nginx, setup.kuik
    blob = f"/v2/{BLOB_REPO}/blobs/{digest}"
    tls_registry, tls_nginx = setup.tls_registry, setup.tls_nginx
    paths = [
        BlobPath("direct", registry.url + blob, lambda: [setup.registry_pid]),
        BlobPath("nginx", nginx.url + blob, lambda: children(nginx.pid)),
        BlobPath("kuikproxy", f"{kuik.url}{blob}?ns={BENCH_HOST}", lambda: [kuik.pid]),
        BlobPath("direct TLS", tls_registry.url + blob, lambda: [tls_registry.pid],
                 ("--cacert", str(tls_registry.ca))),
        BlobPath("nginx TLS-up", tls_nginx.url + blob, lambda: children(tls_nginx.pid)),
        BlobPath("kuikproxy TLS-up", f"{kuik.url}{blob}?ns={TLS_HOST}", lambda: [kuik.pid]),
    ]  # fmt: skip
    plain, tls = paths[:3], paths[3:]
    if (base := setup.base) is not None:
        plain.append(BlobPath("kuik base", f"{base.url}{blob}?ns={BENCH_HOST}", lambda: [base.pid]))
        tls.append(
            BlobPath("kuik base TLS-up", f"{base.url}{blob}?ns={TLS_HOST}", lambda: [base.pid])
        )
    t0 = time.monotonic()
    size = args.blob_mib * MiB
    measure_blobs([*plain, *tls], digest, size, args.rounds)
    print(f"[blobs measured in {time.monotonic() - t0:.1f} s]")
    rounds = f"{args.rounds} rounds, all {len(plain) + len(tls)} paths interleaved"
    return [
        *blob_table(plain, f"(a) {args.blob_mib} MiB blob, curl -o /dev/null, {rounds}",
                    TARGET_BLOB_RATIO, size),
        "",
        *blob_table(tls, "(a') the same blob, the upstream over TLS (TLS 1.3, verified); "
                    "clients on plain HTTP", TARGET_TLS_RATIO, size),
    ]  # fmt: skip


def measure_head(setup: Setup, index_digest: str, args: argparse.Namespace) -> list[str]:
    registry, nginx, kuik, workdir = setup.registry, setup.nginx, setup.kuik, setup.workdir
    manifest = f"/v2/{IMAGE_REPO}/manifests/{IMAGE_TAG}"
    accept = {"Accept": OCI_INDEX}
    kept_path = f"{manifest}?ns={KEPT_HOST}"
    # the kept answer: this HEAD waits for its window (≤ 100 ms) and is read upstream
    status, _ = head_headers(kuik.url, kept_path, {**accept, "Kuik-Resource": "warm"})
    if status != 200:
        raise RuntimeError(f"warming HEAD through kuikproxy: {status}\n{tail(kuik.log)}")
    status, headers = head_headers(registry.url, manifest, accept)
    wanted = ("content-type", "content-length", "docker-content-digest", "etag")
    answer = {k: v for k, v in headers.items() if k.lower() in wanted}
    if status != 200 or answer.get("Docker-Content-Digest") != index_digest:
        raise RuntimeError(f"HEAD {manifest}: {status} {headers}")
    bare = start_bare(workdir, answer)
    setup.peers.append(bare)
    py_spy = Path(args.py_spy) if args.py_spy else None
    if py_spy is not None:
        py_spy.mkdir(parents=True, exist_ok=True)
    kuik_headers = {**accept, "Kuik-Resource": "bench"} if args.same_resource else accept
    results = [
        run_load(workdir, "direct", url=registry.url, path=manifest, headers=accept, args=args,
                 vary_resource=False, pids=[setup.registry_pid]),
        run_load(workdir, "nginx", url=nginx.url, path=manifest, headers=accept, args=args,
                 vary_resource=False, pids=children(nginx.pid)),
        run_load(workdir, "bare aiohttp", url=bare.url, path=manifest, headers=accept,
                 args=args, vary_resource=False, pids=[bare.pid]),
    ]  # fmt: skip
    # the steady shape first: the worst case leaves ~200,000 rings behind, whose collection
    # would otherwise be billed to the steady run's latencies
    tags = warm_steady_tags(registry.url, kuik.url, args.steady_images)
    results += [
        run_load(workdir, "kuikproxy steady", url=kuik.url,
                 path=f"/v2/{IMAGE_REPO}/manifests/{{n}}?ns={STEADY_HOST}", headers={},
                 args=args, vary_resource=False, pids=[kuik.pid], walk_images=tags),
        run_load(workdir, "kuikproxy", url=kuik.url, path=kept_path, headers=kuik_headers,
                 args=args, vary_resource=not args.same_resource, pids=[kuik.pid],
                 py_spy=py_spy),
    ]  # fmt: skip
    note = f"HEAD {kept_path}, paced (check every 100 ms), kept answer warmed; " + (
        "every request from resource 'bench'"
        if args.same_resource
        else "every request a new resource (Kuik-Resource: b<conn>-<n>)"
    )
    steady = (
        f"HEADs on {STEADY_HOST}: connection i is resource r<i> and walks {tags:,} tags whose "
        "answers are kept (R1: each once per resource), as a resource's next lap does"
    )
    return head_table(results, args, note, steady)


def warm_steady_tags(registry_url: str, kuik_url: str, count: int) -> int:
    """``count`` tags of the bench image, pushed to the registry and read once through
    kuikproxy (one per 1 ms window) so that each has a kept answer; returns ``count``."""
    t0 = time.monotonic()
    client = RegistryClient(registry_url)
    index = build_image(IMAGE_REPO, IMAGE_TAG).index
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: client.push_manifest(IMAGE_REPO, f"t{i}", index), range(count)))
    pushed = time.monotonic()

    async def warm() -> list[int]:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def one(i: int) -> int:
                url = f"{kuik_url}/v2/{IMAGE_REPO}/manifests/t{i}?ns={STEADY_HOST}"
                headers = {"Accept": OCI_INDEX, "Kuik-Resource": "warm"}
                async with session.head(url, headers=headers) as response:
                    return response.status

            return await asyncio.gather(*(one(i) for i in range(count)))

    statuses = asyncio.run(warm())
    if set(statuses) != {200}:
        raise RuntimeError(f"warming {count} tags: statuses {sorted(set(statuses))}")
    print(
        f"[pushed {count:,} tags in {pushed - t0:.1f} s, "
        f"read each once through kuikproxy in {time.monotonic() - pushed:.1f} s]"
    )
    return count


CASES = ("blob", "head", "store", "fanout")


def case_table(
    case: str, setup: Setup, digest: str, index_digest: str, args: argparse.Namespace
) -> list[str]:
    if case == "blob":
        return measure_blob(setup, digest, args)
    if case == "head":
        return measure_head(setup, index_digest, args)
    try:  # the pull-through store's rows (c) and (d)
        import kuikproxy.blobs  # noqa: F401  (an older kuikproxy, as bench/compare.py runs)
        from bench import store
    except ImportError as error:
        if args.only is not None:
            raise
        return [f"({case}) skipped: {error}"]
    t0 = time.monotonic()
    measure = store.measure_store if case == "store" else store.measure_fanout
    table = measure(setup, digest, args)
    print(f"[{case} measured in {time.monotonic() - t0:.1f} s]")
    return table


def bench(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="kuik-bench-proxy-"))
    registry = QuietRegistry(workdir / "registry")
    peers: list[Peer] = []
    out: list[str] = []
    try:
        with registry, contextlib.ExitStack() as stack, stopping(peers):
            t0 = time.monotonic()
            digest = push_big_blob(registry.url, BLOB_REPO, args.blob_mib)
            image = push_image(RegistryClient(registry.url), build_image(IMAGE_REPO, IMAGE_TAG))
            print(f"[pushed {args.blob_mib} MiB blob in {time.monotonic() - t0:.1f} s]")
            peers.append(nginx := start_nginx(workdir / "nginx", registry.port, args.nginx_workers))
            ca = workdir / "ca.pem"
            storage = registry.workdir / "storage"
            tls_registry = TLSRegistry(workdir / "registry-tls", storage, ca).start()
            stack.callback(tls_registry.stop)
            tls_nginx = start_nginx(
                workdir / "nginx-tls", tls_registry.port, args.nginx_workers, ca
            )
            peers.append(tls_nginx)
            kuik = start_kuikproxy(workdir / "kuikproxy", registry.url, tls_registry.url, ca)
            peers.append(kuik)
            base = None
            if args.baseline:
                base = start_kuikproxy(
                    workdir / "kuik-base", registry.url, tls_registry.url, ca, args.baseline
                )
                peers.append(base)
            setup = Setup(workdir, registry, nginx, kuik, peers, tls_registry, tls_nginx, base)
            for case in CASES:  # (c) and (d) after (b): bench/compare.py reads (a) and (b)
                if case in (args.only or CASES):
                    table = case_table(case, setup, digest, image.index.digest, args)
                    print("\n" + "\n".join(table), flush=True)
                    out += ["", *table] if out else table
            if kuik.process.poll() is not None:
                raise RuntimeError(f"kuikproxy exited:\n{tail(kuik.log)}")
            errors = [line for line in kuik.log.read_text().splitlines() if "ERROR" in line]
            if errors:
                print(f"kuikproxy logged {len(errors)} errors, first: {errors[0]}")
    finally:
        if args.keep:
            print(f"[kept {workdir}]")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if args.output:
        Path(args.output).write_text("\n".join(out) + "\n")
    return 0


def cases(value: str) -> tuple[str, ...]:
    picked = tuple(c.strip() for c in value.split(",") if c.strip())
    unknown = set(picked) - set(CASES)
    if unknown or not picked:
        raise argparse.ArgumentTypeError(f"cases are {', '.join(CASES)}")
    return picked


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--blob-mib", type=int, default=512, help="blob size (default 512)")
    parser.add_argument("--rounds", type=int, default=3, help="blob transfers per path")
    parser.add_argument("--seconds", type=float, default=10.0, help="HEAD load per target")
    parser.add_argument("--concurrency", type=int, default=64, help="HEAD connections")
    parser.add_argument("--nginx-workers", type=int, default=1)
    parser.add_argument("--same-resource", action="store_true", help="see the module docstring")
    parser.add_argument(
        "--steady-images", type=int, default=4096, help="tags walked by the steady HEAD load"
    )
    parser.add_argument(
        "--only", type=cases, metavar="CASES",
        help=f"comma-separated, of {','.join(CASES)} (default: all; store and fanout are "
        "bench/store.py's)",
    )  # fmt: skip
    parser.add_argument("--clients", type=int, default=10, help="fanout: clients at once")
    parser.add_argument(
        "--store-gets", type=int, default=9, help="store: measured GETs per path (fast ones)"
    )
    parser.add_argument("--py-spy", metavar="DIR", help="py-spy flame graph of kuikproxy's load")
    parser.add_argument("--output", metavar="FILE", help="also write the tables here")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    parser.add_argument(
        "--baseline",
        metavar="TREE",
        help="(a): also a kuikproxy imported from this source tree (PYTHONPATH), e.g. an "
        "extracted older commit, its blobs interleaved with the others' (rows 'kuik base')",
    )
    parser.add_argument("--load", metavar="JSON", help=argparse.SUPPRESS)
    parser.add_argument("--bare-server", nargs=2, metavar=("PORT", "FILE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.load:
        return load_main(json.loads(args.load))
    if args.bare_server:
        return bare_main(int(args.bare_server[0]), args.bare_server[1])
    return bench(args)


if __name__ == "__main__":
    sys.exit(main())
