"""The pacing state's file, kept up to date from the event loop (P13, SPEC §7.3).

What survives a restart: every ring — cursor, lap, ``cycleStarted``, ``cycleDuration``, and
per image its last ask (P8), its last answer (R1's previous read) and its lap — and every
registry block (§11). Not the series: each starts a full interval after the process does (P1),
so a proxy restarting in a loop still sends nothing. Not waiting requests, kept answers or copy
queues: their clients ask again.

When it is written:

* before a window's read goes upstream, awaited by the read (:meth:`Durable.flush`): the turn
  that took the image, and every change before it, is on disk first. A process killed at any
  moment never forgets a read it sent, so no image of a lap is read twice for a restart;
* when a registry says stop: at once, so that a restart does not ask it again early;
* every :data:`FLUSH_EVERY` for the rest (asks, answers), and at shutdown.

Only what changed is written (the scheduler's tracked rings hand it out). Times go to the file
as wall-clock time and come back on the new process's loop clock through the pacer's offset
(the one ``/status`` converts with): a lap in progress started before the restart keeps its
start, so the downtime counts in its ``cycleDuration``.

A write that fails is logged, and the next one rewrites the whole state: pacing does not stop
for a broken disk, and the file never ends up with some changes of a lost batch and not others.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from kuikproxy.config import Config
from kuikproxy.core.ringstate import RingChanges, RingState
from kuikproxy.core.scheduler import HostScheduler
from kuikproxy.state import Batch, ThreadedStore

log = logging.getLogger(__name__)

FLUSH_EVERY = 1.0  # seconds between writes of what no read waits for


class Restoring(Protocol):
    """What the state is restored into (the pacer): its clock, config, and hosts."""

    loop: asyncio.AbstractEventLoop
    wall_offset: float

    @property
    def config(self) -> Config: ...

    def restore(
        self, host: str, rings: dict[str, RingState], blocked_until: float | None
    ) -> None: ...


class Durable:
    """One state file, owned by the event loop."""

    def __init__(self, store: ThreadedStore) -> None:
        self.store = store
        self._schedulers: dict[str, HostScheduler] = {}
        self._detached: list[tuple[str, str, RingChanges]] = []  # last changes of hosts let go
        self._blocks: dict[str, float] = {}  # blocks to write, loop time
        self._offset = 0.0  # loop time + offset = wall-clock time: the pacer's
        self._last: asyncio.Future[None] | None = None  # the write queued last
        self._rewrite = False  # a write failed: the next one writes everything
        self._failing = False
        self._ticker: asyncio.Task[None] | None = None
        self._flushes: set[asyncio.Task[None]] = set()

    @classmethod
    async def open(cls, path: str) -> Durable:
        """Raises :class:`~kuikproxy.errors.StateError` for a file that cannot be used."""
        return cls(await ThreadedStore.open(path))

    def attach(self, host: str, scheduler: HostScheduler) -> None:
        """A host's scheduler was made: its rings remember their changes from now on."""
        scheduler.track_changes()
        self._schedulers[host] = scheduler

    def detach(self, host: str) -> None:
        """A host's scheduler is let go of (forgotten when idle): its last changes — rings
        that expired — are written with the next batch, and nothing of it after."""
        scheduler = self._schedulers.pop(host, None)
        if scheduler is not None:
            self._detached.extend((host, resource, c) for resource, c in scheduler.changes())

    async def restore(self, pacer: Restoring) -> None:
        """Bring back what the file holds into ``pacer`` (before it serves anything), then keep
        the file up to date. Rings of hosts no longer paced or allowed, and blocks already
        over, stay out; the file keeps those rings for a later config that paces them again."""
        self._offset = pacer.wall_offset
        try:
            saved = await self.store.load(self._offset)
        except BaseException:  # the start fails: let go of the file and its thread
            await self.store.close()
            raise
        config, now = pacer.config, pacer.loop.time()
        rings = blocks = 0
        for host in sorted(saved.rings.keys() | saved.blocks.keys()):
            if not config.is_allowed(host):
                continue
            saved_rings = saved.rings.get(host, {}) if config.registry(host).paced else {}
            until = saved.blocks.get(host)
            if until is not None and until <= now:
                until = None
            if saved_rings or until is not None:
                pacer.restore(host, saved_rings, until)
                rings += len(saved_rings)
                blocks += until is not None
        log.info("restored %d rings and %d blocks from %s", rings, blocks, self.store.path)
        self._ticker = pacer.loop.create_task(self._tick())

    def blocked(self, host: str, until: float) -> None:
        """The registry said stop until ``until`` (§11): written now, not at the next tick."""
        self._blocks[host] = max(until, self._blocks.get(host, until))
        self.flush_soon()

    def flush_soon(self) -> None:
        """Write what changed now, without waiting for it: a read's answer credited to other
        resources' rings (R2), so that a crash right after cannot make them read it again."""
        task = asyncio.get_running_loop().create_task(self.flush())
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    async def flush(self) -> None:
        """Write what changed, and return once everything asked for until now is on disk (or
        has failed, which is logged: the caller goes on either way)."""
        batch = self._batch()
        if batch is not None:
            written = self.store.write(batch, self._offset)
            written.add_done_callback(self._written)
            self._last = written
        last = self._last
        if last is not None and not last.done():
            # not ``await last``: a caller cancelled (a read whose host went away) must not
            # cancel a write that other callers wait for
            await asyncio.wait((last,))

    def _batch(self) -> Batch | None:
        schedulers = self._schedulers.items()
        if self._rewrite:
            self._rewrite = False
            self._blocks.clear()
            self._detached.clear()  # the file is written whole: what they dropped is not in it
            return Batch(
                rings=tuple(
                    (host, resource, RingChanges.whole(state))
                    for host, scheduler in schedulers
                    for resource, state in scheduler.export()
                ),
                blocks=tuple(
                    (host, s.blocked_until) for host, s in schedulers if s.blocked_until is not None
                ),
                full=True,
            )
        rings = tuple(self._detached) + tuple(
            (host, resource, changes)
            for host, scheduler in schedulers
            for resource, changes in scheduler.changes()
        )
        self._detached.clear()
        if not rings and not self._blocks:
            return None
        blocks = tuple(self._blocks.items())
        self._blocks.clear()
        return Batch(rings, blocks)

    def _written(self, written: asyncio.Future[None]) -> None:
        error = None if written.cancelled() else written.exception()
        if error is None:
            if self._failing:
                log.info("state file %s written again", self.store.path)
            self._failing = False
            return
        if not self._failing:
            log.error("%s; pacing goes on, the next write rewrites the whole state", error)
        self._failing = self._rewrite = True

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_EVERY)
            try:
                await self.flush()
            except Exception:  # a bug must cost one write, not every later one
                log.exception("writing the state file failed unexpectedly")

    async def close(self) -> None:
        """The last write (at shutdown, once nothing changes any more), then close the file."""
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
        await asyncio.gather(*self._flushes, return_exceptions=True)
        await self.flush()
        if self._rewrite:  # the last write failed: one more try, with everything
            await self.flush()
        await self.store.close()
