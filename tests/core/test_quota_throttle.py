"""Throttling arithmetic (SPEC §11): Retry-After, blocks that are never shortened, backoff with
jitter, Docker Hub's ratelimit headers, and kuikproxy's own Retry-After counting down."""

from __future__ import annotations

import email.utils
from collections.abc import Iterator

import pytest

from kuikproxy.core.quota import (
    ANONYMOUS,
    MAX_BLOCK,
    Backoff,
    Block,
    BucketSpec,
    Category,
    HostQuota,
    RateLimit,
    Route,
    Scope,
    categories_of,
    countdown,
    parse_ratelimit,
    parse_retry_after,
    preset,
)

WALL = 1_700_000_000.0  # a wall-clock instant for HTTP dates
READ = categories_of("HEAD", Route.MANIFESTS)
PULL = categories_of("GET", Route.MANIFESTS)


def draws(*values: float) -> Iterator[float]:
    yield from values


def fixed(value: float) -> HostQuota:
    return HostQuota(random=lambda: value)


# -- Retry-After ----------------------------------------------------------------------------


def test_retry_after_seconds() -> None:
    """Delta-seconds, with spaces; nothing or garbage is None."""
    assert parse_retry_after("60", WALL) == 60.0
    assert parse_retry_after(" 7 ", WALL) == 7.0
    assert parse_retry_after("1.5", WALL) == 1.5
    assert parse_retry_after("0", WALL) == 0.0
    for bad in (None, "", "-5", "soon", "1e3", "60s"):
        assert parse_retry_after(bad, WALL) is None


def test_retry_after_http_dates() -> None:
    """An HTTP date is read against ``now_wall``, in all three RFC 9110 forms; a past date is
    0; a date without a zone is GMT."""
    in_90s = email.utils.formatdate(WALL + 90, usegmt=True)
    assert parse_retry_after(in_90s, WALL) == pytest.approx(90.0)
    assert parse_retry_after(in_90s, WALL + 100) == 0.0
    assert parse_retry_after("Tuesday, 14-Nov-23 22:13:50 GMT", WALL) == pytest.approx(30.0)
    assert parse_retry_after("Tue Nov 14 22:13:50 2023", WALL) == pytest.approx(30.0)
    assert parse_retry_after("Tue, 14 Nov 2023 23:13:50 +0100", WALL) == pytest.approx(30.0)


def test_429_blocks_until_retry_after() -> None:
    """A 429 with Retry-After blocks (a host without quota: the host) until then; the
    returned block says so; the host's requests wait and refusals say how long."""
    quota = HostQuota()
    block = quota.answered(429, [("Retry-After", "60")], ANONYMOUS, 100.0, WALL)
    assert block == Block(160.0, None)
    assert quota.blocked_until(100.0) == 160.0
    assert quota.take(READ, "user:x", 110.0) == pytest.approx(50.0)
    assert quota.blocked_until(160.0) is None
    assert quota.take(READ, "user:x", 160.0) == 0.0


def test_429_with_http_date() -> None:
    """Retry-After as a date blocks until that date, on the runtime's clock."""
    quota = HostQuota()
    date = email.utils.formatdate(WALL + 45, usegmt=True)
    assert quota.answered(429, [("retry-after", date)], None, 10.0, WALL) == Block(55.0, None)


def test_blocks_are_never_shortened() -> None:
    """A later, shorter Retry-After leaves a block where it is; a longer one extends it."""
    quota = HostQuota()
    quota.answered(429, [("Retry-After", "60")], None, 0.0, WALL)
    assert quota.answered(429, [("Retry-After", "10")], None, 5.0, WALL) == Block(60.0, None)
    assert quota.blocked_until(5.0) == 60.0
    quota.block(30.0, now=6.0)
    assert quota.blocked_until(6.0) == 60.0
    quota.answered(429, [("Retry-After", "100")], None, 10.0, WALL)
    assert quota.blocked_until(10.0) == 110.0


def test_a_block_is_capped() -> None:
    """No registry blocks a host for more than a day, whatever it says."""
    quota = HostQuota()
    quota.answered(429, [("Retry-After", "99999999999")], None, 0.0, WALL)
    assert quota.blocked_until(0.0) == MAX_BLOCK


def test_5xx_blocks_only_when_it_says_when() -> None:
    """A 503 throttles like a 429; another 5xx blocks only with a Retry-After."""
    quota = fixed(0.0)
    assert quota.answered(500, [], None, 0.0, WALL) is None
    assert quota.answered(502, [("Retry-After", "5")], None, 0.0, WALL) == Block(5.0, None)
    assert quota.answered(503, [], None, 10.0, WALL) == Block(10.5, None)  # backoff, jittered


# -- per identity ---------------------------------------------------------------------------


def test_per_identity_registry_blocks_the_identity_only() -> None:
    """On a registry modelled per identity (an ACR preset), a 429 to one identity blocks that
    identity; another keeps flowing; a 429 to no known identity blocks the host."""
    quota = HostQuota(preset("acr-standard"))
    block = quota.answered(429, [("Retry-After", "30")], "user:a", 0.0, WALL)
    assert block == Block(30.0, "user:a")
    assert quota.take(READ, "user:a", 10.0) == pytest.approx(20.0)
    assert quota.take(READ, "user:b", 10.0) == 0.0
    assert quota.blocked_until(10.0) is None  # the host as a whole is not blocked
    assert quota.blocked_until(10.0, "user:a") == 30.0
    assert quota.answered(429, [("Retry-After", "5")], None, 10.0, WALL) == Block(15.0, None)
    assert quota.take(READ, "user:b", 11.0) == pytest.approx(4.0)


# -- backoff --------------------------------------------------------------------------------


def test_backoff_grows_to_its_cap() -> None:
    """Ceilings: base 1 s, factor 2, cap 300 s."""
    backoff = Backoff()
    assert [backoff.ceiling(n) for n in range(10)] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]
    assert backoff.ceiling(10_000) == 300.0
    assert Backoff(base=0.5, factor=3, cap=10).ceiling(3) == 10.0
    assert Backoff(base=2, factor=1, cap=10).ceiling(50) == 2.0


def test_backoff_jitter_bounds() -> None:
    """Equal jitter: between half the ceiling (draw 0) and the ceiling (draw → 1)."""
    backoff = Backoff()
    for attempt in range(12):
        ceiling = backoff.ceiling(attempt)
        assert backoff.delay(attempt, 0.0) == ceiling / 2
        assert backoff.delay(attempt, 0.999999) == pytest.approx(ceiling, rel=1e-5)
        assert ceiling / 2 <= backoff.delay(attempt, 0.37) <= ceiling


@pytest.mark.parametrize("kwargs", [{"base": 0}, {"factor": 0.5}, {"base": 10, "cap": 5}])
def test_bad_backoff_is_refused(kwargs: dict[str, float]) -> None:
    """base > 0, factor ≥ 1, cap ≥ base."""
    with pytest.raises(ValueError):
        Backoff(**kwargs)


def test_429_without_retry_after_backs_off_and_success_resets() -> None:
    """Successive 429s without Retry-After block for growing, jittered times drawn from the
    injected random; a success resets the count."""
    values = draws(0.0, 0.5, 0.0, 0.99, 0.0)
    quota = HostQuota(random=lambda: next(values))
    now = 0.0
    blocks = []
    for _ in range(4):
        block = quota.answered(429, [], None, now, WALL)
        assert block is not None
        blocks.append(block.until - now)
        now = block.until
    assert blocks == [0.5, 1.5, 2.0, pytest.approx(7.96)]
    assert quota.snapshot(now).backoff_attempts == 4
    assert quota.answered(200, [], None, now, WALL) is None
    assert quota.snapshot(now).backoff_attempts == 0
    block = quota.answered(429, [], None, now, WALL)
    assert block is not None and block.until - now == 0.5


def test_backoff_is_reproducible_from_a_seed() -> None:
    """Without an injected random, a seed makes the jitter reproducible."""

    def run(seed: int) -> list[float]:
        quota = HostQuota(seed=seed)
        out = []
        for n in range(6):
            block = quota.answered(429, [], None, n * 1000.0, WALL)
            assert block is not None
            out.append(block.until - n * 1000.0)
        return out

    assert run(7) == run(7)
    for n, delay in enumerate(run(7)):
        assert Backoff().ceiling(n) / 2 <= delay <= Backoff().ceiling(n)


def test_a_success_of_one_identity_resets_its_backoff_and_the_hosts() -> None:
    """Backoff is kept where the block lands; an answer resets that scope and the host."""
    quota = HostQuota(preset("acr-premium"), random=lambda: 0.0)
    quota.answered(429, [], "user:a", 0.0, WALL)
    quota.answered(429, [], None, 0.0, WALL)
    assert quota.snapshot(0.0).identities["user:a"].backoff_attempts == 1
    quota.answered(404, [], "user:a", 5.0, WALL)
    snap = quota.snapshot(5.0)
    assert snap.backoff_attempts == 0
    assert "user:a" not in snap.identities


# -- Docker Hub -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "remaining", "expected"),
    [
        ("100;w=21600", "76;w=21600", RateLimit(100, 76, 21600.0)),
        (" 100 ; w = 21600 ", "0 ;w=21600", RateLimit(100, 0, 21600.0)),
        ("100", "3", RateLimit(100, 3, 21600.0)),  # w missing: Docker Hub's 6 h
        ("200", "3;w=3600", RateLimit(200, 3, 3600.0)),
        ("10, 100;w=3600", "9", RateLimit(10, 9, 21600.0)),
        ("junk", "5;w=60", RateLimit(None, 5, 60.0)),
        ("0;w=60", "0;w=60", RateLimit(None, 0, 60.0)),
    ],
)
def test_ratelimit_headers_parse(limit: str, remaining: str, expected: RateLimit) -> None:
    """Docker Hub's headers, tolerating spaces, a missing ``w`` and policy lists."""
    assert parse_ratelimit({"ratelimit-limit": limit, "ratelimit-remaining": remaining}) == (
        expected
    )


def test_no_ratelimit_headers() -> None:
    """Without readable headers there is nothing to learn."""
    assert parse_ratelimit({}) is None
    assert parse_ratelimit({"ratelimit-limit": "lots"}) is None


def test_dockerhub_remaining_zero_blocks_for_w_over_limit() -> None:
    """At ``remaining`` 0 (on any answer, even a 200), that identity is blocked for
    ``w / limit`` seconds: 21600 / 100 = 216 s. Another identity keeps pulling."""
    quota = HostQuota(preset("dockerhub-authenticated"))
    headers = [("RateLimit-Limit", "100;w=21600"), ("RateLimit-Remaining", "1;w=21600")]
    assert quota.answered(200, headers, "user:a", 0.0, WALL) is None
    headers = [("ratelimit-limit", "100;w=21600"), ("ratelimit-remaining", "0;w=21600")]
    assert quota.answered(200, headers, "user:a", 10.0, WALL) == Block(226.0, "user:a")
    assert quota.take(PULL, "user:a", 20.0) == pytest.approx(206.0)
    assert quota.take(PULL, "user:b", 20.0) == 0.0
    snap = quota.snapshot(20.0)
    assert snap.ratelimit_remaining == 0
    assert snap.identities["user:a"].ratelimit_remaining == 0
    assert snap.identities["user:a"].ratelimit_limit == 100
    assert snap.identities["user:a"].blocked_until == 226.0


def test_ratelimit_on_a_host_without_quota_blocks_the_host() -> None:
    """Headers are read on every host; without a per-identity model the host is blocked."""
    quota = HostQuota()
    headers = [("ratelimit-limit", "100"), ("ratelimit-remaining", "0")]
    assert quota.answered(200, headers, ANONYMOUS, 0.0, WALL) == Block(216.0, None)


def test_dockerhub_bucket_learns_and_follows_the_headers() -> None:
    """The learnt bucket refuses nothing before headers; then holds ``remaining`` pulls of
    ``limit`` per ``w`` and re-synchronises on every answer. HEADs are never counted."""
    quota = HostQuota(preset("dockerhub-anonymous"))
    for _ in range(500):
        assert quota.take(PULL, ANONYMOUS, 0.0) == 0.0
    (view,) = quota.snapshot(0.0).buckets
    assert (view.identity, view.learnt, view.tokens, view.rate_per_minute) == (
        ANONYMOUS,
        True,
        None,  # nothing learnt yet: it refuses nothing
        None,
    )
    headers = [("ratelimit-limit", "100;w=21600"), ("ratelimit-remaining", "2;w=21600")]
    quota.answered(200, headers, ANONYMOUS, 0.0, WALL)
    (view,) = quota.snapshot(0.0).buckets
    assert (view.tokens, view.burst) == (2.0, 100.0)
    assert view.rate_per_minute == pytest.approx(100 / 360)
    assert quota.take(PULL, ANONYMOUS, 0.0) == 0.0
    assert quota.take(PULL, ANONYMOUS, 0.0) == 0.0
    assert quota.take(PULL, ANONYMOUS, 0.0) == pytest.approx(216.0)  # one pull per 216 s
    assert quota.take(READ, ANONYMOUS, 0.0) == 0.0  # a HEAD is free on Docker Hub
    headers = [("ratelimit-limit", "100;w=21600"), ("ratelimit-remaining", "40;w=21600")]
    quota.answered(200, headers, ANONYMOUS, 1.0, WALL)  # the registry's count wins
    assert quota.snapshot(1.0).buckets[0].tokens == 40.0


# -- kuikproxy's own Retry-After ------------------------------------------------------------


def test_own_refusals_count_down() -> None:
    """Blocked until T, kuikproxy's Retry-After is ``ceil(T − now)``: 60, then 50 ten seconds
    later, 1 in the last fraction of a second, 0 once the block is over."""
    quota = HostQuota()
    quota.answered(429, [("Retry-After", "60")], None, 0.0, WALL)
    assert quota.retry_after(READ, ANONYMOUS, 0.0) == 60
    assert quota.retry_after(READ, ANONYMOUS, 10.0) == 50
    assert quota.retry_after(READ, ANONYMOUS, 10.25) == 50
    assert quota.retry_after(READ, ANONYMOUS, 59.75) == 1
    assert quota.retry_after(READ, ANONYMOUS, 60.0) == 0
    assert countdown(None, 5.0) == 0
    assert countdown(7.5, 5.0) == 3


def test_own_retry_after_covers_a_bucket_wait_too() -> None:
    """A request refused for want of a token gets the rounded-up wait of its buckets."""
    quota = HostQuota([BucketSpec(Category.DATAPLANE_READ, Scope.REGISTRY, 6.0, 1.0)])
    assert quota.take(READ, ANONYMOUS, 0.0) == 0.0
    assert quota.retry_after(READ, ANONYMOUS, 0.5) == 10
    assert quota.retry_after(READ, ANONYMOUS, 9.5) == 1
