"""A map whose entries lapse at their own deadline, pruned in deadline order.

The scheduler keeps two such maps per host — follow-up grants (P10) and the time each image was
last read for everyone (R1) — both written with deadlines that only grow, so a FIFO of
``(deadline, key)`` prunes them in amortised O(1) without scanning.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class TimedMap(Generic[K, V]):
    __slots__ = ("_entries", "_order")

    def __init__(self) -> None:
        self._entries: dict[K, tuple[float, V]] = {}
        self._order: deque[tuple[float, K]] = deque()

    def __len__(self) -> int:
        return len(self._entries)

    def held(self) -> list[K]:
        """Every key it holds, lapsed or not (until pruned)."""
        return list(self._entries)

    def put(self, key: K, value: V, until: float) -> None:
        self._entries[key] = (until, value)
        self._order.append((until, key))

    def get(self, key: K, now: float) -> V | None:
        entry = self._entries.get(key)
        if entry is None or entry[0] <= now:
            return None
        return entry[1]

    def prune(self, now: float) -> None:
        order = self._order
        while order and order[0][0] <= now:
            until, key = order.popleft()
            entry = self._entries.get(key)
            if entry is not None and entry[0] == until:
                del self._entries[key]
