"""The blob store of the pull-through cache (R1, R6): content-addressed files on disk, bounded
by bytes, least recently used out, with who may be given each blob (R5).

A blob is stored only once verified: written to a temp file, hashed on the way, fsynced, then
renamed into ``blobs/`` (:mod:`kuikproxy.blobs.writer`). So a kill at any moment leaves at worst
temp files, which the next open deletes. A file can still change after that (a disk, a tool,
an operator): :meth:`BlobStore.lookup` checks its size at every open and hashes it again
unless it is unchanged since it was last hashed (:mod:`kuikproxy.blobs.marks`), so a blob it
returns is whole and what its digest says when it is opened. A file found otherwise is
dropped with its grants and tags, logged and counted (``rejected``): its next read goes to
the registry and stores it again.

``used`` counts complete blobs and the room reserved by writers under way, and never passes
``max_bytes``: a writer with a declared size reserves it when it is made, one without reserves
each chunk before writing it, and room is made by evicting complete blobs, least recently used
first; a blob being written is never evicted, and a writer that cannot get room is refused
(``None``, or ``write`` answering False). The index and the lock file are not counted.

Thread work: the index (SQLite) on a thread of its own, in order (the pattern of
:mod:`kuikproxy.state.threaded`); hashing and fsyncs on a small pool. All through
``run_in_executor``, so that the tests' virtual clock (looptime) keeps to real time meanwhile.
The loop itself does only what costs a system call or two: appending a chunk, opening a file
for a lookup, unlinking an evicted one. Unlinking there, not on a thread, keeps the bytes on
disk within ``max_bytes`` at every moment: an evicted file is gone before the writer that made
room for it writes (a reader still holding it keeps its bytes until it closes it).

The index is written lazily: changes (a blob stored or evicted, its place in the LRU order
after a lookup, grants, tags) are gathered by key and flushed at most every
:data:`FLUSH_DELAY` seconds and at :meth:`BlobStore.close`. What a kill loses of them costs only
cache (:mod:`kuikproxy.blobs.recovery`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO

from kuikproxy.blobs import disk, marks
from kuikproxy.blobs.catalog import Catalog
from kuikproxy.blobs.disk import Layout
from kuikproxy.blobs.index import BlobRow, Changes
from kuikproxy.blobs.records import Stored, TagRecord, split_digest
from kuikproxy.blobs.recovery import Recovered, recover
from kuikproxy.blobs.writer import BlobWriter
from kuikproxy.core.digests import matches

__all__ = ["BlobStore", "BlobWriter", "Stored", "TagRecord"]

log = logging.getLogger(__name__)

FLUSH_DELAY = 1.0  # seconds: the most a change waits before the index is written
FILE_THREADS = 4  # hashing and fsyncs of writers in parallel
# The catalog's bounds, oldest out (a lost grant or tag costs a registry read, never a leak).
# Every name in them can be a client's own (a repository under a wildcard host, a token per
# node that changes every few minutes): measured with all names distinct, a tag record is
# ~1.2 KB and a grant ~0.7 KB, so these hold the catalog under ~125 MiB.
MAX_TAGS = 50_000
MAX_GRANTS = 100_000


@dataclass(slots=True)
class _Blob:
    size: int
    media_type: str | None
    used: int  # its place in the LRU order, as the index keeps it
    mark: marks.Mark | None = None  # its file as last hashed whole, if that can be trusted


class BlobStore:
    def __init__(
        self,
        layout: Layout,
        recovered: Recovered,
        index_thread: ThreadPoolExecutor,
        *,
        max_bytes: int,
        max_grants: int,
        max_tags: int,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._layout = layout
        self._lock = recovered.lock
        self._index = recovered.index
        self._index_thread = index_thread
        self._files = ThreadPoolExecutor(FILE_THREADS, thread_name_prefix="kuikproxy-blobs")
        self.max_bytes = max_bytes
        self.evictions = 0
        self.rejected = 0  # files found not to be their blob, and dropped
        self._checks: dict[str, tuple[marks.Mark, asyncio.Task[bool | None]]] = {}
        loaded = recovered.loaded
        self._blobs: OrderedDict[str, _Blob] = OrderedDict(  # least recently used first
            (row.digest, _Blob(row.size, row.media_type, row.used)) for row in loaded.blobs
        )
        self._used_seq = max((blob.used for blob in self._blobs.values()), default=0)
        self._complete = sum(blob.size for blob in self._blobs.values())
        self._reserved = 0
        self._writing: dict[str, BlobWriter] = {}  # oldest first
        self._catalog = Catalog(max_grants, max_tags, loaded.grants, loaded.tags)
        self._dirty: set[str] = set()  # digests whose index row is to be written
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False  # refusing writers and lookups
        self._index_closing = False  # no more flushes to schedule
        self._fit()  # max_bytes may be lower than at the last run

    @classmethod
    async def open(
        cls,
        path: str,
        max_bytes: int,
        *,
        max_grants: int = MAX_GRANTS,
        max_tags: int = MAX_TAGS,
    ) -> BlobStore:
        """Open (or create) the store in directory ``path``. Raises
        :class:`~kuikproxy.errors.StateError` when another process has it open."""
        loop = asyncio.get_running_loop()
        layout = Layout(path)
        index_thread = ThreadPoolExecutor(1, thread_name_prefix="kuikproxy-blob-index")
        try:
            recovered = await loop.run_in_executor(index_thread, recover, layout)
        except BaseException:
            index_thread.shutdown(wait=False)
            raise
        return cls(
            layout,
            recovered,
            index_thread,
            max_bytes=max_bytes,
            max_grants=max_grants,
            max_tags=max_tags,
        )

    @property
    def used(self) -> int:
        """Bytes of complete blobs and bytes reserved by writers under way."""
        return self._complete + self._reserved

    @property
    def count(self) -> int:
        """Complete blobs."""
        return len(self._blobs)

    def resize(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._fit()

    def contains(self, digest: str) -> bool:
        """Whether the blob is stored (its LRU place untouched)."""
        return digest in self._blobs

    async def lookup(self, digest: str) -> Stored | None:
        """The blob, open, if stored and its file is what its digest says; it becomes the most
        recently used. A file changed since it was last hashed is hashed again first, on a
        thread (one hash for every lookup of it meanwhile)."""
        opened = self._open(digest)
        if opened is None:
            return None
        blob, file, stat = opened
        if blob.mark != marks.mark_of(stat):
            try:
                good = await self._check(digest, blob, file, stat)
            except BaseException:
                file.close()
                raise
            if not good or self._closed:
                file.close()
                return None
        if self._blobs.get(digest) is blob:  # not evicted meanwhile (its file is still open)
            self._touch(digest, blob)
        return Stored(digest, blob.size, blob.media_type, file)

    def read_small(self, digest: str, limit: int) -> bytes | None:
        """The whole of a stored blob of at most ``limit`` bytes (a manifest), read and hashed
        here, on the loop: it is small and in the page cache. None when it is not stored, is
        larger, or is not its content (then it is dropped)."""
        opened = self._open(digest)
        if opened is None:
            return None
        blob, file, stat = opened
        with file:
            if blob.size > limit:
                return None
            began = time.time_ns()
            body = os.pread(file.fileno(), blob.size + 1, 0)
        if not matches(digest, body):
            self._reject(digest, "is not its content")
            return None
        blob.mark = marks.kept(stat, began)
        self._touch(digest, blob)
        return body

    def _open(self, digest: str) -> tuple[_Blob, BinaryIO, os.stat_result] | None:
        """The blob's file, open, if it is stored and of its size (else it is dropped)."""
        blob = self._blobs.get(digest)
        if blob is None or self._closed:
            return None
        try:
            file: BinaryIO = open(self._layout.blob(digest), "rb", buffering=0)  # noqa: SIM115
        except FileNotFoundError as error:  # deleted behind the store's back
            log.warning("blob cache: cannot open %s (%s): forgotten", digest, error)
            self._drop(digest)
            return None
        except OSError as error:  # out of descriptors, say: the blob is still there
            log.warning("blob cache: cannot open %s now (%s)", digest, error)
            return None
        try:
            stat = os.fstat(file.fileno())
        except OSError as error:
            file.close()
            log.warning("blob cache: cannot stat %s now (%s)", digest, error)
            return None
        if stat.st_size != blob.size:
            file.close()
            self._reject(digest, f"is {stat.st_size} bytes, not {blob.size}")
            return None
        return blob, file, stat

    async def _check(
        self, digest: str, blob: _Blob, file: BinaryIO, stat: os.stat_result
    ) -> bool | None:
        """Whether ``file`` hashes to ``digest`` (None: it could not be told now). One hash
        of a file as it is now serves every lookup of it that comes meanwhile."""
        mark = marks.mark_of(stat)
        running = self._checks.get(digest)
        if running is None or running[0] != mark:
            try:  # the hash's own descriptor: a caller that gives up closes its file
                fd = os.dup(file.fileno())
            except OSError as error:
                log.warning("blob cache: cannot check %s now (%s)", digest, error)
                return None
            task = self._loop.create_task(self._hash(digest, blob, fd, mark))
            self._checks[digest] = running = (mark, task)
            task.add_done_callback(lambda _: self._checked(digest, task))
        return await asyncio.shield(running[1])

    def _checked(self, digest: str, task: asyncio.Task[bool | None]) -> None:
        running = self._checks.get(digest)
        if running is not None and running[1] is task:
            del self._checks[digest]

    async def _hash(self, digest: str, blob: _Blob, fd: int, mark: marks.Mark) -> bool | None:
        began = time.time_ns()
        try:
            job = self._loop.run_in_executor(self._files, disk.check, fd, digest, blob.size)
        except RuntimeError:  # the store closed: its threads are gone
            disk.close_quietly(fd)
            return None
        good, stat = await job
        if stat is None:
            return None
        if self._blobs.get(digest) is not blob:
            return good  # evicted, or dropped, meanwhile: its file was hashed all the same
        if not good:
            self._reject(digest, "is not its content")
        elif marks.mark_of(stat) == mark:
            blob.mark = marks.kept(stat, began)
        return good

    def _reject(self, digest: str, why: str) -> None:
        """A file that is not its blob: never served. Dropped with its grants and tags, so
        that the next read of it goes to the registry (and stores it again)."""
        log.warning("blob cache: the file of %s %s: not served, dropped", digest, why)
        self.rejected += 1
        self._drop(digest)

    def writing(self, digest: str) -> BlobWriter | None:
        """The writer under way for ``digest``, if any: its temp file can be read meanwhile."""
        return self._writing.get(digest)

    def writer(self, digest: str, size: int | None, media_type: str | None) -> BlobWriter | None:
        """A writer for ``digest``, ``size`` bytes reserved; None when it is stored or being
        written already, when it can never fit, or when no room can be made for it."""
        if (
            self._closed
            or split_digest(digest) is None
            or digest in self._blobs
            or digest in self._writing
            or (size is not None and size < 0)
            or not self._make_room(size or 0)
            or not self._disk_room(size or 0)
        ):
            return None
        algorithm, _, hexpart = digest.partition(":")
        try:
            fd, path = tempfile.mkstemp(prefix=f"{algorithm}-{hexpart[:16]}-", dir=self._layout.tmp)
        except OSError as error:
            log.warning("blob cache: cannot create a temp file (%s)", error)
            return None
        writer = BlobWriter(
            self,
            self._files,
            digest=digest,
            size=size,
            media_type=media_type,
            path=path,
            final=self._layout.blob(digest),
            fd=fd,
        )
        self._writing[digest] = writer
        self.reserve(writer, size or 0)
        return writer

    def grant(self, host: str, repository: str, digest: str, owner: str | None) -> None:
        """``owner`` may be given ``digest`` as read from ``repository``; ignored unless the blob
        is stored or being written (a grant goes with its blob)."""
        if digest in self._blobs or digest in self._writing:
            self._catalog.grant(host, repository, digest, owner)
            self._mark()

    @property
    def catalog_entries(self) -> int:
        """Grants and tags in memory (the budget's ``cache.blobs.maxEntries``)."""
        return len(self._catalog)

    def owners(self, host: str, repository: str, digest: str) -> frozenset[str | None]:
        return self._catalog.owners(host, repository, digest)

    def tag(self, record: TagRecord) -> None:
        """Keep ``record`` (replacing the owner's older one of that tag). Its manifest need not
        be stored yet: a HEAD by tag names the digest before a GET by digest brings the bytes
        (containerd resolves that way). It goes with the manifest's blob once that is evicted,
        and a record whose manifest never came is pushed out by newer ones (``max_tags``)."""
        self._catalog.tag(record)
        self._mark()

    def tags(self, host: str, repository: str, tag: str) -> list[TagRecord]:
        """The records of a tag, one per owner, newest first."""
        return self._catalog.tags(host, repository, tag)

    def all_tags(self) -> list[TagRecord]:
        return self._catalog.all_tags()

    async def flush(self) -> None:
        """Write what changed to the index now; done once it is written."""
        await self._write_index()

    async def close(self) -> None:
        """Abort the writers still writing, let those finishing end, write the index, let go
        of the threads and of the lock."""
        if self._closed:
            return
        self._closed = True
        for writer in list(self._writing.values()):
            writer.abort()
        finishing = [w.finishing for w in self._writing.values() if w.finishing is not None]
        await asyncio.gather(*finishing, return_exceptions=True)
        self._index_closing = True
        await self._write_index()
        await self._loop.run_in_executor(self._index_thread, self._let_go)
        self._index_thread.shutdown(wait=True)  # idle: this only joins it

    def _let_go(self) -> None:
        self._files.shutdown(wait=True)
        self._index.close()
        disk.close_quietly(self._lock)

    # What a writer asks of its store (writer.Shelf).

    def reserve(self, writer: BlobWriter, more: int) -> bool:
        if not self._make_room(more):
            return False
        writer.reserved += more
        self._reserved += more
        return True

    def release(self, writer: BlobWriter) -> None:
        self._reserved -= writer.reserved
        writer.reserved = 0
        if self._writing.get(writer.digest) is writer:
            del self._writing[writer.digest]
            self._catalog.drop(writer.digest)  # grants and tags given while it was written
            self._mark()

    def shelve(self, writer: BlobWriter, file: BinaryIO) -> Stored:
        self._reserved -= writer.reserved
        writer.reserved = 0
        del self._writing[writer.digest]
        blob = _Blob(writer.written, writer.media_type, 0)
        self._blobs[writer.digest] = blob
        self._complete += blob.size
        self._touch(writer.digest, blob)
        self._fit()  # only after a resize below what writers under way had reserved
        return Stored(writer.digest, blob.size, blob.media_type, file)

    # Room and order.

    def _make_room(self, need: int) -> bool:
        """Evict until ``need`` more bytes fit; False, evicting nothing, when even evicting
        every complete blob would not make them fit."""
        if self._reserved + need > self.max_bytes:
            return False
        while self.used + need > self.max_bytes:
            self._drop(next(iter(self._blobs)), evicted=True)
        return True

    def _disk_room(self, need: int) -> bool:
        """Whether the volume holds ``need`` more bytes besides those the writers under way
        have yet to write, evicting blobs to make it so when that can: a ``maxBytes`` larger
        than the volume, or a volume others fill too, turns a blob away (it streams through)
        rather than break its clients off when the disk runs out under it."""
        try:
            free = disk.free(self._layout.tmp)
        except OSError as error:
            log.warning("blob cache: cannot tell the room left on its volume (%s)", error)
            return False
        need += sum(writer.reserved - writer.written for writer in self._writing.values())
        if free + self._complete < need:
            return False  # the volume is full of other things: keep what is stored
        while free < need:
            digest, blob = next(iter(self._blobs.items()))
            self._drop(digest, evicted=True)
            free += blob.size
        return True

    def _fit(self) -> None:
        """Keep within ``max_bytes``: evict complete blobs, then abort the newest writers under
        way (a finishing one cannot be stopped: it is evicted once it is stored)."""
        while self.used > self.max_bytes and self._blobs:
            self._drop(next(iter(self._blobs)), evicted=True)
        for writer in reversed(list(self._writing.values())):
            if self.used <= self.max_bytes:
                break
            writer.abort()

    def _touch(self, digest: str, blob: _Blob) -> None:
        self._used_seq += 1
        blob.used = self._used_seq
        self._blobs.move_to_end(digest)
        self._dirty.add(digest)
        self._mark()

    def _drop(self, digest: str, *, evicted: bool = False) -> None:
        blob = self._blobs.pop(digest)
        self._complete -= blob.size
        disk.remove(self._layout.blob(digest))
        self._catalog.drop(digest)
        self._dirty.add(digest)
        self._mark()
        if evicted:
            self.evictions += 1

    def _row(self, digest: str) -> BlobRow | None:
        blob = self._blobs.get(digest)
        return None if blob is None else BlobRow(digest, blob.size, blob.media_type, blob.used)

    def _mark(self) -> None:
        """Something changed for the index: write it within :data:`FLUSH_DELAY`."""
        if self._timer is None and not self._index_closing:
            self._timer = self._loop.call_later(FLUSH_DELAY, self._write_index)

    def _write_index(self) -> asyncio.Future[None]:
        """Queue what changed for the index's thread, behind every batch queued before (one
        thread: a FIFO); the future is done once it is written."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        grants, tags = self._catalog.take()
        blobs = {digest: self._row(digest) for digest in self._dirty}
        self._dirty = set()
        return self._loop.run_in_executor(
            self._index_thread, self._index.apply, Changes(blobs, grants, tags)
        )
