"""The presets of SPEC §11: ACR's SKUs in requests per minute, Docker Hub learnt from headers.

ACR's numbers are SPEC §11's (the Russian ACR limits page it is built from describes the limits
but its tables did not survive, so it confirms the categories, the scopes and the token-bucket
model, not the numbers). ``acr-basic`` and ``acr-standard`` share one table, as SPEC says.
OAuth is registry-scoped only: "OAuth requests are limited per registry only, with no separate
per-identity limit". Bursts are :func:`~kuikproxy.core.quota.buckets.default_burst`: one
second's worth.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from kuikproxy.core.quota.buckets import BucketSpec
from kuikproxy.core.quota.categories import Category, Scope

REG, IDN = Scope.REGISTRY, Scope.IDENTITY


def _acr(read: int, write: int, delete: int, referrers: int, oauth: int) -> tuple[BucketSpec, ...]:
    """Per-registry rates; SPEC's per-identity rates are half of each, OAuth has none."""
    rows = (
        (Category.DATAPLANE_READ, read),
        (Category.DATAPLANE_WRITE, write),
        (Category.DATAPLANE_DELETE, delete),
        (Category.LIST_REFERRERS, referrers),
    )
    specs = [BucketSpec(c, REG, float(rate)) for c, rate in rows]
    specs += [BucketSpec(c, IDN, rate / 2) for c, rate in rows]
    specs.append(BucketSpec(Category.OAUTH, REG, float(oauth)))
    return tuple(specs)


_DOCKERHUB = (BucketSpec(Category.MANIFEST_GET, IDN),)

PRESETS: Mapping[str, tuple[BucketSpec, ...]] = MappingProxyType(
    {
        "acr-basic": _acr(10000, 2000, 1000, 500, 10000),
        "acr-standard": _acr(10000, 2000, 1000, 500, 10000),
        "acr-premium": _acr(20000, 4000, 4000, 2000, 20000),
        # Both learn their rate from ratelimit-limit/-remaining; the name says which account
        # the operator expects. Anonymous pulls are one identity (Docker Hub counts them per
        # source address, which is kuikproxy's).
        "dockerhub-anonymous": _DOCKERHUB,
        "dockerhub-authenticated": _DOCKERHUB,
    }
)


def preset(name: str, *, scale: float = 1.0) -> tuple[BucketSpec, ...]:
    """A preset's buckets, every fixed rate multiplied by ``scale`` (a safety margin such as
    0.8, or a test's 1/1000) and its burst recomputed from the scaled rate."""
    specs = PRESETS.get(name)
    if specs is None:
        raise ValueError(f"unknown quota preset {name!r}; known: {', '.join(PRESETS)}")
    if not scale > 0:
        raise ValueError(f"scale must be positive, not {scale!r}")
    if scale == 1.0:
        return specs
    return tuple(
        s
        if s.rate_per_minute is None
        else BucketSpec(s.category, s.scope, s.rate_per_minute * scale)
        for s in specs
    )
