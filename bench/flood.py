"""A flood of every client-fillable dimension at once, in a kuikproxy whose only bound written is
its memory budget: does the process stay under it, does a kept answer still come back at once,
and is every refusal counted by reason?

Layout (everything on 127.0.0.1, nothing else is ever contacted; all under one temp dir):

* the CNCF distribution registry (Debian ``docker-registry``, logs at ``error``) holding
  ``flood/big``, a large blob of random bytes, and ``flood/app:<tag>`` manifests pushed for the
  flood (each a distinct OCI manifest whose annotation pads it to ``--manifest-bytes``);
* kuikproxy as a subprocess (``python -m kuikproxy serve``, ``--log-level warning``) with
  ``limits: {memory: 512Mi}`` (the chart's memory limit) and no other bound, so the budget
  sizes every one; its hosts, all upstream the one registry:

  - ``registry.flood-<n>:5000`` (``--flood-hosts``): paced, a check every 1 ms: the windows
    that read the tags that exist (kept answers) and those that do not (404s: kept refusals);
  - ``registry.held:5000``: paced, a check an hour: every request past the first parks;
  - ``registry.probe:5000``: ``check: {mode: prefetch, interval: 50ms}``: kuikproxy reads the
    probe's image itself each turn, so the probe's HEAD always finds a fresh kept answer (R1
    holds a resource that asks again for the same image until an answer newer than its last);
  - ``registry.relay:5000``: ``paced: false``, the slow readers' pass-through;
  - hosts under the wildcard ``allowedHosts: ["127.9.*"]``, IP literals: a config gives a
    wildcard host no ``upstream`` (``registries.default.upstream`` is refused), and the
    address guard answers a loopback literal 403 when its window reads it, so they cost host
    state and never reach anything.

The bounds come from ``/status.budget``; each dimension is driven past its bound (``--over``,
1.2×) at once, every client on raw asyncio sockets in this process, requests pipelined
``DEPTH`` deep on a few keep-alive connections:

* **kept answers**: ``GET`` with ``Kuik-Operation: check`` of tags that exist (a check, so a
  window; a GET, so the body is kept), enough to pass ``cache.maxBytes`` and
  ``cache.maxEntries`` (evictions: those bounds evict, they do not refuse);
* **kept refusals**: ``HEAD`` of tags that do not exist, past ``cache.maxRefusals``;
* **resources**: a new ``Kuik-Resource`` per ``HEAD`` of one kept tag, past ``maxResources``;
* **ring images**: resources × kept tags (``RING_TAGS`` of them), past ``maxImages``;
* **hosts**: a ``HEAD`` per wildcard host, past ``maxHosts``;
* **held**: a connection per request parked on ``registry.held:5000``, past ``maxHeld``;
* **pipelined**: ``--pipelines`` connections each sending ``--pipelined`` HEADs at once to the
  held host (only the first can be answered in the hour);
* **slow readers**: ``--slow-readers`` GETs of the big blob (half through the relay host, half
  as paced copies sharing one read), each socket with ``SO_RCVBUF`` 4 KiB and read at ~4 KB/s.

A sampler in another process (this file, ``--sample``) reads kuikproxy's VmRSS and VmHWM from
``/proc/PID/status`` and HEADs the probe's kept image every 100 ms on a connection of its own
(max, p99), GETs ``/healthz`` as often (the loop's lag as seen from outside: it answers on the
loop, after whatever held it), and ``/status`` every second (each bound's used and limit, the
refusals by reason, top level and every host's summed).

Then (not with ``--quick``) **costs**: a fresh kuikproxy of the same budget, each bound filled
to its limit alone, one after the other, VmRSS before and after: bytes per item, against
``core/memorybudget.py``'s ``COSTS``; and ``--held-cost`` requests held at once (``maxHeld`` written
for it) in a process of their own: VmRSS per held request.

Run: ``.venv/bin/python bench/flood.py`` (~10 min on 2 cores: the flood ~5, most of it the
~320 windows a second the kept answers need, the costs ~5); ``--quick`` floods a 192Mi budget,
holds it 10 s and skips the costs (~2 min).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.proxy import Peer, QuietRegistry, push_big_blob, serve_kuikproxy  # noqa: E402
from kuikproxy.core.memorybudget import COSTS, Bound  # noqa: E402
from tests.e2e.peers import (  # noqa: E402
    LOOPBACK,
    OCI_CONFIG,
    OCI_LAYER,
    OCI_MANIFEST,
    Blob,
    DistributionRegistry,
    RegistryClient,
    canonical_json,
    clean_env,
    free_port,
    http,
    socket_queues,
)

MiB = 1024 * 1024
REPO = "flood/app"
BIG_REPO = "flood/big"
HELD_HOST = "registry.held:5000"
PROBE_HOST = "registry.probe:5000"
RELAY_HOST = "registry.relay:5000"
WILDCARD = "127.9.*"
PROBE_TAG = "probe"
PROBES = 50
HELD_RESOURCES = 100  # the held requests' resources
RING_TAGS = 1_000  # the kept tags every ring-image resource asks: rings of this many images
DEPTH = 64  # requests in flight on one pipelined connection
CONNECTIONS = 4  # pipelined connections per dimension
SLOW_READ = 1024  # bytes a slow reader takes each SLOW_EVERY
SLOW_EVERY = 0.25
SAMPLE_EVERY = 0.1
SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") else None  # the registry's files: no disk
STATUS_EVERY = 1.0
SAMPLER_LIFETIME = 600.0  # the sampler stops by itself after this, whatever happens to us
TARGET_HEAD_MS = 100.0
COST_WINDOWS = 5_000  # kept answers and refusals filled for their cost: a window each
LIMIT_REASONS = {
    Bound.HOSTS: "maxHosts",
    Bound.RESOURCES: "maxResources",
    Bound.IMAGES: "maxImages",
    Bound.HELD: "maxHeld",
}
"""The bounds that refuse (503), by the reason their refusals are counted under; the kept
answers' three evict instead, and the relays' share is a reserve nothing refuses by."""


def flood_host(n: int) -> str:
    return f"registry.flood-{n}:5000"


def wild_host(i: int) -> str:
    return f"127.9.{i // 256}.{i % 256}"


def flood_config(upstream: str, memory: str, flood_hosts: int, **limits: int) -> dict[str, Any]:
    """kuikproxy's config (without ``listen``) before ``upstream`` under every name the flood
    uses, ``memory`` its budget and ``limits`` the only bounds written."""
    registries: dict[str, Any] = {
        "default": {"check": {"interval": "10ms"}},  # the wildcard hosts' windows
        HELD_HOST: {"upstream": upstream, "check": {"interval": "1h"}},
        PROBE_HOST: {"upstream": upstream, "check": {"interval": "50ms", "mode": "prefetch"}},
        RELAY_HOST: {"upstream": upstream, "paced": False},
    }
    for n in range(flood_hosts):
        registries[flood_host(n)] = {
            "upstream": upstream,
            "check": {"interval": "1ms"},
            "copy": {"interval": "10ms"},
        }
    return {
        "defaultRegistry": flood_host(0),
        "allowedHosts": [WILDCARD],
        "limits": {"memory": memory, **limits},
        "registries": registries,
    }


def start_kuikproxy(workdir: Path, config: dict[str, Any]) -> Peer:
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    return serve_kuikproxy(workdir, port, {"listen": f"{LOOPBACK}:{port}", **config})


def port_of(peer: Peer) -> int:
    return int(peer.url.rsplit(":", 1)[1])


def status(url: str, query: str = "") -> dict[str, Any]:
    code, _, body = http(f"{url}/status{query}", timeout=60)
    if code != 200:
        raise RuntimeError(f"/status: {code}")
    document: dict[str, Any] = json.loads(body)
    return document


def bounds_of(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    bounds: dict[str, dict[str, Any]] = document["budget"]["bounds"]
    return bounds


def refusals_of(document: dict[str, Any]) -> Counter[str]:
    """Refusals by reason: the top level's and every host's, summed."""
    total: Counter[str] = Counter(document.get("refused", {}))
    for registry in document["registries"].values():
        total.update(registry.get("refused", {}))
    return total


def proc_status(pid: int) -> dict[str, int]:
    """``/proc/PID/status``'s Vm* figures, KiB (empty once the process is gone)."""
    figures: dict[str, int] = {}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Vm"):
                name, value = line.split(":", 1)
                figures[name] = int(value.split()[0])
    return figures


def raise_nofile() -> None:
    """Soft open-file limit to the hard one: the held requests take a socket each, here and in
    kuikproxy (which inherits it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# --- seeding --------------------------------------------------------------------------------


def manifest(tag: str, config: Blob, layer: Blob, size: int) -> bytes:
    """A distinct OCI manifest of ``size`` bytes or a little more (its annotation pads it)."""
    annotations = {"flood.tag": tag, "flood.pad": ""}
    document = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": config.descriptor(),
        "layers": [layer.descriptor()],
        "annotations": annotations,
    }
    annotations["flood.pad"] = "x" * max(0, size - len(canonical_json(document)))
    return canonical_json(document)


def seed(registry: DistributionRegistry, tags: Sequence[str], size: int) -> None:
    """One config and layer pushed over the API, then a manifest per tag written straight into
    the registry's storage (distribution's filesystem layout: the blob, its revision link and
    the tag's links). Pushed over HTTP, 30,000 manifests took minutes; written, seconds. The
    registry keeps no cache of links (none configured), so it serves them at once."""
    config = Blob(OCI_CONFIG, canonical_json({"architecture": "amd64", "os": "linux"}))
    layer = Blob(OCI_LAYER, b"flood layer")
    client = RegistryClient(registry.url)
    client.push_blob(REPO, config)
    client.push_blob(REPO, layer)
    root = registry.workdir / "storage" / "docker" / "registry" / "v2"
    manifests = root / "repositories" / REPO / "_manifests"
    for tag in tags:
        body = Blob(OCI_MANIFEST, manifest(tag, config, layer, size))
        hexpart = body.digest.split(":", 1)[1]
        data = root / "blobs" / "sha256" / hexpart[:2] / hexpart / "data"
        data.parent.mkdir(parents=True, exist_ok=True)
        data.write_bytes(body.data)
        for link in (
            manifests / "revisions" / "sha256" / hexpart / "link",
            manifests / "tags" / tag / "current" / "link",
            manifests / "tags" / tag / "index" / "sha256" / hexpart / "link",
        ):
            link.parent.mkdir(parents=True, exist_ok=True)
            link.write_text(body.digest)


# --- raw clients ----------------------------------------------------------------------------


def request(path: str, resource: str, method: str = "HEAD", *extra: str) -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: {LOOPBACK}",
        f"Kuik-Resource: {resource}",
        f"Accept: {OCI_MANIFEST}",  # distribution answers an OCI manifest to no other
    ]
    return ("\r\n".join([*lines, *extra]) + "\r\n\r\n").encode()


def probe_requests() -> list[bytes]:
    """The probe's HEADs, one per probe resource, taken in turn. R1 holds a resource that asks
    again until an answer newer than its last: a probe of one resource would find no kept answer
    whenever the prefetch turn (every 50 ms) came later than its 100 ms, and be held, which the
    flood's full ``maxHeld`` refuses. Each of :data:`PROBES` resources asks every five seconds."""
    path = f"/v2/{REPO}/manifests/{PROBE_TAG}?ns={PROBE_HOST}"
    return [request(path, f"probe-{i}") for i in range(PROBES)]


def first_probes(port: int) -> bool:
    """Each probe resource asks once before the flood, so none is a resource the flood's full
    ``maxResources`` refuses; whether each was answered 200."""
    return asyncio.run(pipelined(port, probe_requests())) == Counter({200: PROBES})


async def answer(reader: asyncio.StreamReader, method: bytes) -> int:
    """Read one answer (its body too, unless it answers a HEAD); its status."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.lower() == b"content-length":
            length = int(value)
        elif name.lower() == b"transfer-encoding":
            raise RuntimeError("a chunked answer: this client reads Content-Length only")
    if method != b"HEAD" and length:
        await reader.readexactly(length)
    return int(head[9:12])


async def pipelined(port: int, requests: Sequence[bytes], depth: int = DEPTH) -> Counter[int]:
    """Send ``requests`` on one keep-alive connection, ``depth`` in flight; statuses counted."""
    statuses: Counter[int] = Counter()
    reader, writer = await asyncio.open_connection(LOOPBACK, port, limit=1 << 20)
    try:
        for at in range(0, len(requests), depth):
            batch = requests[at : at + depth]
            writer.write(b"".join(batch))
            for sent in batch:
                statuses[await answer(reader, sent.split(b" ", 1)[0])] += 1
    finally:
        writer.close()
    return statuses


async def spread(
    port: int, requests: Sequence[bytes], connections: int = CONNECTIONS
) -> Counter[int]:
    """:func:`pipelined` over ``connections`` connections, the requests dealt among them."""
    parts = await asyncio.gather(
        *(pipelined(port, requests[n::connections]) for n in range(connections))
    )
    return sum(parts, Counter())


def held_requests(start: int, count: int, tags: int | None = None) -> list[bytes]:
    """HEADs of ``count`` tags of the held host from ``start`` on (the first ``tags`` over
    again: images already in their rings, which a full ``maxImages`` would refuse as new
    ones): each held an hour."""
    indices = range(start, start + count)
    return [
        request(
            f"/v2/{REPO}/manifests/held-{i if tags is None else i % tags:06d}?ns={HELD_HOST}",
            f"held-{i % HELD_RESOURCES}",
        )
        for i in indices
    ]


async def keep_held(
    port: int, sent: int, done: Flooded, opened: list[asyncio.StreamWriter]
) -> None:
    """Keep ``maxHeld`` full until cancelled: a request held an hour takes the place of each
    other held request that has gone since (a window answered it), as many as were refused
    the last time (refused again past the bound)."""
    refused, tags = done.held_refused, sent
    while True:
        await asyncio.sleep(0.25)
        more = held_requests(sent, max(refused, 1), tags)
        sent += len(more)
        refused = await park(port, more, opened)
        done.held_refused += refused


async def park(port: int, requests: Sequence[bytes], opened: list[asyncio.StreamWriter]) -> int:
    """Send each request on a connection of its own and leave it waiting; the writers go in
    ``opened`` (closed by the caller). Returns how many were refused at once (503)."""
    refused = 0
    readers = []
    for at in range(0, len(requests), 256):  # a batch of connects at a time: the backlog
        batch = requests[at : at + 256]
        pairs = await asyncio.gather(*(asyncio.open_connection(LOOPBACK, port) for _ in batch))
        for (reader, writer), sent in zip(pairs, batch, strict=True):
            writer.write(sent)
            opened.append(writer)
            readers.append(reader)
    for reader in readers:  # a refusal comes at once; a held request never before the hour
        with contextlib.suppress(TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            if await asyncio.wait_for(answer(reader, b"HEAD"), 0.001) == 503:
                refused += 1
    return refused


async def slow_reader(port: int, path: str, until: float) -> int:
    """GET ``path`` on a socket with a 4 KiB receive buffer, read ~4 KB/s until ``until``;
    the bytes read."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (LOOPBACK, port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=SLOW_READ)
    writer.write(request(path, "slow", "GET"))
    got = 0
    try:
        while time.monotonic() < until:
            chunk = await reader.read(SLOW_READ)
            if not chunk:
                break
            got += len(chunk)
            await asyncio.sleep(SLOW_EVERY)
    finally:
        writer.close()
    return got


# --- the sampler (a process of its own) -----------------------------------------------------


def percentile(values: Sequence[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


def sample(pid: int, port: int, stop_file: Path) -> dict[str, Any]:
    """Until ``stop_file`` exists: VmRSS/VmHWM, the probe's HEAD and ``/healthz`` every
    :data:`SAMPLE_EVERY`, ``/status`` every :data:`STATUS_EVERY`. Blocking sockets: this process
    does nothing else, so its own lag is not in the figures."""
    probe = socket.create_connection((LOOPBACK, port))
    probe.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    health = socket.create_connection((LOOPBACK, port))
    probes = probe_requests()
    health_line = request("/healthz", "probe", "GET")
    heads: list[float] = []
    lags: list[float] = []
    probe_statuses: Counter[int] = Counter()
    rss, hwm = [], 0
    peaks: dict[str, int] = {}
    limits: dict[str, int] = {}
    last_status = 0.0
    queued = 0  # the most kuikproxy's sockets held queued in the kernel (the pod pays it too)
    started = time.monotonic()

    def exchange(sock: socket.socket, line: bytes, head: bool) -> tuple[float, int]:
        begun = time.perf_counter()
        sock.sendall(line)
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        top, _, rest = data.partition(b"\r\n\r\n")
        if not head:
            length = next(
                int(v) for k, _, v in (h.partition(b":") for h in top.split(b"\r\n")[1:])
                if k.lower() == b"content-length"
            )  # fmt: skip
            while len(rest) < length:
                rest += sock.recv(65536)
        return time.perf_counter() - begun, int(top[9:12])

    while not stop_file.exists() and time.monotonic() - started < SAMPLER_LIFETIME:
        tick = time.monotonic()
        vm = proc_status(pid)
        if not vm:
            break
        rss.append(vm["VmRSS"])
        hwm = max(hwm, vm["VmHWM"])
        seconds, code = exchange(probe, probes[len(heads) % len(probes)], head=True)
        heads.append(seconds * 1000)
        probe_statuses[code] += 1
        seconds, _ = exchange(health, health_line, head=False)
        lags.append(seconds * 1000)
        if tick - last_status >= STATUS_EVERY:
            last_status = tick
            queued = max(queued, sum(socket_queues(pid)))
            with contextlib.suppress(OSError, RuntimeError):
                narrow = f"?registry={PROBE_HOST}&limit=1"  # the budget, and little else
                for name, bound in bounds_of(status(f"http://{LOOPBACK}:{port}", narrow)).items():
                    limits[name] = bound["limit"]
                    if bound["used"] is not None:
                        peaks[name] = max(peaks.get(name, 0), bound["used"])
        time.sleep(max(0.0, SAMPLE_EVERY - (time.monotonic() - tick)))
    return {
        "rss_kib": rss,
        "hwm_kib": hwm,
        "queued_bytes": queued,
        "head_ms": heads,
        "probe_statuses": dict(probe_statuses),
        "healthz_ms": lags,
        "peaks": peaks,
        "limits": limits,
    }


@contextlib.contextmanager
def sampling(workdir: Path, pid: int, port: int) -> Iterator[Callable[[], dict[str, Any]]]:
    """The sampler running in another process while the block runs; call the yielded function
    once done to stop it and have its figures."""
    stop_file = workdir / "stop-sampling"
    with (workdir / "sampler.err").open("ab") as err:
        process = subprocess.Popen(
            [sys.executable, __file__, "--sample", str(pid), str(port), str(stop_file)],
            stdout=subprocess.PIPE,
            stderr=err,
            env=clean_env(),
        )
    result: dict[str, Any] = {}

    def finish() -> dict[str, Any]:
        if not result:
            stop_file.touch()
            out, _ = process.communicate(timeout=60)
            if process.returncode != 0:
                raise RuntimeError(f"the sampler failed: {(workdir / 'sampler.err').read_text()}")
            result.update(json.loads(out))
        return result

    try:
        yield finish
    finally:
        stop_file.touch()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(60)
        if process.poll() is None:
            process.kill()
            process.wait()


# --- the flood ------------------------------------------------------------------------------


@dataclass
class Plan:
    """What the flood sends, sized from the bounds (``/status.budget``) times ``over``."""

    bounds: dict[str, dict[str, Any]]
    over: float
    manifest_bytes: int
    flood_hosts: int
    slow_readers: int
    pipelines: int
    pipelined: int

    def past(self, bound: Bound) -> int:
        return int(self.bounds[str(bound)]["limit"] * self.over) + 1

    @property
    def kept_tags(self) -> int:
        """Tags that exist, read once each: past the entries bound and the bytes bound."""
        by_bytes = self.past(Bound.KEPT_BYTES) // self.manifest_bytes
        return max(self.past(Bound.KEPT_ENTRIES), by_bytes) + RING_TAGS + 1

    @property
    def tags(self) -> list[str]:
        return [PROBE_TAG, *(f"t{i:06d}" for i in range(self.kept_tags))]


@dataclass
class Flooded:
    """What each dimension was answered."""

    statuses: dict[str, Counter[int]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    held_refused: int = 0
    slow_bytes: list[int] = field(default_factory=list)


async def flood(port: int, plan: Plan, digest: str, hold_for: float) -> Flooded:
    """Every dimension at once, in two waves (what needs a window, then the rest); the held,
    pipelined and slow connections stay open ``hold_for`` seconds after the rest is done."""
    done = Flooded()
    hosts = [flood_host(n) for n in range(plan.flood_hosts)]
    ring_tags = [f"t{i:06d}" for i in range(RING_TAGS)]
    kept = plan.tags[1 + RING_TAGS :]

    def on(i: int) -> str:
        return hosts[i % len(hosts)]

    def kept_get(i: int, tag: str) -> bytes:
        return request(
            f"/v2/{REPO}/manifests/{tag}?ns={on(i)}", "kept", "GET", "Kuik-Operation: check"
        )

    # the ring tags first, each on host 0: the ring-image and resource floods ask kept answers
    warm = await spread(port, [kept_get(0, tag) for tag in ring_tags])
    if set(warm) != {200}:
        raise RuntimeError(f"warming the ring tags answered {dict(warm)}")

    async def timed(name: str, work: Awaitable[Counter[int]]) -> None:
        begun = time.monotonic()
        done.statuses[name] = await work
        done.seconds[name] = time.monotonic() - begun

    ring_path = f"/v2/{REPO}/manifests/{{}}?ns={hosts[0]}"
    rings = plan.past(Bound.IMAGES) // RING_TAGS + 1
    sent: dict[str, list[bytes]] = {
        "kept answers": [kept_get(i, tag) for i, tag in enumerate(kept)],
        "kept refusals": [
            request(f"/v2/{REPO}/manifests/missing-{i:06d}?ns={on(i)}", "missing")
            for i in range(plan.past(Bound.REFUSALS))
        ],
        "resources": [
            request(ring_path.format(ring_tags[0]), f"ImageMonitor/flood/r{i:06d}")
            for i in range(plan.past(Bound.RESOURCES))
        ],
        "ring images": [
            request(ring_path.format(tag), f"ImageMonitor/rings/r{r:04d}")
            for r in range(rings)
            for tag in ring_tags
        ],
        "hosts": [
            request(f"/v2/{REPO}/manifests/v1?ns={wild_host(i)}", "hosts")
            for i in range(plan.past(Bound.HOSTS))
        ],
    }
    opened: list[asyncio.StreamWriter] = []
    held = held_requests(0, plan.past(Bound.HELD))
    pipes = [
        b"".join(
            request(f"/v2/{REPO}/manifests/pipe-{p}-{i:05d}?ns={HELD_HOST}", f"pipe-{p}")
            for i in range(plan.pipelined)
        )
        for p in range(plan.pipelines)
    ]
    blob = f"/v2/{BIG_REPO}/blobs/{digest}"
    slow_paths = [
        f"{blob}?ns={RELAY_HOST if n % 2 else hosts[0]}" for n in range(plan.slow_readers)
    ]
    began = time.monotonic()
    slow = asyncio.gather(
        *(slow_reader(port, path, began + 1e9) for path in slow_paths), return_exceptions=True
    )
    # the rings', pipelines' and held requests' resources first: the resources flood then
    # refuses only its own
    made = [request(ring_path.format(ring_tags[0]), f"ImageMonitor/rings/r{r:04d}")
            for r in range(rings)]  # fmt: skip
    made += [request(ring_path.format(ring_tags[0]), f"pipe-{p}") for p in range(plan.pipelines)]
    made += [request(ring_path.format(ring_tags[0]), f"held-{h}") for h in range(HELD_RESOURCES)]
    await spread(port, made)
    windowed = ("kept answers", "hosts", "kept refusals")
    try:
        # What needs a window first: once maxHeld is full, every request that would wait is
        # refused, so kept answers and refusals could not be made past it. The refusals last:
        # kept answers made after them would push them out of the entries, oldest first.
        await asyncio.gather(*(timed(name, spread(port, sent[name])) for name in windowed[:2]))
        await timed(windowed[2], spread(port, sent[windowed[2]]))

        async def hold() -> None:
            # the pipelines first, while maxHeld has room: the first of each parks, the rest
            # wait behind it unread (sent once maxHeld is full, each would be answered 503)
            for stream in pipes:
                _, writer = await asyncio.open_connection(LOOPBACK, port)
                writer.write(stream)
                opened.append(writer)
            done.held_refused = await park(port, held, opened)

        await asyncio.gather(
            hold(),
            *(timed(name, spread(port, r)) for name, r in sent.items() if name not in windowed),
        )
        keeping = asyncio.create_task(keep_held(port, len(held), done, opened))
        await asyncio.sleep(hold_for)  # every bound full at once, the sampler going on
        keeping.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeping
        slow.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await slow
    finally:
        for writer in opened:
            writer.close()
    return done


# --- costs: one bound filled at a time ------------------------------------------------------


async def fill_costs(url: str, pid: int, plan: Plan) -> dict[Bound, tuple[int, float]]:
    """Fill each bound to its limit alone in the running kuikproxy, one after the other:
    ``{bound: (items, bytes of VmRSS each)}``."""
    port = int(url.rsplit(":", 1)[1])
    host = flood_host(0)
    costs: dict[Bound, tuple[int, float]] = {}

    def limit(bound: Bound) -> int:
        return int(plan.bounds[str(bound)]["limit"]) - 8  # room for the probes of other fills

    async def measured(bound: Bound, count: int, work: Callable[[], Awaitable[object]]) -> None:
        await asyncio.sleep(0.5)
        before = proc_status(pid)["VmRSS"]
        await work()
        await asyncio.sleep(0.5)
        costs[bound] = (count, (proc_status(pid)["VmRSS"] - before) * 1024 / count)

    tags = plan.tags[1:]
    path = f"/v2/{REPO}/manifests/{{}}?ns={host}"
    # kept answers first (GETs: the body kept too): the resources and ring images ask them.
    # Each item needs a window (~4 ms here): at most COST_WINDOWS of them.
    n = min(limit(Bound.KEPT_ENTRIES) // 2, len(tags), COST_WINDOWS)
    await measured(
        Bound.KEPT_ENTRIES,
        n,
        lambda: spread(
            port,
            [request(path.format(t), "kept", "GET", "Kuik-Operation: check") for t in tags[:n]],
        ),
    )
    refusals = min(limit(Bound.REFUSALS), COST_WINDOWS)
    await measured(
        Bound.REFUSALS,
        refusals,
        lambda: spread(
            port, [request(path.format(f"missing-{i:06d}"), "missing") for i in range(refusals)]
        ),
    )
    resources = limit(Bound.RESOURCES) // 2
    await measured(
        Bound.RESOURCES,
        resources,
        lambda: spread(
            port,
            [request(path.format(tags[0]), f"ImageMonitor/c/r{i:06d}") for i in range(resources)],
        ),
    )
    per_ring = min(RING_TAGS, n)
    rings = min(limit(Bound.IMAGES) // per_ring, limit(Bound.RESOURCES) // 2 - 8)
    await measured(
        Bound.IMAGES,
        rings * per_ring,
        lambda: spread(
            port,
            [
                request(path.format(tag), f"ImageMonitor/c/ring{r:05d}")
                for r in range(rings)
                for tag in tags[:per_ring]
            ],
        ),
    )
    hosts = limit(Bound.HOSTS)
    await measured(
        Bound.HOSTS,
        hosts,
        lambda: spread(
            port,
            [request(f"/v2/{REPO}/manifests/v1?ns={wild_host(i)}", "hosts") for i in range(hosts)],
        ),
    )
    return costs


async def held_cost(url: str, pid: int, count: int) -> tuple[float, int]:
    """``count`` requests parked on the held host at once: VmRSS per held request, and how
    many /status counted waiting."""
    port = int(url.rsplit(":", 1)[1])
    opened: list[asyncio.StreamWriter] = []
    lines = [
        request(f"/v2/{REPO}/manifests/h-{i:06d}?ns={HELD_HOST}", f"h-{i % 100}")
        for i in range(count + 200)
    ]
    try:
        await park(port, lines[:200], opened)  # warm: the code paths, the first window
        await asyncio.sleep(1.0)
        before = proc_status(pid)["VmRSS"]
        await park(port, lines[200:], opened)
        await asyncio.sleep(2.0)
        after = proc_status(pid)["VmRSS"]
        waiting = status(url, f"?registry={HELD_HOST}")["registries"][HELD_HOST]["check"]["waiting"]
    finally:
        for writer in opened:
            writer.close()
    return (after - before) * 1024 / count, int(waiting)


# --- the table ------------------------------------------------------------------------------


def table(plan: Plan, done: Flooded, sampled: dict[str, Any], final: dict[str, Any]) -> list[str]:
    budget = final["budget"]
    refusals = refusals_of(final)
    heads = sampled["head_ms"]
    lags = sampled["healthz_ms"]
    rss = sampled["rss_kib"]
    memory = budget["memory"] / MiB
    lines = [
        f"budget {memory:.0f} MiB ({budget['source']}); kuikproxy VmRSS max "
        f"{max(rss) / 1024:.1f} MiB, VmHWM {sampled['hwm_kib'] / 1024:.1f} MiB "
        f"({'under' if sampled['hwm_kib'] * 1024 < budget['memory'] else 'OVER'} the budget); "
        f"{len(rss)} samples; its sockets' kernel queues at most "
        f"{sampled['queued_bytes'] / MiB:.1f} MiB (sampled each second)",
        f"kept-answer HEAD (probe, every {SAMPLE_EVERY * 1000:.0f} ms): max {max(heads):.1f} ms, "
        f"p99 {percentile(heads, 0.99):.1f} ms, median {statistics.median(heads):.2f} ms; "
        f"answered {sampled['probe_statuses']} (target: every one under {TARGET_HEAD_MS:.0f} ms: "
        f"{'yes' if max(heads) < TARGET_HEAD_MS else 'NO'})",
        f"/healthz from outside (the loop's lag): max {max(lags):.1f} ms, "
        f"p99 {percentile(lags, 0.99):.1f} ms, median {statistics.median(lags):.2f} ms",
        "",
        "| bound | limit | peak used (sampled) | used at the end | refusals (reason) |",
        "|---|---|---|---|---|",
    ]
    for name, bound in budget["bounds"].items():
        reason = LIMIT_REASONS.get(Bound(name))
        refused = f"{refusals.get(reason, 0):,} ({reason})" if reason else "evicts / reserve"
        peak = sampled["peaks"].get(name)
        used = bound["used"]
        lines.append(
            f"| `{name}` | {bound['limit']:,} | {'—' if peak is None else f'{peak:,}'} | "
            f"{'—' if used is None else f'{used:,}'} | {refused} |"
        )
    lines += [
        "",
        "refusals by reason (top level and every host): "
        + ", ".join(f"{reason} {count:,}" for reason, count in sorted(refusals.items())),
        f"held connections refused at once (503): {done.held_refused:,} of "
        f"{plan.past(Bound.HELD):,}; pipelined: {plan.pipelines} connections × "
        f"{plan.pipelined:,} HEADs",
        "",
        "| dimension | requests | answered | seconds |",
        "|---|---|---|---|",
    ]
    for name, statuses in done.statuses.items():
        answered = ", ".join(f"{code} {count:,}" for code, count in sorted(statuses.items()))
        lines.append(
            f"| {name} | {sum(statuses.values()):,} | {answered} | {done.seconds[name]:.1f} |"
        )
    return lines


def cost_lines(
    costs: dict[Bound, tuple[int, float]], held: tuple[int, float, int], body: int
) -> list[str]:
    lines = [
        "| bound | items filled alone | VmRSS per item | `COSTS` | measured ÷ `COSTS` |",
        "|---|---|---|---|---|",
    ]
    count, each, waiting = held
    rows = [*costs.items(), (Bound.HELD, (count, each))]
    for bound, (items, per) in rows:
        if bound is Bound.KEPT_ENTRIES:  # an entry and its body, ``manifest_bytes`` of it
            lines.append(
                f"| `{bound}` + `{Bound.KEPT_BYTES}` | {items:,} | {per:,.0f} B | "
                f"{COSTS[bound]:,} B + {body:,} B | {per / (COSTS[bound] + body):.2f} |"
            )
            continue
        lines.append(
            f"| `{bound}` | {items:,} | {per:,.0f} B | {COSTS[bound]:,} B | "
            f"{per / COSTS[bound]:.2f} |"
        )
    lines.append(f"(held: /status counted {waiting:,} waiting on {HELD_HOST})")
    return lines


# --- main -----------------------------------------------------------------------------------


def main(args: argparse.Namespace) -> None:
    raise_nofile()
    memory = "192Mi" if args.quick else args.memory
    seconds = 10.0 if args.quick else args.seconds
    with tempfile.TemporaryDirectory(prefix="kuik-flood-", dir=SCRATCH) as tmp:
        workdir = Path(tmp)
        with QuietRegistry(workdir / "registry") as registry:
            digest = push_big_blob(registry.url, BIG_REPO, args.blob_mib)
            config = flood_config(registry.url, memory, args.flood_hosts)
            kuik = start_kuikproxy(workdir / "kuikproxy", config)
            try:
                plan = Plan(
                    bounds_of(status(kuik.url)), args.over, args.manifest_bytes,
                    args.flood_hosts, args.slow_readers, args.pipelines, args.pipelined,
                )  # fmt: skip
                t0 = time.monotonic()
                seed(registry, plan.tags, args.manifest_bytes)
                print(f"seeded {len(plan.tags):,} tags in {time.monotonic() - t0:.1f} s")
                if not first_probes(port_of(kuik)):
                    raise RuntimeError("the probes' first HEADs were not answered 200")
                with sampling(workdir, kuik.pid, port_of(kuik)) as sampled:
                    t0 = time.monotonic()
                    done = asyncio.run(flood(port_of(kuik), plan, digest, seconds))
                    flooded = time.monotonic() - t0
                    figures = sampled()
                final = status(kuik.url)
                alive = kuik.process.poll() is None
            finally:
                kuik.stop()
            print(f"flood: {flooded:.1f} s; kuikproxy {'alive' if alive else 'DEAD'} after it")
            print("\n".join(table(plan, done, figures, final)))
            if args.quick:
                return
            config = flood_config(registry.url, memory, args.flood_hosts)
            kuik = start_kuikproxy(workdir / "costs", config)
            try:
                costs = asyncio.run(fill_costs(kuik.url, kuik.pid, plan))
            finally:
                kuik.stop()
            held_config = flood_config(registry.url, "1Gi", 1, maxHeld=args.held_cost + 1000)
            kuik = start_kuikproxy(workdir / "held", held_config)
            try:
                each, waiting = asyncio.run(held_cost(kuik.url, kuik.pid, args.held_cost))
            finally:
                kuik.stop()
            print()
            print(
                "\n".join(cost_lines(costs, (args.held_cost, each, waiting), args.manifest_bytes))
            )


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--sample":
        json.dump(sample(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])), sys.stdout)
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--memory", default="512Mi", help="limits.memory (the chart's limit)")
    parser.add_argument("--seconds", type=float, default=20.0, help="every bound full, held")
    parser.add_argument("--over", type=float, default=1.2, help="how far past each bound")
    parser.add_argument("--quick", action="store_true", help="a 192Mi budget, held 10 s, no costs")
    parser.add_argument("--flood-hosts", type=int, default=4)
    parser.add_argument("--manifest-bytes", type=int, default=4096)
    parser.add_argument("--blob-mib", type=int, default=64)
    parser.add_argument("--slow-readers", type=int, default=200)
    parser.add_argument("--pipelines", type=int, default=50)
    parser.add_argument("--pipelined", type=int, default=2000)
    parser.add_argument("--held-cost", type=int, default=15_000)
    main(parser.parse_args())
