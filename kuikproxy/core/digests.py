"""Content addressing: what a registry's answer must hash to.

A manifest or blob named by digest is that digest's content or nothing: an answer whose body
hashes to something else is never given to anyone nor kept. A manifest read by tag is kept under
the digest of its body, whatever ``Docker-Content-Digest`` the registry announced with it, since
clients use that header to fetch (and verify) by digest next.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kuikproxy.core.images import BLOBS, MANIFESTS, Image

DEFAULT_ALGORITHM = "sha256"


class Hasher(Protocol):
    """What of :mod:`hashlib`'s objects a digest check uses."""

    def update(self, data: bytes, /) -> None: ...

    def hexdigest(self) -> str: ...

    def copy(self) -> Hasher: ...


_ALGORITHMS: dict[str, Callable[[], Hasher]] = {
    "sha256": hashlib.sha256,
    "sha512": hashlib.sha512,
}


def algorithm_of(digest: str | None) -> str:
    """The algorithm ``digest`` names if kuikproxy knows it, else the default (sha256)."""
    if digest is not None:
        algorithm = digest.partition(":")[0].strip().lower()
        if algorithm in _ALGORITHMS:
            return algorithm
    return DEFAULT_ALGORITHM


def hasher(algorithm: str) -> Hasher:
    return _ALGORITHMS[algorithm]()


def digest_of(body: bytes, algorithm: str = DEFAULT_ALGORITHM) -> str:
    h = hasher(algorithm)
    h.update(body)
    return f"{algorithm}:{h.hexdigest()}"


def matches(digest: str, body: bytes) -> bool:
    """Whether ``body`` is the content ``digest`` (a valid ``sha256:`` or ``sha512:`` one) names."""
    return digest_of(body, algorithm_of(digest)) == digest


def content_digest(body: bytes, announced: str | None) -> str:
    """The digest a manifest read by tag is kept and answered under: its body's, in the
    algorithm the registry announced when kuikproxy knows it."""
    return digest_of(body, algorithm_of(announced))


def with_digest(headers: tuple[tuple[str, str], ...], digest: str) -> tuple[tuple[str, str], ...]:
    """``headers`` with ``Docker-Content-Digest`` set to ``digest`` (any other value dropped)."""
    kept = tuple((k, v) for k, v in headers if k.lower() != "docker-content-digest")
    return (*kept, ("Docker-Content-Digest", digest))


@dataclass(frozen=True, slots=True)
class Content:
    """What a read by digest must be: ``digest``'s content. A manifest (``whole``) is checked
    before it is served (``502`` otherwise); a blob is hashed on the way and, when it turns
    out to be something else, the client's connection is broken off instead of ended."""

    repository: str
    digest: str
    whole: bool

    def hashes_to(self, hashing: Hasher) -> bool:
        return f"{algorithm_of(self.digest)}:{hashing.hexdigest()}" == self.digest


def content_of(image: Image) -> Content | None:
    """What a streamed read of ``image`` must be, when it names its content by digest."""
    if not image.by_digest or image.route not in (MANIFESTS, BLOBS):
        return None
    return Content(image.repository, image.reference, whole=image.route == MANIFESTS)
