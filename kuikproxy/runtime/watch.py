"""Knowing when a config file changed (§7.2), without polling it busily.

On Linux the file's *directory* is watched with inotify, read by the event loop like a socket:
watching the directory rather than the file catches every way a file is replaced — written in
place, renamed over (editors, ``kubectl cp``), or swapped by the symlink dance Kubernetes uses to
update a mounted ConfigMap (``..data`` → a new timestamped directory). Each event names the entry
it is about, and only an entry that can change the file's identity counts (:func:`relevant`):
the file's own name, or one of the ``..``-prefixed entries of a mounted ConfigMap. The rest of
the directory (a log beside the config, a state file and its journal) is read and dropped, so
however busy it is, it holds nothing back.

A relevant event is only a hint: after a short quiet period (:data:`QUIET`), never later than
:data:`LATEST` after the first event of a burst, the file's identity (its resolved path, inode,
size and modification time) is compared with the last one seen, and only a real change calls
back. Where inotify is not available, the same identity is polled every :data:`POLL` seconds.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import struct
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)

POLL = 2.0  # seconds between looks without inotify
QUIET = 0.1  # seconds without a relevant event before looking: a write in several parts settles
# Seconds from the first relevant event of a burst to the look, however many follow: a file
# rewritten without pause is looked at anyway (a version read mid-write is refused, and the
# next look, at most this much later, reads the finished one).
LATEST = 0.5
# inotify(7): a file written, moved or linked in, deleted, or its attributes changed
# MODIFY, ATTRIB, CLOSE_WRITE, MOVED_FROM, MOVED_TO, CREATE, DELETE
_IN_EVENTS = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200
_IN_Q_OVERFLOW = 0x4000  # the kernel dropped events: which entries changed is unknown
_IN_NONBLOCK_CLOEXEC = os.O_NONBLOCK | os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then the name
# The atomic writer of a mounted ConfigMap swaps entries named ``..data``, ``..data_tmp`` and
# ``..<timestamp>``; Kubernetes refuses keys starting with "..", so none is a user's file.
_CONFIGMAP_PREFIX = b".."

Identity = tuple[str, int, int, int] | None


def identity(path: str) -> Identity:
    """What tells one version of the file from another; None while it does not exist."""
    try:
        real = os.path.realpath(path)
        stat = os.stat(real)
    except OSError:
        return None
    return (real, stat.st_ino, stat.st_size, stat.st_mtime_ns)


def events(buffer: bytes) -> Iterator[tuple[int, bytes]]:
    """The (mask, entry name) of each inotify event in ``buffer``, as ``read(2)`` returns
    them: whole events, each name NUL-padded (empty for an event on the directory itself)."""
    offset = 0
    while offset + _EVENT.size <= len(buffer):
        _, mask, _, length = _EVENT.unpack_from(buffer, offset)
        start = offset + _EVENT.size
        yield mask, buffer[start : start + length].rstrip(b"\0")
        offset = start + length


def relevant(mask: int, name: bytes, own: bytes) -> bool:
    """Whether an event about entry ``name`` can change the identity of the file named
    ``own`` in the watched directory."""
    return bool(mask & _IN_Q_OVERFLOW) or name == own or name.startswith(_CONFIGMAP_PREFIX)


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
        self._latest: float | None = None  # when the look of the burst in progress is due
        directory, own = os.path.split(os.path.abspath(path))
        self._own = os.fsencode(own)
        self._fd = _inotify(directory)
        if self._fd is not None:
            loop.add_reader(self._fd, self._events)
        else:
            log.info("watching %s every %gs (no inotify here)", path, POLL)
            self._timer = loop.call_later(POLL, self._poll)

    def _events(self) -> None:
        assert self._fd is not None
        hint = False
        try:
            while chunk := os.read(self._fd, 65536):  # drain, whatever counts
                hint = hint or any(relevant(m, n, self._own) for m, n in events(chunk))
        except BlockingIOError:
            pass
        if not hint:
            return
        now = self._loop.time()
        if self._latest is None:
            self._latest = now + LATEST
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._loop.call_at(min(now + QUIET, self._latest), self._settled)

    def _settled(self) -> None:
        self._timer = self._latest = None
        self._look()

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
