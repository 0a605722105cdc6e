"""Blobs to store, and what a store's directory holds."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from kuikproxy.blobs import BlobStore, Stored


def content(size: int, seed: int) -> bytes:
    """``size`` bytes that differ with ``seed``."""
    block = hashlib.sha512(seed.to_bytes(8, "big")).digest()
    return (block * (size // len(block) + 1))[:size]


def digest(data: bytes, algorithm: str = "sha256") -> str:
    return f"{algorithm}:{hashlib.new(algorithm, data).hexdigest()}"


def read(stored: Stored) -> bytes:
    return os.pread(stored.file.fileno(), stored.size + 1, 0)


def disk_bytes(root: Path) -> int:
    """Bytes of the files under ``blobs/`` and ``tmp/``."""
    return sum(
        p.stat().st_size for d in ("blobs", "tmp") for p in (root / d).rglob("*") if p.is_file()
    )


def blob_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / "blobs").rglob("*") if p.is_file())


def temp_files(root: Path) -> list[Path]:
    return sorted((root / "tmp").iterdir())


async def put(
    store: BlobStore,
    data: bytes,
    media_type: str | None = None,
    *,
    declared: bool = True,
    chunk: int = 65536,
) -> Stored:
    """Store ``data`` under its digest, in chunks; the stored blob (closed: tests reopen it)."""
    writer = store.writer(digest(data), len(data) if declared else None, media_type)
    assert writer is not None
    for start in range(0, len(data), chunk):
        assert writer.write(data[start : start + chunk])
    stored = await writer.finish()
    assert stored is not None
    stored.file.close()
    return stored
