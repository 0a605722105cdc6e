"""Clients that leave in the middle of their answer, as nodes do when a pull is cancelled or a
pod goes: kuikproxy as a process before the distribution registry, each way an answer is
written — a blob relayed alone (a thread's), a blob several follow (a fan-out), a blob from the
store (``sendfile``), a kept manifest (the fast path), a manifest read whole — and each way a
client leaves: a reset (``SO_LINGER`` 0) as the headers come, a close after the first bytes of
the body.

Nobody's error: the log has no ``ERROR`` and no traceback (aiohttp logged one per client,
``unexpected error … ClientConnectionResetError``), and afterwards nothing is held — no relay's
room, no seat — and every path still answers a client that stays.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.e2e.conftest import REGISTRY, StartProxy
from tests.e2e.peers import (
    Blob,
    DistributionRegistry,
    Kuikproxy,
    RegistryClient,
    SeededImage,
    http,
    seed,
)

pytestmark = pytest.mark.e2e

LEAVERS = 60  # per path and way of leaving
LAYER = 4 * 1024 * 1024


@pytest.fixture(scope="module")
def content(registry: DistributionRegistry) -> tuple[Blob, SeededImage]:
    blob = Blob("application/vnd.oci.image.layer.v1.tar", os.urandom(LAYER))
    RegistryClient(registry.url).push_blob("leaving/big", blob)
    return blob, seed(RegistryClient(registry.url), "leaving/app")


def leave(proxy: Kuikproxy, path: str, resource: str, how: str) -> None:
    """GET ``path``, then leave: ``gone`` at once (a reset before any answer), ``reset`` once
    the headers came, ``close`` after the first bytes of the body."""
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.sendall(
            f"GET {path} HTTP/1.1\r\nHost: x\r\nKuik-Resource: {resource}\r\n"
            "Accept: application/vnd.oci.image.index.v1+json\r\n\r\n".encode()
        )
        if how == "gone":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            if not chunk:
                return
            head += chunk
        if how == "reset":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif head.endswith(b"\r\n\r\n"):  # no byte of the body yet: the first of it
            sock.recv(4096)


def settled(proxy: Kuikproxy) -> dict[str, int]:
    """What is still held, once the leavers' relays have noticed (each within its timeouts)."""
    deadline = time.monotonic() + 10
    while True:
        status = proxy.status()
        held = {
            "relays": status["budget"]["bounds"]["relays"]["used"] or 0,
            "executing": sum(
                level["executing"] for level in status["flowControl"]["priorityLevels"]
            ),
        }
        if not any(held.values()) or time.monotonic() > deadline:
            return held
        time.sleep(0.2)


@pytest.fixture(params=["relay", "store"])
def proxy(
    request: pytest.FixtureRequest,
    registry: DistributionRegistry,
    start_proxy: StartProxy,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Kuikproxy]:
    """kuikproxy before the registry, passing blobs through (``paced: false``), without a store
    or with one."""
    top = {"flowControl": {"serverConcurrencyLimit": 1000}}
    if request.param == "store":
        top["cache"] = {"blobs": {"path": str(tmp_path_factory.mktemp("store"))}}
    with start_proxy(registry.url, top=top, paced=False) as started:
        yield started


@pytest.mark.parametrize("how", ["gone", "reset", "close"])
def test_clients_leaving_mid_answer_are_nobodys_error(
    proxy: Kuikproxy, content: tuple[Blob, SeededImage], how: str
) -> None:
    blob, image = content
    blob_path = f"/v2/leaving/big/blobs/{blob.digest}?ns={REGISTRY}"
    manifest_path = f"/v2/leaving/app/manifests/v1?ns={REGISTRY}"
    # alone: one client at a time, each read its own; together: all at once, followers of one
    with ThreadPoolExecutor(50) as pool:
        for n in range(LEAVERS // 2):
            leave(proxy, blob_path, f"alone-{n}", how)
        list(pool.map(lambda n: leave(proxy, blob_path, f"node-{n}", how), range(LEAVERS)))
        list(pool.map(lambda n: leave(proxy, manifest_path, f"node-{n}", how), range(LEAVERS)))
    assert settled(proxy) == {"relays": 0, "executing": 0}
    status, _, body = http(proxy.url + blob_path, headers={"Kuik-Resource": "stays"})
    assert (status, body) == (200, blob.data)
    status, _, body = http(
        proxy.url + manifest_path,
        headers={"Kuik-Resource": "stays", "Accept": image.index.media_type},
    )
    assert (status, body) == (200, image.index.data)
    log = proxy.log_file.read_text()
    assert "ERROR" not in log and "Traceback" not in log, log[-3000:]


def test_clients_gone_while_they_wait_for_a_relay_are_nobodys_error(
    registry: DistributionRegistry, start_proxy: StartProxy, content: tuple[Blob, SeededImage]
) -> None:
    """Slow readers hold every relay the budget has room for (and every seat of their level);
    forty more clients ask, wait, and leave before anything is written to them; then the slow
    readers go. The room and seats pass on to clients that left: their answers meet a closed
    connection, nobody's error, and nothing is held afterwards."""
    blob, _ = content
    path = f"/v2/leaving/big/blobs/{blob.digest}?ns={REGISTRY}"
    top = {"limits": {"memory": "96Mi"}}  # room for one relay at a time
    with start_proxy(registry.url, top=top, paced=False) as proxy:
        holders = []
        for n in range(4):  # the first holds the room; the others wait for it
            sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=30)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(
                f"GET {path} HTTP/1.1\r\nHost: x\r\nKuik-Resource: slow-{n}\r\n\r\n".encode()
            )
            holders.append(sock)
        time.sleep(1.0)
        with ThreadPoolExecutor(40) as pool:
            list(pool.map(lambda n: leave(proxy, path, f"gone-{n}", "gone"), range(40)))
        time.sleep(1.0)
        for sock in holders:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        assert settled(proxy) == {"relays": 0, "executing": 0}
        status, _, body = http(proxy.url + path, headers={"Kuik-Resource": "stays"})
        assert (status, body) == (200, blob.data)
        log = proxy.log_file.read_text()
    assert "ERROR" not in log and "Traceback" not in log, log[-3000:]


def test_clients_gone_as_kept_answers_are_written_are_nobodys_error(
    registry: DistributionRegistry, start_proxy: StartProxy, content: tuple[Blob, SeededImage]
) -> None:
    """A kept manifest (the fast path writes it as the request is parsed): clients pipeline a
    hundred HEADs of it each and reset their connection at once, while kuikproxy writes the
    answers. Nobody's error."""
    _, image = content
    path = f"/v2/leaving/app/manifests/v1?ns={REGISTRY}"
    with start_proxy(registry.url) as proxy:
        accept = {"Accept": image.index.media_type}
        for resource in ("first", "second"):  # kept for everyone after a check's window
            status, _, _ = http(
                proxy.url + path, "HEAD", headers={"Kuik-Resource": resource} | accept
            )
            assert status == 200
        heads = b"".join(
            f"HEAD {path} HTTP/1.1\r\nHost: x\r\nKuik-Resource: node-{n}\r\n"
            f"Accept: {image.index.media_type}\r\n\r\n".encode()
            for n in range(100)
        )

        def pipeline_and_go(_: int) -> None:
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as sock:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.sendall(heads)
                sock.recv(1)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

        with ThreadPoolExecutor(50) as pool:
            list(pool.map(pipeline_and_go, range(200)))
        time.sleep(1.0)
        status, _, _ = http(proxy.url + path, "HEAD", headers={"Kuik-Resource": "stays"} | accept)
        assert status == 200
        log = proxy.log_file.read_text()
    assert "ERROR" not in log and "Traceback" not in log, log[-3000:]
