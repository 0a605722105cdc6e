"""The state file from the event loop: batched writes of what changed, a flush that waits for
everything queued before it, blocks written at once, and a failed write that is logged and
followed by a whole rewrite (P13)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kuikproxy.core.hoststate import HostPacing
from kuikproxy.core.images import Image
from kuikproxy.core.ringstate import RingState
from kuikproxy.core.scheduler import HostScheduler
from kuikproxy.errors import StateError
from kuikproxy.runtime.durable import Durable
from kuikproxy.state import Batch, Saved, StateStore

HOST = "registry.test"


def ask(scheduler: HostScheduler, resource: str, tag: str, now: float) -> None:
    scheduler.check(resource, Image(HOST, "app", tag), now, auth=None, kept_at=None)


def saved_rings(saved: Saved) -> dict[str, RingState]:
    return saved.rings.get(HOST, {})


@pytest.fixture
async def durable(tmp_path: Path) -> AsyncIterator[Durable]:
    opened = await Durable.open(str(tmp_path / "state.db"))
    yield opened
    await opened.close()


@pytest.fixture
def scheduler(durable: Durable) -> HostScheduler:
    made = HostScheduler(HOST, HostPacing(check_interval=60.0, copy_interval=60.0), 0.0)
    durable.attach(HOST, made)
    return made


async def test_a_flush_writes_what_changed(durable: Durable, scheduler: HostScheduler) -> None:
    ask(scheduler, "web", "v1", 1.0)
    ask(scheduler, "api", "v1", 2.0)
    await durable.flush()
    assert saved_rings(await durable.store.load(0.0)) == dict(scheduler.export())


async def test_a_flush_waits_for_writes_queued_before_it(
    durable: Durable, scheduler: HostScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read whose turn another flush already took to the file still waits for that write:
    returning at once would send it before its decision is on disk."""
    write = StateStore.write
    written: list[Batch] = []

    def slow(self: StateStore, batch: Batch, offset: float = 0.0) -> None:
        time.sleep(0.05)
        write(self, batch, offset)
        written.append(batch)

    monkeypatch.setattr(StateStore, "write", slow)
    ask(scheduler, "web", "v1", 1.0)
    earlier = asyncio.ensure_future(durable.flush())
    await asyncio.sleep(0)  # the earlier flush has queued the write
    assert written == []
    await durable.flush()  # nothing new to write
    assert len(written) == 1
    await earlier


async def test_a_block_is_written_at_once(tmp_path: Path) -> None:
    durable = await Durable.open(str(tmp_path / "state.db"))
    durable.blocked(HOST, 500.0)
    durable.blocked(HOST, 400.0)  # never shortened
    await durable.flush()  # waits for the write the block queued
    assert (await durable.store.load(0.0)).blocks == {HOST: 500.0}
    await durable.close()


async def test_a_failed_write_is_logged_and_the_next_rewrites_everything(
    durable: Durable,
    scheduler: HostScheduler,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The changes of a failed batch are lost to the file; the next write replaces the file's
    content with the whole state, so it never holds some of a batch and not the rest."""
    ask(scheduler, "web", "v1", 1.0)
    await durable.flush()
    write = StateStore.write
    failures = iter([True])

    def flaky(self: StateStore, batch: Batch, offset: float = 0.0) -> None:
        if next(failures, False):
            raise StateError("state file x: cannot write it (disk full)")
        write(self, batch, offset)

    monkeypatch.setattr(StateStore, "write", flaky)
    ask(scheduler, "web", "v2", 2.0)
    with caplog.at_level(logging.ERROR, logger="kuikproxy.runtime.durable"):
        await durable.flush()  # the caller goes on: pacing does not stop for the disk
    assert "disk full" in caplog.text and "rewrites the whole state" in caplog.text
    ask(scheduler, "api", "v3", 3.0)
    await durable.flush()
    assert saved_rings(await durable.store.load(0.0)) == dict(scheduler.export())


async def test_close_writes_what_is_left(tmp_path: Path) -> None:
    path = str(tmp_path / "state.db")
    durable = await Durable.open(path)
    scheduler = HostScheduler(HOST, HostPacing(check_interval=60.0, copy_interval=60.0), 0.0)
    durable.attach(HOST, scheduler)
    ask(scheduler, "web", "v1", 1.0)
    await durable.close()
    assert saved_rings(await asyncio.to_thread(load, path)) == dict(scheduler.export())


def load(path: str) -> Saved:
    store = StateStore(path)
    try:
        return store.load()
    finally:
        store.close()


async def test_a_detached_host_writes_its_last_changes_and_nothing_after(
    durable: Durable, scheduler: HostScheduler
) -> None:
    """A host forgotten when idle is detached: the rings that expired before it was
    are dropped from the file with the next write, and it is written no more."""
    scheduler.check("web", Image(HOST, "app", "v1"), 1.0, auth=None, kept_at=1.0)  # R1
    await durable.flush()
    assert saved_rings(await durable.store.load(0.0)) != {}
    scheduler.sweep(1.0 + scheduler.pacing.retention + 1.0)  # v1 and its ring expire (P8)
    durable.detach(HOST)
    await durable.flush()
    assert saved_rings(await durable.store.load(0.0)) == {}
    ask(scheduler, "web", "v2", 2.0)  # not its state any more: never written
    await durable.flush()
    assert saved_rings(await durable.store.load(0.0)) == {}
