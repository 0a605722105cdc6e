"""Knowing when a config file changed (§7.2), without polling it busily.

On Linux the file's *directory* is watched with inotify, read by the event loop like a socket:
watching the directory rather than the file catches every way a file is replaced — written in
place, renamed over (editors, ``kubectl cp``), or swapped by the symlink dance Kubernetes uses to
update a mounted ConfigMap (``..data`` → a new timestamped directory). Any event there is only a
hint: after a short quiet period the file's identity (its resolved path, inode, size and
modification time) is compared with the last one seen, and only a real change calls back. Where
inotify is not available, the same identity is polled every :data:`POLL` seconds.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
from collections.abc import Callable

log = logging.getLogger(__name__)

POLL = 2.0  # seconds between looks without inotify
QUIET = 0.1  # seconds without an event before looking: a write in several parts settles
# inotify(7): a file written, moved or linked in, deleted, or its attributes changed
# MODIFY, ATTRIB, CLOSE_WRITE, MOVED_FROM, MOVED_TO, CREATE, DELETE
_IN_EVENTS = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200
_IN_NONBLOCK_CLOEXEC = os.O_NONBLOCK | os.O_CLOEXEC

Identity = tuple[str, int, int, int] | None


def identity(path: str) -> Identity:
    """What tells one version of the file from another; None while it does not exist."""
    try:
        real = os.path.realpath(path)
        stat = os.stat(real)
    except OSError:
        return None
    return (real, stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _inotify(directory: str) -> int | None:
    """An inotify descriptor watching ``directory``, or None where there is none."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name, use_errno=True)
        fd = int(libc.inotify_init1(_IN_NONBLOCK_CLOEXEC))
    except (OSError, AttributeError):
        return None
    if fd < 0:
        return None
    if libc.inotify_add_watch(fd, os.fsencode(directory), _IN_EVENTS) < 0:
        os.close(fd)
        return None
    return fd


class FileWatch:
    """Calls ``changed()`` on the loop, once per change of the file at ``path``."""

    def __init__(
        self, path: str, changed: Callable[[], object], loop: asyncio.AbstractEventLoop
    ) -> None:
        self.path = path
        self._changed = changed
        self._loop = loop
        self._seen = identity(path)
        self._timer: asyncio.TimerHandle | None = None
        self._fd = _inotify(os.path.dirname(os.path.abspath(path)))
        if self._fd is not None:
            loop.add_reader(self._fd, self._events)
        else:
            log.info("watching %s every %gs (no inotify here)", path, POLL)
            self._timer = loop.call_later(POLL, self._poll)

    def _events(self) -> None:
        assert self._fd is not None
        try:
            while os.read(self._fd, 65536):  # drain: what happened is looked up, not read
                pass
        except BlockingIOError:
            pass
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_later(QUIET, self._look)

    def _poll(self) -> None:
        self._look()
        self._timer = self._loop.call_later(POLL, self._poll)

    def _look(self) -> None:
        now = identity(self.path)
        # missing is a moment in a replacement (deleted, then written): the new one is awaited
        if now is not None and now != self._seen:
            self._seen = now
            self._changed()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None
