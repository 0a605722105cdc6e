"""The pull-through store on the loop (§15): content by digest served from the disk, a blob read
from the registry once whoever asks, manifests kept across restarts, and stale answers while a
registry cannot be asked.

Whose content is whose follows R5, as for kept answers: what was read anonymously or with
kuikproxy's own credentials serves every client; what was read with a client's own
``Authorization`` serves a request that proves access to that repository the same way — the
identical ``Authorization``, or a manifest of that repository answered 200 to it within
``copy.followUp`` (:mod:`~kuikproxy.runtime.proofs`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Coroutine
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

from kuikproxy.blobs.store import BlobStore, BlobWriter, Stored, TagRecord
from kuikproxy.core.images import BLOBS, MANIFESTS, Image
from kuikproxy.core.reuse import accept_admits, owner_key
from kuikproxy.core.stored import (
    ServeStale,
    content_serves,
    manifest_type,
    owner_parts,
    serves_stale,
)
from kuikproxy.core.tickets import Operation
from kuikproxy.runtime.content import MAX_MANIFEST
from kuikproxy.runtime.fills import Fill
from kuikproxy.runtime.kept import KeptAnswers
from kuikproxy.runtime.messages import KUIK_RESOURCE, Answer, Body, Opened, RegistryRequest
from kuikproxy.runtime.proofs import Proofs

log = logging.getLogger(__name__)

SOURCES = ("store", "shared", "registry")


@dataclass(slots=True)
class CacheCounts:
    """What the store saved, for ``/status`` and metrics."""

    # bytes and reads of content by digest given to clients, by source (:class:`Body`): the
    # store, a registry read of the client's own, another client's registry read followed
    bytes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0))
    reads: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SOURCES, 0))
    stale: int = 0  # answers given from the store while their registry could not be asked


def stored_by_digest(image: Image) -> bool:
    """Whether a read may be answered from the store: a blob, or a manifest by digest."""
    return image.by_digest and image.route in (BLOBS, MANIFESTS)


class PullThrough:
    def __init__(
        self,
        store: BlobStore,
        proofs: Proofs,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self.store = store
        self._spawn = spawn  # a task the runtime cancels and awaits at shutdown
        self._fills: dict[str, Fill] = {}
        self._fill_owners: dict[str, tuple[str, str, str | None]] = {}
        self._proofs = proofs
        self._loop = asyncio.get_running_loop()
        self._writing: set[asyncio.Task[None]] = set()  # manifests on their way to the disk
        self.counts = CacheCounts()

    # -- reads by digest ------------------------------------------------------------------

    async def find(self, request: RegistryRequest) -> Body | None:
        """``request``'s content from the store, or from a read of it under way, when it may
        have it (R5); None sends it the usual way (a window, then the registry). A stored file
        changed since it was hashed is hashed again first (:meth:`BlobStore.lookup`)."""
        image = request.image
        if request.operation is not Operation.COPY:
            return None  # a check asks whether it is still there: only the registry knows
        digest, host, repository = image.reference, request.host, image.repository
        owners = self.store.owners(host, repository, digest)
        fill = self._fills.get(digest)
        if fill is not None:
            fill_host, fill_repository, fill_owner = self._fill_owners[digest]
            if (fill_host, fill_repository) == (host, repository):
                owners |= {fill_owner}
            else:  # being read for another repository: not this request's to follow (R5)
                fill = None
        if not content_serves(owners, self._proofs.holds(request), request.auth, request.signer):
            return None
        if fill is not None:
            try:
                return self._counted(fill.follower(None), request)
            except FileNotFoundError:  # it was moved into the store just now
                pass
            except OSError as error:  # out of descriptors, say: the registry's to answer
                log.warning("cannot follow the read of %s (%s)", digest, error)
                return None
        stored = await self.store.lookup(digest)
        if stored is None:
            return None
        media_type = stored.media_type
        if image.route == MANIFESTS:
            media_type = _manifest_type(stored)
            if not (media_type and accept_admits(request.accept, media_type)):
                # R3: the registry negotiates a manifest; a type the client refuses goes there
                stored.file.close()
                return None
        return self._counted(_body(stored, media_type), request)

    def _counted(self, body: Body, request: RegistryRequest) -> Body:
        self.counts.reads[body.source] += 1
        return body

    def fill(self, request: RegistryRequest, opened: Opened, stack: AsyncExitStack) -> Body | None:
        """The registry's 200 to a blob GET: read once into the store for everyone who asks
        (:class:`Fill`), and followed by this client. None when it cannot be stored (no
        length, too big, already being read): the caller streams it through as it is."""
        length = opened.headers.get("Content-Length")
        digest = request.image.reference
        if digest in self._fills or self.store.contains(digest):
            # read before, from another repository or for another client: once the relay has
            # checked it whole, this repository and this client may have it from the store too
            host, repository = request.host, request.image.repository
            owner = owner_key(request.auth, request.signer)
            opened.verified = lambda: self.store.grant(host, repository, digest, owner)
            return None
        if length is None or not length.isdigit():
            return None
        writer = self.store.writer(digest, int(length), opened.headers.get("Content-Type"))
        if writer is None:
            return None
        fill = Fill(writer, opened, stack, self._filled)
        self._fills[digest] = fill
        owner = owner_key(request.auth, request.signer)
        self._fill_owners[digest] = (request.host, request.image.repository, owner)
        self._spawn(fill.run())
        self.counts.reads["registry"] += 1
        return fill.follower(opened.headers.get("Content-Type"), "registry")

    def _filled(self, fill: Fill, stored: Stored | None) -> None:
        host, repository, owner = self._fill_owners.pop(fill.digest)
        del self._fills[fill.digest]
        if stored is not None:
            self.store.grant(host, repository, fill.digest, owner)

    def sent(self, body: Body) -> None:
        """A client's read of ``body`` ended, ``body.sent`` bytes of it given."""
        self.counts.bytes[body.source] += body.sent
        body.file.close()

    # -- manifests ------------------------------------------------------------------------

    def keep(self, request: RegistryRequest, answer: Answer) -> None:
        """A manifest kept (R1) goes to the store too: its body by digest (a GET's), and a
        tag's mapping to it with whose it is and when it was read (a GET's or a HEAD's), so
        that a restart keeps it and an outage can serve it (§15).

        Only a GET's body, checked against its digest (``runtime.content.verified``), grants
        the repository the digest: a HEAD names one it does not prove, and a registry run by
        whoever asks would name someone's private layer. A tag's mapping from a HEAD is
        served (:meth:`_answer`) only once a GET granted its digest there."""
        image = request.image
        if answer.status != 200 or image.route != MANIFESTS:
            return
        digest, media_type = answer.header("docker-content-digest"), answer.content_type
        if digest is None or media_type is None:
            return
        if answer.method == "GET":
            if not self.store.contains(digest):
                writer = self.store.writer(digest, len(answer.body), media_type)
                if writer is None or not writer.write(answer.body):
                    return
                task = self._loop.create_task(_finish(writer))
                self._writing.add(task)  # finished at shutdown, not cancelled: it is small
                task.add_done_callback(self._writing.discard)
            self.store.grant(request.host, image.repository, digest, answer.owner)
        if not image.by_digest:
            read_at = time.time() - (self._loop.time() - answer.read_at)
            record = TagRecord(
                request.host, image.repository, image.reference, answer.owner, digest,
                media_type, read_at,
            )  # fmt: skip
            self.store.tag(record)

    def stale(self, request: RegistryRequest, setting: ServeStale) -> Answer | None:
        """The newest stored manifest ``request``'s tag named that may serve it (R3, R5),
        however old, if its host's ``serveStale`` (``setting``) lets this request have one: for
        while its registry cannot be asked. Counted as given by the one who gives it."""
        image = request.image
        if image.route != MANIFESTS or image.by_digest:
            return None
        from_kuik = request.header(KUIK_RESOURCE) is not None
        if not serves_stale(setting, request.operation is Operation.CHECK, from_kuik):
            return None
        for record in self.store.tags(request.host, image.repository, image.reference):
            answer = self._answer(record)
            if answer is not None and answer.may_serve(request):
                return answer
        return None

    def restore(self, kept: KeptAnswers) -> int:
        """Put the stored manifests of tags back among the kept answers (a restart), each with
        its age; how many. R1 decides, as ever, whether one is fresh enough to serve."""
        restored = 0
        for record in self.store.all_tags():
            answer = self._answer(record)
            if answer is not None:
                image = Image(record.host, record.repository, record.tag)
                kept.keep(record.host, image.key, answer)
                restored += 1
        return restored

    async def close(self) -> None:
        """Once the runtime stopped (the fills cancelled with its tasks): the manifests on
        their way written, then the store closed."""
        await asyncio.gather(*self._writing, return_exceptions=True)
        await self.store.close()

    def _answer(self, record: TagRecord) -> Answer | None:
        if not self.store.owners(record.host, record.repository, record.digest):
            return None  # named by a HEAD, never read from that repository (:meth:`keep`)
        body = self.store.read_small(record.digest, MAX_MANIFEST)
        if body is None:
            return None
        headers = (
            ("Content-Type", record.media_type),
            ("Content-Length", str(len(body))),
            ("Docker-Content-Digest", record.digest),
            ("Docker-Distribution-API-Version", "registry/2.0"),
        )
        read_at = self._loop.time() - max(0.0, time.time() - record.read_at)
        auth, signer = owner_parts(record.owner)
        return Answer(200, headers, body, "GET", read_at, auth, signer)


async def _finish(writer: BlobWriter) -> None:
    stored = await writer.finish()
    if stored is not None:
        stored.file.close()


def _manifest_type(stored: Stored) -> str | None:
    """The type a manifest in the store is served with (:func:`manifest_type`); None, for the
    registry to answer, when it is too big to be one."""
    if stored.size > MAX_MANIFEST:
        return None
    body = os.pread(stored.file.fileno(), stored.size, 0)  # small, and in the page cache
    return manifest_type(body, stored.media_type)


def _body(stored: Stored, media_type: str | None) -> Body:
    size = stored.size

    async def ready(offset: int) -> int:
        return size

    return Body(stored.digest, size, media_type, stored.file, ready, "store")
