"""A host's two series (check, copy) on the loop's clock: one timer per series while something
may be due there, and the windows they open.

The scheduler decides what a window does; this only opens windows when the scheduler says they
are due (a series with nothing due sleeps, timerless: a quiet host costs no CPU), and, for a
host shared with a fleet, claims each window from the fleet first. What a window decided goes
to ``opened``, which carries it out.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from kuikproxy.core.fleetturns import LATE, Turns
from kuikproxy.core.scheduler import HostScheduler
from kuikproxy.core.tickets import Operation, WindowResult
from kuikproxy.core.windows import Outcome, Series
from kuikproxy.runtime.fleetlink import FleetLink
from kuikproxy.runtime.services import Services
from kuikproxy.runtime.windowhistory import WindowHistory

log = logging.getLogger(__name__)


class Owner(Protocol):
    """What the timers tell of their windows: the host."""

    def opened(self, operation: Operation, result: WindowResult) -> None:
        """Carry out what a window decided."""

    def block(self, until: float) -> None:
        """Put a block the fleet knows of on the host."""

    def cut_off(self) -> None:
        """A window lost to the fleet's store out of reach, which this proxy waits for."""

    @property
    def history(self) -> WindowHistory:
        """Where its windows are written down (the status page's timeline)."""


class SeriesTimers:
    """One host's check and copy series on the loop.

    Made for every host, so it holds no more than it must: a slot per series' timer, not a
    dict, and its host, not bound methods of it.
    """

    __slots__ = (
        "_check",
        "_copy",
        "_turns",
        "closed",
        "fleet",
        "name",
        "owner",
        "scheduler",
        "services",
    )

    def __init__(
        self, name: str, scheduler: HostScheduler, services: Services, owner: Owner
    ) -> None:
        self.name = name
        self.scheduler = scheduler
        self.services = services
        self.owner = owner
        self.closed = False  # the host was let go of (forgotten, or a reload): no more windows
        self.fleet: FleetLink | None = None  # set while the host is shared with a fleet
        # each series' timer while something may be due there; a series with none sleeps
        self._check: asyncio.TimerHandle | None = None
        self._copy: asyncio.TimerHandle | None = None
        # each series' own turns in the fleet's (kept to while the store is away), once shared
        self._turns: dict[Operation, Turns] | None = None
        self.arm(Operation.CHECK)
        self.arm(Operation.COPY)

    @property
    def armed(self) -> dict[Operation, asyncio.TimerHandle]:
        """The series' timers that are set."""
        timers = ((Operation.CHECK, self._check), (Operation.COPY, self._copy))
        return {operation: timer for operation, timer in timers if timer is not None}

    def _set(self, operation: Operation, timer: asyncio.TimerHandle | None) -> None:
        if operation is Operation.CHECK:
            self._check = timer
        else:
            self._copy = timer

    def series(self, operation: Operation) -> Series:
        s = self.scheduler
        return s.check_series if operation is Operation.CHECK else s.copy_series

    def arm(self, operation: Operation) -> None:
        """Set the series' timer at its next window while something may be due there; with
        nothing due it sleeps, timerless, until :meth:`wake`."""
        loop = self.services.loop
        old = self._check if operation is Operation.CHECK else self._copy
        if old is not None:
            old.cancel()
        at = self.scheduler.next_due(operation, loop.time())
        self._set(operation, None if at is None else loop.call_at(at, self.window, operation))

    def wake(self, operation: Operation) -> None:
        """Something may have become due on a sleeping series: its timer, at its next window
        on its grid (P1); the windows it slept through were idle."""
        timer = self._check if operation is Operation.CHECK else self._copy
        if timer is None and self.scheduler.has_due(operation):
            self.arm(operation)

    def close(self) -> None:
        self.closed = True
        for timer in (self._check, self._copy):
            if timer is not None:
                timer.cancel()
        self._check = self._copy = None

    def window(self, operation: Operation) -> None:
        self._set(operation, None)  # it fired: armed again below, if it must be
        fleet, loop = self.fleet, self.services.loop
        if fleet is None or not self.scheduler.has_due(operation):
            self.open(operation, loop.time())
            return
        # a window with something due, on a fleet's grid: claimed first; the next one is armed
        # now, so a slow answer from the fleet never shifts the grid. The window is the latest
        # due: the last one's claim may not have been answered yet (its window has not fired)
        series = self.series(operation)
        index = max(series.fired + 1, series.last_due(loop.time()))
        at = series.origin + (index + 1) * series.interval
        self._set(operation, loop.call_at(at, self.window, operation))
        self.services.spawn(self.fleet_window(operation, index))

    async def fleet_window(self, operation: Operation, index: int) -> None:
        fleet, series = self.fleet, self.series(operation)
        assert fleet is not None
        if fleet.connected and not fleet.aligned(self.name, operation, series):
            # not on the fleet's grid yet (the store was away): take it, and skip this window,
            # whose index was counted on this proxy's own grid
            await fleet.align(self.name, operation, series)
            self.arm(operation)
            return
        if self._turns is None:
            self._turns = {Operation.CHECK: fleet.turns(), Operation.COPY: fleet.turns()}
        turns = self._turns[operation]
        sent = self.services.loop.time()
        lost = await fleet.claim(
            self.name, operation, index, series.interval, turns=turns, block=self.owner.block
        )
        now = self.services.loop.time()
        if series.fired >= index or self.closed or series.last_due(now) > index:
            # a later window fired meanwhile, or the host is gone (a reload), or the answer
            # came after the next window's time: it is that window's claim that may use it
            # (this one is counted busy then), never this one's answer
            return
        # too late to be read in its window's time: the claim (a block's look and the claim,
        # two round trips) and the one more the window's read makes first (the fleet's kept
        # answers) must be over a tenth of the interval after the window
        if (
            lost is None
            and now + (now - sent) / 2 > series.origin + (index + LATE) * series.interval
        ):
            lost = Outcome.AWAY
        if lost is Outcome.AWAY:
            fleet.away += 1
            if fleet.cut_off:
                self.owner.cut_off()
        if lost is None:
            self.open(operation, now)
        else:
            self.observe(operation, self.scheduler.lose_window(operation, now, lost), now)

    async def align(self) -> None:
        """Both series on the fleet's grid (at start, and after a reload changed an interval)."""
        fleet = self.fleet
        if fleet is None:
            return
        for operation in (Operation.CHECK, Operation.COPY):
            await fleet.align(self.name, operation, self.series(operation))
            self.arm(operation)

    def open(self, operation: Operation, now: float) -> None:
        s = self.scheduler
        result = s.check_window(now) if operation is Operation.CHECK else s.copy_window(now)
        self.arm(operation)
        self.observe(operation, result, now)
        self.owner.opened(operation, result)

    def observe(self, operation: Operation, result: WindowResult, now: float) -> None:
        self.owner.history.record(operation, result, now - result.at)
        log.debug(
            "%s %s window: %s (%.1f ms late)",
            self.name, operation, result.outcome, (now - result.at) * 1000,
        )  # fmt: skip
