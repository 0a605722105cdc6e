"""What a request counts against: the categories a registry rations, and a request's own.

ACR names its categories after the HTTP methods of the data plane (``DataplaneRead`` = GET,
HEAD, OPTIONS; ``DataplaneWrite`` = PUT, PATCH, POST; ``DataplaneDelete``), plus
``ListReferrers`` for referrers GETs and ``OAuth`` for token requests. A request may belong to
several: a referrers GET is ``ListReferrers`` *and* ``DataplaneRead``. Docker Hub counts pulls
as manifest GETs (HEADs are free); kuikproxy names that category ``ManifestGet``, its own
addition to ACR's five.
"""

from __future__ import annotations

from enum import StrEnum


class Category(StrEnum):
    """A kind of request a registry rations (SPEC §11), spelt as ACR spells it."""

    DATAPLANE_READ = "DataplaneRead"
    DATAPLANE_WRITE = "DataplaneWrite"
    DATAPLANE_DELETE = "DataplaneDelete"
    LIST_REFERRERS = "ListReferrers"
    OAUTH = "OAuth"
    MANIFEST_GET = "ManifestGet"  # kuikproxy's: Docker Hub's unit of count (a pull)


class Scope(StrEnum):
    """Who shares a bucket: every client of a registry, or one identity (§11)."""

    REGISTRY = "registry"
    IDENTITY = "identity"


class Route(StrEnum):
    """The kind of registry route a request is for."""

    PING = "ping"  # GET /v2/
    MANIFESTS = "manifests"
    BLOBS = "blobs"  # including uploads (/blobs/uploads/...)
    TAGS = "tags"
    REFERRERS = "referrers"
    TOKEN = "token"  # a token request to the registry's realm (OAuth)
    OTHER = "other"  # any other /v2/ path (_catalog, …): counted by its method


_READ = frozenset({"GET", "HEAD", "OPTIONS"})
_WRITE = frozenset({"PUT", "PATCH", "POST"})
_BY_METHOD: dict[str, Category] = {
    **dict.fromkeys(_READ, Category.DATAPLANE_READ),
    **dict.fromkeys(_WRITE, Category.DATAPLANE_WRITE),
    "DELETE": Category.DATAPLANE_DELETE,
}


def categories_of(method: str, route: Route, *, by_digest: bool = False) -> frozenset[Category]:
    """Every category a request counts against; empty for a method no registry rations.

    A token request is ``OAuth`` only, whatever its method (ACR counts sign-ins per registry,
    apart from the data plane). ``by_digest`` changes nothing today, and is taken so that the
    runtime says everything it knows: ACR counts by method alone, and Docker Hub counts every
    manifest GET, by tag or by digest — its "up to two GETs per pull" is left to the learnt
    bucket, which follows the registry's own count on every answer.
    """
    del by_digest
    if route is Route.TOKEN:
        return frozenset({Category.OAUTH})
    verb = method.upper()
    category = _BY_METHOD.get(verb)
    if category is None:
        return frozenset()
    categories = {category}
    if verb == "GET" and route is Route.REFERRERS:
        categories.add(Category.LIST_REFERRERS)
    if verb == "GET" and route is Route.MANIFESTS:
        categories.add(Category.MANIFEST_GET)
    return frozenset(categories)
