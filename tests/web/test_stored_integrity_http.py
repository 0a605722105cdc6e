"""A stored file that is not what it was (§15): cut short or with other bytes on disk, found so
at a read, after a restart, or while a client reads it. Its clients get the registry's bytes
or a connection broken off, never other bytes, never a hang, and never a connection kept open
after a body shorter than its ``Content-Length`` (the next answer would land in that body).

The stored file is found where ``cache.blobs.path`` says the store keeps its blobs
(``<path>/blobs/<algorithm>/<hex>``, docs/spec.md §15); each client is a raw socket that
sends two GETs at once, so that an answer cut short but kept alive shows as a body that runs
into the next answer, or as no end at all."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from tests.conftest import HOST, ProxyFactory
from tests.upstream_app import Registry, blob_of
from tests.web.raw import Exchange, answers, exchange
from tests.web.test_metrics_http import named, scrape
from tests.web.test_store_http import BLOB, BLOB_DIGEST, COPY, config, get, store_at

pytestmark = pytest.mark.looptime

Client = TestClient[Any, Any]


def stored_file(store: Path, digest: str) -> Path:
    algorithm, _, hexpart = digest.partition(":")
    return store / "blobs" / algorithm / hexpart


def twice(digest: str) -> bytes:
    """Two GETs of ``digest``, written at once on one connection."""
    one = (
        f"GET /v2/app/blobs/{digest}?ns={HOST} HTTP/1.1\r\n"
        f"Host: 127.0.0.1\r\nKuik-Resource: node\r\n\r\n"
    )
    return (one * 2).encode()


def assert_honest(result: Exchange, body: bytes) -> None:
    """Every answer that came whole is ``body``; one that did not come whole ended with the
    connection closed, not kept waiting."""
    for response in result.responses:
        assert response.status == 200
        assert response.body == body, "other bytes than the blob's, or a body run into the next"
    if len(result.responses) < 2:
        assert result.closed, "a body cut short on a connection left open"


def flip(path: Path, at: int) -> None:
    """Other bytes at ``at``, the size kept."""
    with path.open("r+b") as file:
        file.seek(at)
        old = file.read(16)
        file.seek(at)
        file.write(bytes(b ^ 0xFF for b in old))


def dropped(caplog: pytest.LogCaptureFixture, digest: str) -> list[logging.LogRecord]:
    """The store's log records saying it let go of ``digest``'s file as bad."""
    return [
        r
        for r in caplog.records
        if r.name.startswith("kuikproxy.blobs")
        and digest in r.getMessage()
        and "not served" in r.getMessage()
    ]


async def filled(client: Client, store: Path, digest: str, body: bytes) -> Path:
    response = await get(client, f"blobs/{digest}")
    assert await response.read() == body
    path = stored_file(store, digest)
    assert path.stat().st_size == len(body)
    return path


async def second_read_is_the_registrys(
    client: Client, fake: Registry, store: Path, digest: str, body: bytes
) -> None:
    """A read after a bad file was found is whole, from the registry, and stored right again."""
    assert await (await get(client, f"blobs/{digest}", "later")).read() == body
    assert len(fake.reads("blobs")) == 2
    assert stored_file(store, digest).read_bytes() == body


def cut_short(path: Path) -> None:
    with path.open("r+b") as file:
        file.truncate(path.stat().st_size // 2)


def other_bytes(path: Path) -> None:
    flip(path, path.stat().st_size // 3)


@pytest.mark.parametrize("spoil", [cut_short, other_bytes])
async def test_a_stored_file_that_is_not_its_blob_is_read_from_the_registry_again(
    proxy: ProxyFactory,
    registry: tuple[Registry, TestServer],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    spoil: Callable[[Path], None],
) -> None:
    """Cut short, or its bytes changed with its size kept: dropped once, never served."""
    fake, _ = registry
    client = await proxy(COPY, top=store_at(tmp_path))
    path = await filled(client, tmp_path, BLOB_DIGEST, BLOB)
    spoil(path)
    result = await exchange(client.host, client.port, twice(BLOB_DIGEST), expect=2)
    assert_honest(result, BLOB)
    assert len(result.responses) == 2
    assert len(dropped(caplog, BLOB_DIGEST)) == 1
    await second_read_is_the_registrys(client, fake, tmp_path, BLOB_DIGEST, BLOB)
    # counted, and shown: /status and /metrics
    status = await (await client.get("/status")).json()
    assert status["cache"]["store"]["rejected"] == 1
    assert named(await scrape(client), "kuik_proxy_store_rejected_files_total") == {(): 1.0}


@pytest.mark.looptime(False)  # the store trusts a file by its times on disk: real seconds pass
async def test_a_stored_file_served_a_while_then_changed_is_not_served(
    proxy: ProxyFactory, registry: tuple[Registry, TestServer], tmp_path: Path
) -> None:
    """Served from the disk (and so known good) before its bytes change: still caught."""
    fake, _ = registry
    client = await proxy(COPY, top=store_at(tmp_path))
    path = await filled(client, tmp_path, BLOB_DIGEST, BLOB)
    for _ in range(2):
        assert await (await get(client, f"blobs/{BLOB_DIGEST}")).read() == BLOB
    await asyncio.sleep(3)
    assert await (await get(client, f"blobs/{BLOB_DIGEST}")).read() == BLOB
    assert len(fake.reads("blobs")) == 1
    flip(path, 0)
    result = await exchange(client.host, client.port, twice(BLOB_DIGEST), expect=2)
    assert_honest(result, BLOB)
    assert len(result.responses) == 2
    await second_read_is_the_registrys(client, fake, tmp_path, BLOB_DIGEST, BLOB)


async def test_a_stored_file_with_other_bytes_is_not_served_after_a_restart(
    registry: tuple[Registry, TestServer],
    aiohttp_client: Any,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake, server = registry
    text = config(server, tmp_path)
    first = await aiohttp_client(build_app(parse_config(text)))
    path = await filled(first, tmp_path, BLOB_DIGEST, BLOB)
    await first.close()
    flip(path, len(BLOB) - 16)
    second = await aiohttp_client(build_app(parse_config(text)))
    result = await exchange(second.host, second.port, twice(BLOB_DIGEST), expect=2)
    assert_honest(result, BLOB)
    assert len(result.responses) == 2
    assert len(dropped(caplog, BLOB_DIGEST)) == 1
    await second_read_is_the_registrys(second, fake, tmp_path, BLOB_DIGEST, BLOB)


BIG = bytes(range(251)) * (32 * 1024 * 1024 // 251)  # ~32 MiB: more than the sockets buffer
BIG_DIGEST = blob_of(BIG)
RECEIVE_BUFFER = 64 * 1024


async def test_a_stored_file_cut_short_while_a_client_reads_it_closes_that_connection(
    proxy: ProxyFactory, registry: tuple[Registry, TestServer], tmp_path: Path
) -> None:
    """The file shrinks under a client's read: its connection is closed once what is left has
    gone, never kept for its next request; the next read is whole, from the registry."""
    fake, _ = registry
    client = await proxy(COPY, top=store_at(tmp_path))
    path = await filled(client, tmp_path, BIG_DIGEST, BIG)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (client.host, client.port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=RECEIVE_BUFFER)
    buffer = b""
    try:
        writer.write(twice(BIG_DIGEST))
        await writer.drain()
        while len(buffer) < 1024 * 1024:  # the head and the first MiB: the client is mid-read
            buffer += await reader.read(RECEIVE_BUFFER)
        with path.open("r+b") as file:
            file.truncate(len(BIG) // 2)
        result = await answers(reader, buffer, expect=2, timeout=10)
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    assert_honest(result, BIG)
    assert not result.responses, "the blob came whole from a file cut to half"
    assert await (await get(client, f"blobs/{BIG_DIGEST}", "later")).read() == BIG
    assert len(fake.reads("blobs")) == 2
