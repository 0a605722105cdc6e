"""Repository names, references and image keys, validated as the OCI distribution spec says.

An *image* is ``<repository>:<tag>`` or ``<repository>@<digest>`` on one host; rings order
images by that string. Everything here is pure parsing: no I/O, no clock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from kuikproxy.errors import DigestInvalid, ManifestUnknown, NameUnknown

# distribution/reference: path components joined by "/", each [a-z0-9]+ separated by ".", "_",
# "__" or runs of "-". The whole name is capped at 255 characters by the distribution spec.
_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
_NAME = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
# SPEC §12 is stricter than the distribution grammar on purpose: only the two algorithms
# registries use, lowercase hex of the exact length.
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128}")
_MAX_NAME = 255

DOCKER_HUB = "docker.io"
_DOCKER_HUB_ALIASES = frozenset({"index.docker.io", "registry-1.docker.io"})


@lru_cache(maxsize=4096)  # asked several times per request, of a handful of hosts
def normalize_host(host: str) -> str:
    """The canonical spelling of a registry host: lowercase, Docker Hub's names folded.

    ``Index.Docker.IO`` and ``registry-1.docker.io`` are ``docker.io``: they are the same
    registry, and pacing it under two names would double its budget.
    """
    host = host.strip().lower().rstrip(".")
    return DOCKER_HUB if host in _DOCKER_HUB_ALIASES else host


def parse_repository(name: str, host: str) -> str:
    """Validate a repository name; on Docker Hub a single segment gets ``library/``."""
    if len(name) > _MAX_NAME or not _NAME.fullmatch(name):
        raise NameUnknown(f"invalid repository name {name[:300]!r}", detail={"name": name[:300]})
    if host == DOCKER_HUB and "/" not in name:
        return f"library/{name}"
    return name


def is_digest(reference: str) -> bool:
    return ":" in reference


def check_digest(digest: str) -> str:
    if not _DIGEST.fullmatch(digest):
        raise DigestInvalid(f"invalid digest {digest[:200]!r}", detail={"digest": digest[:200]})
    return digest


def check_reference(reference: str) -> str:
    """A manifest reference: a digest (checked strictly) or a tag."""
    if is_digest(reference):
        return check_digest(reference)
    if not _TAG.fullmatch(reference):
        raise ManifestUnknown(
            f"invalid tag {reference[:200]!r}", detail={"reference": reference[:200]}
        )
    return reference


# Routes under /v2/<repository>/ that read what a ring holds: manifests (images proper), and the
# tag list and referrers of a repository, which are paced on the check series too (§4.1).
MANIFESTS, BLOBS, TAGS, REFERRERS = "manifests", "blobs", "tags", "referrers"
# the kinds of read a registry counts apart (Docker Hub counts a manifest GET as a pull)
READ_KINDS = ("manifest-tag", "manifest-digest", "blob", "referrers", "tags")


@dataclass(frozen=True, slots=True)
class Image:
    """One thing a ring holds on one host: a manifest by tag or digest (an image), a blob, a
    repository's tag list (``reference`` "list") or the referrers of a digest. ``query`` is
    a tag list's or referrers' query (pagination, filters), part of what is read."""

    host: str
    repository: str
    reference: str
    route: str = MANIFESTS
    query: str = ""
    # the ring key, ordered byte-wise: ``repo:tag``, ``repo@digest``, ``repo#tags/list?n=10``,
    # ``repo#referrers/sha256:...``; "#" is in no repository name or tag, so keys never
    # collide. Made once: the scheduler asks for it at every step.
    key: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.route in (MANIFESTS, BLOBS):
            separator = "@" if self.by_digest else ":"
            key = f"{self.repository}{separator}{self.reference}"
        else:
            key = f"{self.repository}#{self.route}/{self.reference}"
            if self.query:
                key += f"?{self.query}"
        object.__setattr__(self, "key", key)

    @classmethod
    def from_key(cls, host: str, key: str) -> Image:
        """The image a ring key names (the inverse of :attr:`key`, for manifests and lists)."""
        repository, hash_, rest = key.partition("#")
        if hash_:
            route, _, reference = rest.partition("/")
            reference, _, query = reference.partition("?")
            return cls(host, repository, reference, route, query)
        at = key.find("@")
        if at >= 0:
            return cls(host, key[:at], key[at + 1 :])
        repository, _, tag = key.rpartition(":")
        return cls(host, repository, tag)

    @property
    def by_digest(self) -> bool:
        return is_digest(self.reference)

    @property
    def kind(self) -> str:
        """Which of :data:`READ_KINDS` a read of it is."""
        if self.route == MANIFESTS:
            return "manifest-digest" if self.by_digest else "manifest-tag"
        return "blob" if self.route == BLOBS else self.route

    def with_reference(self, reference: str) -> Image:
        return Image(self.host, self.repository, reference, self.route)
