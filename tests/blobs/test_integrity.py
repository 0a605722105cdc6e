"""A stored file that changes on disk after it was verified: never handed out as its blob.

A lookup checks the file's size at every open and hashes it again unless it is unchanged since
it was last hashed; one found otherwise is dropped with its grants, and counted."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kuikproxy.blobs import BlobStore
from tests.blobs.helpers import blob_files, content, digest, put, read

MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def flip(path: Path, at: int) -> None:
    with path.open("r+b") as file:
        file.seek(at)
        byte = file.read(1)
        file.seek(at)
        file.write(bytes([byte[0] ^ 1]))


async def test_a_file_cut_short_or_with_other_bytes_is_dropped_not_served(tmp_path: Path) -> None:
    store = await BlobStore.open(str(tmp_path), 10_000_000)
    short, flipped = content(300_000, 1), content(300_000, 2)
    for data in (short, flipped):
        await put(store, data)
        store.grant("h", "r", digest(data), None)
        found = await store.lookup(digest(data))
        assert found is not None and read(found) == data
        found.file.close()
    files = {p.name: p for p in blob_files(tmp_path)}
    with files[digest(short).partition(":")[2]].open("r+b") as file:
        file.truncate(1000)
    flip(files[digest(flipped).partition(":")[2]], 299_999)
    assert await store.lookup(digest(short)) is None
    assert await store.lookup(digest(flipped)) is None
    assert store.rejected == 2 and store.count == 0 and blob_files(tmp_path) == []
    assert store.owners("h", "r", digest(flipped)) == frozenset()
    await store.close()


async def test_a_small_blob_read_whole_is_checked_too(tmp_path: Path) -> None:
    store = await BlobStore.open(str(tmp_path), 10_000_000)
    body = b'{"schemaVersion": 2}'
    await put(store, body, MANIFEST)
    assert store.read_small(digest(body), 1024) == body
    flip(blob_files(tmp_path)[0], 3)
    assert store.read_small(digest(body), 1024) is None
    assert store.rejected == 1 and store.count == 0
    await store.close()


async def test_after_a_restart_a_file_with_other_bytes_is_dropped(tmp_path: Path) -> None:
    data = content(2_000_000, 3)
    store = await BlobStore.open(str(tmp_path), 10_000_000)
    await put(store, data)
    await store.close()
    flip(blob_files(tmp_path)[0], 0)
    store = await BlobStore.open(str(tmp_path), 10_000_000)
    assert store.count == 1  # the size still agrees: the hash tells
    found = await asyncio.gather(*(store.lookup(digest(data)) for _ in range(3)))
    assert found == [None, None, None]
    assert store.rejected == 1  # one hash for the lookups that came meanwhile: dropped once
    await store.close()


async def test_a_good_file_replaced_by_its_own_bytes_is_served(tmp_path: Path) -> None:
    """Changed on disk is not bad: hashed again, it is still its blob."""
    data = content(500_000, 4)
    store = await BlobStore.open(str(tmp_path), 10_000_000)
    await put(store, data)
    path = blob_files(tmp_path)[0]
    path.unlink()
    path.write_bytes(data)
    found = await asyncio.gather(*(store.lookup(digest(data)) for _ in range(3)))
    assert all(f is not None and read(f) == data for f in found)
    for f in found:
        assert f is not None
        f.file.close()
    assert store.rejected == 0 and store.count == 1
    await store.close()
