"""Where the blob store's files are, and the file work done on its threads.

``<root>/blobs/<algorithm>/<hex>`` holds complete, verified blobs and nothing else: a file gets
there only by :func:`commit`, an atomic rename of a temp file that was hashed and fsynced first.
``<root>/tmp/`` holds writers' temp files, all deleted at open (a process killed mid-write
leaves them). ``<root>/index.sqlite`` is the index (:mod:`kuikproxy.blobs.index`); ``<root>/lock``
is held (``flock``) while a store is open, so that two processes never share the directory:
each would delete the other's temp files at open and evict the other's blobs.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from dataclasses import dataclass
from typing import BinaryIO

from kuikproxy.blobs.records import HEX_DIGITS, split_digest
from kuikproxy.core.digests import Hasher, algorithm_of, hasher
from kuikproxy.errors import StateError

log = logging.getLogger(__name__)

READ_SIZE = 1024 * 1024  # bytes read back in one go when hashing a file


@dataclass(frozen=True, slots=True)
class Layout:
    root: str

    @property
    def blobs(self) -> str:
        return os.path.join(self.root, "blobs")

    @property
    def tmp(self) -> str:
        return os.path.join(self.root, "tmp")

    @property
    def index(self) -> str:
        return os.path.join(self.root, "index.sqlite")

    def blob(self, digest: str) -> str:
        """The file of ``digest``, one that :func:`~kuikproxy.blobs.records.split_digest`
        accepted (the store never builds a path from any other)."""
        algorithm, _, hexpart = digest.partition(":")
        return os.path.join(self.blobs, algorithm, hexpart)


def lock(layout: Layout) -> int:
    """Create the directories and take the store's lock; its descriptor, closed to let go."""
    for algorithm in HEX_DIGITS:
        os.makedirs(os.path.join(layout.blobs, algorithm), exist_ok=True)
    os.makedirs(layout.tmp, exist_ok=True)
    fd = os.open(os.path.join(layout.root, "lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as error:
        os.close(fd)
        raise StateError(f"blob cache {layout.root}: in use by another kuikproxy") from error
    return fd


def clear_tmp(layout: Layout) -> None:
    """Delete every temp file: none belongs to a writer of this process yet."""
    with os.scandir(layout.tmp) as entries:
        for entry in entries:
            remove(entry.path)


def scan(layout: Layout) -> dict[str, int]:
    """The blob files there are, digest → size. A file whose name is no digest was not put
    there by :func:`commit`: it is deleted."""
    found: dict[str, int] = {}
    for algorithm in HEX_DIGITS:
        with os.scandir(os.path.join(layout.blobs, algorithm)) as entries:
            for entry in entries:
                digest = f"{algorithm}:{entry.name}"
                if split_digest(digest) is not None and entry.is_file(follow_symlinks=False):
                    found[digest] = entry.stat(follow_symlinks=False).st_size
                elif not entry.is_dir(follow_symlinks=False):
                    remove(entry.path)
    return found


def remove(path: str) -> None:
    """Unlink ``path`` if it is there. A failure is logged, not raised: the file is forgotten
    either way, and the next open deletes what has no index row."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as error:
        log.warning("blob cache: cannot delete %s (%s)", path, error)


def free(path: str) -> int:
    """Bytes an unprivileged writer may still put on ``path``'s volume."""
    stats = os.statvfs(path)
    return stats.f_bavail * stats.f_frsize


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def hash_range(fd: int, hashing: Hasher, start: int, end: int) -> None:
    """Hash bytes ``start`` to ``end`` of the file back from the page cache (a worker thread;
    hashlib lets go of the GIL). A read that fails or comes back short leaves the hash short,
    so the blob cannot verify: nothing is stored, nor served, that was not hashed whole."""
    position = start
    try:
        while position < end:
            data = os.pread(fd, min(READ_SIZE, end - position), position)
            if not data:
                break
            hashing.update(data)
            position += len(data)
    except OSError as error:
        log.warning("blob cache: cannot read a file back (%s)", error)


def check(fd: int, digest: str, size: int) -> tuple[bool, os.stat_result | None]:
    """Whether the file open on ``fd`` is ``size`` bytes that hash to ``digest``, and what
    ``fstat`` said of it once hashed (None if it could not); ``fd`` is closed. A worker thread's
    work: the file is read whole."""
    try:
        hashing = hasher(algorithm_of(digest))
        hash_range(fd, hashing, 0, size)
        stat = os.fstat(fd)
    except OSError as error:
        log.warning("blob cache: cannot check %s (%s)", digest, error)
        return False, None
    finally:
        close_quietly(fd)
    good = stat.st_size == size and f"{algorithm_of(digest)}:{hashing.hexdigest()}" == digest
    return good, stat


def commit(fd: int, tmp: str, final: str) -> BinaryIO:
    """Put a verified temp file in place, durably, and open it for reading: its bytes reach
    the disk before its name does, and the name before the index row, so neither a kill nor a
    power cut leaves a partial file under ``blobs/``."""
    os.fsync(fd)
    os.rename(tmp, final)
    directory = os.open(os.path.dirname(final), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    return open(final, "rb", buffering=0)


def close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
