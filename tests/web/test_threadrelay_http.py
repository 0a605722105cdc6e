"""A large blob by digest relayed off the loop, in a thread (kuikproxy.web.threadrelay): the
client's connection is the loop's again afterwards (kept alive, its next requests answered, its
socket still non-blocking), and every way it can end early — the client leaves, the registry
stalls past ``copy.timeout``, SIGTERM's shutdown grace runs out — ends the thread and both
connections, leaving no thread, descriptor or task behind. Each for a plain registry, read by
the thread itself, and a TLS one, whose body the loop decrypts into the thread's ring
(kuikproxy.upstream.decrypted).

Content checks (a byte wrong at either end, a registry that breaks off) are in
test_content_http.py, for both paths.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from kuikproxy.server import SHUTDOWN_GRACE
from kuikproxy.upstream.client import STALL_TIMEOUT
from kuikproxy.upstream.detached import READ_SIZE
from kuikproxy.web import relay, threadrelay
from tests.web.test_content_http import HOST, Lie, LyingRegistry, blob_of, digest_of, serve_lying

pytestmark = pytest.mark.looptime

Client = TestClient[Any, Any]
Start = Callable[..., Awaitable[tuple[Client, LyingRegistry]]]
BODY = blob_of(4 * READ_SIZE)
DIGEST = digest_of(BODY)


@pytest.fixture
def start(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    aiohttp_client: Callable[..., Awaitable[Client]],
) -> Start:
    """kuikproxy (handlers cancelled when their client leaves, SIGTERM's grace, as ``serve``)
    before a registry that answers blobs as told (``fake.lies``); over TLS with ``tls``."""

    async def run(
        tls: Path | None = None, timeout: str = "0s", store: Path | None = None
    ) -> tuple[Client, LyingRegistry]:
        """``store``: with a pull-through store there."""
        fake, upstream = await serve_lying(aiohttp_server, tls)
        cache = "" if store is None else f"cache: {{blobs: {{path: {str(store)!r}}}}}\n"
        config = parse_config(
            f"{cache}registries:\n  {HOST}:\n{upstream}    check: {{interval: 200ms}}\n"
            f"    copy: {{interval: 200ms, idle: 0s, timeout: {timeout}}}\n"
        )
        kwargs = {"handler_cancellation": True, "shutdown_timeout": SHUTDOWN_GRACE}
        return await aiohttp_client(build_app(config), server_kwargs=kwargs), fake

    return run


@pytest.fixture
def relays(monkeypatch: pytest.MonkeyPatch) -> list[threading.Thread]:
    """The threads that relayed a blob, as they started."""
    started: list[threading.Thread] = []
    original = threadrelay.relay_in_thread

    async def counted(*args: Any, **kwargs: Any) -> bool:
        before = set(threadrelay.relaying())
        task = asyncio.ensure_future(original(*args, **kwargs))
        for _ in range(10_000):  # the thread starts once the headers have gone out
            if task.done() or set(threadrelay.relaying()) != before:
                break
            await asyncio.sleep(0)
        started.extend(set(threadrelay.relaying()) - before)
        return await task

    monkeypatch.setattr(relay, "relay_in_thread", counted)
    return started


def blob_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("kuik-blob")]


def census() -> tuple[int, int, int]:
    """Blob threads, open descriptors of the process, tasks of the loop."""
    return len(blob_threads()), len(os.listdir("/proc/self/fd")), len(asyncio.all_tasks())


async def settled(done: Callable[[], bool], what: str) -> None:
    """Until ``done()``, in real time: threads run on the real clock, not the test's."""
    for _ in range(1000):
        if done():
            return
        await asyncio.to_thread(time.sleep, 0.01)
    raise AssertionError(f"never: {what}")


async def exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *requests: str
) -> list[tuple[int, bytes]]:
    """``requests`` (paths) sent at once on one connection (pipelined), their answers read in
    order: status and body, by ``Content-Length``."""
    writer.write(
        b"".join(
            f"GET {path} HTTP/1.1\r\nHost: kuik\r\nKuik-Resource: r1\r\n\r\n".encode()
            for path in requests
        )
    )
    answers = []
    for _ in requests:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        status = int(head.split(" ", 2)[1])
        fields = dict(line.split(": ", 1) for line in head.split("\r\n")[1:] if line)
        assert "Connection" not in fields  # kept alive
        answers.append((status, await reader.readexactly(int(fields["Content-Length"]))))
    return answers


async def get_blob(client: Client) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A GET of the blob on a connection of its own (asyncio streams: no client timer for the
    test's virtual clock to run out while a thread works in real time), its head read."""
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    path = f"/v2/app/blobs/{DIGEST}?ns={HOST}"
    writer.write(f"GET {path} HTTP/1.1\r\nHost: kuik\r\nKuik-Resource: r1\r\n\r\n".encode())
    assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
    return reader, writer


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_the_clients_connection_serves_its_next_requests_after_a_blob_in_a_thread(
    start: Start, tmp_path: Path, relays: list[threading.Thread], tls: bool
) -> None:
    """A keep-alive client: the blob relayed in a thread, then the same blob again and a
    small one on the same connection — sent before the first answer ended (pipelined) — all
    whole; the connection's socket is still non-blocking for the loop, and still open."""
    client, fake = await start(tls=tmp_path if tls else None)
    small = blob_of(5000)
    fake.lies[DIGEST] = Lie(BODY, DIGEST)
    fake.lies[digest_of(small)] = Lie(small, digest_of(small))
    reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
    path = f"/v2/app/blobs/{{}}?ns={HOST}"
    answers = await exchange(reader, writer, path.format(DIGEST), path.format(DIGEST))
    assert answers == [(200, BODY), (200, BODY)]
    assert len(relays) == 2  # each relayed in a thread
    assert await exchange(reader, writer, path.format(digest_of(small))) == [(200, small)]
    (connection,) = client.server.runner.server.connections  # type: ignore[union-attr]
    assert connection.transport is not None
    fd = connection.transport.get_extra_info("socket").fileno()
    assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK
    writer.close()
    await settled(lambda: not threadrelay.relaying() and not blob_threads(), "threads ended")


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_a_client_that_leaves_mid_blob_frees_the_thread_and_both_connections(
    start: Start, tmp_path: Path, relays: list[threading.Thread], tls: bool
) -> None:
    """A client that leaves in the middle of a blob: its relay's threads end, the registry's
    connection is closed, not left to stall, and no thread, descriptor or task is left over."""
    client, fake = await start(tls=tmp_path if tls else None)
    fake.lies[DIGEST] = Lie(BODY, DIGEST, stall=True)
    before = census()
    reader, writer = await get_blob(client)
    size = READ_SIZE
    assert await reader.readexactly(size) == BODY[:size]
    assert len(relays) == 1
    writer.close()
    upstream = fake.transports[-1]
    await settled(lambda: upstream is None or upstream.is_closing(), "registry's end closed")
    await settled(lambda: not blob_threads() and not threadrelay.relaying(), "threads ended")
    fake.let_go.set()  # the registry's handler ends too
    await settled(lambda: census() == before, f"{census()} back to {before}")


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_shutdown_cancels_a_blob_in_a_thread_at_the_end_of_its_grace(
    start: Start, tmp_path: Path, relays: list[threading.Thread], tls: bool
) -> None:
    """SIGTERM (``serve`` then cleans its runner up) in the middle of a blob whose registry
    stalls: the blob has the shutdown grace to end, then its handler is cancelled; the thread
    wakes then (not at the registry's stall timeout), the client's connection is broken off
    (never a clean end), and no thread, descriptor or task is left over."""
    client, fake = await start(tls=tmp_path if tls else None)
    fake.lies[DIGEST] = Lie(BODY, DIGEST, stall=True)
    before = census()
    reader, writer = await get_blob(client)
    size = READ_SIZE
    assert await reader.readexactly(size) == BODY[:size]
    assert len(relays) == 1
    await client.server.runner.cleanup()  # type: ignore[union-attr]
    with pytest.raises(asyncio.IncompleteReadError):  # broken off, never a clean end
        await reader.readexactly(len(BODY) * 2 - size)
    writer.close()
    # woken by the cancellation: the registry's stall timeout is far off (and real time)
    await settled(lambda: not blob_threads() and not threadrelay.relaying(), "threads ended")
    fake.let_go.set()
    await settled(lambda: all(a <= b for a, b in zip(census(), before, strict=True)), "freed")


@pytest.mark.looptime(False)  # the relay's thread waits on the real clock
@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_a_blob_relayed_in_a_thread_ends_at_copy_timeout(
    start: Start, tmp_path: Path, relays: list[threading.Thread], tls: bool
) -> None:
    """A registry that stalls in the middle of a blob relayed in a thread: the copy's
    ``copy.timeout`` bounds the read off the loop as it does on it (not the stall timeout), and
    the client's answer is broken off then."""
    client, fake = await start(tls=tmp_path if tls else None, timeout="1s")
    fake.lies[DIGEST] = Lie(BODY, DIGEST, stall=True)
    started = time.monotonic()
    async with client.get(
        f"/v2/app/blobs/{DIGEST}?ns={HOST}", headers={"Kuik-Resource": "r1"}
    ) as response:
        assert response.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):  # broken off, never a clean end
            await response.read()
    assert len(relays) == 1
    assert time.monotonic() - started < STALL_TIMEOUT / 2  # the deadline, not a stall
    fake.let_go.set()
    await settled(lambda: not blob_threads() and not threadrelay.relaying(), "threads ended")


@pytest.mark.parametrize("wrong", [False, True], ids=["honest", "last-byte"])
async def test_with_a_store_a_blob_is_filled_on_the_loop(
    start: Start, tmp_path: Path, relays: list[threading.Thread], wrong: bool
) -> None:
    """With a pull-through store, a large blob is read once into the store on the loop, not in
    a thread (docs/architecture.md): served whole when it is its digest's content, and otherwise
    broken off, with nothing of it kept on disk."""
    client, fake = await start(store=tmp_path / "store")
    served = BODY[:-1] + bytes([BODY[-1] ^ 1]) if wrong else BODY
    fake.lies[DIGEST] = Lie(served, DIGEST)
    reader, writer = await get_blob(client)
    if wrong:
        with pytest.raises(asyncio.IncompleteReadError):
            await reader.readexactly(len(BODY))
    else:
        assert await reader.readexactly(len(BODY)) == BODY
    writer.close()
    assert relays == []
    on_disk = [p.read_bytes() for p in (tmp_path / "store").rglob("*") if p.is_file()]
    assert (BODY in on_disk) is not wrong
    assert served not in on_disk or not wrong
