"""Any sequence of writes, finishes, aborts, lookups and resizes keeps the books: ``used`` is
the bytes of the blob files plus what writers under way reserved, and neither it nor the bytes
on disk ever pass ``max_bytes``; no blob is stored that was not what its digest says."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from kuikproxy.blobs import BlobStore, BlobWriter
from tests.blobs.helpers import blob_files, content, digest, disk_bytes, temp_files

BLOBS = [content(50 + (97 * i) % 700, i) for i in range(12)]

Op = tuple[str, int, int]

ops = st.lists(
    st.one_of(
        st.tuples(st.just("start"), st.integers(0, 11), st.integers(0, 2)),  # declared, not, bad
        st.tuples(st.just("write"), st.integers(0, 3), st.integers(1, 400)),
        st.tuples(st.just("finish"), st.integers(0, 3), st.just(0)),
        st.tuples(st.just("abort"), st.integers(0, 3), st.just(0)),
        st.tuples(st.just("lookup"), st.integers(0, 11), st.just(0)),
        st.tuples(st.just("resize"), st.integers(0, 2500), st.just(0)),
    ),
    max_size=60,
)


async def run(root: Path, steps: list[Op]) -> None:
    store = await BlobStore.open(str(root), 1500)
    writers: list[tuple[BlobWriter, bytes, bool]] = []  # with the bytes it is fed, and if true

    def check() -> None:
        live = [w for w, _, _ in writers if not w.aborted]
        files = blob_files(root)
        assert store.used == sum(p.stat().st_size for p in files) + sum(w.reserved for w in live)
        assert store.used <= store.max_bytes
        assert disk_bytes(root) <= store.max_bytes
        assert store.count == len(files)
        assert len(temp_files(root)) == len(live)

    for op, a, b in steps:
        if op == "start":
            data = BLOBS[a]
            true = b != 2
            writer = store.writer(digest(data), len(data) if b == 0 else None, None)
            if writer is not None:
                writers.append((writer, data if true else content(len(data), 99), true))
        elif op == "write" and a < len(writers):
            writer, data, _ = writers[a]
            writer.write(data[writer.written : writer.written + b])
        elif op in ("finish", "abort") and a < len(writers):
            writer, data, true = writers.pop(a)
            if op == "abort":
                writer.abort()
                continue
            whole = writer.written == len(data) and not writer.aborted
            stored = await writer.finish()
            if stored is not None:
                stored.file.close()
            assert (stored is not None) == (true and whole)
            if stored is None:
                assert await store.lookup(writer.digest) is None
        elif op == "lookup":
            found = await store.lookup(digest(BLOBS[a]))
            if found is not None:
                found.file.close()
        elif op == "resize":
            store.resize(a)
        check()
    await store.close()
    assert temp_files(root) == []


@settings(max_examples=60, deadline=None)
@given(ops)
def test_the_books_always_balance(steps: list[Op]) -> None:
    with tempfile.TemporaryDirectory() as root:
        asyncio.run(run(Path(root), steps))
