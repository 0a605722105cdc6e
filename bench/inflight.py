"""Ten clients of one blob read in flight, without the pull-through store, one of them slow:
kuikproxy's memory while they trail one registry read, and whether the slow one holds the
others back. Everything on 127.0.0.1.

Without ``cache.blobs`` a blob GET that others follow is given from memory
(``kuikproxy/runtime/fanout.py``): a window of at most ``WINDOW`` (16 MiB) that every client
sends from at its own pace; when the window is full and a client waits for more, the slowest
is overtaken and reads the rest with a ``Range`` read of its own. So ten clients, one of them on
a 1 MiB/s link, should cost about one window, not a blob, and the nine others should not go at
the slow one's pace.

Layout: one distribution registry (``docker-registry``, filesystem storage under the run's
temp dir, its combined access log on) holding ``bench/big``, ``--blob-mib`` (512) MiB of random
bytes pushed as one streamed ``PATCH``; kuikproxy as a subprocess (``kuikproxy serve --config``,
``registry.bench:5000`` ``paced: false``, no ``cache.blobs``), a fresh one for every scenario
through it. Each client is a process of its own (this file, ``--read``: no client waits for
another's GIL) reading a raw socket that the bench connected and hands it: all connections
are made first, then every request is sent from here in one burst (the slow client's first:
its request is the one that goes to the registry), so the nine others arrive before the
registry's answer and follow that read (checked: ``/status`` ``reads`` and the registry's
access log; a fan-out whose clients did not all follow one read, the bench preempted
mid-burst on a busy machine, is run again, up to 3 times in all, and says so). A fast
client writes the body to a file on /dev/shm (memory: no disk, no hashing while timed) and the
files are hashed afterwards; the slow one has a 64 KiB receive buffer, reads at ``--slow-rate``
(1 MiB/s) and hashes as it goes; ``--slow-tail`` (3) s after the nine finished it reads the
rest as fast as it can (by then from its own ``Range`` read) and its hash is checked too.

Scenarios, each ``--rounds`` (2) times, interleaved in each round:

* ``registry, 1``: one client GETs the blob from the registry itself (the registry's speed);
* ``kuikproxy, 1``: one client through kuikproxy (a solo read, relayed as before);
* ``registry, 9``: nine at once from the registry itself (the registry's speed for nine);
* ``kuikproxy, 9``: nine at once through kuikproxy, no slow client (the fan-out, control);
* ``kuikproxy, 9+slow``: the case: the nine and the slow one, through kuikproxy.

A thread samples kuikproxy's VmRSS (``/proc/<pid>/status``) every ``--sample-ms`` (50) ms;
growth is the peak during the scenario (until the slow client's end) over the idle value just
before the requests are sent (connections already open); ``left`` is the RSS over that idle
value 1 s after the last client ended (what outlives the read). Times are from sending the
burst to a client's last byte. The registry's blob GETs (status, bytes) are read from its
access log.

The target, judged on every round of the case: **kuikproxy's RSS growth < 64 MiB**, and **the
nine fast clients finish at the registry's speed: the slowest of them within 1.5× the slowest
of nine clients reading the blob from the registry itself at once** (``registry, 9``, same
round: what the registry gives nine clients on this machine). Against one client alone on the
registry (``registry, 1``, also printed) the nine cannot be within 1.5× on a small machine:
nine bodies cross the loopback and the clients' copies share its cores with kuikproxy (on 2
cores the registry itself takes 6-12× as long for nine as for one). The nine must have shared one
registry read (its log shows one 200 GET of the blob, with and without the slow client) and
the slow one must have read on with a ``Range`` GET (a 206), or the run did not test the
shape and fails. Fast clients that fall a window behind the fastest are overtaken too (a 206
each: the log's count and the bytes the registry sent, ``×blob``, say how often). The other
rows say where the time goes: ``kuikproxy, 9`` against ``registry, 9`` is the fan-out's own
cost, against ``kuikproxy, 9+slow`` what the slow one costs the others. Exit status 1 when a
target is missed or a body is wrong.

Run: ``.venv/bin/python bench/inflight.py`` (about 2 minutes; ``--blob-mib 128 --rounds 1``
for a quick look).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

MiB = 1024 * 1024
TARGET_RSS_MIB = 64.0  # kuikproxy's RSS growth while the ten trail one read
TARGET_FAST_RATIO = 1.5  # the slowest fast client's time over nine reading from the registry
FAST_CLIENTS = 9
CLIENT_DIR = Path("/dev/shm")  # the fast clients' bodies: memory, hashed after
RECV = MiB  # a client's read buffer
SLOW_RCVBUF = 64 * 1024  # the slow client's socket receive buffer (before connecting)
SLOW_PIECE = 16 * 1024  # the slow client reads at most this at a time while slow
TIMEOUT = 120.0  # any socket read
LEFT_AFTER = 1.0  # s after the last client's end: the RSS left then
ATTEMPTS = 3  # of a fan-out whose clients did not all follow one read (Bench.scenario)
# a line of the combined access log: "GET /v2/.../blobs/sha256:... HTTP/1.1" 206 12345
ACCESS = re.compile(r'"(GET|HEAD) (\S+) HTTP/[\d.]+" (\d{3}) (\d+|-)')


# --- a client's reader (a process of its own: ``--read``) -----------------------------------


@dataclass
class Result:
    """What a reader reports, as JSON on its stdout. Times are ``time.monotonic()``, the
    system's monotonic clock (the same in every process)."""

    status: int = 0
    size: int = 0
    got: int = 0
    digest: str = ""  # the slow client's, hashed as it read (a fast one's file is hashed after)
    ended: float = 0.0  # its last byte (or giving up)
    slow_bytes: int = 0  # read while slow
    slow_ended: float = 0.0  # when it was released
    error: str = ""


class Reader:
    """One client's answer, read from ``sock`` (connected, its request sent by the bench).
    ``out``: the body goes to that file (a fast client); else it is hashed as it comes, at
    ``rate`` bytes/s until ``release`` is set (the slow client)."""

    def __init__(self, sock: socket.socket, out: Path | None, rate: float | None) -> None:
        self.sock, self.out, self.rate = sock, out, rate
        self.release = threading.Event()
        self.result = Result()

    def run(self) -> Result:
        try:
            self._read()
        except (OSError, ValueError) as error:
            self.result.error = f"{type(error).__name__}: {error}"
        finally:
            self.result.ended = self.result.ended or time.monotonic()
            self.sock.close()
        return self.result

    def _head(self) -> bytes:
        """Reads the status line and headers; returns the body's first bytes."""
        data = b""
        while b"\r\n\r\n" not in data:
            more = self.sock.recv(SLOW_PIECE if self.rate is not None else 65536)
            if not more:
                raise ValueError(f"closed before the headers ({len(data)} bytes)")
            data += more
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        self.result.status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if self.result.status != 200 or "content-length" not in headers:
            raise ValueError(f"answered {lines[0]!r}, headers {headers}")
        self.result.size = int(headers["content-length"])
        return rest

    def _read(self) -> None:
        rest = self._head()
        if self.out is not None:
            self._read_fast(rest)
        else:
            self._read_slow(rest)
        result = self.result
        result.ended = time.monotonic()
        if result.got != result.size:
            raise ValueError(f"the body ended at {result.got} of {result.size} bytes")

    def _read_fast(self, rest: bytes) -> None:
        assert self.out is not None
        result, view = self.result, memoryview(bytearray(RECV))
        fd = os.open(self.out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            _write_all(fd, rest)
            result.got = len(rest)
            while result.got < result.size:
                n = self.sock.recv_into(view)
                if not n:
                    return
                _write_all(fd, view[:n])
                result.got += n
        finally:
            os.close(fd)

    def _read_slow(self, rest: bytes) -> None:
        assert self.rate is not None
        result, view = self.result, memoryview(bytearray(RECV))
        sha = hashlib.sha256(rest)
        result.got = len(rest)
        t0 = time.monotonic()
        while result.got < result.size:
            if self.release.is_set():
                if not result.slow_ended:
                    result.slow_ended, result.slow_bytes = time.monotonic(), result.got
                n = self.sock.recv_into(view)
            else:
                allowed = int((time.monotonic() - t0) * self.rate) - result.got
                if allowed <= 0:
                    self.release.wait(min(0.05, (1 - allowed) / self.rate))
                    continue
                n = self.sock.recv_into(view[: min(allowed, SLOW_PIECE)])
            if not n:
                break
            sha.update(view[:n])
            result.got += n
        if not result.slow_ended:  # it read everything while slow
            result.slow_ended, result.slow_bytes = time.monotonic(), result.got
        result.digest = "sha256:" + sha.hexdigest()


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def reader_main(spec: dict[str, Any]) -> int:
    """A reader process: the socket is inherited (``spec["fd"]``); says ``ready`` on stdout,
    reads, then prints its :class:`Result`. A line on stdin releases the slow client; stdin's
    end (the bench is gone) breaks the read off."""
    sock = socket.socket(fileno=spec["fd"])
    sock.settimeout(TIMEOUT)
    reader = Reader(sock, Path(spec["out"]) if spec["out"] else None, spec["rate"])

    def watch() -> None:
        if not sys.stdin.readline():  # the bench is gone
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        reader.release.set()

    threading.Thread(target=watch, daemon=True).start()
    print("ready", flush=True)
    print(json.dumps(asdict(reader.run())), flush=True)
    return 0


if __name__ == "__main__" and sys.argv[1:2] == ["--read"]:  # a reader needs nothing below
    sys.exit(reader_main(json.loads(sys.argv[2])))

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from bench.proxy import (  # noqa: E402
    BENCH_HOST,
    BLOB_REPO,
    Peer,
    QuietRegistry,
    push_big_blob,
    serve_kuikproxy,
)
from bench.store import file_digest  # noqa: E402
from tests.e2e.peers import (  # noqa: E402
    LOOPBACK,
    clean_env,
    cpu_seconds,
    free_port,
    http,
    rss_kib,
    stop_process,
)

# --- peers ----------------------------------------------------------------------------------


class LoggingRegistry(QuietRegistry):
    """The bench registry with its combined access log on (stdout, so in its log file): one
    line per request, with its status and the bytes sent."""

    def config(self) -> dict[str, Any]:
        config = super().config()
        config["log"] = {"level": "error", "accesslog": {"disabled": False}}
        return config

    def log_size(self) -> int:
        try:
            return self.log_file.stat().st_size
        except FileNotFoundError:
            return 0

    def blob_gets(self, digest: str, since: int, expect: int) -> list[tuple[int, int]]:
        """(status, bytes) of every GET of ``digest``'s blob in the log past offset ``since``,
        once ``expect`` are there and nothing new came for 0.2 s, or after 5 s (the log trails
        answers)."""
        last: list[tuple[int, int]] | None = None
        deadline = time.monotonic() + 5
        while True:
            with self.log_file.open("rb") as f:
                f.seek(since)
                text = f.read().decode(errors="replace")
            gets = [
                (int(m[3]), int(m[4]) if m[4] != "-" else 0)
                for m in ACCESS.finditer(text)
                if m[1] == "GET" and m[2].partition("?")[0].endswith(f"/blobs/{digest}")
            ]
            if len(gets) >= expect and gets == last:
                return gets
            if time.monotonic() > deadline:
                return gets
            last = gets
            time.sleep(0.2)


def start_kuikproxy(workdir: Path, upstream: str) -> Peer:
    """A kuikproxy of its own before ``upstream``, ``paced: false``, without a store."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config: dict[str, Any] = {
        "listen": f"{LOOPBACK}:{port}",
        "registries": {BENCH_HOST: {"upstream": upstream, "paced": False}},
    }
    return serve_kuikproxy(workdir, port, config)


def blob_reads(kuik: Peer) -> dict[str, int]:
    """kuikproxy's ``/status`` ``reads``: its blob reads sent to the registry, and shared."""
    code, _, body = http(kuik.url + "/status")
    if code != 200:
        raise RuntimeError(f"/status: {code}")
    reads = json.loads(body)["reads"]
    return {"registry": reads["registry"]["blob"], "shared": reads["shared"]["blob"]}


class RssSampler:
    """VmRSS of ``pid`` every ``every`` s in a thread: (``time.monotonic()``, KiB) samples."""

    def __init__(self, pid: int, every: float) -> None:
        self.pid, self.every = pid, every
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), rss_kib(self.pid)))
            self._stop.wait(self.every)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.monotonic(), rss_kib(self.pid)))

    def peak(self, until: float = float("inf")) -> int:
        """The highest sample so far, or of those taken until ``until``."""
        return max((kib for t, kib in self.samples if t <= until), default=0)


# --- clients --------------------------------------------------------------------------------


class Client:
    """One GET: its connection made and its request sent here (so that every request of a
    scenario leaves in one burst), its answer read by a :class:`Reader` in a process of its
    own, which inherits the socket (no client waits for another's GIL)."""

    def __init__(
        self, name: str, port: int, path: str, *, out: Path | None = None,
        rate: float | None = None,
    ) -> None:  # fmt: skip
        self.name, self.port, self.path, self.out, self.rate = name, port, path, out, rate
        self.sock: socket.socket | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.result = Result()
        self.digest = ""  # the body's, once known

    def connect(self) -> None:
        """Connects, and starts the reader process, once it is ready to read."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if self.rate is not None:  # before connecting, so the window it advertises is small
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SLOW_RCVBUF)
        sock.settimeout(TIMEOUT)
        sock.connect((LOOPBACK, self.port))
        self.sock = sock
        spec = {"fd": sock.fileno(), "out": str(self.out) if self.out else None, "rate": self.rate}
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--read", json.dumps(spec)],
            pass_fds=(sock.fileno(),),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=clean_env(),
        )
        if self._stdout.readline().strip() != b"ready":
            raise RuntimeError(f"{self.name}: its reader did not start")

    @property
    def _stdout(self) -> IO[bytes]:
        assert self.process is not None and self.process.stdout is not None
        return self.process.stdout

    def request(self) -> bytes:
        return (
            f"GET {self.path} HTTP/1.1\r\nHost: {LOOPBACK}:{self.port}\r\n"
            "User-Agent: kuik-bench-inflight\r\nAccept: */*\r\nConnection: close\r\n\r\n"
        ).encode()

    def send(self, request: bytes) -> None:
        assert self.sock is not None
        self.sock.sendall(request)

    def detach(self) -> None:
        """This process's copy of the socket closed (the reader's stays open)."""
        if self.sock is not None:
            self.sock.close()

    def release(self) -> None:
        """The slow client reads the rest as fast as it can."""
        assert self.process is not None and self.process.stdin is not None
        self.process.stdin.write(b"release\n")
        self.process.stdin.flush()

    def wait(self) -> Result:
        """Its reader's result, once it ended (its socket read times out at worst)."""
        line = self._stdout.readline()
        self.result = Result(**json.loads(line)) if line else Result(error="its reader died")
        self.stop()
        return self.result

    def stop(self) -> None:
        if self.sock is not None:
            self.sock.close()
        if self.process is not None:
            if self.process.stdin is not None:
                with contextlib.suppress(OSError):
                    self.process.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):  # an ended one exits itself
                self.process.wait(5 if self.result.ended else 0.1)
            stop_process(self.process, 1)
            if self.process.stdout is not None:
                self.process.stdout.close()


def burst(clients: list[Client]) -> float:
    """Every request sent at once (the connections are open, the readers ready), nothing else
    between them; returns when the burst began (``time.monotonic()``)."""
    requests = [(client, client.request()) for client in clients]
    t0 = time.monotonic()
    for client, request in requests:
        client.send(request)
    for client in clients:
        client.detach()
    return t0


# --- scenarios ------------------------------------------------------------------------------


@dataclass
class Run:
    """One scenario's figures."""

    name: str
    fast_seconds: list[float]  # each fast client's, from the burst to its last byte
    gets: list[tuple[int, int]]  # the registry's blob GETs: (status, bytes)
    wrong: list[str]  # clients whose body was not the blob, or broke off
    rss_idle_kib: int = 0
    rss_peak_kib: int = 0  # during the whole scenario
    rss_fast_peak_kib: int = 0  # until the nine fast clients ended
    rss_left_kib: int = 0  # LEFT_AFTER s after every client ended
    kuik_cpu_s: float = 0.0
    reads: dict[str, int] | None = None  # kuikproxy's /status blob reads
    slow: Result | None = None
    slow_started: float = 0.0  # the burst, as the slow client's times count
    fast_done: float = 0.0  # the last fast client's end, s from the burst
    attempt: int = 1  # of ATTEMPTS (Bench.scenario)

    @property
    def one_read(self) -> bool:
        """Whether the registry's log shows one full GET of the blob."""
        return [status for status, _ in self.gets].count(200) == 1

    @property
    def growth_mib(self) -> float:
        return (self.rss_peak_kib - self.rss_idle_kib) / 1024

    @property
    def fast_growth_mib(self) -> float:
        return (self.rss_fast_peak_kib - self.rss_idle_kib) / 1024

    @property
    def left_mib(self) -> float:
        return (self.rss_left_kib - self.rss_idle_kib) / 1024

    @property
    def slowest(self) -> float:
        return max(self.fast_seconds)


@dataclass
class Bench:
    workdir: Path
    registry: LoggingRegistry
    digest: str
    size: int
    args: argparse.Namespace

    @property
    def path(self) -> str:
        return f"/v2/{BLOB_REPO}/blobs/{self.digest}"

    def scenario(self, name: str, *, fast: int, slow: bool, through: bool, round_: int) -> Run:
        """One scenario, on a fresh kuikproxy when ``through``. When the clients of a fan-out
        did not all follow one read (a request of the burst reached kuikproxy after the
        registry's answer: the bench's process was preempted mid-burst on a busy machine),
        it is run again, up to :data:`ATTEMPTS` times in all."""
        for attempt in range(1, ATTEMPTS + 1):
            kuik = None
            if through:
                where = self.workdir / f"kuikproxy-{round_}-{name.replace(' ', '')}-{attempt}"
                kuik = start_kuikproxy(where, self.registry.url)
            out = Path(tempfile.mkdtemp(prefix="kuik-bench-inflight-", dir=CLIENT_DIR))
            try:
                run = self._scenario(name, kuik, out, fast=fast, slow=slow)
            finally:
                if kuik is not None:
                    kuik.stop()
                shutil.rmtree(out, ignore_errors=True)
            run.attempt = attempt
            if not (through and fast > 1) or run.one_read or attempt == ATTEMPTS:
                return run
            print(f"[{name}: {gets_text(run.gets)} in the registry's log: the clients did not "
                  "all follow one read; again]", flush=True)  # fmt: skip
        raise AssertionError("unreachable")

    def _scenario(self, name: str, kuik: Peer | None, out: Path, *, fast: int, slow: bool) -> Run:
        port = int(kuik.url.rsplit(":", 1)[1]) if kuik is not None else self.registry.port
        path = f"{self.path}?ns={BENCH_HOST}" if kuik is not None else self.path
        clients: list[Client] = []
        if slow:  # first: its request is the one that goes to the registry
            clients.append(Client("slow", port, path, rate=self.args.slow_rate * MiB))
        quick = [Client(f"fast-{i}", port, path, out=out / str(i)) for i in range(fast)]
        clients += quick
        since = self.registry.log_size()
        sampler = RssSampler(kuik.pid if kuik is not None else 0, self.args.sample_ms / 1000)
        cpu = cpu_seconds([kuik.pid]) if kuik is not None else 0.0
        try:
            for client in clients:
                client.connect()
            with sampler if kuik is not None else contextlib.nullcontext():
                time.sleep(0.3)  # the idle value, every connection open
                idle = sampler.peak()
                t0 = burst(clients)
                ended = [c.wait().ended for c in quick]
                fast_done = max(ended) - t0
                if slow:
                    time.sleep(self.args.slow_tail)
                    clients[0].release()
                    clients[0].wait()
            kuik_cpu = cpu_seconds([kuik.pid]) - cpu if kuik is not None else 0.0
            reads = blob_reads(kuik) if kuik is not None else None
            if kuik is not None:
                time.sleep(LEFT_AFTER)
            left = rss_kib(kuik.pid) if kuik is not None else 0
        finally:
            for client in clients:
                client.stop()
        with ThreadPoolExecutor(2) as pool:  # hashlib lets go of the GIL
            digests = list(pool.map(file_digest, (c.out for c in quick if c.out is not None)))
        for client, digest in zip(quick, digests, strict=True):
            client.digest = digest if client.result.got == client.result.size else ""
        if slow:
            clients[0].digest = clients[0].result.digest
        wrong = [
            f"{c.name}: {c.result.error or 'wrong bytes'}"
            for c in clients
            if c.digest != self.digest
        ]
        expect = 1 if kuik is not None else len(clients)
        gets = self.registry.blob_gets(self.digest, since, expect + (1 if slow else 0))
        return Run(
            name=name,
            fast_seconds=[e - t0 for e in ended],
            gets=gets,
            wrong=wrong,
            rss_idle_kib=idle,
            rss_peak_kib=sampler.peak(),
            rss_fast_peak_kib=sampler.peak(until=t0 + fast_done),
            rss_left_kib=left,
            kuik_cpu_s=kuik_cpu,
            reads=reads,
            slow=clients[0].result if slow else None,
            slow_started=t0,
            fast_done=fast_done,
        )


SCENARIOS: tuple[tuple[str, int, bool, bool], ...] = (
    # name, fast clients, a slow one, through kuikproxy
    ("registry, 1", 1, False, False),
    ("kuikproxy, 1", 1, False, True),
    ("registry, 9", FAST_CLIENTS, False, False),
    ("kuikproxy, 9", FAST_CLIENTS, False, True),
    ("kuikproxy, 9+slow", FAST_CLIENTS, True, True),
)
CASE = "kuikproxy, 9+slow"
BASELINE = "registry, 1"  # one client alone on the registry
REGISTRY_SPEED = "registry, 9"  # the target's: the registry's speed for nine clients
CONTROL = "kuikproxy, 9"  # the case without its slow client
FANNED = (CONTROL, CASE)  # nine or ten clients of one registry read


# --- the report -----------------------------------------------------------------------------


def gets_text(gets: list[tuple[int, int]]) -> str:
    counts: dict[int, int] = {}
    for status, _ in gets:
        counts[status] = counts.get(status, 0) + 1
    return " ".join(f"{n}×{s}" for s, n in sorted(counts.items())) or "none"


def table(
    rounds: list[dict[str, Run]], size: int, digest: str, args: argparse.Namespace
) -> list[str]:
    lines = [
        f"one {size // MiB} MiB blob; s: from sending the requests to a client's last byte (of "
        "the fast ones); ÷: the slowest's over the same round's; RSS: kuikproxy's VmRSS every "
        f"{args.sample_ms:g} ms, growth = peak − idle (connections open), over the whole "
        f"scenario and until the fast ones ended, left: {LEFT_AFTER:g} s after the last client "
        "ended (over idle); registry: its access log's blob GETs",
        "",
        f"{'round':<5} {'scenario':<17} {'median s':>8} {'slowest s':>9} {'÷reg,1':>6} "
        f"{'÷reg,9':>6} {'MiB/s':>5} {'RSS idle':>8} {'growth MiB':>10} {'(fast)':>6} {'left':>5} "
        f"{'CPU s':>5} {'registry GETs':>13} {'×blob':>5}  /status blob reads",
    ]
    for r, runs in enumerate(rounds, 1):
        one, nine = runs[BASELINE].slowest, runs[REGISTRY_SPEED].slowest
        for name, run in runs.items():
            sent = sum(b for _, b in run.gets) / size
            kuik = (
                f"{run.rss_idle_kib / 1024:>8.1f} {run.growth_mib:>10.2f} "
                f"{run.fast_growth_mib:>6.2f} {run.left_mib:>5.1f} {run.kuik_cpu_s:>5.2f}"
                if run.reads is not None
                else f"{'—':>8} {'—':>10} {'—':>6} {'—':>5} {'—':>5}"
            )
            reads = (
                f"registry {run.reads['registry']}, shared {run.reads['shared']}"
                if run.reads is not None
                else "—"
            )
            lines.append(
                f"{r:<5} {name:<17} {statistics.median(run.fast_seconds):>8.2f} "
                f"{run.slowest:>9.2f} {run.slowest / one:>6.2f} {run.slowest / nine:>6.2f} "
                f"{size / MiB / run.slowest:>5.0f} {kuik} {gets_text(run.gets):>13} "
                f"{sent:>5.2f}  {reads}"
            )
    lines.append("")
    for r, runs in enumerate(rounds, 1):
        case = runs[CASE]
        slow = case.slow
        if slow is None:
            continue
        ranges = [b for s, b in case.gets if s == 206]  # in the order they ended
        resumed = (  # the slow client's is the last to end
            f"its own Range read from offset {(size - ranges[-1]) / MiB:.1f} MiB "
            f"(the last of {len(ranges)} Range GETs in the registry's log)"
            if ranges
            else "no Range GET in the registry's log"
        )
        rest = slow.got - slow.slow_bytes
        finish = max(slow.ended - slow.slow_ended, 1e-9)
        verdict = "right" if slow.digest == digest else f"WRONG ({slow.error})"
        lines.append(
            f"round {r}: slow client read {slow.slow_bytes / MiB:.1f} MiB at ≤ "
            f"{args.slow_rate:g} MiB/s in {slow.slow_ended - case.slow_started:.1f} s (until "
            f"{args.slow_tail:g} s after the nine, done at {case.fast_done:.2f} s), then the rest, "
            f"{rest / MiB:.1f} MiB, in {finish:.2f} s ({rest / MiB / finish:.0f} MiB/s) from "
            f"{resumed}; SHA-256 of its {slow.got / MiB:.1f} MiB {verdict}"
        )
    return lines


def verdict(rounds: list[dict[str, Run]], size: int) -> tuple[list[str], bool]:
    growth = [runs[CASE].growth_mib for runs in rounds]
    ratios = [runs[CASE].slowest / runs[REGISTRY_SPEED].slowest for runs in rounds]
    per_one = [runs[CASE].slowest / runs[BASELINE].slowest for runs in rounds]
    by_slow = [runs[CASE].slowest / runs[CONTROL].slowest for runs in rounds]
    wrong = [f"round {r} {n}: {w}" for r, runs in enumerate(rounds, 1) for n, run in runs.items()
             for w in run.wrong]  # fmt: skip
    shared = all(runs[name].one_read for runs in rounds for name in FANNED)
    again = sum(runs[name].attempt - 1 for runs in rounds for name in FANNED)
    resumed = all(206 in [s for s, _ in runs[CASE].gets] for runs in rounds)
    rss_ok = max(growth) < TARGET_RSS_MIB
    fast_ok = max(ratios) <= TARGET_FAST_RATIO
    upstream = [sum(b for _, b in runs[CASE].gets) / size for runs in rounds]
    lines = [
        f"target: kuikproxy's RSS growth < {TARGET_RSS_MIB:g} MiB: "
        + ("met" if rss_ok else "MISSED")
        + f" (max {max(growth):.2f} MiB over {len(rounds)} rounds)",
        f"target: the nine fast clients at the registry's speed, the slowest within "
        f"{TARGET_FAST_RATIO:g}× the slowest of nine reading from the registry itself: "
        + ("met" if fast_ok else "MISSED")
        + " ("
        + ", ".join(f"{x:.2f}×" for x in ratios)
        + ")",
        "  (the same ÷ one client alone on the registry: "
        + ", ".join(f"{x:.2f}×" for x in per_one)
        + "; ÷ the nine through kuikproxy without the slow one: "
        + ", ".join(f"{x:.2f}×" for x in by_slow)
        + ")",
        "the nine shared one registry read (one 200 GET in its log, with and without the slow "
        "one): "
        + ("yes" if shared else "NO: the shape was not tested")
        + (f" ({again} run again for it)" if again else "")
        + "; the slow client read on with a Range GET: "
        + ("yes" if resumed else "NO")
        + "; the registry sent "
        + ", ".join(f"{x:.2f}×" for x in upstream)
        + " the blob",
        "every body's SHA-256 is the digest: "
        + ("yes" if not wrong else "NO: " + "; ".join(wrong)),
    ]
    return lines, rss_ok and fast_ok and shared and resumed and not wrong


# --- main -----------------------------------------------------------------------------------


@contextlib.contextmanager
def workdir(keep: bool) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kuik-bench-inflight-"))
    try:
        yield path
    finally:
        if keep:
            print(f"[kept {path}]")
        else:
            shutil.rmtree(path, ignore_errors=True)


def tree_text() -> str:
    """Which kuikproxy this run measures: the work tree's commit, and whether kuikproxy/ has
    uncommitted changes (other sessions edit it meanwhile)."""

    def git(*args: str) -> str:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, check=False
        )
        return out.stdout.strip()

    changed = "kuikproxy/ changed" if git("status", "--porcelain", "kuikproxy") else "clean"
    return f"the work tree of {git('rev-parse', '--short', 'HEAD') or '?'} ({changed})"


def load_text() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def bench(args: argparse.Namespace) -> int:
    loads, tree = [load_text()], tree_text()
    with workdir(args.keep) as work, LoggingRegistry(work / "registry") as registry:
        t0 = time.monotonic()
        digest = push_big_blob(registry.url, BLOB_REPO, args.blob_mib)
        print(f"[pushed {args.blob_mib} MiB blob in {time.monotonic() - t0:.1f} s]", flush=True)
        bench = Bench(work, registry, digest, args.blob_mib * MiB, args)
        rounds: list[dict[str, Run]] = []
        for r in range(args.rounds):
            runs: dict[str, Run] = {}
            for name, fast, slow, through in SCENARIOS:
                run = bench.scenario(name, fast=fast, slow=slow, through=through, round_=r)
                runs[name] = run
                print(
                    f"[round {r + 1} {name}: slowest fast client {run.slowest:.2f} s"
                    + (f", RSS growth {run.growth_mib:.2f} MiB" if run.reads is not None else "")
                    + "]",
                    flush=True,
                )
            rounds.append(runs)
        lines = table(rounds, bench.size, digest, args)
        summary, ok = verdict(rounds, bench.size)
        print("\n" + "\n".join([*lines, "", *summary]), flush=True)
        print(
            f"[{time.monotonic() - t0:.0f} s; load average at the start {loads[0]}, at the end "
            f"{load_text()}; kuikproxy: {tree} at the start, {tree_text()} at the end]"
        )
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--blob-mib", type=int, default=512, help="blob size (default 512)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every scenario (2)")
    parser.add_argument("--slow-rate", type=float, default=1.0, help="slow client, MiB/s (1)")
    parser.add_argument(
        "--slow-tail", type=float, default=3.0,
        help="s the slow client stays slow after the nine ended (3), then reads the rest",
    )  # fmt: skip
    parser.add_argument("--sample-ms", type=float, default=50.0, help="RSS sampling (50 ms)")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs)")
    return bench(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
