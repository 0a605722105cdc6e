"""One blob being written: appended to a temp file, hashed on the way, put in place if verified.

Bytes are appended with ``os.write`` on the caller's thread: into the page cache, it costs
less than handing them to a thread. They are hashed back from the file on a worker thread
(hashlib lets go of the GIL), :data:`HASH_BATCH` bytes or more at a time, one batch at a time
and in order; reading them back rather than holding the chunks keeps memory flat when hashing
falls behind. Until :meth:`BlobWriter.finish`, the temp file at :attr:`BlobWriter.path` may be
read by others up to :attr:`BlobWriter.written` bytes (a second client of a blob still coming
in); once finished it is renamed away, so readers open it before.

The room a writer takes is its store's business (:class:`Shelf`): a declared size is reserved
when the writer is made; without one, each chunk is reserved before it is written.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, BinaryIO, Protocol

from kuikproxy.blobs import disk
from kuikproxy.blobs.records import Stored
from kuikproxy.core.digests import algorithm_of, hasher

log = logging.getLogger(__name__)

HASH_BATCH = 1024 * 1024  # bytes written before a worker thread hashes them


class Shelf(Protocol):
    """What a writer asks of its store."""

    def reserve(self, writer: BlobWriter, more: int) -> bool:
        """Make room for ``more`` bytes of ``writer`` (evicting), or say it cannot."""

    def release(self, writer: BlobWriter) -> None:
        """``writer`` ended with nothing stored: its room is free again."""

    def shelve(self, writer: BlobWriter, file: BinaryIO) -> Stored:
        """``writer``'s blob is in place (``file`` open on it): it is stored."""


class BlobWriter:
    __slots__ = (
        "_aborted",
        "_closed",
        "_executor",
        "_fd",
        "_final",
        "_finishing",
        "_hashed",
        "_hashing",
        "_job",
        "_loop",
        "_shelf",
        "digest",
        "media_type",
        "path",
        "reserved",
        "size",
        "written",
    )

    def __init__(
        self,
        shelf: Shelf,
        executor: ThreadPoolExecutor,
        *,
        digest: str,
        size: int | None,
        media_type: str | None,
        path: str,
        final: str,
        fd: int,
    ) -> None:
        self.digest = digest
        self.size = size
        self.media_type = media_type
        self.path = path  # the temp file
        self.written = 0
        self.reserved = 0  # bytes its store holds for it
        self._shelf = shelf
        self._executor = executor
        self._loop = asyncio.get_running_loop()
        self._final = final
        self._fd = fd
        self._hashing = hasher(algorithm_of(digest))
        self._hashed = 0  # bytes handed to the hash so far
        self._job: asyncio.Future[Any] | None = None  # the last piece of thread work
        self._finishing: asyncio.Task[Stored | None] | None = None
        self._closed = False  # no more bytes: finishing, finished or aborted
        self._aborted = False  # ended with nothing stored

    @property
    def final(self) -> str:
        """Where the blob is once verified. A reader that finds the temp file gone opens it
        there: it was renamed only after its bytes hashed to the digest, and the store learns
        of it a moment later (after the directory's fsync)."""
        return self._final

    @property
    def aborted(self) -> bool:
        """Whether it ended with nothing stored: a reader of the temp file waits for no more."""
        return self._aborted

    @property
    def finishing(self) -> asyncio.Task[Stored | None] | None:
        """:meth:`finish`'s work, once begun."""
        return self._finishing

    def write(self, chunk: bytes) -> bool:
        """Append ``chunk``. False, and the writer aborted, when it takes the blob past its
        declared size, when no room can be made for it, or when the disk refuses it."""
        if self._closed:
            return False
        more = len(chunk)
        if self.size is not None:
            if self.written + more > self.size:
                self.abort()
                return False
        elif not self._shelf.reserve(self, more):
            self.abort()
            return False
        try:
            disk.write_all(self._fd, chunk)
        except OSError as error:
            log.warning("blob cache: cannot write %s (%s)", self.path, error)
            self.abort()
            return False
        self.written += more
        if self.written - self._hashed >= HASH_BATCH and (self._job is None or self._job.done()):
            self._hash_more()
        return True

    async def finish(self) -> Stored | None:
        """The blob, stored and open, if the bytes written are ``digest``'s content (and its
        declared size); else None, the temp file deleted. Once begun it runs to its end even
        if the caller is cancelled (the file is then closed), and an :meth:`abort` no longer
        changes it."""
        if self._finishing is None:
            if self._aborted:
                return None
            self._closed = True
            self._finishing = self._loop.create_task(self._finish())
        task = self._finishing
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(_close_unclaimed)
            raise

    def abort(self) -> None:
        """Delete the temp file and give the room back; nothing once :meth:`finish` began."""
        if not self._closed:
            self._closed = True
            self._end_unstored()

    async def _finish(self) -> Stored | None:
        try:
            return await self._store()
        except asyncio.CancelledError:
            # only with the loop (a caller's cancellation stops at the shield): a file renamed
            # into place meanwhile has no index row, and the next open deletes it
            self._end_unstored()
            raise

    async def _store(self) -> Stored | None:
        if self._job is not None:
            await asyncio.shield(self._job)
        if self._hashed < self.written:
            await asyncio.shield(self._hash_more())
        if not self._verified():
            log.warning("blob cache: %s is not what was written: not kept", self.digest)
            self._end_unstored()
            return None
        self._job = self._loop.run_in_executor(
            self._executor, disk.commit, self._fd, self.path, self._final
        )
        try:
            file: BinaryIO = await asyncio.shield(self._job)
        except OSError as error:  # the fsync or the rename failed: the blob cannot be kept
            log.warning("blob cache: cannot store %s (%s)", self.digest, error)
            disk.remove(self._final)  # renamed before the failure, it is still this writer's
            self._end_unstored()
            return None
        disk.close_quietly(self._fd)
        self._fd = -1
        return self._shelf.shelve(self, file)

    def _verified(self) -> bool:
        if self.size is not None and self.written != self.size:
            return False
        return f"{algorithm_of(self.digest)}:{self._hashing.hexdigest()}" == self.digest

    def _hash_more(self) -> asyncio.Future[None]:
        self._job = self._loop.run_in_executor(
            self._executor, disk.hash_range, self._fd, self._hashing, self._hashed, self.written
        )
        self._hashed = self.written
        return self._job

    def _end_unstored(self) -> None:
        """Delete the temp file and give the room back at once (unlinking does not disturb a
        thread still reading it); close the descriptor only once no thread uses it, so that
        its number is not handed to another file under that thread's reads."""
        if self._aborted:
            return
        self._aborted = True
        disk.remove(self.path)
        self._shelf.release(self)
        fd, self._fd = self._fd, -1
        if self._job is None or self._job.done():
            disk.close_quietly(fd)
        else:
            self._job.add_done_callback(lambda _: disk.close_quietly(fd))


def _close_unclaimed(task: asyncio.Task[Stored | None]) -> None:
    """A finish whose caller was cancelled: nobody will close what it opened."""
    if not task.cancelled() and task.exception() is None and (stored := task.result()):
        stored.file.close()
