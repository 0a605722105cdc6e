"""What the web edge hands the runtime, and what it gets back.

A :class:`RegistryRequest` is a classified read (host, image, resource, operation, flow); the
runtime answers it with an :class:`Answer` (a whole upstream answer, read once for every waiter,
R2, or kept, R1) or a :class:`Go` (no window needed or the window came: go upstream and stream).
The edge gets a :class:`Reply` from :meth:`Pacer.read`: a whole answer, or the registry's answer
:class:`Opened` to relay as it arrives (it never sees the upstream client).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import BinaryIO, Protocol

from multidict import CIMultiDict
from yarl import URL

from kuikproxy.core.digests import Content
from kuikproxy.core.flowcontrol import FlowOperation
from kuikproxy.core.images import MANIFESTS, Image
from kuikproxy.core.reuse import (
    accept_admits,
    method_serves,
    negotiated_alike,
    owner_key,
    shared_with,
)
from kuikproxy.core.tickets import Operation
from kuikproxy.runtime.flowgate import Flow, FlowGate
from kuikproxy.upstream.client import UpstreamRequest, UpstreamResponse, end_to_end
from kuikproxy.upstream.detached import DetachedBody

# R1: what a kept answer remembers of the headers, besides its status and body.
KEPT_HEADERS = frozenset(
    {
        "content-type",
        "content-length",
        "docker-content-digest",
        "www-authenticate",
        "etag",
        "docker-distribution-api-version",  # a /v2/ ping's: clients check it
    }
)
# Headers meant for kuikproxy or for one connection, never forwarded upstream.
KUIK_RESOURCE = "Kuik-Resource"
KUIK_OPERATION = "Kuik-Operation"
NOT_FORWARDED = frozenset({"host", "content-length", "kuik-resource", "kuik-operation"})

Headers = tuple[tuple[str, str], ...]


def forwarded(sent: Mapping[str, str] | Headers) -> Headers:
    """What of a client's headers goes to the registry: end-to-end ones, repeated ones
    (``Accept``) as sent, kuikproxy's own left out."""
    items = tuple(sent.items()) if isinstance(sent, Mapping) else sent
    return tuple((k, v) for k, v in end_to_end(items).items() if k.lower() not in NOT_FORWARDED)


# not frozen: one is made for every read, and a frozen dataclass pays a setattr call per field
@dataclass(slots=True)
class RegistryRequest:
    host: str
    image: Image
    resource: str
    operation: Operation
    method: str  # GET or HEAD
    opens: bool  # a manifest GET by tag: always a copy of its own (§4.3)
    # the client's headers as received; what goes upstream is derived when the read goes, so a
    # request answered from a kept answer, or parked, never pays for it
    sent: Mapping[str, str] | Headers
    auth: str | None  # key of the client's own Authorization (R5), None without one
    accept: tuple[str, ...]
    gate: FlowGate  # the flow control that classifies it (§10)
    query: tuple[tuple[str, str], ...] = ()  # forwarded as sent, less ``ns``
    paced: bool = True  # False: a host kuik owns (§4.3), its flows are ``unpaced`` ones
    # fingerprint of the credentials kuikproxy signs it with when it brings none (R5), if any
    signer: str | None = None
    _flow: Flow | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def flow(self) -> Flow:
        """Its priority level and flow (§10), classified when first needed: a request that a
        kept answer serves never is, so that path pays nothing for flow schemas."""
        flow = self._flow
        if flow is None:
            kind: FlowOperation = "unpaced"
            if self.paced:
                kind = "check" if self.operation is Operation.CHECK else "copy"
            sent = self.sent if isinstance(self.sent, Mapping) else CIMultiDict(self.sent)
            flow = self.gate.classify(self.resource, self.host, kind, sent)
            self._flow = flow
        return flow

    @property
    def headers(self) -> Headers:
        """What goes upstream. Manifests are asked for unencoded: their digest is that of the
        bytes, and a HEAD answered from a kept GET must carry the body's exact length (R3)."""
        headers = forwarded(self.sent)
        if self.image.route != MANIFESTS:
            return headers
        plain = tuple((k, v) for k, v in headers if k.lower() != "accept-encoding")
        return (*plain, ("Accept-Encoding", "identity"))

    @property
    def authorization(self) -> str | None:
        """The client's own ``Authorization``, if it sent one."""
        return self.header("Authorization")

    def header(self, name: str) -> str | None:
        """The client's header ``name`` (its first value), if it sent one."""
        if isinstance(self.sent, Mapping):
            return self.sent.get(name)
        name = name.lower()
        return next((v for k, v in self.sent if k.lower() == name), None)

    def url(self, base: URL) -> URL:
        """Where this read goes on a registry served at ``base``."""
        path = f"/v2/{self.image.repository}/{self.image.route}/{self.image.reference}"
        return base.with_path(path, encoded=False).with_query(self.query)

    def upstream(self, base: URL, timeout: float | None) -> UpstreamRequest:
        """The registry request for this read, built once it may go (never while it waits):
        the one way a read becomes a request, whether a window's or a client's own."""
        image = self.image
        return UpstreamRequest(self.method, self.url(base), self.headers, timeout, kind=image.kind)


@dataclass(frozen=True, slots=True)
class Answer:
    """A registry's whole answer: status, end-to-end headers, body (empty for HEAD)."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    method: str
    read_at: float  # the window time it was read at (loop clock)
    auth: str | None  # the reader's Authorization key; None: shared with every client (R5)
    signer: str | None = None  # for a shared answer: kuikproxy's credentials it was read with
    accept: tuple[str, ...] = ()  # the Accept the registry negotiated it with (R3)
    content_type: str | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "content_type", self.header("content-type"))

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)

    def serves(self, request: RegistryRequest) -> bool:
        """R3: a GET answer serves a HEAD but not the other way round; a 200 serves a request
        whose ``Accept`` admits its type, a refusal only one that negotiates as its read did."""
        if not method_serves(self.method, request.method):
            return False
        if self.status == 200:
            return accept_admits(request.accept, self.content_type)
        return negotiated_alike(self.accept, request.accept)

    def may_serve(self, request: RegistryRequest) -> bool:
        """Whether this kept answer (here or the fleet's) may answer ``request``: R5, whose it
        is, then R3."""
        return shared_with(
            self.auth, self.signer, self.status, request.auth, request.signer
        ) and self.serves(request)

    @property
    def owner(self) -> str | None:
        """Whose it is, as the key it is kept under (R5)."""
        return owner_key(self.auth, self.signer)

    @property
    def size(self) -> int:
        return len(self.body) + sum(len(k) + len(v) for k, v in self.headers)

    def kept(self) -> Answer:
        """The part of this answer that R1 keeps, and that may be given to anyone but the
        client whose request was read: per-client headers (``Set-Cookie``, …) are left out."""
        headers = tuple((k, v) for k, v in self.headers if k.lower() in KEPT_HEADERS)
        return replace(self, headers=headers)


@dataclass(frozen=True, slots=True)
class Go:
    """Go upstream now and stream the answer; call ``done`` when the request has ended (it
    closes the accounting of an open copy, P9). A request of a copy with a ``copy.timeout``
    must be over by ``deadline`` (loop time)."""

    done: Callable[[], None] = field(default=lambda: None)
    deadline: float | None = None


# seconds a relay may wait on its client in all before its pace is the client's, not the
# registry's (:meth:`Opened.lagging`): a fast client's moments of scheduling or a TCP window
# stay well within it
LAGGING_AFTER = 0.5


@dataclass(slots=True)
class Opened:
    host: str
    status: int
    headers: CIMultiDict[str]  # end-to-end only: hop-by-hop headers are the proxy's own
    content: Content | None  # what a 200 to a read by digest must hash to
    response: UpstreamResponse
    # how a ``Location`` the client must come back to kuikproxy with reads for it (writes)
    relocated: Callable[[str], str] | None = None
    # told once the body was relayed whole and hashed to its digest (``content``)
    verified: Callable[[], None] | None = None
    # what the read lets go of once its client, not the registry, sets its pace: its seat,
    # its part of an open copy (:meth:`lagging`); None once let go, or for reads holding none
    paced: Callable[[], None] | None = None
    threaded: bool = True  # whether its relay may take a thread's ring (its room holds one)

    def lagging(self) -> None:
        """The relay waits on its client now, not on the registry: the read gives back its
        seat, ends its part of an open copy (P9) and leaves the registry client's count of
        connections, so that a slow client holds up nobody else's reads (:mod:`~kuikproxy.
        runtime.pace`). Its connection stays its own until it ends."""
        paced, self.paced = self.paced, None
        if paced is not None:
            paced()
            self.response.unpool()

    def chunks(self) -> AsyncIterator[bytes]:
        return self.response.chunks()

    async def read(self, limit: int) -> bytes:
        return await self.response.read(limit)

    def detach(self) -> DetachedBody | None:
        """The rest of the body, for a blob relayed in a thread, or None."""
        return self.response.detach()


@dataclass(slots=True)
class Body:
    """Content by digest on disk for one client (§15): a blob or manifest in the store, or one
    being read from the registry for everyone who asked, which ``file`` follows as it grows.

    ``ready(offset)`` is how many bytes from the start may be sent, once more than ``offset``
    may (or all of them are); it raises :class:`~kuikproxy.errors.UpstreamError` when the read
    failed, and holds the last bytes back until the whole is known to hash to ``digest``."""

    digest: str
    size: int
    media_type: str | None
    file: BinaryIO  # this client's own: reads at offsets, closed when the read ends
    ready: Callable[[int], Awaitable[int]]
    # where its bytes come from: "store" (whole on disk), "registry" (this client's read of
    # it), "shared" (another client's read of it, followed)
    source: str
    sent: int = 0  # bytes the edge sent of it, counted when the read ends

    @property
    def headers(self) -> tuple[tuple[str, str], ...]:
        """What the registry would answer a read of it with, for either method."""
        return (
            ("Content-Type", self.media_type or "application/octet-stream"),
            ("Content-Length", str(self.size)),
            ("Docker-Content-Digest", self.digest),
            ("Accept-Ranges", "bytes"),
            ("Docker-Distribution-API-Version", "registry/2.0"),
        )


class Shared(Protocol):
    """A blob by digest followed from one registry read with others (:mod:`kuikproxy.runtime.
    fanout`): its 200's headers and length, then its bytes; an
    :class:`~kuikproxy.errors.UpstreamError` when the read fails or is not its content."""

    @property
    def size(self) -> int: ...

    @property
    def headers(self) -> Headers: ...

    def pieces(self) -> AsyncIterator[bytes]: ...


@dataclass(slots=True)  # one per read: not frozen, see RegistryRequest
class Reply:
    """What a read gets from the runtime: a whole ``answer`` (kept, R1, or read once for every
    waiter, R2), the registry's answer ``opened`` to stream, or content on disk (``body``)."""

    answer: Answer | None = None
    opened: Opened | None = None
    body: Body | None = None
    shared: Shared | None = None  # a blob given from memory (runtime.fanout)
    hit: bool = False  # a kept answer served it at once (R1)
    stale: bool = False  # kept, given while its host is blocked, however old (§11, P14)

    @property
    def status(self) -> int | None:
        """The registry's status, for a whole answer or one to stream; None for content on
        disk."""
        if self.opened is not None:
            return self.opened.status
        if self.shared is not None:
            return 200
        return None if self.answer is None else self.answer.status
