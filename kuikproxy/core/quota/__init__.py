"""Registry quotas and throttling (SPEC §11): token buckets, identities, blocks and backoff.

How it works
============

Registries ration requests. ACR documents how: a token bucket per *category* of request
(:class:`Category`: ``DataplaneRead`` = GET/HEAD/OPTIONS, ``DataplaneWrite`` = PUT/PATCH/POST,
``DataplaneDelete``, ``ListReferrers``, ``OAuth``), per registry and per identity, refilled
continuously at a rate per minute. A request counts against every category it belongs to
(:func:`categories_of`: a referrers GET is ``ListReferrers`` *and* ``DataplaneRead``) and is
refused if any of those buckets is empty. :class:`HostQuota` models one host the same way, so
kuikproxy can wait instead of being refused: :meth:`HostQuota.take` takes a token from every
bucket a request counts against or from none, and then says how long until all would have one
— the time the runtime waits, or the ``Retry-After`` of its own ``429``. No timer runs: a
bucket's level is computed from ``now`` (:mod:`.buckets`).

Buckets are scoped to the registry or to an identity. Identity buckets are made at an
identity's first request and forgotten when full (a full bucket is a new one), so their number
follows the identities active in the last refill time, and it is bounded. Who an identity is
comes from the client's ``Authorization`` (:func:`identity_of`): anonymous requests are one
identity, kuikproxy's own credential is one, a Basic user is its name, a bearer token its JWT
``sub`` (read, never trusted: it only picks a bucket) or a hash. Credentials are never kept.

Presets (:data:`PRESETS`, :func:`preset`) are SPEC §11's tables. Their bursts are one second's
worth of the rate, rounded up (as the config's presets are): ACR does not publish its bucket
sizes, and its page's "up to a whole minute" of throttling after a large burst bounds them at a
minute's worth; a pacer is there not to be refused, so it assumes the small end, which keeps
any minute within 1/60 of the published rate. Docker Hub publishes no fixed
rate for an account: its presets are one *learnt* bucket per identity for manifest GETs (its
unit of count), which refuses nothing until ``ratelimit-limit``/``ratelimit-remaining`` are seen
and then follows them, re-synchronised on every answer.

A model is not the registry: a registry that is scaling, or shared with clients kuikproxy does
not see, still says ``429``. :meth:`HostQuota.answered` reads every answer
(:mod:`.throttle`): ``Retry-After`` (seconds, or an HTTP date against ``now_wall``) blocks until
then; a throttling answer without it backs off exponentially with jitter (base 1 s, factor 2,
cap 5 min, reset by a success; the jitter is drawn from an injected ``random``); Docker Hub's
``ratelimit-remaining: 0`` blocks for ``w / limit`` seconds. Blocks are never shortened. On a
registry modelled per identity a block lands on the identity that was answered (another keeps
flowing); otherwise on the host, whose windows it loses. kuikproxy's own refusals count down
(``ceil(T − now)``), as a registry's do.

Everything here is pure: ``now`` is the runtime's monotonic clock, ``now_wall`` (Unix seconds)
is passed only to read HTTP dates, and randomness is injected.
"""

from __future__ import annotations

from kuikproxy.core.quota.buckets import (
    Buckets,
    BucketSpec,
    BucketView,
    SharedBucket,
    TokenBucket,
    default_burst,
    take_shared,
)
from kuikproxy.core.quota.categories import Category, Route, Scope, categories_of
from kuikproxy.core.quota.hostquota import HostQuota, QuotaSnapshot
from kuikproxy.core.quota.identity import ANONYMOUS, OWN, identity_of
from kuikproxy.core.quota.presets import PRESETS, preset
from kuikproxy.core.quota.throttle import (
    DOCKER_HUB_WINDOW,
    MAX_BLOCK,
    Backoff,
    Block,
    RateLimit,
    Throttle,
    ThrottleView,
    countdown,
    parse_ratelimit,
    parse_retry_after,
)

__all__ = [
    "ANONYMOUS",
    "DOCKER_HUB_WINDOW",
    "MAX_BLOCK",
    "OWN",
    "PRESETS",
    "Backoff",
    "Block",
    "BucketSpec",
    "BucketView",
    "Buckets",
    "Category",
    "HostQuota",
    "QuotaSnapshot",
    "RateLimit",
    "Route",
    "Scope",
    "SharedBucket",
    "Throttle",
    "ThrottleView",
    "TokenBucket",
    "categories_of",
    "countdown",
    "default_burst",
    "identity_of",
    "parse_ratelimit",
    "parse_retry_after",
    "preset",
    "take_shared",
]
