"""What of a host's scheduler survives a restart (P13): its rings, saved and brought back.

With a state file configured, rings record what changed (:mod:`kuikproxy.core.tracked`) and the
runtime drains those changes in batches; at start, saved rings come back before any request.
"""

from __future__ import annotations

import heapq

from kuikproxy.core.hoststate import HostState
from kuikproxy.core.ringstate import RingChanges, RingState


class RestartState(HostState):
    """Rings tracked, exported and restored across restarts (P13)."""

    # -- what survives a restart (P13) --------------------------------------------------------

    def track_changes(self) -> None:
        """From now on, rings remember what changed, for :meth:`changes` (a store is
        configured). Called before any ring exists; without it rings pay nothing."""
        if self._changed is None:
            self._changed = {}

    def restore(self, resource: str, state: RingState) -> None:
        """Bring back ``resource``'s ring as it was saved before a restart, times in this
        scheduler's clock, before any request of that resource here. It resumes after its
        cursor; its lap in progress started before the restart, so the downtime counts in it.
        Counted against the limits, never refused: it was admitted before the restart."""
        ring = self._new_ring(resource)
        ring.load(state)
        oldest = ring.oldest_ask()
        if oldest is None:
            return
        self._rings[resource] = ring
        self._census.enter(resource, self.host)
        self._census.images += len(ring)
        heapq.heappush(self._expiry, (oldest, resource))
        if self.pacing.prefetch:
            ring.walk_in_order()
            self._check_ready.add(resource)

    def changes(self) -> list[tuple[str, RingChanges]]:
        """Each ring's changes since the last call, by resource, in the order the rings first
        changed; a ring that expired meanwhile says it is gone. Empty when not tracking."""
        changed = self._changed
        if not changed:
            return []
        out = [(ring.resource, ring.changes()) for ring in changed]
        changed.clear()
        return out

    def export(self) -> list[tuple[str, RingState]]:
        """Every ring whole, by resource; their changes until now count as written."""
        self.changes()
        return [(resource, ring.export()) for resource, ring in sorted(self._rings.items())]
