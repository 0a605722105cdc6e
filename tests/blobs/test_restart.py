"""What a blob store keeps across a restart, a kill, and a lost index."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

from kuikproxy.blobs import BlobStore, TagRecord
from kuikproxy.blobs.writer import HASH_BATCH
from tests.blobs.helpers import blob_files, content, digest, put, read, temp_files

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
PROJECT = Path(__file__).resolve().parents[2]  # where ``tests.blobs.helpers`` imports from

# Stores ``kept`` and flushes the index, stores ``unindexed`` without flushing, then writes half
# of ``partial``, says so, and blocks its loop (no timer flushes) until it is killed.
KILLED = """
import asyncio, sys, time
from kuikproxy.blobs import BlobStore
from tests.blobs.helpers import content, digest, put

async def main():
    store = await BlobStore.open(sys.argv[1], 10**9)
    await put(store, content(5000, 1), "text/kept")
    await store.flush()
    await put(store, content(5000, 2))
    partial = content(5 * 1024 * 1024, 3)
    writer = store.writer(digest(partial), len(partial), None)
    for start in range(0, len(partial) // 2, 65536):
        assert writer.write(partial[start : start + 65536])
    await asyncio.sleep(0.2)  # let a batch be hashed
    print("ready", flush=True)
    time.sleep(60)

asyncio.run(main())
"""


async def test_a_kill_mid_write_leaves_no_partial_blob(tmp_path: Path) -> None:
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", KILLED, str(tmp_path), stdout=asyncio.subprocess.PIPE, cwd=PROJECT
    )
    try:
        assert child.stdout is not None
        assert await asyncio.wait_for(child.stdout.readline(), 60) == b"ready\n"
    finally:
        child.send_signal(signal.SIGKILL)
        await child.wait()
    assert len(temp_files(tmp_path)) == 1  # the partial blob, left behind
    assert len(blob_files(tmp_path)) == 2  # kept, and unindexed: stored but no row yet
    store = await BlobStore.open(str(tmp_path), 10**9)
    assert temp_files(tmp_path) == []
    assert await store.lookup(digest(content(5 * 1024 * 1024, 3))) is None
    assert await store.lookup(digest(content(5000, 2))) is None  # no row: deleted
    kept = await store.lookup(digest(content(5000, 1)))
    assert kept is not None
    with kept.file:
        assert read(kept) == content(5000, 1) and kept.media_type == "text/kept"
    assert blob_files(tmp_path) == [tmp_path / "blobs" / "sha256" / kept.digest[7:]]
    assert (store.count, store.used) == (1, 5000)
    await store.close()


async def test_a_restart_keeps_blobs_media_types_grants_tags_and_lru_order(
    tmp_path: Path,
) -> None:
    store = await BlobStore.open(str(tmp_path), 300)
    a, b, c = (content(100, seed) for seed in (10, 11, 12))
    for data in (a, b, c):
        await put(store, data, MANIFEST)
    found = await store.lookup(digest(a))
    assert found is not None
    found.file.close()
    store.grant("h", "r", digest(b), None)
    store.grant("h", "r", digest(b), "own:x")
    record = TagRecord("h", "r", "latest", "own:x", digest(b), MANIFEST, 1700000000.5)
    store.tag(record)
    await store.close()

    store = await BlobStore.open(str(tmp_path), 300)
    assert (store.count, store.used) == (3, 300)
    assert store.owners("h", "r", digest(b)) == {None, "own:x"}
    assert store.tags("h", "r", "latest") == [record] and store.all_tags() == [record]
    found = await store.lookup(digest(c))
    assert found is not None
    with found.file:
        assert read(found) == c and found.media_type == MANIFEST
    await put(store, content(100, 13))  # b is the least recently used: a was looked up
    assert await store.lookup(digest(b)) is None
    assert store.owners("h", "r", digest(b)) == frozenset() and store.all_tags() == []
    await store.close()

    store = await BlobStore.open(str(tmp_path), 300)  # the eviction was written too
    assert store.all_tags() == [] and store.owners("h", "r", digest(b)) == frozenset()
    assert store.count == 3
    await store.close()


async def test_a_lower_max_bytes_at_open_evicts(tmp_path: Path) -> None:
    store = await BlobStore.open(str(tmp_path), 1000)
    for seed in range(5):
        await put(store, content(200, seed))
    await store.close()
    store = await BlobStore.open(str(tmp_path), 500)
    assert (store.count, store.used, store.evictions) == (2, 400, 3)
    assert len(blob_files(tmp_path)) == 2
    await store.close()


async def test_a_lost_or_corrupt_index_costs_only_cache(tmp_path: Path) -> None:
    store = await BlobStore.open(str(tmp_path), 10**7)
    data = content(3 * HASH_BATCH // 2, 20)
    await put(store, data)
    await store.close()
    (tmp_path / "index.sqlite").write_bytes(b"this is not a database" * 100)
    store = await BlobStore.open(str(tmp_path), 10**7)
    assert store.count == 0 and await store.lookup(digest(data)) is None
    assert blob_files(tmp_path) == []  # no row: nobody may be given it
    await put(store, data)
    await store.close()
    for suffix in ("", "-wal", "-shm"):
        (tmp_path / f"index.sqlite{suffix}").unlink(missing_ok=True)
    store = await BlobStore.open(str(tmp_path), 10**7)
    assert store.count == 0 and blob_files(tmp_path) == []
    await store.close()


async def test_rows_whose_file_is_gone_or_changed_are_dropped(tmp_path: Path) -> None:
    store = await BlobStore.open(str(tmp_path), 10**7)
    gone, changed, kept = content(100, 30), content(100, 31), content(100, 32)
    for data in (gone, changed, kept):
        await put(store, data)
        store.grant("h", "r", digest(data), None)
    await store.close()
    (tmp_path / "blobs" / "sha256" / digest(gone)[7:]).unlink()
    (tmp_path / "blobs" / "sha256" / digest(changed)[7:]).write_bytes(b"short")
    (tmp_path / "blobs" / "sha256" / "not-a-digest").write_bytes(b"stray")
    store = await BlobStore.open(str(tmp_path), 10**7)
    assert (store.count, store.used) == (1, 100)
    assert store.owners("h", "r", digest(gone)) == frozenset()
    assert store.owners("h", "r", digest(kept)) == {None}
    assert blob_files(tmp_path) == [tmp_path / "blobs" / "sha256" / digest(kept)[7:]]
    await store.close()


def test_the_package_imports_neither_aiohttp_nor_the_outer_layers() -> None:
    probe = (
        "import sys, kuikproxy.blobs; "
        "print(sorted(m for m in sys.modules "
        "if m.split('.')[0] == 'aiohttp' or m.startswith(('kuikproxy.web', 'kuikproxy.runtime'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, check=True, text=True)
    assert out.stdout.strip() == "[]"
