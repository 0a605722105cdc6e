"""What the blob store hands out, and the digests it accepts as names of files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import BinaryIO

# The algorithms of :mod:`kuikproxy.core.digests`, with the hex digits of a digest of each: a
# digest becomes a file name, so its length is checked, not only its prefix.
HEX_DIGITS = {"sha256": 64, "sha512": 128}
_HEX = frozenset("0123456789abcdef")


def split_digest(digest: str) -> tuple[str, str] | None:
    """``digest``'s algorithm and hex part, or None when the store cannot keep it. Only
    lowercase hex of the algorithm's exact length passes: no ``/``, no ``..``, and one
    spelling per content (OCI digests are lowercase), so one file per blob."""
    algorithm, _, hexpart = digest.partition(":")
    if HEX_DIGITS.get(algorithm) != len(hexpart) or not _HEX.issuperset(hexpart):
        return None
    return algorithm, hexpart


@dataclass(frozen=True, slots=True)
class Stored:
    """A complete, verified blob, open for reading. Readers read it at offsets (``os.pread``,
    ``loop.sendfile``), so the position does not matter; whoever got it closes it. An eviction
    only unlinks the file: a read under way goes on to the end."""

    digest: str
    size: int
    media_type: str | None  # the Content-Type it was stored with, None if none was given
    file: BinaryIO


@dataclass(frozen=True, slots=True)
class TagRecord:
    """The newest tag → digest mapping of a manifest read by ``owner`` (an owner key of
    :func:`kuikproxy.core.reuse.owner_key`), read at ``read_at`` (wall-clock seconds)."""

    host: str
    repository: str
    tag: str
    owner: str | None
    digest: str
    media_type: str
    read_at: float
