"""Connections that aiohttp stopped reading, watched for their client's hang-up (P11).

aiohttp queues at most 32 parsed requests of a connection ahead of the one it answers, then
stops reading it (``transport.pause_reading``) until the queue drains: a reset or a close behind
the queued requests is not read either, and the request under way — a read parked for its
window — would hold its place, its tasks and its descriptor until that window. So each such
connection's socket is watched meanwhile, in an epoll of its own server's (Linux), for its
peer's hang-up alone: ``EPOLLRDHUP`` (a FIN: a close or a half-close), ``EPOLLHUP`` and
``EPOLLERR`` (a reset), never ``EPOLLIN`` — the requests still unread in the socket wake nothing,
and the kernel reports the hang-up behind them. That epoll is one reader of the event loop's,
there while some connection is watched. Where there is no epoll (not Linux), nothing is
watched: the connection waits as aiohttp has it wait.
"""

from __future__ import annotations

import asyncio
import os
import select
from collections.abc import Callable

WATCHABLE = hasattr(select, "epoll") and hasattr(select, "EPOLLRDHUP")

HungUp = Callable[[], None]  # what a watched connection does when its client hangs up


class Hangups:
    """A server's watch over the sockets of its connections that are not read. Each socket is
    watched through a descriptor of the watch's own (a ``dup``), so that the socket's being
    closed before its connection unwatches it (TLS's order) never leaves the epoll watching a
    number that is by then another socket's."""

    __slots__ = ("_epoll", "_loop", "_watched")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._epoll: select.epoll | None = None
        self._watched: dict[int, HungUp] = {}  # the watch's descriptor → its connection's callback

    def watch(self, fd: int, hung_up: HungUp) -> int | None:
        """Call ``hung_up`` (once) when the peer of the socket ``fd`` hangs up: the watch, to be
        given to :meth:`unwatch` when the connection is read again or lost; None where nothing
        can be watched."""
        if not WATCHABLE:
            return None
        epoll = self._epoll
        if epoll is None:
            epoll = self._epoll = select.epoll()
            self._loop.add_reader(epoll.fileno(), self._ready)
        watch = os.dup(fd)
        epoll.register(watch, select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR)
        self._watched[watch] = hung_up
        return watch

    def unwatch(self, watch: int) -> None:
        """Stop ``watch``, if its hang-up was not told already."""
        if self._watched.pop(watch, None) is not None:
            self._forget(watch)

    def _ready(self) -> None:
        assert self._epoll is not None
        for watch, _ in self._epoll.poll(0):
            hung_up = self._watched.pop(watch, None)
            if hung_up is not None:
                self._forget(watch)  # told once: its connection is let go now
                hung_up()

    def _forget(self, watch: int) -> None:
        epoll = self._epoll
        assert epoll is not None
        epoll.unregister(watch)
        os.close(watch)
        if not self._watched:  # nothing watched: no epoll, no reader of the loop's
            self._epoll = None
            self._loop.remove_reader(epoll.fileno())
            epoll.close()
