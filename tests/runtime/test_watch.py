"""The config file's watch (§7.2) in a busy directory: what happens beside the file never
holds a change back, and a file rewritten without pause is still looked at, within 1 s."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from kuikproxy.runtime.watch import FileWatch

EVERY = 0.01  # seconds between two writes of the busy writer
WITHIN = 1.0  # seconds a change may take to be seen, whatever else the directory does


@contextlib.asynccontextmanager
async def busy(write: Callable[[int], object]) -> AsyncIterator[None]:
    """``write(n)`` every :data:`EVERY` seconds on the loop, until the block ends."""

    async def loop() -> None:
        for n in range(1_000_000):
            write(n)
            await asyncio.sleep(EVERY)

    task = asyncio.create_task(loop())
    try:
        yield
    finally:
        task.cancel()


def beside(directory: Path) -> Callable[[int], None]:
    """A log appended and a journal created and removed, as a state file's would be."""

    def write(n: int) -> None:
        with (directory / "beside.log").open("a") as log:
            log.write(f"line {n}\n")
        journal = directory / "state.db-journal"
        journal.write_bytes(b"page")
        journal.unlink()

    return write


class Calls:
    """The watch's callback: counts its calls, and waits for a number of them."""

    def __init__(self) -> None:
        self.count = 0
        self._called = asyncio.Event()

    def __call__(self) -> None:
        self.count += 1
        self._called.set()

    async def reach(self, count: int) -> bool:
        """Whether ``count`` calls have been made within :data:`WITHIN` from now."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(WITHIN):
                while self.count < count:
                    self._called.clear()
                    await self._called.wait()
        return self.count >= count


def watch(path: Path, calls: Calls) -> FileWatch:
    return FileWatch(str(path), calls, asyncio.get_running_loop())


async def test_a_busy_neighbour_holds_no_change_back(tmp_path: Path) -> None:
    """A file beside the config written every 10 ms: a rename over the config is seen."""
    path = tmp_path / "kuikproxy.yaml"
    path.write_text("listen: 127.0.0.1:1\n")
    calls = Calls()
    files = watch(path, calls)
    try:
        async with busy(beside(tmp_path)):
            await asyncio.sleep(0.3)
            assert calls.count == 0  # the neighbour alone changes nothing
            fresh = tmp_path / "kuikproxy.yaml.tmp"
            fresh.write_text("listen: 127.0.0.1:2\n")
            fresh.replace(path)
            assert await calls.reach(1)
            await asyncio.sleep(0.3)
            assert calls.count == 1  # one version, one call
    finally:
        files.close()


async def test_a_file_rewritten_without_pause_is_still_looked_at(tmp_path: Path) -> None:
    """The config itself written in place every 10 ms: the quiet period never comes, and the
    change is looked at anyway, more than once while it goes on."""
    path = tmp_path / "kuikproxy.yaml"
    path.write_text("listen: 127.0.0.1:0\n")
    calls = Calls()
    files = watch(path, calls)
    try:
        async with busy(lambda n: path.write_text(f"listen: 127.0.0.1:{n + 1}\n")):
            assert await calls.reach(1)
            assert await calls.reach(2)
    finally:
        files.close()


def swap(directory: Path, stamp: str, text: str) -> None:
    """What the kubelet does to a mounted ConfigMap: a new timestamped directory, a
    ``..data_tmp`` link to it renamed over ``..data``, the old directory removed."""
    old = os.readlink(directory / "..data") if (directory / "..data").is_symlink() else None
    fresh = directory / f"..{stamp}"
    fresh.mkdir()
    (fresh / "kuikproxy.yaml").write_text(text)
    os.symlink(fresh.name, directory / "..data_tmp")
    os.rename(directory / "..data_tmp", directory / "..data")
    if old is not None:
        shutil.rmtree(directory / old)


async def test_a_configmap_swap_beside_a_busy_neighbour_is_seen(tmp_path: Path) -> None:
    path = tmp_path / "kuikproxy.yaml"
    swap(tmp_path, "2026_01_01_00_00_00.000000001", "listen: 127.0.0.1:1\n")
    path.symlink_to("..data/kuikproxy.yaml")
    calls = Calls()
    files = watch(path, calls)
    try:
        async with busy(beside(tmp_path)):
            await asyncio.sleep(0.2)
            swap(tmp_path, "2026_01_01_00_01_00.000000002", "listen: 127.0.0.1:2\n")
            assert await calls.reach(1)
    finally:
        files.close()
