"""When a stored file is still the one hashed: the mark the store keeps of a file known good.

Hashing a blob at every serve would cost CPU per MiB that ``sendfile`` otherwise spares. So a
file hashed whole to its digest keeps a mark: what ``fstat`` said of it then. Any write,
truncation or replacement through the kernel moves the file's change time (ctime, which no
call sets back) or its inode, so while a file's ``fstat`` still equals its mark it is served
on that one system call; otherwise it is hashed again before a byte of it is served.

A mark is kept only when the file's last change was at least :data:`GRANULARITY_NS` before
the hash began reading it: file systems keep times at a tick, some at a second, and a change
within that of the hash could share the time the mark holds (the "racy" case of git's index).
A file renamed into place just now is therefore hashed at its next serve again, once that is
later than this. Bytes that rot below the kernel move no time: a start keeps no marks, so each
file is hashed at its first serve after one.
"""

from __future__ import annotations

import os

Mark = tuple[int, int, int, int, int]  # device, inode, size, mtime and ctime in nanoseconds

# Longer than the coarsest timestamps a store's file system plausibly keeps (1 s: ext3, or
# ext4 with 128-byte inodes) and than a kernel tick; a clock set back only keeps marks away.
GRANULARITY_NS = 2_000_000_000


def mark_of(stat: os.stat_result) -> Mark:
    return (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def kept(stat: os.stat_result, began_ns: int) -> Mark | None:
    """The mark of a file that hashed to its digest, its hash begun at ``began_ns`` (wall
    clock, ``time.time_ns``); None when a later change could share its times."""
    return mark_of(stat) if stat.st_ctime_ns < began_ns - GRANULARITY_NS else None
