"""The rest of a large blob by digest relayed off the loop, socket to socket, in a thread.

Profiled, the loop was the bottleneck of a relayed blob (bench/RESULTS.md §3): per read of at
most 256 KiB, a parser callback, a stream buffer, a wake-up, a write and their Python. Once the
headers are out, the registry's answer, when it can be (``Opened.detach``: a ``Content-Length``
and at least 1 MiB to come), is taken in pieces of a ring of buffers by a thread of its own —
read from the registry's socket by that thread, or over TLS decrypted into the ring by the loop
— and written to the client's socket, hashed by a second thread on the way; the last piece is
written only once the whole is known to be the digest's content (R5, §12), otherwise the
client's connection is broken off. Every call that takes time lets go of the GIL: the loop runs
on. Sockets are ``dup``\\ s used without touching the loop's flags (:mod:`kuikproxy.sockets`),
made and closed on the loop; the thread only reads and writes them.

The client's connection stays the loop's: its headers went out through aiohttp, the thread
writes only the body's bytes that aiohttp was told of (``Content-Length``), and only once the
transport's buffer is empty; aiohttp writes nothing more of the answer, so the next request on
a kept-alive connection is aiohttp's again, as after any answer. A thread that fails, or a
handler cancelled (the client left, SIGTERM after the shutdown grace), ends the connection:
the sockets are shut down (which wakes the thread wherever it waits), the thread waited for,
and only then are the descriptors closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Protocol, cast

from kuikproxy.core.digests import Content, Hasher
from kuikproxy.runtime.messages import LAGGING_AFTER
from kuikproxy.sockets import ThreadSocket

MAX_THREADS = 64  # blobs relayed in threads at once; more go through the loop
FLUSH_POLL = 0.001  # seconds between looks at whether the headers have gone out

_relaying: set[threading.Thread] = set()  # blobs being relayed in threads


def relaying() -> frozenset[threading.Thread]:
    """The threads relaying blobs now (at most :data:`MAX_THREADS`)."""
    return frozenset(_relaying)


class DetachedBody(Protocol):
    """The rest of a body taken from the loop (what ``Opened.detach`` returns): ``arrived``,
    then ``remaining`` bytes in pieces of a ring of buffers (``upstream.detached``)."""

    arrived: bytes
    remaining: int
    stall: float  # seconds a socket may keep the thread waiting
    deadline: float | None  # time.monotonic(): the request's own end

    def next_piece(self) -> memoryview: ...

    def release(self, piece: memoryview) -> None: ...

    def shutdown(self) -> None: ...

    def close(self) -> None: ...


def client_socket(transport: asyncio.Transport | None) -> int | None:
    """The descriptor of the client's connection when a thread may relay to it (a plain
    socket, and a thread to spare), or None: the loop relays."""
    if (
        transport is None
        or transport.is_closing()
        or transport.get_extra_info("sslcontext") is not None
        or len(_relaying) >= MAX_THREADS
    ):
        return None
    raw = transport.get_extra_info("socket")
    return None if raw is None else int(raw.fileno())


async def relay_in_thread(
    transport: asyncio.Transport,
    client: int,
    body: DetachedBody,
    hashing: Hasher,
    check: Content,
    *,
    lagging: Callable[[], None],
) -> bool:
    """Relay ``body`` to the client's socket ``client`` (its descriptor; ``transport`` is its
    connection's) in a thread of its own (:func:`_pump`), not the executor's: a blob holds it
    for as long as it takes, and the executor also resolves names. Whether it was ``check``'s
    content. :class:`ConnectionResetError` when the client's side failed (its connection is
    aborted), :class:`~kuikproxy.errors.UpstreamError` when the registry's did. ``lagging``
    is called on the loop once the thread has waited on the client for
    :data:`~kuikproxy.runtime.messages.LAGGING_AFTER` in all."""
    loop = asyncio.get_running_loop()
    # set once by the thread, never cancelled (shielded): the thread's end is always known
    finished: asyncio.Future[bool | BaseException] = loop.create_future()
    with contextlib.ExitStack() as owned:
        owned.callback(body.close)
        sink = ThreadSocket(client, body.stall, body.deadline)
        owned.callback(sink.close)
        pace = _Pace(sink, loop, lagging)
        # the headers, still in the transport's buffer when the client is slow, go out before
        # a byte of the body
        while transport.get_write_buffer_size():
            if transport.is_closing():
                raise ConnectionResetError
            await asyncio.sleep(FLUSH_POLL)

        def run() -> None:
            outcome: bool | BaseException
            try:
                outcome = _pump(body, pace, hashing, check)
            except BaseException as error:  # handed to the loop, raised there
                outcome = error
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                loop.call_soon_threadsafe(finished.set_result, outcome)

        thread = threading.Thread(target=run, name="kuik-blob", daemon=True)
        thread.start()
        _relaying.add(thread)
        owned.callback(_relaying.discard, thread)
        try:
            outcome = await asyncio.shield(finished)
        finally:
            if not finished.done():  # cancelled: wake the thread, and let it end first
                body.shutdown()
                sink.shutdown()
                await _ended(finished)
    if isinstance(outcome, ConnectionResetError):
        # the loop may not know yet: the client's connection must not be kept with a body
        # cut short
        transport.abort()
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


async def _ended(finished: asyncio.Future[bool | BaseException]) -> None:
    """Until the thread has handed its outcome over: its sockets are not closed under it,
    however many times the handler is cancelled meanwhile (the cancellation goes on after)."""
    while not finished.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(finished)


class _Pace:
    """The client's socket as the thread writes to it, timed: once the writes have waited on
    the client for :data:`~kuikproxy.runtime.messages.LAGGING_AFTER` in all, the loop is told
    (once) that the client sets the relay's pace."""

    __slots__ = ("_lagging", "_loop", "_waited", "sink")

    def __init__(
        self, sink: ThreadSocket, loop: asyncio.AbstractEventLoop, lagging: Callable[[], None]
    ) -> None:
        self.sink = sink
        self._loop = loop
        self._lagging: Callable[[], None] | None = lagging
        self._waited = 0.0

    def send(self, data: memoryview) -> None:
        try:
            if self._lagging is not None:
                start = time.monotonic()
                data = self.sink.sendall(data, within=LAGGING_AFTER - self._waited)
                self._waited += time.monotonic() - start
                if data:  # the client has kept the relay waiting long enough
                    lagging, self._lagging = self._lagging, None
                    with contextlib.suppress(RuntimeError):  # the loop is gone: nobody to tell
                        self._loop.call_soon_threadsafe(lagging)
            self.sink.sendall(data)
        except OSError:  # gone, or not reading for as long as a registry may be silent
            raise ConnectionResetError from None


def _pump(body: DetachedBody, sink: _Pace, hashing: Hasher, check: Content) -> bool:
    """``body`` to ``sink``: what had arrived, then the rest; the last piece is sent only once
    the whole is known to hash to ``check`` (whether it did)."""
    hashing.update(body.arrived)
    last = memoryview(body.arrived)
    if body.remaining:
        sink.send(last)
        last = _ring(body, sink, hashing)
    if not check.hashes_to(hashing):
        return False
    sink.send(last)
    return True


def _ring(body: DetachedBody, sink: _Pace, hashing: Hasher) -> memoryview:
    """Every piece of ``body`` hashed, and sent but the last one, which is returned hashed.

    A second thread hashes the pieces while this one sends them (hashing in turn with the reads
    and writes held the relay to the hash's pace plus theirs), and releases each to the body's
    ring once it is both hashed and sent: only then may it be read into again."""
    todo: queue.SimpleQueue[memoryview | None] = queue.SimpleQueue()
    sent: queue.SimpleQueue[memoryview | None] = queue.SimpleQueue()  # in the order of todo

    def hash_all() -> None:
        while (piece := todo.get()) is not None:
            hashing.update(cast(bytes, piece))  # hashlib takes any buffer: no copy
            if sent.get() is None:  # the last piece, kept back, or the relay's end
                return
            body.release(piece)

    hasher = threading.Thread(target=hash_all, name="kuik-blob-hash", daemon=True)
    hasher.start()
    try:
        while True:
            piece = body.next_piece()
            todo.put(piece)
            if not body.remaining:
                return piece
            sink.send(piece)
            sent.put(piece)
    finally:
        todo.put(None)
        sent.put(None)
        hasher.join()
