"""What the web edge hands the runtime, and what it gets back.

A :class:`RegistryRequest` is a classified read (host, image, resource, operation); the runtime
answers it with an :class:`Answer` (a whole upstream answer, read once for every waiter, R2, or
kept, R1) or a :class:`Go` (no window needed or the window came: go upstream and stream).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from yarl import URL

from kuikproxy.core.images import Image
from kuikproxy.core.scheduler import Operation

# R1: what a kept answer remembers of the headers, besides its status and body.
KEPT_HEADERS = frozenset(
    {"content-type", "content-length", "docker-content-digest", "www-authenticate", "etag"}
)


@dataclass(frozen=True, slots=True)
class RegistryRequest:
    host: str
    image: Image
    resource: str
    operation: Operation
    method: str  # GET or HEAD
    opens: bool  # a manifest GET by tag: always a copy of its own (§4.3)
    headers: tuple[tuple[str, str], ...]  # what goes upstream, repeated names kept
    auth: str | None  # key of the client's own Authorization (R5), None without one
    accept: tuple[str, ...]
    query: tuple[tuple[str, str], ...] = ()  # forwarded as sent, less ``ns``

    def url(self, base: URL) -> URL:
        """Where this read goes on a registry served at ``base``."""
        path = f"/v2/{self.image.repository}/{self.image.route}/{self.image.reference}"
        return base.with_path(path, encoded=False).with_query(self.query)


@dataclass(frozen=True, slots=True)
class Answer:
    """A registry's whole answer: status, end-to-end headers, body (empty for HEAD)."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    method: str
    read_at: float  # the window time it was read at (loop clock)
    auth: str | None  # None: shared with every client (R5)

    def header(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)

    @property
    def size(self) -> int:
        return len(self.body) + sum(len(k) + len(v) for k, v in self.headers)

    def kept(self) -> Answer:
        """The part of this answer that R1 keeps."""
        headers = tuple((k, v) for k, v in self.headers if k.lower() in KEPT_HEADERS)
        return Answer(self.status, headers, self.body, self.method, self.read_at, self.auth)


@dataclass(frozen=True, slots=True)
class Go:
    """Go upstream now and stream the answer; call ``done`` when the request has ended (it
    closes the accounting of an open copy, P9). A request of a copy with a ``copy.timeout``
    must be over by ``deadline`` (loop time)."""

    done: Callable[[], None] = field(default=lambda: None)
    deadline: float | None = None
