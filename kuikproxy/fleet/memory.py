"""The fleet seam in memory: proxies of one process sharing a registry budget.

What :mod:`.redis` does across machines, here across :class:`MemoryFleet` handles on one
:class:`FleetState` — the reference for the seam's rules (and what the runtime's fleet tests run
on, under virtual time). ``clock`` is the fleet's clock (wall time by default).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kuikproxy.core.quota import SharedBucket, take_shared
from kuikproxy.fleet.backend import FleetUnavailable

Series = tuple[str, str]  # (host, "check" | "copy")
SEEN_FOR = 60.0  # a proxy counts in the fleet's size this long after it was last heard of
KEPT_WINDOWS = 64  # claims remembered per series: a late claim of an older window finds it


@dataclass
class FleetState:
    """What the fleet shares; ``up`` False makes every call fail, as an unreachable store."""

    clock: Callable[[], float] = time.time
    up: bool = True
    origins: dict[Series, tuple[float, float]] = field(default_factory=dict)  # interval, origin
    due: dict[Series, dict[str, float]] = field(default_factory=dict)  # name → last claim
    windows: dict[Series, dict[int, str]] = field(default_factory=dict)  # index → owner
    blocks: dict[str, float] = field(default_factory=dict)
    seen: dict[str, float] = field(default_factory=dict)  # name → last heard of
    answers: dict[tuple[str, str], tuple[bytes, float]] = field(default_factory=dict)  # → expiry
    buckets: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)  # per host


class MemoryFleet:
    def __init__(self, state: FleetState, name: str) -> None:
        self.state = state
        self.name = name

    def _now(self) -> float:
        state = self.state
        if not state.up:
            raise FleetUnavailable("the fleet's store is down")
        now = state.clock()
        state.seen[self.name] = now
        return now

    async def origin(self, host: str, series: str, interval: float, proposed: float) -> float:
        self._now()
        kept = self.state.origins.get((host, series))
        if kept is not None and kept[0] == interval:
            return kept[1]
        self.state.origins[(host, series)] = (interval, proposed)
        return proposed

    async def claim(self, host: str, series: str, window: int, interval: float) -> bool:
        now = self._now()
        due = self.state.due.setdefault((host, series), {})
        due[self.name] = now
        for name, last in list(due.items()):
            if last < now - 2 * interval:
                del due[name]
        windows = self.state.windows.setdefault((host, series), {})
        owner = windows.get(window)
        if owner is None:
            members = sorted(due)
            owner = members[window % len(members)]
            if owner != self.name:
                return False
            windows[window] = owner
            for old in [k for k in windows if k < window - KEPT_WINDOWS]:
                del windows[old]
        return owner == self.name

    async def block(self, host: str, until: float) -> float:
        self._now()
        until = max(until, self.state.blocks.get(host, until))
        self.state.blocks[host] = until
        return until

    async def blocked_until(self, host: str) -> float | None:
        now = self._now()
        until = self.state.blocks.get(host)
        return until if until is not None and until > now else None

    async def keep(self, host: str, key: str, answer: bytes, ttl: float) -> None:
        self.state.answers[(host, key)] = (answer, self._now() + ttl)

    async def kept(self, host: str, keys: list[str]) -> list[bytes | None]:
        now = self._now()
        out: list[bytes | None] = []
        for key in keys:
            found = self.state.answers.get((host, key))
            out.append(None if found is None or found[1] <= now else found[0])
        return out

    async def take(self, host: str, buckets: list[SharedBucket]) -> float:
        return take_shared(buckets, self.state.buckets.setdefault(host, {}), self._now())

    async def size(self) -> int:
        now = self._now()
        return sum(1 for last in self.state.seen.values() if last >= now - SEEN_FOR) or 1

    async def close(self) -> None:
        return None
