"""Token buckets (SPEC §11): continuous refill from ``now``, all-or-nothing takes, the wait they
report, and identity buckets that are made lazily and forgotten when full."""

from __future__ import annotations

import math

import pytest

from kuikproxy.core.quota import (
    Buckets,
    BucketSpec,
    Category,
    HostQuota,
    Route,
    Scope,
    SharedBucket,
    TokenBucket,
    categories_of,
    default_burst,
    take_shared,
)

READ, REFS = Category.DATAPLANE_READ, Category.LIST_REFERRERS
REG, IDN = Scope.REGISTRY, Scope.IDENTITY
REFERRERS_GET = categories_of("GET", Route.REFERRERS, by_digest=True)


def test_bucket_starts_full_and_refills_continuously() -> None:
    """60 r/m with a burst of 3: full at first, one token a second after, never above burst."""
    bucket = TokenBucket(BucketSpec(READ, REG, 60.0, 3.0))
    assert bucket.level(0.0) == 3.0
    for _ in range(3):
        assert bucket.wait(0.0) == 0.0
        bucket.take(0.0)
    assert bucket.level(0.0) == 0.0
    assert bucket.wait(0.0) == pytest.approx(1.0)
    assert bucket.level(0.25) == pytest.approx(0.25)
    assert bucket.wait(0.25) == pytest.approx(0.75)
    assert bucket.level(2.5) == pytest.approx(2.5)
    assert bucket.level(100.0) == 3.0  # capped at the burst
    assert bucket.full_at() == pytest.approx(3.0)


def test_refill_arithmetic_survives_float_error() -> None:
    """10 r/m: a runtime that waits exactly the reported wait finds the token (10/60 is not a
    binary fraction), and a clock that does not move adds nothing."""
    bucket = TokenBucket(BucketSpec(READ, REG, 10.0, 1.0))
    bucket.take(0.0)
    now = 0.0
    for _ in range(50):
        now += bucket.wait(now)
        assert bucket.wait(now) == 0.0
        bucket.take(now)
        assert bucket.level(now) == 0.0
    assert now == pytest.approx(50 * 6.0)


def test_default_burst_is_one_seconds_worth_at_least_one() -> None:
    """Bursts default to one second's worth of the rate, rounded up (as the config's presets
    are)."""
    assert default_burst(10000) == 167
    assert default_burst(250) == 5
    assert default_burst(0.5) == 1
    assert default_burst(10) == 1
    assert BucketSpec(READ, REG, 600.0).burst == 10


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rate_per_minute": 0.0},
        {"rate_per_minute": -1.0},
        {"rate_per_minute": math.inf},
        {"rate_per_minute": 60.0, "burst": 0.5},
        {"burst": 3.0},  # a learnt bucket has no burst of its own
    ],
)
def test_invalid_specs_are_refused(kwargs: dict[str, float]) -> None:
    """A rate must be positive and finite, a burst at least one token."""
    with pytest.raises(ValueError):
        BucketSpec(READ, REG, **kwargs)


def test_two_buckets_of_one_category_and_scope_are_refused() -> None:
    """One bucket per (category, scope): two would make the take ambiguous."""
    with pytest.raises(ValueError, match="two"):
        Buckets([BucketSpec(READ, REG, 60.0), BucketSpec(READ, REG, 120.0)])


def test_all_or_nothing_take_reports_the_longest_wait() -> None:
    """A request goes only if every bucket it counts against has a token; otherwise none is
    taken and the wait is until *all* would have one."""
    buckets = Buckets([BucketSpec(READ, REG, 60.0, 5.0), BucketSpec(REFS, REG, 6.0, 1.0)])
    assert buckets.take(REFERRERS_GET, "a", 0.0) == 0.0  # read 4 left, referrers 0
    wait = buckets.take(REFERRERS_GET, "a", 0.0)
    assert wait == pytest.approx(10.0)  # the referrers bucket: 6 r/m
    assert buckets.views(0.0)[0].tokens == 4.0  # the read bucket was not touched
    # a plain read still goes: it counts against the read bucket only
    assert buckets.take([READ], "a", 0.0) == 0.0
    assert buckets.wait(REFERRERS_GET, "a", 9.0) == pytest.approx(1.0)
    assert buckets.take(REFERRERS_GET, "a", 10.0) == 0.0


def test_referrers_get_drains_both_buckets() -> None:
    """A referrers GET takes from ListReferrers *and* DataplaneRead; when the read bucket is
    empty, referrers wait even though their own bucket is full."""
    buckets = Buckets([BucketSpec(READ, REG, 60.0, 3.0), BucketSpec(REFS, REG, 60.0, 3.0)])
    assert {READ, REFS} == REFERRERS_GET
    buckets.take(REFERRERS_GET, "a", 0.0)
    tokens = {v.category: v.tokens for v in buckets.views(0.0)}
    assert tokens == {READ: 2.0, REFS: 2.0}
    buckets.take([READ], "a", 0.0)
    buckets.take([READ], "a", 0.0)
    assert buckets.take(REFERRERS_GET, "a", 0.0) == pytest.approx(1.0)
    assert {v.category: v.tokens for v in buckets.views(0.0)} == {READ: 0.0, REFS: 2.0}


def test_categories_without_a_bucket_never_wait() -> None:
    """A quota without a bucket for a category lets its requests go freely."""
    buckets = Buckets([BucketSpec(REFS, REG, 6.0, 1.0)])
    for _ in range(100):
        assert buckets.take([READ], "a", 0.0) == 0.0
    assert HostQuota().take([READ], "anonymous", 0.0) == 0.0


def test_identity_buckets_are_per_identity_and_lazy() -> None:
    """An identity's buckets appear at its first take; each identity has its own."""
    buckets = Buckets([BucketSpec(READ, IDN, 60.0, 1.0)])
    assert len(buckets) == 0
    assert buckets.wait([READ], "a", 0.0) == 0.0  # peeking makes nothing
    assert len(buckets) == 0
    assert buckets.take([READ], "a", 0.0) == 0.0
    assert buckets.take([READ], "a", 0.0) == pytest.approx(1.0)
    assert buckets.take([READ], "b", 0.0) == 0.0
    assert len(buckets) == 2
    assert [(v.identity, v.tokens) for v in buckets.views(0.5)] == [("a", 0.5), ("b", 0.5)]


def test_identity_buckets_are_bounded_forgetting_full_ones_first() -> None:
    """At the bound, identities whose buckets have refilled are forgotten (nothing is lost);
    when none has, the one that refills soonest goes."""
    buckets = Buckets([BucketSpec(READ, IDN, 60.0, 2.0)], max_identities=3)
    buckets.take([READ], "a", 0.0)  # full again at 1
    buckets.take([READ], "b", 0.5)  # full again at 1.5
    buckets.take([READ], "c", 0.9)  # full again at 1.9
    buckets.take([READ], "d", 1.2)  # a is full by now: forgotten
    assert {v.identity for v in buckets.views(1.2)} == {"b", "c", "d"}
    buckets.take([READ], "b", 1.3)  # b: 1.0 tokens left, full at 2.3
    buckets.take([READ], "e", 1.4)  # nobody full: c (full at 1.9) refills soonest
    assert {v.identity for v in buckets.views(1.4)} == {"b", "d", "e"}
    assert len(buckets) == 3
    # a forgotten identity starts full, which is exactly what it would have had
    assert buckets.take([READ], "a", 1.4) == 0.0
    assert len(buckets) == 3


def test_many_identities_stay_bounded() -> None:
    """Thousands of identities in a burst never hold more than the bound."""
    buckets = Buckets([BucketSpec(READ, IDN, 6.0, 1.0)], max_identities=50)
    for n in range(5000):
        assert buckets.take([READ], f"id{n}", n * 0.001) == 0.0
        assert len(buckets) <= 50
    assert buckets.refills <= 2 * 50 + 64 + 1


def test_shared_buckets_take_all_or_none_and_refill() -> None:
    """A fleet's buckets follow the same rule as a proxy's own: one token from each
    or none, the wait until all would have one, refilled at their rate up to their burst."""
    reads = SharedBucket("DataplaneRead/registry", rate=0.1, burst=2)
    mine = SharedBucket("DataplaneRead/identity/alice", rate=0.1, burst=1)
    saved: dict[str, tuple[float, float]] = {}
    assert take_shared([reads, mine], saved, 0.0) == 0.0
    assert take_shared([reads, mine], saved, 1.0) == pytest.approx(9.0)  # alice: 9 s more
    assert saved["DataplaneRead/registry"] == (1.0, 0.0)  # nothing taken by the refusal
    assert take_shared([reads], saved, 1.0) == 0.0  # another identity: the registry's token
    assert take_shared([reads, mine], saved, 10.0) == pytest.approx(0.0)
    assert take_shared([reads.scaled(0.5)], {}, 0.0) == 0.0
