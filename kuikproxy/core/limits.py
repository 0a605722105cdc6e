"""Limits on what kuikproxy keeps, as pure decisions.

kuikproxy's state grows with the names clients send: each new resource gets a ring on each host
it asks there, each new host under an allowed wildcard a scheduler of its own, each new image a
ring entry. Retention (P8) drops what nobody asks for any more, but only after
``unusedImageRetention``; until then a client that makes names up could fill memory. So the
``limits`` block bounds, at once:

* ``maxHosts``: the hosts not in ``registries`` (allowed by a wildcard) that have state;
* ``maxResources``: the resources that have state (a ring or a copy queue) on some host;
* ``maxImages``: the ring images of every ring together;
* ``maxRingImages``: the images of one ring;
* ``maxHeld``: the requests held for their windows, over every host.

Each is sized from the memory budget unless the config writes it
(:mod:`kuikproxy.core.memorybudget`).

A request that would pass a limit is refused (:class:`Refuse`); what already has state keeps
working. :class:`Census` counts the resources and images across hosts: the schedulers of every
host report to one census, which is also the order ``/status`` pages resources in.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from kuikproxy.core.sortedset import SortedSet


class Limit(StrEnum):
    """A limit, by its key in the ``limits`` block: the reason of a refusal (SPEC §12)."""

    HOSTS = "maxHosts"
    RESOURCES = "maxResources"
    IMAGES = "maxImages"
    RING_IMAGES = "maxRingImages"
    HELD = "maxHeld"


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits in force; the runtime builds them from the config (``limits``)."""

    max_hosts: int = 1_000
    max_resources: int = 10_000
    max_images: int = 1_000_000
    max_ring_images: int = 100_000
    max_held: int = 10_000

    def value(self, limit: Limit) -> int:
        return {
            Limit.HOSTS: self.max_hosts,
            Limit.RESOURCES: self.max_resources,
            Limit.IMAGES: self.max_images,
            Limit.RING_IMAGES: self.max_ring_images,
            Limit.HELD: self.max_held,
        }[limit]


@dataclass(frozen=True, slots=True)
class Refuse:
    """Refuse the request: keeping what it asks for would pass ``limit``. Nothing of it is
    kept; whatever already has state is untouched."""

    limit: Limit


def admits_host(extra_hosts: int, limits: Limits) -> bool:
    """Whether one more host not in ``registries`` may have state, ``extra_hosts`` having it."""
    return extra_hosts < limits.max_hosts


class Census:
    """The resources that have state on some host — on which hosts — and how many ring images
    there are in all, as the hosts' schedulers report them, and how many requests are held.

    Resources are also kept in name order, so that ``/status`` lists a page of them without
    sorting them all (:meth:`page`).
    """

    __slots__ = ("_hosts", "_names", "held", "images", "limits")

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._hosts: dict[str, set[str]] = {}
        self._names = SortedSet()
        self.images = 0
        self.held = 0  # requests held for their windows, over every host

    def __len__(self) -> int:
        return len(self._hosts)

    def __contains__(self, resource: object) -> bool:
        return resource in self._hosts

    def refusal(self, resource: str, new_images: int, ring_images: int) -> Refuse | None:
        """Whether ``resource`` may keep ``new_images`` more ring images in a ring that holds
        ``ring_images`` now (0 and 0 for a copy queue): a resource without state is one more;
        a request that adds no image never passes an image limit."""
        limits = self.limits
        if resource not in self._hosts and len(self._hosts) >= limits.max_resources:
            return Refuse(Limit.RESOURCES)
        if new_images:
            if ring_images + new_images > limits.max_ring_images:
                return Refuse(Limit.RING_IMAGES)
            if self.images + new_images > limits.max_images:
                return Refuse(Limit.IMAGES)
        return None

    def holds(self) -> Refuse | None:
        """Whether one more request may be held for its window."""
        return Refuse(Limit.HELD) if self.held >= self.limits.max_held else None

    def enter(self, resource: str, host: str) -> None:
        """``resource`` now has state on ``host``."""
        hosts = self._hosts.get(resource)
        if hosts is None:
            hosts = self._hosts[resource] = set()
            self._names.add(resource)
        hosts.add(host)

    def leave(self, resource: str, host: str) -> None:
        """``resource`` no longer has state on ``host``."""
        hosts = self._hosts.get(resource)
        if hosts is None:
            return
        hosts.discard(host)
        if not hosts:
            del self._hosts[resource]
            self._names.discard(resource)

    def hosts(self, resource: str) -> list[str]:
        """The hosts ``resource`` has state on, in name order."""
        return sorted(self._hosts.get(resource, ()))

    def page(self, after: str | None, limit: int) -> tuple[list[str], bool]:
        """At most ``limit`` resources after ``after`` (from the first when None), in name
        order, and whether more follow: O(log n + limit)."""
        names: list[str] = []
        for name in self._names.iter_after(after):
            if len(names) == limit:
                return names, True
            names.append(name)
        return names, False
