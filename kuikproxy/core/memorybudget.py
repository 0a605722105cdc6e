"""The memory budget every client-fillable bound is sized from, as a pure split.

Each thing a client can make kuikproxy keep — ring images, resources, hosts under a wildcard,
held requests, kept answers, kept refusals, the store's catalog, relay buffers — is bounded; the
bounds are only safe *together*: priced one by one at generous defaults they added up past the
pod's memory limit, so names a client chooses could get the pod OOM-killed and every held pull
lost with it. So one number, the budget (``limits.memory``: the pod's limit by default), is split:

* :data:`BASE` for the process itself (the interpreter, its libraries, the loop, fixed-size
  caches: ~56 MiB at start) and :data:`HEADROOM` of the budget for what the allocator does not
  give back (fragmentation, a collection's garbage, a reload's two configs);
* the rest into :data:`SHARES`, each the bound's fraction; a bound's value is its share over what
  one item costs (:data:`COSTS`, measured by ``bench/state.py``, rounded up; a held request's by
  ``bench/flood.py``, 15,000 held at once). The relays' share is bytes, taken by each blob relay
  as it starts and given back as it ends (``runtime/relayroom.py``).

A bound set in the config is taken as written and priced the same; the others share what it left.
When the bounds set take more than there is, :attr:`MemoryBudget.over` says by how much and the
config is refused: a budget that is not kept is worse than none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

MIB = 1024**2
BASE = 64 * MIB
HEADROOM = 0.2  # of the budget


class Bound(StrEnum):
    """A client-fillable bound, by the setting that overrides it."""

    IMAGES = "limits.maxImages"
    RESOURCES = "limits.maxResources"
    HOSTS = "limits.maxHosts"
    HELD = "limits.maxHeld"
    KEPT_BYTES = "cache.maxBytes"
    KEPT_ENTRIES = "cache.maxEntries"
    REFUSALS = "cache.maxRefusals"
    CATALOG = "cache.blobs.maxEntries"
    RELAYS = "relays"  # not a setting: relay buffers and fan-out windows, in bytes


COSTS: Mapping[Bound, int] = {
    Bound.IMAGES: 256,  # a ring image, its key included (~220 B measured)
    Bound.RESOURCES: 2048,  # a resource with a one-image ring and its census entry (~1.9 KiB)
    Bound.HOSTS: 16 * 1024,  # a host's scheduler, series, buckets and counts (~14 KiB)
    Bound.HELD: 9 * 1024,  # a parked request, its connection and transport (~8.2 KiB measured)
    Bound.KEPT_BYTES: 1,  # a kept answer's body, byte for byte
    Bound.KEPT_ENTRIES: 1024,  # a kept answer's object, headers and key, body aside
    Bound.REFUSALS: 1024,  # a kept 401/403/404: an entry with a small body
    Bound.CATALOG: 768,  # one of the store's grants or tags (~650 B measured)
    Bound.RELAYS: 1,  # relay buffers (fan-out windows), byte for byte
}
"""Bytes one item of a bound costs, rounded up from what was measured."""

SHARES: Mapping[Bound, float] = {
    Bound.KEPT_BYTES: 0.21,
    Bound.KEPT_ENTRIES: 0.08,
    Bound.REFUSALS: 0.02,  # the cheapest thing to make (a name that does not exist): the least
    Bound.IMAGES: 0.20,  # priced at twice what the flood measured (bench/RESULTS.md §9)
    Bound.RESOURCES: 0.05,
    Bound.HOSTS: 0.04,
    Bound.HELD: 0.10,
    Bound.CATALOG: 0.10,
    Bound.RELAYS: 0.20,  # a relay's kernel queues are in it (kuikproxy/socketbuffers.py)
}
"""Each bound's fraction of what the base and the headroom leave; they add up to 1."""


@dataclass(frozen=True, slots=True)
class Share:
    """One bound's part of the budget: ``value`` items of ``each`` bytes, ``set`` when the
    config wrote the value rather than the budget sizing it."""

    bound: Bound
    value: int
    each: int
    set: bool

    @property
    def bytes(self) -> int:
        return self.value * self.each


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """The budget and how it is split (:func:`split`)."""

    memory: int
    base: int
    headroom: int
    shares: tuple[Share, ...]

    def value(self, bound: Bound) -> int:
        return next(s.value for s in self.shares if s.bound is bound)

    @property
    def over(self) -> int:
        """Bytes the bounds take past what the budget has for them (0 when they fit)."""
        return max(0, sum(s.bytes for s in self.shares) - self.fillable)

    @property
    def fillable(self) -> int:
        return max(0, self.memory - self.base - self.headroom)


def split(
    memory: int, written: Mapping[Bound, int], unused: frozenset[Bound] = frozenset()
) -> MemoryBudget:
    """Size every bound from ``memory`` bytes: those in ``written`` as written, those
    ``unused`` (the store's catalog without a store) at nothing, the others by their fraction of
    what those leave (never below one item)."""
    headroom = int(memory * HEADROOM)
    fillable = max(0, memory - BASE - headroom)
    taken = sum(value * COSTS[bound] for bound, value in written.items())
    sized = [b for b in SHARES if b not in written and b not in unused]
    free_fraction = sum(SHARES[b] for b in sized)
    left = max(0, fillable - taken)
    shares = []
    for bound, fraction in SHARES.items():
        each = COSTS[bound]
        if bound in written:
            shares.append(Share(bound, written[bound], each, True))
        elif bound in unused:
            shares.append(Share(bound, 0, each, False))
        else:
            value = int(left * fraction / free_fraction) // each if free_fraction else 0
            shares.append(Share(bound, max(1, value), each, False))
    return MemoryBudget(memory, BASE, headroom, tuple(shares))
