"""The blob store: verified blobs only, LRU within max_bytes, grants and tags with their blob."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import random
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kuikproxy.blobs import BlobStore, BlobWriter, TagRecord, disk
from kuikproxy.blobs.store import FLUSH_DELAY
from kuikproxy.blobs.writer import HASH_BATCH
from kuikproxy.errors import StateError
from tests.blobs.helpers import (
    blob_files,
    content,
    digest,
    disk_bytes,
    put,
    read,
    temp_files,
)

MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[BlobStore]:
    opened = await BlobStore.open(str(tmp_path), 10_000_000)
    yield opened
    await opened.close()


@pytest.mark.parametrize("declared", [True, False])
@pytest.mark.parametrize("algorithm", ["sha256", "sha512"])
async def test_round_trip(store: BlobStore, tmp_path: Path, declared: bool, algorithm: str) -> None:
    data = content(3 * HASH_BATCH + 123, 1)  # hashed in batches on the way, the rest at finish
    name = digest(data, algorithm)
    writer = store.writer(name, len(data) if declared else None, MANIFEST)
    assert writer is not None
    for start in range(0, len(data), 65536):
        assert writer.write(data[start : start + 65536])
    stored = await writer.finish()
    assert stored is not None
    with stored.file:
        assert (stored.digest, stored.size, stored.media_type) == (name, len(data), MANIFEST)
        assert read(stored) == data
    found = await store.lookup(name)
    assert found is not None
    with found.file:
        assert read(found) == data
        assert found.media_type == MANIFEST
    assert (store.used, store.count) == (len(data), 1)
    assert store.contains(name) and not store.contains(digest(b"other"))
    assert blob_files(tmp_path) == [tmp_path / "blobs" / algorithm / name.partition(":")[2]]
    assert temp_files(tmp_path) == []


async def test_no_media_type_and_empty_blob(store: BlobStore) -> None:
    stored = await put(store, b"")
    assert (stored.size, stored.media_type) == (0, None)
    found = await store.lookup(digest(b""))
    assert found is not None
    found.file.close()


@pytest.mark.parametrize("declared", [True, False])
async def test_a_mismatching_blob_is_never_stored(
    store: BlobStore, tmp_path: Path, declared: bool
) -> None:
    data = content(HASH_BATCH * 2, 2)
    claimed = digest(content(HASH_BATCH * 2, 3))
    writer = store.writer(claimed, len(data) if declared else None, None)
    assert writer is not None
    assert writer.write(data)
    assert await writer.finish() is None
    assert writer.aborted
    assert await store.lookup(claimed) is None
    assert (store.used, store.count) == (0, 0)
    assert blob_files(tmp_path) == [] and temp_files(tmp_path) == []
    assert store.writer(claimed, None, None) is not None  # free to be read again


async def test_the_declared_size_is_held_to(store: BlobStore, tmp_path: Path) -> None:
    data = content(1000, 4)
    short = store.writer(digest(data), 1001, None)
    assert short is not None
    assert short.write(data)
    assert await short.finish() is None
    long = store.writer(digest(data), 999, None)
    assert long is not None
    assert not long.write(data)  # past the declared size: aborted at once
    assert long.aborted and temp_files(tmp_path) == []
    assert not long.write(b"x")
    assert await long.finish() is None
    assert store.used == 0 and temp_files(tmp_path) == []


async def test_writers_refused(store: BlobStore) -> None:
    data = content(100, 5)
    writer = store.writer(digest(data), 100, None)
    assert writer is not None
    assert store.writing(digest(data)) is writer
    assert not store.contains(digest(data))  # not stored until finished
    assert store.writer(digest(data), 100, None) is None  # being written
    assert store.writer(digest(data), None, None) is None
    writer.abort()
    writer.abort()  # idempotent
    assert store.writing(digest(data)) is None
    await put(store, data)
    assert store.writer(digest(data), 100, None) is None  # stored
    assert store.writer(digest(b"x"), store.max_bytes + 1, None) is None  # can never fit
    for bad in ("sha256:../../etc/passwd", "sha256:" + "A" * 64, "md5:" + "0" * 32, "sha256:"):
        assert store.writer(bad, 1, None) is None
        assert await store.lookup(bad) is None


async def test_abort_after_finish_changes_nothing(store: BlobStore) -> None:
    data = content(500, 6)
    writer = store.writer(digest(data), None, None)
    assert writer is not None
    writer.write(data)
    stored = await writer.finish()
    assert stored is not None
    stored.file.close()
    writer.abort()
    assert store.count == 1 and store.used == 500


async def test_the_temp_file_can_be_read_while_it_grows(store: BlobStore) -> None:
    data = content(3000, 7)
    writer = store.writer(digest(data), len(data), None)
    assert writer is not None
    writer.write(data[:1000])
    tail = os.open(writer.path, os.O_RDONLY)
    try:
        assert os.pread(tail, writer.written, 0) == data[:1000]
        writer.write(data[1000:])
        stored = await writer.finish()
        assert stored is not None
        stored.file.close()
        assert os.pread(tail, writer.written, 0) == data  # renamed, still readable
    finally:
        os.close(tail)


async def test_lru_eviction_order(tmp_path: Path) -> None:
    store = await BlobStore.open(str(tmp_path), 300)
    a, b, c, d, e = (content(100, seed) for seed in range(10, 15))
    for data in (a, b, c):
        await put(store, data)
    found = await store.lookup(digest(a))  # a is now the most recently used
    assert found is not None
    found.file.close()
    await put(store, d)
    assert await store.lookup(digest(b)) is None
    assert (store.evictions, store.count, store.used) == (1, 3, 300)
    await put(store, e)
    assert await store.lookup(digest(c)) is None
    assert store.evictions == 2
    for data in (a, d, e):
        found = await store.lookup(digest(data))
        assert found is not None
        found.file.close()
    assert len(blob_files(tmp_path)) == 3
    await store.close()


async def test_a_blob_being_written_is_never_evicted(tmp_path: Path) -> None:
    store = await BlobStore.open(str(tmp_path), 300)
    a, b = content(100, 20), content(250, 21)
    writer = store.writer(digest(a), 100, None)
    assert writer is not None
    assert store.writer(digest(b), 250, None) is None  # 100 are reserved: 250 cannot fit
    assert store.used == 100 and store.evictions == 0
    writer.abort()
    assert store.used == 0
    await put(store, b)
    assert store.writer(digest(a), 100, None) is not None  # b evicted to make room
    assert store.evictions == 1
    await store.close()


async def test_a_writer_without_size_stops_when_room_runs_out(tmp_path: Path) -> None:
    store = await BlobStore.open(str(tmp_path), 1000)
    held = store.writer(digest(content(800, 22)), 800, None)
    assert held is not None
    data = content(300, 23)
    writer = store.writer(digest(data), None, None)
    assert writer is not None
    assert writer.write(data[:200])
    assert not writer.write(data[200:])  # 800 + 300 > 1000, and nothing can be evicted
    assert writer.aborted and store.used == 800
    assert temp_files(tmp_path) == [Path(held.path)]
    await store.close()
    assert temp_files(tmp_path) == []  # close aborts the writers still writing


async def test_a_volume_with_less_room_than_max_bytes_turns_blobs_away(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``maxBytes`` says 1,000 but the volume has 250 bytes left: a writer counts the room
    the writers under way will still take, evicts blobs when that makes room, and otherwise
    turns the blob away (it streams through) instead of failing mid-way on a full disk."""
    store = await BlobStore.open(str(tmp_path), 1000)
    a, b, c = content(100, 30), content(200, 31), content(150, 32)
    await put(store, a)
    room = {"free": 250}
    monkeypatch.setattr(disk, "free", lambda path: room["free"])
    writer = store.writer(digest(b), 200, None)
    assert writer is not None
    assert writer.write(b[:50])  # 150 more to come: 100 left for others
    assert store.writer(digest(c), 150, None) is not None  # a evicted: 100 + 100 free
    assert store.evictions == 1 and await store.lookup(digest(a)) is None
    room["free"] = 0
    assert store.writer(digest(content(10, 33)), 10, None) is None  # nothing left to evict
    assert store.evictions == 1
    monkeypatch.setattr(disk, "free", _refused)
    assert store.writer(digest(content(10, 34)), 10, None) is None
    await store.close()


def _refused(path: str) -> int:
    raise PermissionError(path)


@pytest.mark.parametrize("declared", [True, False, None])
async def test_a_flood_never_passes_max_bytes(tmp_path: Path, declared: bool | None) -> None:
    """200 distinct blobs through 12 writers at a time, sizes declared, not, or either."""
    limit = 20_000
    store = await BlobStore.open(str(tmp_path), limit)
    rng = random.Random(0)
    blobs = [content(rng.randrange(1, 6000), 100 + i) for i in range(200)]
    pending = list(blobs)
    open_: list[tuple[BlobWriter, bytes, int]] = []
    stored = 0

    def check() -> None:
        assert store.used <= limit
        assert disk_bytes(tmp_path) <= limit

    while pending or open_:
        while pending and len(open_) < 12:
            data = pending.pop()
            say = rng.random() < 0.5 if declared is None else declared
            writer = store.writer(digest(data), len(data) if say else None, None)
            check()
            if writer is not None:
                open_.append((writer, data, 0))
        writer, data, at = open_.pop(rng.randrange(len(open_)))
        step = rng.randrange(1, 2000)
        if at < len(data) and writer.write(data[at : at + step]):
            open_.append((writer, data, at + step))
        elif at >= len(data):
            result = await writer.finish()
            assert result is not None
            result.file.close()
            stored += 1
        check()
    assert stored >= 10  # writers refused or cut short for room, not all
    assert store.used == sum(p.stat().st_size for p in blob_files(tmp_path))
    assert store.count == len(blob_files(tmp_path)) and temp_files(tmp_path) == []
    await store.close()


async def test_resize_evicts_and_aborts(tmp_path: Path) -> None:
    store = await BlobStore.open(str(tmp_path), 1000)
    for seed in range(30, 35):
        await put(store, content(150, seed))
    writer = store.writer(digest(content(200, 40)), 200, None)
    assert writer is not None
    assert store.used == 950
    store.resize(500)
    assert (store.used, store.evictions, store.count) == (500, 3, 2)
    assert not writer.aborted
    store.resize(100)  # the last blobs go, then the writer
    assert (store.used, store.evictions, store.count) == (0, 5, 0)
    assert writer.aborted
    assert disk_bytes(tmp_path) == 0
    await store.close()


async def test_a_blob_that_cannot_be_opened_now_is_kept_and_one_gone_is_forgotten(
    store: BlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of descriptors (clients holding thousands of connections and files), a lookup
    finds nothing now but the blob stays; a blob whose file was deleted behind the store's
    back is forgotten."""
    data = content(100, 40)
    await put(store, data)
    real_open = open

    def out_of_descriptors(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr("builtins.open", out_of_descriptors)
    assert await store.lookup(digest(data)) is None
    monkeypatch.setattr("builtins.open", real_open)
    assert store.contains(digest(data)) and len(blob_files(tmp_path)) == 1
    blob_files(tmp_path)[0].unlink()
    assert await store.lookup(digest(data)) is None
    assert not store.contains(digest(data))


async def test_an_open_file_still_reads_after_its_blob_is_evicted(tmp_path: Path) -> None:
    store = await BlobStore.open(str(tmp_path), 1000)
    data = content(1000, 50)
    await put(store, data)
    found = await store.lookup(digest(data))
    assert found is not None
    await put(store, content(10, 51))  # evicts it
    assert await store.lookup(digest(data)) is None and store.evictions == 1
    with found.file:
        assert read(found) == data
    await store.close()


async def test_a_finish_goes_on_when_its_caller_is_cancelled(store: BlobStore) -> None:
    data = content(2 * HASH_BATCH, 52)
    writer = store.writer(digest(data), len(data), None)
    assert writer is not None
    writer.write(data)
    task = asyncio.ensure_future(writer.finish())
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert writer.finishing is not None
    result = await writer.finishing
    assert result is not None and result.file.closed  # nobody would close it
    found = await store.lookup(digest(data))
    assert found is not None
    found.file.close()


async def test_grants_and_tags(store: BlobStore) -> None:
    data = content(100, 60)
    name = digest(data)
    store.grant("h", "r", name, None)  # not stored: ignored
    assert store.owners("h", "r", name) == frozenset()
    writer = store.writer(name, 100, MANIFEST)
    assert writer is not None
    store.grant("h", "r", name, "own:abc")  # being written: kept
    writer.write(data)
    stored = await writer.finish()
    assert stored is not None
    stored.file.close()
    store.grant("h", "r", name, None)
    store.grant("h", "r", name, "key")
    store.grant("h", "other", name, "key")
    assert store.owners("h", "r", name) == {None, "own:abc", "key"}
    assert store.owners("h", "other", name) == {"key"}
    older = TagRecord("h", "r", "latest", None, name, MANIFEST, 1.0)
    newer = TagRecord("h", "r", "latest", "key", name, MANIFEST, 2.0)
    store.tag(older)
    store.tag(newer)
    # a HEAD by tag names a manifest before its bytes come: kept all the same
    early = TagRecord("h", "r", "latest", "x", digest(b"nope"), MANIFEST, 3.0)
    store.tag(early)
    assert store.tags("h", "r", "latest") == [early, newer, older]
    replaced = TagRecord("h", "r", "latest", None, name, MANIFEST, 5.0)
    store.tag(replaced)
    assert store.tags("h", "r", "latest") == [replaced, early, newer]
    assert set(store.all_tags()) == {replaced, early, newer}


async def test_grants_and_tags_go_with_their_blob(tmp_path: Path) -> None:
    store = await BlobStore.open(str(tmp_path), 100)
    data = content(100, 61)
    await put(store, data)
    store.grant("h", "r", digest(data), None)
    store.tag(TagRecord("h", "r", "t", None, digest(data), MANIFEST, 1.0))
    await put(store, content(50, 62))  # evicts it
    assert store.owners("h", "r", digest(data)) == frozenset()
    assert store.tags("h", "r", "t") == [] and store.all_tags() == []
    failed = store.writer(digest(content(10, 63)), 10, None)
    assert failed is not None
    store.grant("h", "r", failed.digest, "key")
    failed.abort()
    assert store.owners("h", "r", failed.digest) == frozenset()
    await store.close()


async def test_bounded_tags_and_grants(tmp_path: Path) -> None:
    store = await BlobStore.open(str(tmp_path), 10_000, max_tags=3, max_grants=2)
    name = (await put(store, b"manifest")).digest
    records = [TagRecord("h", "r", f"t{i}", None, name, MANIFEST, float(i)) for i in range(5)]
    for record in records:
        store.tag(record)
    assert store.all_tags() == records[2:]
    store.tag(records[2])  # read again: new again
    store.tag(records[0])
    assert store.all_tags() == [records[4], records[2], records[0]]
    for owner in ("a", "b", "a", "c"):
        store.grant("h", "r", name, owner)
    assert store.owners("h", "r", name) == {"a", "c"}
    await store.close()


async def test_a_second_process_is_refused(tmp_path: Path) -> None:
    store = await BlobStore.open(str(tmp_path), 1000)
    with pytest.raises(StateError, match="in use"):
        await BlobStore.open(str(tmp_path), 1000)
    await store.close()
    again = await BlobStore.open(str(tmp_path), 1000)
    await again.close()


async def test_a_closed_store_refuses(tmp_path: Path) -> None:
    store = await BlobStore.open(str(tmp_path), 1000)
    data = content(10, 70)
    await put(store, data)
    await store.close()
    await store.close()
    assert await store.lookup(digest(data)) is None
    assert store.writer(digest(b"x"), 1, None) is None


@pytest.mark.looptime
async def test_the_index_is_written_lazily_within_the_flush_delay(tmp_path: Path) -> None:
    """Under the virtual clock too: every disk job goes through ``run_in_executor``."""
    store = await BlobStore.open(str(tmp_path), 1000)
    data = content(100, 80)
    await put(store, data, MANIFEST)

    def rows() -> list[tuple[str, str | None]]:
        with contextlib.closing(sqlite3.connect(tmp_path / "index.sqlite")) as db:
            return db.execute("SELECT digest, media_type FROM blobs").fetchall()

    assert rows() == []
    await asyncio.sleep(FLUSH_DELAY + 0.1)
    assert rows() == [(digest(data), MANIFEST)]
    await store.close()
