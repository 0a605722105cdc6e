"""The state file on a thread of its own, for the event loop.

Every SQLite call is made on one worker thread (the connection is that thread's alone), in the
order the loop asked for them: a single-worker executor is a FIFO, so a batch queued after
another is written after it, whoever awaits which. The loop never waits on the disk except in
an ``await``. ``run_in_executor`` rather than a bare submit, so that the virtual clock of the
tests (looptime) knows a thread is working and keeps to real time meanwhile.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from kuikproxy.state.statefile import Batch, Saved, StateStore


class ThreadedStore:
    def __init__(
        self, loop: asyncio.AbstractEventLoop, executor: ThreadPoolExecutor, store: StateStore
    ) -> None:
        self._loop = loop
        self._executor = executor
        self._store = store

    @classmethod
    async def open(cls, path: str, *, busy_timeout: float = 5.0) -> ThreadedStore:
        """Open the file on the store's thread; raises :class:`~kuikproxy.errors.StateError`."""
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kuikproxy-state")
        try:
            store = await loop.run_in_executor(
                executor, lambda: StateStore(path, busy_timeout=busy_timeout)
            )
        except BaseException:
            executor.shutdown(wait=False)
            raise
        return cls(loop, executor, store)

    @property
    def path(self) -> str:
        return self._store.path

    def load(self, offset: float) -> asyncio.Future[Saved]:
        return self._loop.run_in_executor(self._executor, self._store.load, offset)

    def write(self, batch: Batch, offset: float) -> asyncio.Future[None]:
        """Queue ``batch`` now, behind every batch queued before it; the future is done once it
        is on disk (or failed, with :class:`~kuikproxy.errors.StateError`)."""
        return self._loop.run_in_executor(self._executor, self._store.write, batch, offset)

    async def close(self) -> None:
        """Close the file once everything queued is written."""
        await self._loop.run_in_executor(self._executor, self._store.close)
        self._executor.shutdown(wait=True)  # the thread is idle: this only joins it
