"""A registry for tests: an aiohttp app that serves any manifest and blob and records every
request it receives, with the loop time it arrived at."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field

from aiohttp import web

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
BLOB_SIZE = 256 * 1024


# Content addressing, as a real registry has it: every manifest and blob this module makes is
# kept under its digest, and a read by digest gets that content or a 404 (kuikproxy verifies it).
_CONTENT: dict[str, bytes] = {}


def manifest_of(repository: str, reference: str) -> bytes:
    """The manifest the registry serves for ``repository:reference``; readable by its digest
    from then on."""
    body = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "annotations": {"ref": f"{repository}:{reference}"},
        }
    ).encode()
    _CONTENT[digest_of(body)] = body
    return body


def blob_digest(label: str) -> str:
    """The digest of a blob of ``BLOB_SIZE`` bytes made from ``label``, which the registry
    serves from then on."""
    body = (label.encode() * BLOB_SIZE)[:BLOB_SIZE]
    digest = digest_of(body)
    _CONTENT[digest] = body
    return digest


def digest_of(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


@dataclass
class Seen:
    method: str
    path: str
    at: float
    headers: dict[str, list[str]]


@dataclass
class Registry:
    """The recording registry; ``delay`` slows manifest answers, ``fail`` maps paths to statuses
    (with ``Retry-After: retry_after`` when set).

    ``script`` is what the registry answers first, in order, whatever it is asked (the ping
    too): a status and headers each; a 200 is the usual answer with those headers added, any
    other status an error carrying them. ``negotiate`` serves manifests only to an ``Accept``
    that takes ``MANIFEST_TYPE`` (or ``*/*``, or none) and 404s the others; ``content_type``
    labels every manifest with that type whatever was asked (old registries say
    ``application/json``); ``gzip`` encodes manifests for requests that accept it, as CDNs in
    front of registries do (their length unknown until the end)."""

    seen: list[Seen] = field(default_factory=list)
    delay: float = 0.0
    fail: dict[str, int] = field(default_factory=dict)
    retry_after: str | None = None  # sent with the failing answers
    blob_chunks: int = 4
    # Tags the registry does not have (answered 404 MANIFEST_UNKNOWN, as distribution does);
    # every other tag is served. ``tags`` is what ``GET /v2/<name>/tags/list`` lists per
    # repository (sorted, paginated by ``n`` and ``last``); other repositories get NAME_UNKNOWN.
    unknown_tags: set[str] = field(default_factory=set)
    tags: dict[str, list[str]] = field(default_factory=dict)
    script: list[tuple[int, dict[str, str]]] = field(default_factory=list)
    negotiate: bool = False
    content_type: str | None = None
    gzip: bool = False

    def reads(self, kind: str = "manifests") -> list[Seen]:
        return [s for s in self.seen if f"/{kind}/" in s.path]

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v2/", self.ping)
        app.router.add_route("*", "/v2/{name:.+}/manifests/{reference}", self.manifest)
        app.router.add_route("*", "/v2/{name:.+}/blobs/{digest}", self.blob)
        app.router.add_get("/v2/{name:.+}/tags/list", self.tag_list)
        app.router.add_get("/v2/{name:.+}/referrers/{digest}", self.referrers)
        return app

    def scripted(self) -> tuple[web.Response | None, dict[str, str]]:
        """The next scripted answer: an error to send instead of the usual one, or the headers
        to add to it (none once the script is spent)."""
        if not self.script:
            return None, {}
        status, headers = self.script.pop(0)
        if status == 200:
            return None, headers
        body = {"errors": [{"code": "TOOMANYREQUESTS", "message": "scripted"}]}
        return web.json_response(body, status=status, headers=headers), {}

    def record(self, request: web.Request) -> None:
        headers: dict[str, list[str]] = {}
        for k, v in request.headers.items():
            headers.setdefault(k.lower(), []).append(v)
        loop = asyncio.get_running_loop()
        self.seen.append(Seen(request.method, request.path, loop.time(), headers))

    async def ping(self, request: web.Request) -> web.Response:
        self.record(request)
        error, extra = self.scripted()
        if error is not None:
            return error
        return web.json_response(
            {}, headers={"Docker-Distribution-API-Version": "registry/2.0", **extra}
        )

    async def manifest(self, request: web.Request) -> web.StreamResponse:
        self.record(request)
        error, extra = self.scripted()
        if error is not None:
            return error
        if self.delay:
            await asyncio.sleep(self.delay)
        status = self.fail.get(request.path)
        if status is not None:
            return web.json_response(
                {"errors": [{"code": "UNKNOWN", "message": "failing"}]},
                status=status,
                headers={"Retry-After": self.retry_after} if self.retry_after else None,
            )
        name, reference = request.match_info["name"], request.match_info["reference"]
        if reference.startswith(("sha256:", "sha512:")):
            found = _CONTENT.get(reference)
            if found is None:
                return _unknown("MANIFEST_UNKNOWN", reference)
            body = found
        elif reference in self.unknown_tags:
            return web.json_response(
                {
                    "errors": [
                        {
                            "code": "MANIFEST_UNKNOWN",
                            "message": "manifest unknown",
                            "detail": {"Tag": reference},
                        }
                    ]
                },
                status=404,
            )
        else:
            body = manifest_of(name, reference)
        accept = ",".join(request.headers.getall("Accept", []))
        fits = MANIFEST_TYPE in accept or "*/*" in accept or not accept
        if self.negotiate and self.content_type is None and not fits:
            return _unknown("MANIFEST_UNKNOWN", reference)
        headers = {
            "Content-Type": self.content_type or MANIFEST_TYPE,
            "Docker-Content-Digest": digest_of(body),
            "Content-Length": str(len(body)),
            **extra,
        }
        if request.method == "HEAD":
            return web.Response(headers=headers)
        del headers["Content-Length"]
        if self.gzip and "gzip" in request.headers.get("Accept-Encoding", ""):
            response = web.StreamResponse(headers={**headers, "Content-Encoding": "gzip"})
            await response.prepare(request)
            await response.write(gzip.compress(body))
            await response.write_eof()
            return response
        return web.Response(body=body, headers=headers)

    async def blob(self, request: web.Request) -> web.StreamResponse:
        self.record(request)
        error, extra = self.scripted()
        if error is not None:
            return error
        status = self.fail.get(request.path)
        if status is not None:
            return web.json_response(
                {"errors": [{"code": "BLOB_UNKNOWN", "message": "failing"}]}, status=status
            )
        digest = request.match_info["digest"]
        body = _CONTENT.get(digest)
        if body is None:
            return _unknown("BLOB_UNKNOWN", digest)
        response = web.StreamResponse(
            headers={
                "Content-Type": "application/octet-stream",
                "Docker-Content-Digest": digest,
                **extra,
            }
        )
        response.content_length = len(body)
        await response.prepare(request)
        if request.method == "GET":
            size = -(-len(body) // self.blob_chunks)
            for start in range(0, len(body), size):
                await response.write(body[start : start + size])
                await asyncio.sleep(0.01)
        await response.write_eof()
        return response

    async def tag_list(self, request: web.Request) -> web.Response:
        """``tags`` of the repository, sorted; ``n`` caps the page and ``last`` starts it after
        that tag, with a ``Link`` to the next page when one is cut short (distribution spec)."""
        self.record(request)
        error, extra = self.scripted()
        if error is not None:
            return error
        name = request.match_info["name"]
        if name not in self.tags:
            return web.json_response(
                {"errors": [{"code": "NAME_UNKNOWN", "message": f"unknown {name}"}]}, status=404
            )
        tags = sorted(self.tags[name])
        last = request.query.get("last")
        if last is not None:
            tags = [t for t in tags if t > last]
        headers: dict[str, str] = dict(extra)
        n = request.query.get("n")
        if n is not None and len(tags) > int(n):
            tags = tags[: int(n)]
            headers["Link"] = f'</v2/{name}/tags/list?n={n}&last={tags[-1]}>; rel="next"'
        return web.json_response({"name": name, "tags": tags}, headers=headers)

    async def referrers(self, request: web.Request) -> web.Response:
        """The referrers API: an empty image index, whatever the digest."""
        self.record(request)
        error, extra = self.scripted()
        if error is not None:
            return error
        index = {"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": []}
        return web.json_response(index, content_type=INDEX_TYPE, headers=extra)


def _unknown(code: str, digest: str) -> web.Response:
    return web.json_response(
        {"errors": [{"code": code, "message": f"unknown {digest}"}]}, status=404
    )


class Callers:
    """Who asked ``fake`` — its ``Authorization``, or ``anonymous`` — and when, as it comes."""

    def __init__(self, fake: Registry, anonymous: str = "") -> None:
        self.fake, self.anonymous = fake, anonymous

    def __iter__(self) -> Iterator[tuple[str, float]]:
        for seen in self.fake.seen:
            yield seen.headers.get("authorization", [self.anonymous])[0], seen.at
