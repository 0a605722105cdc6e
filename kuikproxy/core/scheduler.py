"""The pacing scheduler of one host: windows, turns, rings and copies, as a pure state machine.

How it works
============

Every registry host has two *series* of windows (:mod:`kuikproxy.core.windows`): one for checks
(reads that ask "is this image there, what digest") and one for copies (pulls of content). A
window is an instant at which the series may start reading exactly one image; a window that
finds nothing to do, or finds the previous image still being read, is lost (P1–P3).

The windows belong to the host, not to whoever asks. Each *resource* (a kuik ImageMonitor, a
containerd node, …) holds a :class:`~kuikproxy.core.rings.Ring` per host: the images it asked for
there, byte-wise ordered, with a cursor. At a check window the resources with something due take
turns, round-robin in their names' order, skipping those with nothing due (P4); the resource
whose turn it is takes the first due image after its cursor (P5). Copies do the same over
per-resource queues in arrival order (P9, :mod:`kuikproxy.core.copyqueues`).

One read serves everyone who waits for that image when the window reads it (R2), and its answer
is kept: a later request of another resource is answered from it at once when it is newer than
that resource's previous read of the image (R1). That is why two resources tracking the same N
images lap in N windows, not 2N.

The scheduler never reads a clock and never performs I/O. The runtime feeds it events —
:meth:`HostScheduler.check` / :meth:`copy` when a request arrives, :meth:`cancel` when its client
goes away, :meth:`check_window` / :meth:`copy_window` when a window's time comes,
:meth:`check_read_done` / :meth:`copy_request_done` when upstream work ends — each with ``now``,
and carries out the decision it returns: answer from a kept answer, let a request through, hold
it on a :class:`~kuikproxy.core.tickets.Ticket`, or read an image upstream for a list of tickets.

The scheduler is built in parts, one concern each, over the state they share
(:mod:`kuikproxy.core.hoststate`): checks (:mod:`kuikproxy.core.checks`), copies
(:mod:`kuikproxy.core.copyseries`), requests that stop waiting and standing asks
(:mod:`kuikproxy.core.standing`), what survives a restart (:mod:`kuikproxy.core.restarts`),
sleeping series and sweeps (:mod:`kuikproxy.core.housekeeping`); its decisions are values of
:mod:`kuikproxy.core.tickets`, its snapshots of :mod:`kuikproxy.core.views`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator

from kuikproxy.core.checks import CheckTurns
from kuikproxy.core.copyseries import CopyTurns
from kuikproxy.core.housekeeping import Housekeeping
from kuikproxy.core.restarts import RestartState
from kuikproxy.core.tickets import Operation
from kuikproxy.core.views import HostView, RingView, series_view


class HostScheduler(CheckTurns, CopyTurns, RestartState, Housekeeping):
    """Pacing state and decisions for one registry host."""

    # -- views ------------------------------------------------------------------------------

    def waiting(self, operation: Operation) -> int:
        tickets = self._check_tickets if operation is Operation.CHECK else self._copy_tickets
        return tickets.count()

    def ring_progress(self, resource: str, limit: int) -> tuple[int | None, int]:
        """For the status page, never a decision: where ``resource``'s cursor is in its ring on
        this host (:meth:`Ring.position`, None for a hold ring over ``limit`` images) and how
        many of its check requests wait here. Not part of :meth:`view`, which metrics scrapes
        call: only the page pays for it."""
        ring = self._rings.get(resource)
        if ring is None:
            return 0, 0
        return ring.position(limit), ring.waiting_requests()

    def ring_stats(self) -> Iterator[tuple[str, int, float | None]]:
        """Each ring's resource, images and last lap (``cycleDuration``), unsorted: what a
        metrics scrape reads, without the views and the sorting ``/status`` needs. Consume it
        before anything else runs on the loop."""
        for resource, ring in self._rings.items():
            yield resource, len(ring), ring.cycle_duration

    def view(self, now: float, resources: Collection[str] | None = None) -> HostView:
        """The host's state at ``now``. ``resources`` narrows its rings and copy queues to
        those resources' (None: every one, in name order): a page of ``/status`` costs what the
        page shows, not what the host holds."""
        self._doze(now)
        p = self.pacing
        copy = self._open_copy
        names = sorted({*self._rings, *self._queues}) if resources is None else resources
        copy_open = copy.image if copy and copy.is_open(now, p.copy_idle, p.copy_timeout) else None
        return HostView(
            check=series_view(self.check_series, self._check_in_flight is not None),
            copy=series_view(self.copy_series, copy_open is not None),
            prefetch=p.prefetch,
            check_waiting=self.waiting(Operation.CHECK),
            copy_waiting=self.waiting(Operation.COPY),
            copy_open=copy_open,
            copy_queued=sum(len(q) for q in self._queues.values()),
            blocked_until=self.blocked_until if self._blocked(now) else None,
            rings=tuple(
                RingView(r, len(ring), ring.cursor, ring.cycle_started, ring.cycle_duration)
                for r in names
                if (ring := self._rings.get(r)) is not None
            ),
            copy_queues={r: len(q) for r in names if (q := self._queues.get(r)) is not None and q},
            ring_count=len(self._rings),
        )
