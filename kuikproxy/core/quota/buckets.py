"""Token buckets refilled continuously from ``now``; per-identity buckets made lazily, bounded.

A bucket holds at most ``burst`` tokens and gains ``rate`` tokens a second; its level at any
``now`` is computed from the level and time of its last change, so no timer ever runs. A
request takes one token from *every* bucket it counts against, or from none: when any lacks a
token, the answer is how long until all would have one (the longest of their waits).

Identity-scoped buckets exist per identity, made at an identity's first take. A full bucket is
indistinguishable from a new one, so an identity whose buckets are all full is forgotten at no
cost; a heap of the times identities become full finds those in O(log n). At the bound, when
none is full, the one that fills soonest goes: it can at most send early what it would have
been allowed a moment later.

A *learnt* bucket (Docker Hub) has no rate of its own: until a registry's ``ratelimit-*``
headers are seen it never refuses; then it holds ``remaining`` tokens out of ``limit`` and
refills at ``limit / w`` a second, re-synchronised to the registry's count on every answer.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from kuikproxy.core.quota.categories import Category, Scope

# A token "there" up to float error: a runtime that waits exactly the reported wait must find it.
EPSILON = 1e-9


def default_burst(rate_per_minute: float) -> float:
    """One second's worth of requests, rounded up (see the package's essay)."""
    return max(1.0, float(math.ceil(rate_per_minute / 60.0)))


@dataclass(frozen=True, slots=True)
class BucketSpec:
    """One bucket a registry is modelled with. ``rate_per_minute`` None: learnt from headers;
    ``burst`` None: :func:`default_burst` of the rate."""

    category: Category
    scope: Scope
    rate_per_minute: float | None = None
    burst: float | None = None

    def __post_init__(self) -> None:
        rate = self.rate_per_minute
        if rate is None:
            if self.burst is not None:
                raise ValueError("a learnt bucket (no ratePerMinute) takes no burst")
            return
        if not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"ratePerMinute must be a positive number, not {rate!r}")
        if self.burst is None:
            object.__setattr__(self, "burst", default_burst(rate))
        elif not (math.isfinite(self.burst) and self.burst >= 1):
            raise ValueError(f"burst must be at least 1, not {self.burst!r}")

    @property
    def learnt(self) -> bool:
        return self.rate_per_minute is None


@dataclass(frozen=True, slots=True)
class SharedBucket:
    """A bucket as a fleet's store keeps it: a key, tokens per second, the most it holds."""

    key: str
    rate: float
    burst: float

    def scaled(self, share: float) -> SharedBucket:
        return SharedBucket(self.key, self.rate * share, self.burst)


def take_shared(
    buckets: Iterable[SharedBucket], saved: dict[str, tuple[float, float]], now: float
) -> float:
    """A token from every bucket (all or none; ``saved`` maps a key to its level and the time
    it was at it, a bucket not in it being full): 0.0, or the seconds until all would have one.
    The rule a fleet's store applies to its shared buckets, in Python."""
    buckets = tuple(buckets)
    levels = []
    for bucket in buckets:
        kept = saved.get(bucket.key)
        level = bucket.burst
        if kept is not None:
            level = min(bucket.burst, kept[0] + max(0.0, now - kept[1]) * bucket.rate)
        levels.append(level)
    wait = max(
        ((1.0 - level) / b.rate for b, level in zip(buckets, levels, strict=True) if level < 1),
        default=0.0,
    )
    if wait > 0:
        return wait
    for bucket, level in zip(buckets, levels, strict=True):
        saved[bucket.key] = (level - 1.0, now)
    return 0.0


class TokenBucket:
    """One bucket. ``rate`` is per second; None (learnt, not yet seen) never refuses."""

    __slots__ = ("_at", "_level", "burst", "rate", "spec")

    def __init__(self, spec: BucketSpec) -> None:
        self.spec = spec
        rate = spec.rate_per_minute
        self.rate: float | None = None if rate is None else rate / 60.0
        self.burst: float | None = spec.burst
        self._level = spec.burst or 0.0
        self._at = -math.inf  # full since forever

    def level(self, now: float) -> float:
        """Tokens at ``now`` (infinite while a learnt bucket has learnt nothing)."""
        if self.rate is None or self.burst is None:
            return math.inf
        elapsed = now - self._at
        if elapsed <= 0:  # a clock that stands still (or, wrongly, goes back) adds nothing
            return self._level
        return min(self.burst, self._level + elapsed * self.rate)

    def wait(self, now: float) -> float:
        """Seconds until this bucket has a token; 0.0 if it has one now."""
        level = self.level(now)
        if level >= 1.0 - EPSILON:
            return 0.0
        assert self.rate is not None
        return (1.0 - level) / self.rate

    def take(self, now: float) -> None:
        """Take a token (the caller has seen :meth:`wait` say 0)."""
        if self.rate is None:
            return
        self._level = max(0.0, self.level(now) - 1.0)
        self._at = max(self._at, now)

    def full_at(self) -> float:
        """When this bucket is full again if nothing takes from it."""
        if self.rate is None or self.burst is None:
            return -math.inf
        return self._at + (self.burst - self._level) / self.rate

    def learn(self, limit: int, remaining: int, window: float, now: float) -> None:
        """Follow a registry's count: ``remaining`` of ``limit`` per ``window`` seconds."""
        self.rate = limit / window
        self.burst = float(limit)
        self._level = float(min(max(remaining, 0), limit))
        self._at = now


@dataclass(frozen=True, slots=True)
class BucketView:
    """One bucket for ``/status``. ``tokens``/``rate_per_minute``/``burst`` are None for a
    learnt bucket that has learnt nothing yet (it refuses nothing)."""

    category: Category
    scope: Scope
    identity: str | None
    tokens: float | None
    rate_per_minute: float | None
    burst: float | None
    learnt: bool


class _Identity:
    __slots__ = ("buckets", "full_at")

    def __init__(self, buckets: dict[Category, TokenBucket]) -> None:
        self.buckets = buckets
        self.full_at = -math.inf


class Buckets:
    """Every bucket of one registry: its registry-scoped ones and each identity's."""

    def __init__(self, specs: Iterable[BucketSpec], *, max_identities: int = 4096) -> None:
        if max_identities < 1:
            raise ValueError("max_identities must be at least 1")
        self.max_identities = max_identities
        self.specs = tuple(specs)
        seen: set[tuple[Category, Scope]] = set()
        for spec in self.specs:
            key = (spec.category, spec.scope)
            if key in seen:
                raise ValueError(f"two {spec.scope}-scoped {spec.category} buckets")
            seen.add(key)
        self._registry = {
            s.category: TokenBucket(s) for s in self.specs if s.scope is Scope.REGISTRY
        }
        self._identity_specs = tuple(s for s in self.specs if s.scope is Scope.IDENTITY)
        self._identities: dict[str, _Identity] = {}
        self._full: list[tuple[float, str]] = []  # (full_at, identity), lazily invalidated

    @property
    def per_identity(self) -> bool:
        """Whether the registry is modelled as rationing per identity."""
        return bool(self._identity_specs)

    def __len__(self) -> int:
        """How many identities have buckets (full ones may have been forgotten)."""
        return len(self._identities)

    @property
    def refills(self) -> int:
        """Entries of the heap of when identities' buckets are full again, stale ones included:
        rebuilt past twice the identities (plus 64), so a burst of new names cannot grow it."""
        return len(self._full)

    def _chosen(self, categories: Iterable[Category], identity: str) -> Iterator[TokenBucket]:
        entry = self._identities.get(identity)
        for category in categories:
            bucket = self._registry.get(category)
            if bucket is not None:
                yield bucket
            if entry is not None:
                bucket = entry.buckets.get(category)
                if bucket is not None:
                    yield bucket
            # an identity without an entry has full buckets: they never make anyone wait

    def fixed(self, categories: Iterable[Category], identity: str) -> list[SharedBucket]:
        """The buckets of fixed rate a request counts against, as a fleet shares them: learnt
        ones are left out, each proxy follows the registry's own count for those."""
        out = []
        for spec in self.specs:
            if spec.category not in categories or spec.rate_per_minute is None:
                continue
            key = f"{spec.category}/{spec.scope}"
            if spec.scope is Scope.IDENTITY:
                key += f"/{identity}"
            out.append(SharedBucket(key, spec.rate_per_minute / 60.0, spec.burst or 1.0))
        return out

    def wait(self, categories: Iterable[Category], identity: str, now: float) -> float:
        """Seconds until every bucket the request counts against has a token; 0.0 now."""
        return max((b.wait(now) for b in self._chosen(categories, identity)), default=0.0)

    def take(self, categories: Iterable[Category], identity: str, now: float) -> float:
        """Take a token from every bucket the request counts against and return 0.0, or take
        none and return the seconds until all would have one."""
        categories = tuple(categories)
        wait = self.wait(categories, identity, now)
        if wait > 0:
            return wait
        for category in categories:
            bucket = self._registry.get(category)
            if bucket is not None:
                bucket.take(now)
        if any(s.category in categories for s in self._identity_specs):
            entry = self._entry(identity, now)
            for category in categories:
                bucket = entry.buckets.get(category)
                if bucket is not None:
                    bucket.take(now)
            self._refilled(identity, entry)
        return 0.0

    def learn(
        self, identity: str | None, limit: int, remaining: int, window: float, now: float
    ) -> None:
        """A registry's ``ratelimit-*`` headers, answered to ``identity``: every learnt bucket
        of that scope follows them."""
        for bucket in self._registry.values():
            if bucket.spec.learnt:
                bucket.learn(limit, remaining, window, now)
        if identity is None or not any(s.learnt for s in self._identity_specs):
            return
        entry = self._entry(identity, now)
        for bucket in entry.buckets.values():
            if bucket.spec.learnt:
                bucket.learn(limit, remaining, window, now)
        self._refilled(identity, entry)

    def _entry(self, identity: str, now: float) -> _Identity:
        entry = self._identities.get(identity)
        if entry is None:
            self._forget_full(now)
            while len(self._identities) >= self.max_identities:
                self._forget_soonest()
            buckets = {s.category: TokenBucket(s) for s in self._identity_specs}
            entry = self._identities[identity] = _Identity(buckets)
        return entry

    def _refilled(self, identity: str, entry: _Identity) -> None:
        entry.full_at = max((b.full_at() for b in entry.buckets.values()), default=-math.inf)
        heapq.heappush(self._full, (entry.full_at, identity))
        if len(self._full) > 2 * len(self._identities) + 64:
            self._full = [(e.full_at, k) for k, e in self._identities.items()]
            heapq.heapify(self._full)

    def _valid(self, full_at: float, identity: str) -> bool:
        entry = self._identities.get(identity)
        return entry is not None and entry.full_at == full_at

    def _forget_full(self, now: float) -> None:
        """Forget every identity whose buckets are all full by ``now``."""
        heap = self._full
        while heap and heap[0][0] <= now:
            full_at, identity = heapq.heappop(heap)
            if self._valid(full_at, identity):
                del self._identities[identity]

    def _forget_soonest(self) -> None:
        heap = self._full
        while heap:
            full_at, identity = heapq.heappop(heap)
            if self._valid(full_at, identity):
                del self._identities[identity]
                return
        # every entry has a valid heap item; reaching here means the heap was rebuilt short
        self._identities.pop(next(iter(self._identities)))

    def views(self, now: float) -> list[BucketView]:
        """Every bucket's state at ``now``: registry-scoped first, then identities by name."""
        views = [_view(b, None, now) for b in self._registry.values()]
        for identity in sorted(self._identities):
            views.extend(
                _view(b, identity, now) for b in self._identities[identity].buckets.values()
            )
        return views


def _view(bucket: TokenBucket, identity: str | None, now: float) -> BucketView:
    known = bucket.rate is not None
    return BucketView(
        category=bucket.spec.category,
        scope=bucket.spec.scope,
        identity=identity,
        tokens=bucket.level(now) if known else None,
        rate_per_minute=bucket.rate * 60.0 if bucket.rate is not None else None,
        burst=bucket.burst if known else None,
        learnt=bucket.spec.learnt,
    )
