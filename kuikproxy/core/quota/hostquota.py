"""One registry host's quota: its buckets and its throttle, behind the calls the runtime makes."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kuikproxy.core.quota.buckets import Buckets, BucketSpec, BucketView
from kuikproxy.core.quota.categories import Category
from kuikproxy.core.quota.throttle import (
    Backoff,
    Block,
    Throttle,
    ThrottleView,
    countdown,
    parse_ratelimit,
    parse_retry_after,
)


@dataclass(frozen=True, slots=True)
class QuotaSnapshot:
    """A host's quota at ``now``, for ``/status`` and metrics. Times are on the runtime's clock
    (the ``now`` the core is given); ``/status`` converts them to wall time."""

    buckets: tuple[BucketView, ...]
    blocked_until: float | None  # the host's own block
    backoff_attempts: int
    ratelimit_remaining: int | None  # the last ``ratelimit-remaining`` any answer carried
    identities: dict[str, ThrottleView]


class HostQuota:
    """What one host rations and how it last answered. Every method takes ``now`` (the
    runtime's monotonic clock); only :meth:`answered` also takes ``now_wall``, for HTTP dates.

    ``per_identity`` (default: whether any bucket is identity-scoped) says where an answer's
    block lands: on the identity it answered, or on the whole host.
    """

    def __init__(
        self,
        specs: Iterable[BucketSpec] = (),
        *,
        backoff: Backoff | None = None,
        random: Callable[[], float] | None = None,
        seed: int | None = None,
        max_identities: int = 4096,
        per_identity: bool | None = None,
    ) -> None:
        self.buckets = Buckets(specs, max_identities=max_identities)
        self.throttle = Throttle(
            per_identity=self.buckets.per_identity if per_identity is None else per_identity,
            backoff=backoff,
            random=random,
            seed=seed,
            max_identities=max_identities,
        )

    def wait(self, categories: Iterable[Category], identity: str, now: float) -> float:
        """Seconds until a request of ``identity`` counting against ``categories`` may go (a
        block in force, or a bucket without a token); 0.0 if it may go now. Takes nothing."""
        categories = tuple(categories)
        blocked = self.throttle.blocked_until(now, identity)
        bucket_wait = self.buckets.wait(categories, identity, now)
        return max(0.0 if blocked is None else blocked - now, bucket_wait)

    def take(self, categories: Iterable[Category], identity: str, now: float) -> float:
        """Let the request go and return 0.0, taking a token from each of its buckets; or take
        nothing and return the seconds until it could go (all-or-nothing)."""
        categories = tuple(categories)
        blocked = self.throttle.blocked_until(now, identity)
        if blocked is not None:
            return max(blocked - now, self.buckets.wait(categories, identity, now))
        return self.buckets.take(categories, identity, now)

    def retry_after(self, categories: Iterable[Category], identity: str, now: float) -> int:
        """The ``Retry-After`` of kuikproxy's own refusal of such a request at ``now``: at
        least ``ceil(T − now)`` while blocked until T, so refusals count down."""
        return countdown(now + self.wait(categories, identity, now), now)

    def answered(
        self,
        status: int,
        headers: Iterable[tuple[str, str]],
        identity: str | None,
        now: float,
        now_wall: float,
    ) -> Block | None:
        """A registry's answer to ``identity`` (None: not known): ``Retry-After``, backoff,
        ``ratelimit-*``. Returns the block it put (or kept) in force, if any; a host-wide one
        (``identity`` None) is also a run of lost windows for the scheduler."""
        found: dict[str, str] = {}
        for key, value in headers:
            found.setdefault(key.lower(), value)
        ratelimit = parse_ratelimit(found)
        if ratelimit is not None and ratelimit.limit and ratelimit.remaining is not None:
            self.buckets.learn(
                identity, ratelimit.limit, ratelimit.remaining, ratelimit.window, now
            )
        return self.throttle.answered(
            status,
            retry_after=parse_retry_after(found.get("retry-after"), now_wall),
            ratelimit=ratelimit,
            identity=identity,
            now=now,
        )

    def block(self, until: float, identity: str | None = None, *, now: float) -> float:
        """Block the host (or one identity) until ``until``, never shortening a block; for a
        block restored after a restart (P13). Returns the block's end."""
        return self.throttle.block(until, identity, now=now)

    def blocked_until(self, now: float, identity: str | None = None) -> float | None:
        """The end of the block ``identity`` (None: the host as a whole) is under, if any."""
        return self.throttle.blocked_until(now, identity)

    def snapshot(self, now: float) -> QuotaSnapshot:
        host = self.throttle.host
        return QuotaSnapshot(
            buckets=tuple(self.buckets.views(now)),
            blocked_until=host.until if host.until > now else None,
            backoff_attempts=host.attempts,
            ratelimit_remaining=self.throttle.last_remaining,
            identities=self.throttle.views(now),
        )
