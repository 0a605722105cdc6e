"""Rings that remember what changed, so that a store writes only that (P13).

With ``state.path`` set, the scheduler makes :class:`TrackedRing` s instead of plain rings. Each
change to what survives a restart — an image asked for, answered, taken or spared by a turn, or
dropped by retention; the header at a turn that moves it — marks the image and puts the ring in
its scheduler's ordered set of changed rings, which :meth:`HostScheduler.changes` drains. A
plain :class:`~kuikproxy.core.rings.Ring` pays nothing for any of this: the kept-answer path
(one ``ask``, one ``answer``) is benchmarked without a store.
"""

from __future__ import annotations

from kuikproxy.core.rings import Ring
from kuikproxy.core.ringstate import RingChanges, RingState
from kuikproxy.core.sharedreads import SharedReads


class TrackedRing(Ring):
    __slots__ = ("_changed", "_dirty", "_dropped", "_replace", "resource")

    _tracks = True

    def __init__(self, resource: str, dirty: dict[TrackedRing, None]) -> None:
        super().__init__()
        self.resource = resource
        # the scheduler's changed rings, in the order they first changed: a ring that expired
        # and one made again for the same resource are written in that order
        self._dirty = dirty
        self._changed: set[str] = set()
        self._dropped: set[str] = set()
        self._replace = True  # made in this process: whatever a store held for it is stale

    def load(self, state: RingState) -> None:
        super().load(state)
        self._replace = False  # it is what the store holds

    def changes(self) -> RingChanges:
        """What changed since the last call, which it forgets."""
        if len(self):
            changes = RingChanges(
                header=self.header(),
                entries=tuple(self.entry_state(i) for i in sorted(self._changed)),
                dropped=tuple(sorted(self._dropped)),
                replace=self._replace,
            )
        else:
            changes = RingChanges(header=None, entries=(), dropped=(), replace=self._replace)
        self._changed.clear()
        self._dropped.clear()
        self._replace = False
        return changes

    # -- every change of what survives, marked --------------------------------------------------

    def ask(self, image: str, now: float) -> float | None:
        previous = super().ask(image, now)
        self._changed.add(image)
        self._dropped.discard(image)
        self._dirty[self] = None
        return previous

    def join(self, images: list[str], now: float) -> None:
        super().join(images, now)
        self._changed.update(images)
        self._dropped.difference_update(images)
        self._dirty[self] = None

    def answer(self, image: str, now: float) -> None:
        super().answer(image, now)
        if image in self:
            self._changed.add(image)
            self._dirty[self] = None

    def expire(self, before: float, now: float) -> list[str]:
        # images still waiting stay, asked for again now: their new time must be written too
        gone, kept = self._table.expire(before, now, self._waiting or ())
        if kept or gone:
            self._changed.update(kept)
            self._changed.difference_update(gone)
            self._dropped.update(gone)
            self._dirty[self] = None
        return gone

    def _spared(self, images: list[str]) -> None:
        # a prefetch walk marks images read for everyone as done in this lap (P7)
        self._changed.update(images)
        self._dirty[self] = None

    def take(self, now: float, prefetch: bool, shared: SharedReads | None = None) -> str | None:
        before = (self.cursor, self.lap, self.cycle_started)
        image = super().take(now, prefetch, shared)
        if image is not None:
            self._changed.add(image)
        if image is not None or before != (self.cursor, self.lap, self.cycle_started):
            self._dirty[self] = None
        return image
