"""What hashing the pull-through store's files again costs: the price of checking every stored
blob at a start, against checking each one at its first serve after it (docs/spec.md §15).

A fresh store under a temp dir is filled through its own writers with ``--gib`` GiB of blobs
of ``--blob-mib`` MiB each, then closed and opened again (as a restart does), and every file
is hashed whole with the store's own check (:func:`kuikproxy.blobs.disk.check`): once one at a
time, once on the store's :data:`~kuikproxy.blobs.store.FILE_THREADS` threads at once. Each
both from the page cache (just written: CPU only) and with the files' pages dropped first
(``posix_fadvise(DONTNEED)``; the files are fsynced, so the kernel lets go of them): the
disk's read on top. Seconds, GiB/s, and CPU seconds of the process.

Run: ``.venv/bin/python bench/store_rehash.py`` (``--gib 1 --blob-mib 32``, the defaults).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from kuikproxy.blobs import BlobStore, disk
from kuikproxy.blobs.store import FILE_THREADS

CHUNK = 1024 * 1024


def blob(index: int, size: int) -> bytes:
    seed = index.to_bytes(8, "big") * (CHUNK // 8)
    return (seed * (size // CHUNK + 1))[:size]


async def fill(root: str, count: int, size: int) -> list[tuple[str, int]]:
    store = await BlobStore.open(root, count * size + CHUNK)
    stored = []
    for index in range(count):
        data = blob(index, size)
        digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
        writer = store.writer(digest, size, None)
        assert writer is not None
        for start in range(0, size, CHUNK):
            assert writer.write(data[start : start + CHUNK])
        done = await writer.finish()
        assert done is not None
        done.file.close()
        stored.append((digest, size))
    await store.close()
    return stored


def check(root: str, digest: str, size: int, cold: bool) -> None:
    algorithm, _, hexpart = digest.partition(":")
    fd = os.open(os.path.join(root, "blobs", algorithm, hexpart), os.O_RDONLY)
    if cold:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    good, _ = disk.check(fd, digest, size)  # closes fd
    assert good


def measure(root: str, blobs: list[tuple[str, int]], threads: int, cold: bool) -> None:
    total = sum(size for _, size in blobs)
    cpu, wall = time.process_time(), time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda b: check(root, b[0], b[1], cold), blobs))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    where = "disk (pages dropped)" if cold else "page cache"
    print(
        f"{total / 2**30:.2f} GiB, {threads} thread(s), {where}: {wall:.2f} s "
        f"({total / 2**30 / wall:.2f} GiB/s), CPU {cpu:.2f} s"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--blob-mib", type=int, default=32)
    args = parser.parse_args()
    size = args.blob_mib * CHUNK
    count = max(1, round(args.gib * 2**30 / size))
    with tempfile.TemporaryDirectory() as root:
        blobs = await fill(root, count, size)
        await (await BlobStore.open(root, count * size + CHUNK)).close()  # a restart's recovery
        for cold in (False, True):
            for threads in (1, FILE_THREADS):
                measure(root, blobs, threads, cold)


if __name__ == "__main__":
    asyncio.run(main())
