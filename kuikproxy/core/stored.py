"""What the pull-through store may answer (§15), as predicates over plain values.

Content by digest in the store is someone's read of it: whose (R5) decides who else may have
it, as for kept answers. And a stale manifest — the newest a tag was known to name, however
old — is given only while its registry cannot be asked, and only to the requests the operator
chose (``serveStale``).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Literal

from kuikproxy.core.reuse import shared_with

ServeStale = Literal[False, True, "checks"]


def owner_parts(owner: str | None) -> tuple[str | None, str | None]:
    """An owner key (:func:`~kuikproxy.core.reuse.owner_key`) as the (auth, signer) pair."""
    if owner is not None and owner.startswith("own:"):
        return None, owner[len("own:") :]
    return owner, None


def content_serves(
    owners: Collection[str | None],
    proved: bool,
    request_auth: str | None,
    request_signer: str | None,
) -> bool:
    """R5 for stored content of one repository of one host: a request may have it when one of
    the reads that stored it there (``owners``) shares with it — anonymous, kuikproxy's own
    credentials, or the identical ``Authorization`` — or when it ``proved`` access to that
    repository (a manifest of it answered 200 to the same ``Authorization`` lately): registries
    hand every client a token of its own, so the identical header alone would share nothing
    between two nodes.

    A proof opens only content read from that very repository (``owners`` not empty): the
    store holds each digest once for every host, and a proof for a repository of one's own —
    on a registry one runs, under a wildcard — must not open a blob read from another."""
    if not owners:
        return False
    if proved:
        return True
    return any(
        shared_with(*owner_parts(owner), 200, request_auth, request_signer) for owner in owners
    )


def serves_stale(setting: ServeStale, check: bool, from_kuik: bool) -> bool:
    """Whether a manifest read by tag may be answered stale while its registry cannot be asked:
    pulls when ``serveStale`` is on; kuik's own checks (a ``Kuik-Resource`` header) only with
    ``checks`` — a stale "Available" would hide an image deleted meanwhile. A node's own HEAD
    by tag (containerd resolves a tag that way before every pull) counts as a pull."""
    if setting is False:
        return False
    return not (check and from_kuik) or setting == "checks"


def outage(status: int | None) -> bool:
    """Whether a registry's answer says it cannot be reached, as unreachable as no connection
    for ``serveStale``: the gateway in front of it could not reach it (502, 504) or it is
    unavailable (503: a registry down for maintenance, a CDN in front of one that is down).
    Other statuses, a 500 included, are the registry's own answer, relayed."""
    return status in (502, 503, 504)


def manifest_type(body: bytes, labelled: str | None) -> str | None:
    """The media type a manifest in the store is served with: the one its body declares
    (``mediaType``: Docker's schema 2, OCI's manifests and indexes), else the label it was
    stored with. The label is whatever ``Content-Type`` the first read of those bytes carried —
    from any host, through the blobs route too — so a registry one runs could otherwise give
    another registry's manifest a type that breaks its clients."""
    try:
        document = json.loads(body)
    except ValueError:  # not JSON (UnicodeDecodeError is one): nothing declared
        return labelled
    declared = document.get("mediaType") if isinstance(document, dict) else None
    return declared if isinstance(declared, str) and declared else labelled
