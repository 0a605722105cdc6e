"""The fleet seam in memory: proxies of one process sharing a registry budget.

What :mod:`.redis` does across machines, here across :class:`MemoryFleet` handles on one
:class:`FleetState` — the reference for the seam's rules (and what the runtime's fleet tests run
on, under virtual time). ``clock`` is the fleet's clock (wall time by default).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kuikproxy.core.fleetturns import Claim, careful_for
from kuikproxy.core.quota import SharedBucket, take_shared
from kuikproxy.fleet.backend import FleetUnavailable, StoreView

Series = tuple[str, str]  # (host, "check" | "copy")
SEEN_FOR = 60.0  # a proxy counts in the fleet's size this long after it was last heard of
KEPT_WINDOWS = 64  # claims remembered per series: a late claim of an older window finds it


@dataclass
class FleetState:
    """What the fleet shares; ``up`` False makes every call fail, as an unreachable store, and
    so does a name in ``cut`` for that proxy alone (a store coming back one connection at a
    time, or a partition)."""

    clock: Callable[[], float] = time.time
    up: bool = True
    cut: set[str] = field(default_factory=set)
    origins: dict[Series, tuple[float, float]] = field(default_factory=dict)  # interval, origin
    forming: dict[Series, float] = field(default_factory=dict)  # origin put back → until
    due: dict[Series, dict[str, float]] = field(default_factory=dict)  # name → last claim
    windows: dict[Series, dict[int, str]] = field(default_factory=dict)  # index → owner
    blocks: dict[str, float] = field(default_factory=dict)
    seen: dict[str, float] = field(default_factory=dict)  # name → last heard of
    answers: dict[tuple[str, str], tuple[bytes, float]] = field(default_factory=dict)  # → expiry
    buckets: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)  # per host
    readers: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict)  # → expiry

    def restart(self) -> None:
        """The store restarts without its data (Redis without persistence)."""
        self.origins, self.forming, self.due, self.windows = {}, {}, {}, {}
        self.blocks, self.seen, self.answers, self.buckets = {}, {}, {}, {}
        self.readers = {}


class MemoryFleet:
    def __init__(self, state: FleetState, name: str) -> None:
        self.state = state
        self.name = name
        self._origins: dict[Series, tuple[float, float]] = {}  # the ones this proxy was given

    def _now(self) -> float:
        state = self.state
        if not state.up or self.name in state.cut:
            raise FleetUnavailable("the fleet's store is down")
        now = state.clock()
        state.seen[self.name] = now
        return now

    async def origin(self, host: str, series: str, interval: float, proposed: float) -> float:
        now, key, state = self._now(), (host, series), self.state
        kept = state.origins.get(key)
        if kept is None and key in self._origins:  # the store lost it: turns forming
            state.forming[key] = now + careful_for(interval)
        if kept is None or kept[0] != interval:
            kept = state.origins[key] = (interval, proposed)
        self._origins[key] = kept
        return kept[1]

    async def time(self, host: str) -> float:
        return self._now()

    async def claim(self, host: str, series: str, window: int, interval: float) -> Claim:
        now, key, state = self._now(), (host, series), self.state
        mine = self._origins.get(key)
        if mine is not None:
            if key not in state.origins:  # the store lost it: the fleet's back, turns forming
                state.origins[key] = mine
                state.forming[key] = now + careful_for(interval)
            elif state.origins[key] != mine:  # off the fleet's grid: no window
                return Claim(won=False, place=0, of=0)
        forming = state.forming.get(key, now) > now
        due = state.due.setdefault(key, {})
        due[self.name] = now
        for name, last in list(due.items()):
            if last < now - 2 * interval:
                del due[name]
        members = sorted(due)
        place = members.index(self.name)
        windows = state.windows.setdefault(key, {})
        owner = windows.get(window)
        if owner is None and window % len(members) == place:
            owner = windows[window] = self.name
            for old in [k for k in windows if k < window - KEPT_WINDOWS]:
                del windows[old]
        return Claim(owner == self.name, place, len(members), forming)

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

    async def reading(self, host: str, key: str, ttl: float) -> bytes | bool:
        now, state = self._now(), self.state
        found = state.answers.get((host, key))
        if found is not None and found[1] > now:
            return found[0]
        reader = state.readers.get((host, key))
        if reader is not None and reader[1] > now:
            return reader[0] == self.name
        state.readers[(host, key)] = (self.name, now + ttl)
        return True

    async def read(self, host: str, key: str, answer: bytes | None, ttl: float) -> None:
        now, state = self._now(), self.state
        if answer is not None:
            state.answers[(host, key)] = (answer, now + ttl)
        reader = state.readers.get((host, key))
        if reader is not None and reader[0] == self.name:
            del state.readers[(host, key)]

    async def take(self, host: str, buckets: list[SharedBucket]) -> float:
        return take_shared(buckets, self.state.buckets.setdefault(host, {}), self._now())

    async def size(self) -> int:
        now = self._now()
        return sum(1 for last in self.state.seen.values() if last >= now - SEEN_FOR) or 1

    def store(self) -> StoreView:
        return StoreView("memory", None, None)

    async def close(self) -> None:
        return None
