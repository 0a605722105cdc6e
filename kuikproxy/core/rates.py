"""What a host's intervals let through, beside what its registry allows (SPEC §14).

Pacing bounds a host's reads from above: one image per window, so at most ``3600 / interval``
checks and as many copies an hour. An operator sizing intervals needs those figures next to
the registry's own limit, in the same unit:

* ACR rations every read (``DataplaneRead``, per registry, per minute): a check is one read; a
  copy is one manifest read plus its blobs, so the copy figure is a floor.
* Docker Hub counts *pulls* — manifest GETs — per address (anonymous) or per account, over six
  hours; HEADs are free. kuik's checks are HEADs, so only copies count (and checks made with
  ``Kuik-Operation: check`` GETs, which this cannot know).
"""

from __future__ import annotations

from dataclasses import dataclass

HOUR = 3600.0
# Docker Hub's published pull limits, per six hours (the ratelimit headers tell the real one).
DOCKERHUB_PULLS = {"dockerhub-anonymous": 100.0, "dockerhub-authenticated": 200.0}
DOCKERHUB_WINDOW = 6 * HOUR


@dataclass(frozen=True, slots=True)
class HostRates:
    checks_per_hour: float
    copies_per_hour: float


@dataclass(frozen=True, slots=True)
class QuotaRate:
    """What a quota allows an hour, and which of the host's reads count against it."""

    per_hour: float
    counts: str  # "checks and copies" or "copies"
    what: str  # how the registry counts, for a person


def pacing_rates(check_interval: float, copy_interval: float) -> HostRates:
    return HostRates(HOUR / check_interval, HOUR / copy_interval)


def quota_rate(
    preset: str | None, reads_per_minute: float | None, share: float = 1.0
) -> QuotaRate | None:
    """What ``preset`` (at ``share``) allows an hour; ``reads_per_minute`` is the host's
    per-registry ``DataplaneRead`` rate when it has one."""
    if preset in DOCKERHUB_PULLS:
        per_hour = DOCKERHUB_PULLS[preset] * share * HOUR / DOCKERHUB_WINDOW
        limit = f"{DOCKERHUB_PULLS[preset] * share:g} pulls per 6h"
        return QuotaRate(per_hour, "copies", f"{limit}; a pull is a manifest GET, HEADs are free")
    if reads_per_minute is not None:
        return QuotaRate(reads_per_minute * 60, "checks and copies", "DataplaneRead per registry")
    return None


def exceeds(rates: HostRates, quota: QuotaRate) -> bool:
    """Whether the intervals let through more than the quota allows (copies count one read
    each here: a floor of what they cost)."""
    counted = rates.copies_per_hour
    if quota.counts == "checks and copies":
        counted += rates.checks_per_hour
    return counted > quota.per_hour


def first_pull(check_interval: float, copy_interval: float) -> float:
    """The longest a first pull by a mirror client waits on an idle host: a check window for
    its HEAD by tag, then a copy window for its manifest GET (§14)."""
    return check_interval + copy_interval
