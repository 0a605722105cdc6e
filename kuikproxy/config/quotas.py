"""Registry quotas (SPEC §11): token buckets per host, from a preset and/or written out.

::

    registries:
      myregistry.azurecr.io:
        quota:
          preset: acr-standard         # acr-basic | acr-standard | acr-premium
                                       # | dockerhub-anonymous | dockerhub-authenticated
          share: 0.5                   # of the preset's rates this proxy may use (default 1)
          buckets:                     # on top of the preset
            - {category: DataplaneRead, scope: identity, ratePerMinute: 2500, burst: 42}

A bucket rations one **category** of requests (``DataplaneRead`` = GET/HEAD/OPTIONS,
``DataplaneWrite`` = PUT/PATCH/POST, ``DataplaneDelete``, ``ListReferrers`` = referrers GETs,
``OAuth`` = token requests) in one **scope** (``registry``: one bucket for the host;
``identity``: one per identity, SPEC §11), refilling ``ratePerMinute`` tokens a minute up to
``burst``.

Decisions:

- An explicit bucket *replaces* the preset's bucket of the same category and scope, and is
  *added* when the preset has none: ``preset: acr-standard`` plus one identity read bucket is
  the ACR tier with a tighter per-identity read rate. Two explicit buckets of one category and
  scope are an error.
- ``quota`` merges from ``registries.default`` key by key like every block: a default
  ``preset`` with a host's ``buckets`` gives that host both; a host writes ``preset: null`` or
  ``buckets: []`` to drop the default's. A ``registry``-scoped bucket set in ``default`` is
  still one bucket *per host*.
- ``share`` scales a preset's rates (and so its bursts) for a registry budget that several
  proxies or clusters spend: two clusters behind one egress IP each take ``share: 0.5``.
  Explicit buckets are taken as written.
- Preset bursts are one second's worth of tokens (``ceil(ratePerMinute / 60)``): a token bucket
  cannot reproduce a registry's per-minute count exactly, and this keeps any minute within
  1/60 of the published rate while letting a short burst of blob requests through at once.
- The Docker Hub presets have no fixed buckets: Docker Hub counts manifest GETs only (no
  category says that) per identity, and says its own limit in ``ratelimit-limit`` /
  ``ratelimit-remaining`` headers, from which kuikproxy learns it (SPEC §11).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any, Literal, cast, get_args

from pydantic import AfterValidator, BeforeValidator
from pydantic import model_validator as _model_validator
from pydantic.dataclasses import dataclass

from kuikproxy.config.base import MODEL_CONFIG, Loc, NestedErrors, PositiveInt
from kuikproxy.core.quota import PRESETS, BucketSpec, preset

__all__ = [
    "DOCKER_HUB_PRESETS",
    "QUOTA_PRESETS",
    "QuotaBucket",
    "QuotaCategory",
    "QuotaPreset",
    "QuotaScope",
    "QuotaSettings",
]

QuotaCategory = Literal[
    "DataplaneRead", "DataplaneWrite", "DataplaneDelete", "ListReferrers", "OAuth"
]
"""What a bucket rations (SPEC §11)."""
QuotaScope = Literal["registry", "identity"]
"""One bucket per host, or one per identity at that host."""
QuotaPreset = Literal[
    "acr-basic", "acr-standard", "acr-premium", "dockerhub-anonymous", "dockerhub-authenticated"
]
"""A registry's published limits, by name."""

_CATEGORY_ORDER = {name: index for index, name in enumerate(get_args(QuotaCategory))}
_SCOPE_ORDER = {name: index for index, name in enumerate(get_args(QuotaScope))}


def _number(value: Any) -> Any:
    # A float field would take ``true`` as 1.0; a rate written as a boolean is a mistake.
    if isinstance(value, bool):
        raise ValueError("must be a number")
    return value


def _rate(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    if value <= 0:
        raise ValueError("must be greater than 0")
    return value


Rate = Annotated[float, BeforeValidator(_number), AfterValidator(_rate)]


def _share(value: float) -> float:
    if not 0 < value <= 1:
        raise ValueError("must be greater than 0 and at most 1")
    return value


"""Tokens per minute, a finite number greater than 0."""


@dataclass(frozen=True, config=MODEL_CONFIG)
class QuotaBucket:
    """A token bucket: ``rate_per_minute`` tokens a minute, at most ``burst`` saved up."""

    category: QuotaCategory
    """The requests it rations."""
    scope: QuotaScope
    """``registry``: one bucket per host; ``identity``: one per identity (SPEC §11)."""
    rate_per_minute: Rate
    """Tokens added per minute, continuously."""
    burst: PositiveInt
    """The most tokens it holds, so the most requests that may go at once (``>= 1``)."""

    @property
    def key(self) -> tuple[QuotaCategory, QuotaScope]:
        """``(category, scope)``: at most one bucket of a host has a given key."""
        return (self.category, self.scope)


def _sort_key(bucket: QuotaBucket) -> tuple[int, int]:
    return (_CATEGORY_ORDER[bucket.category], _SCOPE_ORDER[bucket.scope])


def _from_core(specs: tuple[BucketSpec, ...]) -> tuple[QuotaBucket, ...]:
    """A preset's fixed buckets, from the core's table (the one source of its numbers); the
    buckets it learns from headers (Docker Hub's) are not settings."""
    buckets = (
        QuotaBucket(
            cast(QuotaCategory, spec.category.value),
            spec.scope.value,
            spec.rate_per_minute,
            math.ceil(spec.burst or 1),
        )
        for spec in specs
        if spec.rate_per_minute is not None
    )
    return tuple(sorted(buckets, key=_sort_key))


QUOTA_PRESETS: Mapping[QuotaPreset, tuple[QuotaBucket, ...]] = {
    name: _from_core(PRESETS[name]) for name in get_args(QuotaPreset)
}
"""The buckets of each preset (SPEC §11). The Docker Hub ones have none: see the module doc."""
DOCKER_HUB_PRESETS: frozenset[QuotaPreset] = frozenset(
    {"dockerhub-anonymous", "dockerhub-authenticated"}
)
"""Presets whose limit is learnt from Docker Hub's ``ratelimit-*`` headers, per identity."""


@dataclass(frozen=True, config=MODEL_CONFIG)
class QuotaSettings:
    """A host's quota: its preset and effective buckets (the preset's, explicit ones on top).

    ``buckets`` is the effective list once validated, sorted by category then scope; an empty
    ``QuotaSettings()`` rations nothing.
    """

    preset: QuotaPreset | None = None
    """The registry's published limits, or ``None``."""
    share: Annotated[float, BeforeValidator(_number), AfterValidator(_share)] = 1.0
    """The part of the preset's rates this proxy may use, ``0 < share <= 1``."""
    buckets: tuple[QuotaBucket, ...] = ()
    """The buckets to enforce (after validation: the preset's, replaced or extended)."""

    @_model_validator(mode="after")
    def _effective(self) -> QuotaSettings:
        first: dict[tuple[str, str], int] = {}
        problems: list[tuple[Loc, str]] = []
        for index, bucket in enumerate(self.buckets):
            if bucket.key in first:
                name = f"{bucket.category}/{bucket.scope}"
                problems.append(
                    (
                        ("buckets", index),
                        f"duplicate bucket {name} (also buckets[{first[bucket.key]}])",
                    )
                )
            else:
                first[bucket.key] = index
        if problems:
            raise NestedErrors(problems)
        effective = {bucket.key: bucket for bucket in self.preset_buckets()}
        effective.update((bucket.key, bucket) for bucket in self.buckets)
        object.__setattr__(self, "buckets", tuple(sorted(effective.values(), key=_sort_key)))
        return self

    def preset_buckets(self) -> tuple[QuotaBucket, ...]:
        """The preset's fixed buckets at this ``share`` of their rates (none without one)."""
        if self.preset is None:
            return ()
        return _from_core(preset(self.preset, scale=self.share))

    @property
    def learns_from_headers(self) -> bool:
        """Whether the preset is Docker Hub's, whose limit is read from ``ratelimit-*`` headers."""
        return self.preset in DOCKER_HUB_PRESETS

    def bucket(self, category: QuotaCategory, scope: QuotaScope) -> QuotaBucket | None:
        """The effective bucket of ``category`` and ``scope``, if there is one."""
        return next((b for b in self.buckets if b.key == (category, scope)), None)
