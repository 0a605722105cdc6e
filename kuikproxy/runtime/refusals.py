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

from kuikproxy.core.limits import Limit, Limits
from kuikproxy.errors import RefusalLog, RegistryError, Unavailable

_WHAT = {
    Limit.HOSTS: "hosts under allowedHosts' wildcards",
    Limit.RESOURCES: "resources",
    Limit.IMAGES: "ring images in all",
    Limit.RING_IMAGES: "images in this resource's ring",
    Limit.HELD: "requests held for their windows",
}
_FORGOTTEN = (
    "refused until one is forgotten, unusedImageRetention after its last request; what "
    "kuikproxy holds already is served as before"
)
_NEW = {
    Limit.HOSTS: f"a new host is {_FORGOTTEN}",
    Limit.RESOURCES: f"a new resource is {_FORGOTTEN}",
    Limit.IMAGES: f"a new image is {_FORGOTTEN}",
    Limit.RING_IMAGES: f"a new image is {_FORGOTTEN}",
    Limit.HELD: "a request that would wait is refused until a held one is answered; kept "
    "answers are served as before",
}


class Refusals(RefusalLog):
    """The refusals of one host, or of the requests no host's state answers for (``host``
    None), and the limits' own."""

    __slots__ = ()

    def refusal(self, limit: Limit, limits: Limits, now: float, host: str) -> RegistryError:
        """Count the refusal of a request to ``host`` that would pass ``limit``, and return
        its ``503 UNAVAILABLE``: what is at the limit, and that what has state goes on."""
        value = limits.value(limit)
        error = Unavailable(
            f"kuikproxy holds {value} {_WHAT[limit]} (limits.{limit}): {_NEW[limit]}",
            detail={"host": host, "limit": str(limit), "value": value},
        )
        error.counted = True  # here, where it is made: the edge must not count it again
        return self.count(str(limit), error, now)
