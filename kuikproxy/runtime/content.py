"""Content addressing applied to whole answers read for windows (:mod:`kuikproxy.core.digests`).

A manifest read by digest is verified before anyone is served or anything kept: a body that does
not hash to the digest is a bad gateway (``502``), never an answer. A manifest read by tag is
kept and answered under the digest of its body. Streamed answers are checked on the way in
:mod:`kuikproxy.web.relay`.
"""

from __future__ import annotations

import logging
from dataclasses import replace

from kuikproxy.core.digests import content_digest, matches, with_digest
from kuikproxy.core.images import MANIFESTS
from kuikproxy.errors import ContentMismatch
from kuikproxy.runtime.messages import Answer, RegistryRequest

log = logging.getLogger(__name__)

MAX_MANIFEST = 4 * 1024 * 1024  # distribution's own limit on a manifest's size


def verified(request: RegistryRequest, answer: Answer) -> Answer:
    """``answer`` to ``request`` as it may be served and kept, or :class:`ContentMismatch`."""
    image = request.image
    if answer.status != 200:
        return answer
    if image.route != MANIFESTS:
        # a blob's bytes are checked as they are relayed; what its answer says it is, here
        announced = answer.header("docker-content-digest")
        if image.by_digest and announced is not None and announced != image.reference:
            raise mismatch(request.host, image.repository, image.reference)
        return answer
    encoding = answer.header("content-encoding")
    if encoding is not None and encoding.strip().lower() != "identity":
        # asked for unencoded (RegistryRequest.headers): encoded bytes cannot be checked, and
        # kept without their encoding they would be served as something else
        raise ContentMismatch(
            f"{request.host} answered a manifest with Content-Encoding {encoding[:40]!r} "
            "although kuikproxy asked for it unencoded",
            detail={"host": request.host},
        )
    announced = answer.header("docker-content-digest")
    if image.by_digest:
        digest = image.reference
        wrong = announced is not None and announced != digest
        if wrong or (answer.method == "GET" and not matches(digest, answer.body)):
            raise mismatch(request.host, image.repository, digest)
        return exact_length(answer) if answer.method == "GET" else answer
    if answer.method != "GET":
        return answer
    answer = exact_length(answer)
    digest = content_digest(answer.body, announced)
    if announced is not None and announced != digest:
        log.warning(
            "%s: %s:%s announced %s for a body whose digest is %s; kept under the body's",
            request.host, image.repository, image.reference, announced[:80], digest,
        )  # fmt: skip
    if announced == digest:
        return answer
    return replace(answer, headers=with_digest(answer.headers, digest))


def mismatch(host: str, repository: str, digest: str) -> ContentMismatch:
    return ContentMismatch(
        f"{host} answered {repository}@{digest} with content of another digest",
        detail={"host": host, "digest": digest},
    )


def exact_length(answer: Answer) -> Answer:
    """A whole GET answer whose ``Content-Length`` is its body's: a HEAD served from it
    carries that (R3; clients size what they fetch by it)."""
    length = str(len(answer.body))
    if answer.header("content-length") == length:
        return answer
    headers = tuple((k, v) for k, v in answer.headers if k.lower() != "content-length")
    return replace(answer, headers=(*headers, ("Content-Length", length)))
