"""A socket the loop owns, used from a thread through a ``dup`` (kuikproxy.sockets): the loop's
descriptor keeps its flags and its timeout whatever the thread does, waits end at the stall
timeout and at the deadline, and a shutdown from another thread wakes a blocked call."""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from kuikproxy.sockets import ThreadSocket


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """The loop's end (non-blocking, as asyncio makes it) and its peer."""
    loops, peer = socket.socketpair()
    loops.setblocking(False)
    yield loops, peer
    loops.close()
    peer.close()


def non_blocking(sock: socket.socket) -> bool:
    return bool(fcntl.fcntl(sock.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK)


def test_waits_end_at_the_stall_timeout_and_leave_the_loops_socket_as_it_was(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    loops, peer = pair
    thread_end = ThreadSocket(loops.fileno(), stall=0.05, deadline=None)
    buffer = memoryview(bytearray(64))
    with pytest.raises(TimeoutError):  # nothing to read
        thread_end.recv_into(buffer, 64)
    with pytest.raises(TimeoutError):  # the peer reads nothing: the buffers fill up
        thread_end.sendall(b"x" * (64 * 1024 * 1024))
    assert non_blocking(loops) and loops.gettimeout() == 0.0
    peer.sendall(b"hello")
    assert thread_end.recv_into(buffer, 64) == 5 and bytes(buffer[:5]) == b"hello"
    thread_end.close()
    assert non_blocking(loops)
    peer.sendall(b"again")  # still the loop's: closing the dup closed nothing else
    assert loops.recv(8) == b"again"
    assert peer.recv(8) == b"xxxxxxxx"


def test_a_deadline_past_fails_at_once(pair: tuple[socket.socket, socket.socket]) -> None:
    loops, _ = pair
    thread_end = ThreadSocket(loops.fileno(), stall=3600, deadline=time.monotonic() - 1)
    with pytest.raises(TimeoutError):
        thread_end.recv_into(memoryview(bytearray(8)), 8)
    thread_end.close()


def test_a_shutdown_from_another_thread_wakes_a_blocked_read(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    loops, _ = pair
    thread_end = ThreadSocket(loops.fileno(), stall=3600, deadline=None)
    got: list[int] = []
    reader = threading.Thread(
        target=lambda: got.append(thread_end.recv_into(memoryview(bytearray(8)), 8))
    )
    reader.start()
    thread_end.shutdown()
    reader.join(30)
    assert not reader.is_alive() and got == [0]  # the end of the stream, for the loop too
    assert loops.recv(8) == b""
    thread_end.close()


def test_refused_while_a_default_timeout_is_in_force(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """With ``socket.setdefaulttimeout``, making the Python object would set the shared flags."""
    loops, _ = pair
    socket.setdefaulttimeout(5)
    try:
        with pytest.raises(RuntimeError):
            ThreadSocket(loops.fileno(), stall=1, deadline=None)
    finally:
        socket.setdefaulttimeout(None)
