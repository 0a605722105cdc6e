"""A host's scheduler when nothing is due: series that sleep, sweeps, hosts forgotten.

A series with nothing due asks for no timer: its windows are idle, counted when it wakes (P3a).
What windows do in passing — ring images leaving after their retention (P8), grants lapsing —
happens at sweeps instead; a host nobody asks for any more may be forgotten (§11: never while
blocked).
"""

from __future__ import annotations

from kuikproxy.core.hoststate import HostState
from kuikproxy.core.tickets import Operation

SWEEP_GRACE = 0.001  # seconds: a sweep comes this long after a retention ends (P8: *after* it)


class Housekeeping(HostState):
    """Sleeping series, sweeps, and whether and how a host is forgotten."""

    # -- when nothing is due: sleep, sweep, forget ---------------------------------

    def next_due(self, operation: Operation, now: float) -> float | None:
        """When the runtime must fire ``operation``'s series next: its next window while
        something may be due there, None when nothing is. A series the runtime does not fire
        *sleeps*: its windows are idle (P3a), counted when it wakes here or is viewed, and
        stay on their grid (P1), so a host nobody asks costs no timer."""
        series = self.check_series if operation is Operation.CHECK else self.copy_series
        if not self.has_due(operation):
            self._asleep.add(operation)
            return None
        if operation in self._asleep:
            self._asleep.discard(operation)
            series.pass_idle(now, self.blocked_until)
        return series.next_window()

    def sweep(self, now: float) -> None:
        """What windows do in passing, for a host whose series sleep: ring images past their
        retention leave (P8), lapsed grants go."""
        self._expire(now)
        self._follow_ups.prune(now)
        self._shared_reads.prune(now)
        self._copy_follow_ups.prune(now)

    def next_sweep(self, now: float, *, forgettable: bool) -> float | None:
        """When :meth:`sweep` next has something to do, after a sweep at ``now``: just after the
        oldest ring ask's retention (P8 drops an image *after* it, :data:`SWEEP_GRACE`). For a
        host that may be forgotten (not in ``registries``), also when :meth:`idle` may next
        hold: a retention after its last request and after the end of its block; a host still
        in use then is looked at again a retention later. None: nothing to sweep."""
        retention = self.pacing.retention
        times = []
        if self._expiry:
            times.append(self._expiry[0][0] + retention + SWEEP_GRACE)
        if forgettable:
            at = max(self.last_request + retention, self.blocked_until or 0.0) + SWEEP_GRACE
            times.append(at if at > now else now + retention)
        return min(times, default=None)

    def idle(self, now: float) -> bool:
        """Whether this host may be forgotten at ``now`` (if it is not in ``registries``): no
        request for ``unusedImageRetention``, nothing waiting or being read, no copy open, no
        ring or queue left, and no block in force — a block is never forgotten (§11)."""
        p = self.pacing
        copy = self._open_copy
        return (
            now - self.last_request >= p.retention
            and not self._rings
            and not any(self._queues.values())
            and not self._check_tickets
            and not self._copy_tickets
            and self._check_in_flight is None
            and (copy is None or not copy.is_open(now, p.copy_idle, p.copy_timeout))
            and not self._blocked(now)
        )

    def forget(self) -> None:
        """This scheduler is dropped (its host forgotten when idle, or no longer paced): its
        resources and ring images leave the census. Nothing else is asked of it after."""
        for resource in {*self._rings, *self._queues}:
            self._census.leave(resource, self.host)
        self._census.images -= sum(len(ring) for ring in self._rings.values())
