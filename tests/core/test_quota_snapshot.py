"""The quota's snapshot for ``/status``, its bounds, and its purity (no clock, no loop)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kuikproxy.core.quota
from kuikproxy.core.quota import (
    ANONYMOUS,
    Category,
    HostQuota,
    QuotaSnapshot,
    Route,
    Scope,
    Throttle,
    categories_of,
    preset,
)

WALL = 1_700_000_000.0
READ = categories_of("GET", Route.BLOBS)


def test_snapshot_shows_buckets_blocks_and_remaining() -> None:
    """Each bucket's tokens and rate (registry-scoped, then each identity), the host's block,
    each identity's block and count, and the last ``ratelimit-remaining`` seen."""
    quota = HostQuota(preset("acr-basic"))
    empty = quota.snapshot(0.0)
    assert empty.blocked_until is None and empty.identities == {}
    assert empty.ratelimit_remaining is None
    assert all(b.scope is Scope.REGISTRY and b.tokens == b.burst for b in empty.buckets)
    assert len(empty.buckets) == 5

    quota.take(READ, "user:a", 0.0)
    quota.answered(429, [("Retry-After", "30"), ("ratelimit-remaining", "7")], "user:a", 1, WALL)
    quota.answered(429, [("Retry-After", "10")], None, 1.0, WALL)
    snap = quota.snapshot(2.0)
    assert isinstance(snap, QuotaSnapshot)
    assert snap.blocked_until == 11.0
    assert snap.ratelimit_remaining == 7
    view = snap.identities["user:a"]
    assert (view.blocked_until, view.ratelimit_remaining, view.backoff_attempts) == (31.0, 7, 1)
    reads = {
        (b.scope, b.identity): (b.tokens, b.rate_per_minute)
        for b in snap.buckets
        if b.category is Category.DATAPLANE_READ
    }
    assert reads[(Scope.REGISTRY, None)] == (167.0, 10000.0)  # refilled within 2 s
    assert reads[(Scope.IDENTITY, "user:a")] == (84.0, 5000.0)
    assert quota.snapshot(40.0).blocked_until is None
    assert quota.snapshot(40.0).identities["user:a"].blocked_until is None


def test_throttle_identities_are_bounded() -> None:
    """Per-identity throttle state is an LRU: the oldest with nothing in force goes first."""
    throttle = Throttle(per_identity=True, max_identities=3, random=lambda: 0.0)
    throttle.answered(429, retry_after=100.0, ratelimit=None, identity="a", now=0.0)
    for name in ("b", "c", "d", "e"):
        throttle.answered(200, retry_after=None, ratelimit=None, identity=name, now=1.0)
    assert throttle.blocked_until(2.0, "a") == 100.0  # the blocked one was kept
    assert len(throttle) == 3


def test_restored_block_is_kept_and_shown() -> None:
    """A block restored after a restart (P13) is in force and shown like any other."""
    quota = HostQuota()
    assert quota.block(50.0, now=0.0) == 50.0
    assert quota.block(20.0, ANONYMOUS, now=0.0) == 20.0
    assert quota.snapshot(0.0).blocked_until == 50.0
    assert quota.take(READ, ANONYMOUS, 10.0) == pytest.approx(40.0)


FORBIDDEN = ("asyncio", "aiohttp", "time", "datetime", "kuikproxy.runtime", "kuikproxy.web")


def test_quota_is_pure() -> None:
    """No module of the quota package imports a clock, a loop or an outer layer."""
    root = Path(kuikproxy.core.quota.__file__).parent
    offenders = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module]
                if isinstance(node, ast.ImportFrom) and node.module
                else []
            )
            offenders |= {
                f"{path.name}: {n}"
                for n in names
                if any(n == f or n.startswith(f + ".") for f in FORBIDDEN)
                or n.startswith("kuikproxy.config")
                or n.startswith("kuikproxy.upstream")
            }
    assert offenders == set()
