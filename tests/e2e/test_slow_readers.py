"""Slow readers never stop another flow's pulls, nor take memory the pod does not have: a seat,
a place of the registry client's connections and a copy's window are held by the registry's
pace, not the client's (SPEC §10), and relay buffers come from the budget's relays share (R6).

A node on a bad link pulling a large layer reads it at a few KB a second. Its read held a seat
of its priority level for as long as the node read, its connection to the registry counted
against the registry client's limit just as long, and its copy stayed open: thirty such readers
held every seat of the built-in ``copies`` level, a few hundred every connection, and any other
resource's pull — on that host or another — waited until its timeout. Two hundred of them took
more memory than the chart's 512 MiB.

Here a real distribution registry holds one 8 MiB layer. Slow readers ask for it 30 ms apart,
so that each starts a read of its own (none follows another's read), read their answer's
headers, and then nothing: their sockets' buffers are small, so every relay waits on its client.
Readers for whom the relays' share has no room wait for it and are refused ``503`` (reason
``relays``, counted). Another resource then pulls an image on the same host and on another
host (a second name for the same registry): each manifest and blob is answered within a few
windows, and the copies level's seats are free again (``/status``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.certs import self_signed
from tests.e2e.conftest import REGISTRY, StartProxy
from tests.e2e.peers import (
    Blob,
    DistributionRegistry,
    Kuikproxy,
    RegistryClient,
    SeededImage,
    TLSRegistry,
    http,
    registry_block,
    rss_kib,
    seed,
    socket_queues,
    vm_kib,
)

pytestmark = pytest.mark.e2e

OTHER = "other.test:5000"
"""A second name for the same registry: another host to kuikproxy."""
MiB = 1024 * 1024
LAYER = 8 * MiB
"""The slow readers' layer: more than the sockets between them and the registry hold."""
WINDOW = 1.0
"""``copy.interval``: the other resource's pull must be answered within a few of these."""
APART = 0.03
"""Seconds between two slow readers' requests: the first one's read has landed by then."""


@pytest.fixture(scope="module")
def layer(registry: DistributionRegistry) -> Blob:
    blob = Blob("application/vnd.oci.image.layer.v1.tar", os.urandom(LAYER))
    RegistryClient(registry.url).push_blob("slow/big", blob)
    return blob


@pytest.fixture(scope="module")
def image(registry: DistributionRegistry) -> SeededImage:
    return seed(RegistryClient(registry.url), "fast/app")


def stalled_read(proxy: Kuikproxy, path: str, resource: str) -> tuple[socket.socket, int, bytes]:
    """A client of ``resource`` that asks for ``path``, reads its answer's headers (and a
    refusal's body), and then nothing: a receive buffer of a few KiB, never drained."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", proxy.port))
    request = f"GET {path} HTTP/1.1\r\nHost: {proxy.host_port}\r\nKuik-Resource: {resource}\r\n\r\n"
    sock.sendall(request.encode())
    head = b""
    while b"\r\n\r\n" not in head:
        piece = sock.recv(1)
        assert piece, "the proxy closed the slow reader's connection"
        head += piece
    status = int(head.split(b" ", 2)[1])
    body = b"" if status == 200 else sock.recv(4096)
    return sock, status, body


@contextlib.contextmanager
def slow_readers(
    proxy: Kuikproxy, layer: Blob, resources: list[str], host: str = REGISTRY
) -> Iterator[Counter[int]]:
    """One slow reader per entry of ``resources``, :data:`APART` seconds apart; the count of
    their answers' statuses. Every refusal is the relays' share (``relays``)."""
    path = f"/v2/slow/big/blobs/{layer.digest}?ns={host}"

    def start(n: int) -> tuple[socket.socket, int, bytes]:
        time.sleep(n * APART)
        return stalled_read(proxy, path, resources[n])

    with contextlib.ExitStack() as stack, ThreadPoolExecutor(len(resources)) as pool:
        readers = list(pool.map(start, range(len(resources))))
        for sock, _, _ in readers:
            stack.callback(sock.close)
        for _, status, body in readers:
            if status != 200:
                assert status == 503, body
                assert json.loads(body)["errors"][0]["detail"]["resource"] in resources
        yield Counter(status for _, status, _ in readers)


def pull(proxy: Kuikproxy, image: SeededImage, host: str) -> None:
    """Resource ``fast`` pulls ``image`` from ``host`` as a node does: its index by tag (a
    copy, paced), its platform's manifest, config and layer by digest; whole, and all within
    a few windows."""
    base = f"{proxy.url}/v2/{image.repository}"
    fast = {"Kuik-Resource": "fast"}
    platform = image.platforms[0]
    started = time.monotonic()
    reads = [(image.tag, image.index), (platform.manifest.digest, platform.manifest)]
    for reference, content in reads:
        url = f"{base}/manifests/{reference}?ns={host}"
        status, _, body = http(url, headers={**fast, "Accept": content.media_type}, timeout=15)
        assert (status, body) == (200, content.data), (host, reference, status, body[:300])
    for blob in platform.blobs:
        url = f"{base}/blobs/{blob.digest}?ns={host}"
        status, _, body = http(url, headers=fast, timeout=15)
        assert status == 200, (host, blob.digest, status, body[:300])
        assert "sha256:" + hashlib.sha256(body).hexdigest() == blob.digest
    took = time.monotonic() - started
    if took >= 4 * WINDOW:
        status = proxy.status()
        seen = {"relays": status["budget"]["bounds"]["relays"], "host": status["registries"][host]}
        raise AssertionError(f"{host}: the other resource's pull took {took:.1f}s: {seen}")


def copies_executing(proxy: Kuikproxy) -> int:
    levels: list[dict[str, Any]] = proxy.status()["flowControl"]["priorityLevels"]
    return next(level["executing"] for level in levels if level["name"] == "copies")


def seats_given_back(proxy: Kuikproxy) -> bool:
    """Whether the copies level's seats all came back within a few seconds: a relay lets go
    of its seat once it has waited on its client 0.5 s (the last reader's may not have yet)."""
    deadline = time.monotonic() + 5
    while copies_executing(proxy) and time.monotonic() < deadline:
        time.sleep(0.1)
    return copies_executing(proxy) == 0


def relays_refused(proxy: Kuikproxy, host: str = REGISTRY) -> int:
    refused: dict[str, int] = proxy.status()["registries"][host]["refused"]
    return refused.get("relays", 0)


def hosts(upstream: str, **settings: Any) -> dict[str, Any]:
    windows = {"copy": {"interval": f"{WINDOW:g}s", "idle": "1s"}}
    return {name: registry_block(upstream, **windows, **settings) for name in (REGISTRY, OTHER)}


@pytest.mark.parametrize(
    ("resources", "top"),
    [
        pytest.param(["slow"] * 30, {}, id="30 readers of one resource, every seat of copies"),
        pytest.param(
            [f"node-{n}" for n in range(300)],
            {"flowControl": {"serverConcurrencyLimit": 1000}, "limits": {"memory": "4Gi"}},
            id="300 readers, past the registry client's connection limit",
        ),
    ],
)
def test_slow_readers_leave_their_seats_to_other_pulls(
    registry: DistributionRegistry,
    start_proxy: StartProxy,
    layer: Blob,
    image: SeededImage,
    *,
    resources: list[str],
    top: dict[str, Any],
) -> None:
    config = {"registries": hosts(registry.url), **top}
    with (
        start_proxy(registry.url, top=config) as proxy,
        slow_readers(proxy, layer, resources) as answered,
    ):
        assert answered[200] > 0, answered
        assert relays_refused(proxy) == answered[503]
        pull(proxy, image, REGISTRY)
        pull(proxy, image, OTHER)
        assert seats_given_back(proxy), "the slow readers still hold their seats"


@pytest.fixture(scope="module")
def tls_layer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TLSRegistry, Blob]]:
    """A 16 MiB layer, pushed over plain HTTP, then served by the registry over TLS."""
    workdir = tmp_path_factory.mktemp("slow-tls")
    blob = Blob("application/vnd.oci.image.layer.v1.tar", os.urandom(2 * LAYER))
    with DistributionRegistry(workdir) as plain:
        RegistryClient(plain.url).push_blob("slow/big", blob)
    cert, key = self_signed(workdir)
    with TLSRegistry(workdir, cert, key) as secure:
        yield secure, blob


def test_two_hundred_slow_readers_of_a_tls_registry_stay_within_the_budget(
    tls_layer: tuple[TLSRegistry, Blob], start_proxy: StartProxy
) -> None:
    """Each reader its own node, each read its own: the process's peak RSS stays under the
    chart's memory limit (its budget), readers past the relays' share are refused and counted,
    and once they have gone the process is back within 20 % of its size before them. The
    kernel's queues of its sockets count with the RSS: the pod's memory cgroup pays for them."""
    registry, layer = tls_layer
    upstream = f"https://127.0.0.1:{registry.port}"
    budget = 512  # MiB: the chart's limit
    top = {"limits": {"memory": f"{budget}Mi"}, "flowControl": {"serverConcurrencyLimit": 1000}}
    tls = {"tls": {"caFile": str(registry.cert)}}
    with start_proxy(upstream, top=top, **tls) as proxy:
        url = f"{proxy.url}/v2/slow/big/blobs/{layer.digest}?ns={REGISTRY}"
        status, _, body = http(url, headers={"Kuik-Resource": "warm-up"})
        assert (status, len(body)) == (200, len(layer.data))
        time.sleep(2)  # the warm-up's relay ended a while ago: its memory went back
        before = rss_kib(proxy.pid) / 1024
        with slow_readers(proxy, layer, [f"node-{n}" for n in range(200)]) as answered:
            assert answered[200] > 0 and answered[503] > 0, answered
            assert relays_refused(proxy) == answered[503]
            assert seats_given_back(proxy), "the slow readers still hold their seats"
            queued = 0  # the most kuikproxy's sockets held, as the readers hang on
            for _ in range(5):
                queued = max(queued, sum(socket_queues(proxy.pid)))
                time.sleep(0.2)
        peak = vm_kib(proxy.pid, "VmHWM") / 1024
        # the kernel's queues of its sockets are the pod's memory too (its cgroup is charged):
        # with the peak RSS under the budget, and within the relays' share (they are theirs)
        share = proxy.status()["budget"]["bounds"]["relays"]["limit"]
        assert peak + queued / MiB < budget, (peak, queued / MiB)
        assert queued < share, (
            f"{queued / MiB:.0f} MiB queued in its sockets, over the relays' {share / MiB:.0f} MiB"
        )
        time.sleep(3)  # the relays have ended: their buffers, and the heap, are given back
        after = rss_kib(proxy.pid) / 1024
        assert after < 1.2 * before, f"RSS {before:.0f} MiB before the readers, {after:.0f} after"
