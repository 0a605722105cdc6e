"""A connection's socket used from a thread while the event loop still owns the connection.

A blob relayed off the loop (``web.threadrelay``) reads the registry's socket and writes the
client's from a thread of its own. It does so through :class:`ThreadSocket`, a ``dup`` of the
socket's descriptor:

* a descriptor of its own, so that the loop closing its descriptor (a client gone, an aborted
  transport) can never leave the thread writing to whatever socket reuses that number: the
  connection lives until both are closed, and :meth:`ThreadSocket.shutdown` ends it for both;
* the same open file description as the loop's, so the same file status flags: ``O_NONBLOCK``,
  which asyncio set and relies on, is shared. Nothing here writes those flags. Python's
  ``settimeout``/``setblocking`` would (``ioctl(FIONBIO)`` on the shared description, and
  ``settimeout(None)`` would make the loop's own socket blocking), so the Python object is
  never given a timeout: made from a descriptor with no default timeout, its calls are single
  system calls that fail with ``EAGAIN`` (``BlockingIOError``) as the loop's do, and the thread
  waits with ``poll(2)`` on its own descriptor, up to a stall timeout and a deadline.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import socket
import time


class ThreadSocket:
    """A ``dup`` of a non-blocking socket's descriptor, for one thread's blocking use: each
    wait for the socket is at most ``stall`` seconds and never past ``deadline``
    (``time.monotonic()``), else :class:`TimeoutError`. Made and closed on the loop, used by
    one thread in between; :meth:`shutdown` may be called from any thread."""

    __slots__ = ("_deadline", "_poll", "_sock", "_stall")

    def __init__(self, fileno: int, stall: float, deadline: float | None) -> None:
        if socket.getdefaulttimeout() is not None:  # would make the constructor set flags
            raise RuntimeError("socket.setdefaulttimeout() is in force")
        self._sock = socket.socket(fileno=os.dup(fileno))
        self._stall = stall
        self._deadline = deadline
        self._poll = select.poll()

    def recv_into(self, buffer: memoryview, size: int) -> int:
        """At most ``size`` bytes into ``buffer`` once some have arrived: how many (0 at the
        end of the stream)."""
        while True:
            try:
                return self._sock.recv_into(buffer, size)
            except BlockingIOError:
                self._wait(select.POLLIN)

    def pending(self) -> bool:
        """Whether bytes have arrived that nothing has read yet (a peek: none is taken)."""
        try:
            return bool(self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except OSError:  # none yet (EAGAIN), or the connection is gone: nothing past the end
            return False

    def sendall(self, data: bytes | memoryview, within: float = math.inf) -> memoryview:
        """Send ``data``; what the peer has not taken after ``within`` seconds of waiting for
        it is returned unsent (nothing, when it took it all)."""
        view = memoryview(data).cast("B")
        patience = time.monotonic() + within
        while view:
            try:
                view = view[self._sock.send(view) :]
            except BlockingIOError:
                if not self._wait(select.POLLOUT, patience):
                    break
        return view

    def _wait(self, event: int, patience: float = math.inf) -> bool:
        """Until the socket is ready for ``event``: False when ``patience`` (monotonic) came
        first, :class:`TimeoutError` when the stall timeout or the deadline did."""
        now = time.monotonic()
        wait = self._stall
        if self._deadline is not None:
            wait = min(wait, self._deadline - now)
        if wait <= 0:
            raise TimeoutError
        self._poll.register(self._sock, event)
        try:
            # an error or a hang-up is ready too: the call after it says what happened
            if self._poll.poll(max(0.0, min(wait, patience - now)) * 1000):
                return True
        finally:
            self._poll.unregister(self._sock)
        if patience - now < wait:
            return False
        raise TimeoutError

    def shutdown(self) -> None:
        """End the connection for everyone (the loop's descriptor too): a thread blocked in
        :meth:`recv_into` or :meth:`sendall` wakes up and fails."""
        with contextlib.suppress(OSError):  # already gone
            self._sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """This descriptor only; the loop's, and the connection, stay as they are."""
        self._sock.close()
