"""Slow readers of a blob, each its own node and its own read: kuikproxy's memory while they
hang on, whether the loop stays responsive, and what is left once they have gone. Everything on
127.0.0.1.

One distribution registry (over TLS by default, ``--plain`` for HTTP) holds one ``--blob-mib``
(16) MiB layer; kuikproxy serves it with ``limits.memory`` ``--budget`` (512Mi, the chart's
limit) and ``serverConcurrencyLimit: 1000``, no store. After one warm-up read (TLS context, first
connection), ``--readers`` (200) clients, 30 ms apart so each starts a read of its own, each
with ``Kuik-Resource: node-<n>`` and a 4 KiB receive buffer, read their answer's headers and
then nothing. A process of its own GETs ``/healthz`` every 50 ms throughout (the loop's lag as a
client sees it). Printed: the answers' statuses (``503``: refused for want of the relays'
room), VmRSS before the readers, VmHWM (the peak), VmRSS 5 s after they closed, the most its
sockets held queued in the kernel as the readers hung on (``ss``: not in RSS, but charged to
the pod's memory cgroup), the probe's worst and p99.

``--baseline DIR`` runs the same against a kuikproxy from another source tree (``git worktree
add DIR <commit>``) first, side by side in the same run.

Run: ``.venv/bin/python bench/slow_readers.py [--baseline /tmp/kuik-base]`` (about a minute a
kuikproxy).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.certs import self_signed
from tests.e2e.conftest import REGISTRY
from tests.e2e.peers import (
    Blob,
    DistributionRegistry,
    Kuikproxy,
    RegistryClient,
    TLSRegistry,
    clean_env,
    http,
    registry_block,
    socket_queues,
    spawn,
    vm_kib,
)

PROBE = """
import http.client, json, sys, time
port, until = int(sys.argv[1]), time.monotonic() + float(sys.argv[2])
connection, took = http.client.HTTPConnection("127.0.0.1", port, timeout=10), []
while time.monotonic() < until:
    start = time.monotonic()
    connection.request("GET", "/healthz")
    connection.getresponse().read()
    took.append(time.monotonic() - start)
    time.sleep(0.05)
print(json.dumps(took))
"""


class Proxy(Kuikproxy):
    """kuikproxy from ``source`` (a source tree), or this one."""

    def __init__(self, workdir: Path, config: dict[str, Any], source: Path | None) -> None:
        super().__init__(workdir, config)
        self.source = source

    def launch(self) -> subprocess.Popen[bytes]:
        import yaml

        config_file = self.workdir / "kuikproxy.yaml"
        config_file.write_text(yaml.safe_dump({"listen": self.host_port, **self.settings}))
        extra = {} if self.source is None else {"PYTHONPATH": str(self.source)}
        # -P: not the working directory first on the path, which would be this tree
        command = [sys.executable, "-P", "-m", "kuikproxy", "serve", "--config", str(config_file)]
        return spawn(command, self.log_file, clean_env(PYTHONUNBUFFERED="1", **extra))


def stalled(proxy: Proxy, path: str, n: int) -> tuple[socket.socket, int]:
    time.sleep(n * 0.03)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(60)
    sock.connect(("127.0.0.1", proxy.port))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nKuik-Resource: node-{n}\r\n\r\n".encode())
    head = b""
    try:
        while b"\r\n\r\n" not in head:
            head += sock.recv(1)
    except TimeoutError:
        return sock, 0  # never answered within a minute
    return sock, int(head.split(b" ", 2)[1])


def run(args: argparse.Namespace, upstream: str, blob: Blob, ca: Path | None, source: Path | None):
    block = registry_block(upstream, copy={"interval": "1s", "idle": "1s"})
    if ca is not None:
        block["tls"] = {"caFile": str(ca)}
    config = {
        "defaultRegistry": REGISTRY,
        "allowedHosts": [],
        "registries": {REGISTRY: block},
        "flowControl": {"serverConcurrencyLimit": 1000},
        "limits": {"memory": args.budget},
    }
    path = f"/v2/slow/big/blobs/{blob.digest}?ns={REGISTRY}"
    with Proxy(Path(tempfile.mkdtemp()), config, source) as proxy:
        code, _, body = http(proxy.url + path, headers={"Kuik-Resource": "warm-up"})
        assert code == 200 and body == blob.data, code
        time.sleep(2)
        before = vm_kib(proxy.pid, "VmRSS") / 1024
        probe = subprocess.Popen(
            [sys.executable, "-c", PROBE, str(proxy.port), str(args.readers * 0.03 + 25)],
            stdout=subprocess.PIPE,
        )
        with ThreadPoolExecutor(args.readers) as pool:
            readers = list(pool.map(lambda n: stalled(proxy, path, n), range(args.readers)))
        queues = [socket_queues(proxy.pid)]
        for _ in range(10):  # the relays' queues as they fill behind their stalled clients
            time.sleep(0.5)
            queues.append(socket_queues(proxy.pid))
        peak = vm_kib(proxy.pid, "VmHWM") / 1024
        for sock, _ in readers:
            sock.close()
        time.sleep(5)
        after = vm_kib(proxy.pid, "VmRSS") / 1024
        out, _ = probe.communicate()
        took = sorted(json.loads(out))
    statuses = Counter(status for _, status in readers)
    return {
        "answers": dict(sorted(statuses.items())),
        "rss before MiB": round(before),
        "VmHWM MiB": round(peak),
        "rss after MiB": round(after),
        "socket queues MiB (received, to send)": [
            round(max(q[i] for q in queues) / 2**20) for i in (0, 1)
        ],
        "after/before": round(after / before, 2),
        "probe max ms": round(took[-1] * 1000),
        "probe p99 ms": round(took[int(len(took) * 0.99)] * 1000),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readers", type=int, default=200)
    parser.add_argument("--blob-mib", type=int, default=16)
    parser.add_argument("--budget", default="512Mi")
    parser.add_argument("--plain", action="store_true", help="the registry over plain HTTP")
    parser.add_argument("--baseline", type=Path, help="another kuikproxy source tree, first")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp())
    blob = Blob("application/octet-stream", os.urandom(args.blob_mib * 1024 * 1024))
    with DistributionRegistry(work) as plain:
        RegistryClient(plain.url).push_blob("slow/big", blob)
    cert, key = self_signed(work)
    registry = DistributionRegistry(work) if args.plain else TLSRegistry(work, cert, key)
    with registry:
        scheme = "http" if args.plain else "https"
        upstream = f"{scheme}://127.0.0.1:{registry.port}"
        ca = None if args.plain else cert
        for name, source in (("baseline", args.baseline), ("kuikproxy", None)):
            if name == "baseline" and source is None:
                continue
            print(name, json.dumps(run(args, upstream, blob, ca, source)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
