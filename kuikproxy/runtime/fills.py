"""One read of a blob from the registry, written to the store while every client that asked
for it follows (§15).

The registry's answer is appended to a temporary file of the store as it arrives; each client
reads that file at its own pace with its own file object, so a slow client never slows the read
down and a client that joins late gets what has arrived so far, then the rest. The last chunk
is held back from everyone until the whole has hashed to its digest: a client may see a body
cut short, never a clean end of content that is not what it asked for. The read goes on when
the client that started it leaves: others may follow, and the bytes were paid for.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from contextlib import AsyncExitStack

from kuikproxy.blobs.store import BlobWriter, Stored
from kuikproxy.errors import ContentMismatch, KuikProxyError, UpstreamError
from kuikproxy.runtime.messages import Body, Opened

log = logging.getLogger(__name__)


class Fill:
    """A blob on its way from the registry into the store."""

    __slots__ = (
        "_changed", "_end", "_failure", "_opened", "_stack", "_writer", "done", "readable"
    )  # fmt: skip

    def __init__(
        self,
        writer: BlobWriter,
        opened: Opened,
        stack: AsyncExitStack,
        end: Callable[[Fill, Stored | None], None],
    ) -> None:
        self._writer = writer
        self._opened = opened  # the registry's answer, open until the read ends
        self._stack = stack  # the seat and quota the read holds, and the answer itself
        self._end = end  # told once, with the blob as stored, or None when it failed
        self._changed = asyncio.Event()
        self._failure: UpstreamError | None = None
        self.readable = 0  # bytes from the start that followers may send
        self.done = False  # the whole arrived and hashed to its digest

    @property
    def digest(self) -> str:
        return self._writer.digest

    @property
    def size(self) -> int:
        size = self._writer.size
        assert size is not None  # only a blob of a known length is filled (PullThrough.fill)
        return size

    def follower(self, media_type: str | None, source: str = "shared") -> Body:
        """A client's way to follow the read: its own file object on the growing file."""
        try:
            fd = os.open(self._writer.path, os.O_RDONLY)
        except FileNotFoundError:  # verified and renamed into place just now
            fd = os.open(self._writer.final, os.O_RDONLY)
        file = os.fdopen(fd, "rb")
        return Body(self.digest, self.size, media_type, file, self.ready, source)

    async def ready(self, offset: int) -> int:
        """Bytes that may be sent, once more than ``offset`` may (:class:`Body`)."""
        while True:
            if self._failure is not None:
                raise self._failure
            if self.readable > offset or self.done:
                return self.readable
            await self._changed.wait()

    def _advance(self, readable: int) -> None:
        self.readable = readable
        self._changed.set()  # wakes every follower waiting now; the next ones wait anew
        self._changed.clear()

    async def run(self) -> None:
        writer, stored = self._writer, None
        try:
            held = 0  # the last chunk's length: not readable until the whole is verified
            async for chunk in self._opened.chunks():
                if not writer.write(chunk):
                    if writer.written + len(chunk) <= self.size:
                        raise OSError(f"the store's disk refused {self.digest}")  # logged
                    raise ContentMismatch(
                        f"{self._opened.host} sent more of {self.digest} than it announced",
                        detail={"host": self._opened.host, "digest": self.digest},
                    )
                if held:
                    self._advance(writer.written - len(chunk))
                held = len(chunk)
            stored = await writer.finish()
            if stored is None:
                raise ContentMismatch(
                    f"{self._opened.host} answered {self.digest} with content of another "
                    "digest; nothing of it was kept",
                    detail={"host": self._opened.host, "digest": self.digest},
                )
            stored.file.close()  # the store's own handle: followers read with theirs
            self.done = True
            self._advance(self.size)
        except (KuikProxyError, OSError) as error:
            log.warning("%s: reading %s failed: %s", self._opened.host, self.digest, error)
            self._fail(error if isinstance(error, UpstreamError) else None)
        except BaseException:  # cancelled (shutdown): the followers break off
            self._fail(None)
            raise
        finally:
            writer.abort()  # a no-op once the blob is in the store
            self._end(self, stored)
            await self._stack.aclose()

    def _fail(self, error: UpstreamError | None) -> None:
        self._failure = error or UpstreamError(f"the read of {self.digest} broke off")
        self._changed.set()
