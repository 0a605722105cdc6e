"""Refusals kuikproxy makes itself, counted by reason (SPEC §12): for ``/status``
(``registries.<h>.refused``, and ``refused`` at the top level for those no host state answers
for), for ``kuik_proxy_refusals_total{registry,reason}``, and logged at ``warning`` at most once
a minute per host and reason — a client that falls back to the registry after a refusal must
never do so unseen.

The reasons: ``notAllowed`` (a host not allowed, §3.1), ``addressGuard`` (an address kuikproxy
never connects to), ``ambiguous`` (two names for the registry), ``maxHold`` (P7), ``blocked``
(the registry said stop, §11), ``flowControl`` (§10), ``shutdown``, and the limits below. Each
error carries its reason (``RegistryError.refusal``); the edge counts it once per client it
reaches (:meth:`Pacer.refused_now`), the limits where they are made.

The limits on kept state (:mod:`kuikproxy.core.limits`) refuse with ``503 UNAVAILABLE``: a
new host, resource or image is turned away because kuikproxy holds as much as it may, which
is the proxy's condition, not the client's rate (``429`` says "you asked too often"). No
``Retry-After``: room is made only when something is forgotten, a retention after its last
request, which no client should wait for.
"""

from __future__ import annotations

import logging

from kuikproxy.core.limits import Limit, Limits
from kuikproxy.errors import RegistryError, Unavailable

log = logging.getLogger(__name__)

WARN_EVERY = 60.0
"""Seconds between two warnings of one host and reason."""

_WHAT = {
    Limit.HOSTS: "hosts under allowedHosts' wildcards",
    Limit.RESOURCES: "resources",
    Limit.IMAGES: "ring images in all",
    Limit.RING_IMAGES: "images in this resource's ring",
}
_NEW = {
    Limit.HOSTS: "host",
    Limit.RESOURCES: "resource",
    Limit.IMAGES: "image",
    Limit.RING_IMAGES: "image",
}


class Refusals:
    """The refusals of one host, or of the requests no host's state answers for (``host``
    None): counts by reason, and when each reason was last logged."""

    __slots__ = ("_logged", "counts", "host")

    def __init__(self, host: str | None) -> None:
        self.host = host
        self.counts: dict[str, int] = {}
        self._logged: dict[str, float] = {}

    def count(self, reason: str, error: RegistryError, now: float) -> RegistryError:
        """Count a refusal (``now`` on the loop's clock) and return its error, to raise."""
        error.refusal = reason
        total = self.counts[reason] = self.counts.get(reason, 0) + 1
        last = self._logged.get(reason)
        if last is None or now - last >= WARN_EVERY:
            self._logged[reason] = now
            log.warning(
                "%s refused (%s, %d so far): %s",
                self.host or "a request", reason, total, error.message,
            )  # fmt: skip
        return error

    def refusal(self, limit: Limit, limits: Limits, now: float, host: str) -> RegistryError:
        """Count the refusal of a request to ``host`` that would pass ``limit``, and return
        its ``503 UNAVAILABLE``: what is at the limit, and that what has state goes on."""
        value = limits.value(limit)
        error = Unavailable(
            f"kuikproxy holds {value} {_WHAT[limit]} (limits.{limit}): a new {_NEW[limit]} is "
            "refused until one is forgotten, unusedImageRetention after its last request; "
            "what kuikproxy holds already is served as before",
            detail={"host": host, "limit": str(limit), "value": value},
        )
        error.counted = True  # here, where it is made: the edge must not count it again
        return self.count(str(limit), error, now)
