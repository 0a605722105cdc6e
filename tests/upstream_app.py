"""A registry for tests: an aiohttp app that serves any manifest and blob and records every
request it receives, with the loop time it arrived at. It can want sign-in (:class:`Auth`:
Basic, or tokens from its own realm), and send blobs to storage on another origin."""

from __future__ import annotations

import asyncio
import base64
import gzip
import hashlib
import json
import secrets
from collections.abc import Awaitable, Callable, Iterator
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
    return blob_of((label.encode() * BLOB_SIZE)[:BLOB_SIZE])


def blob_of(body: bytes) -> str:
    """The digest of ``body``, which the registry (and its storage) serves from then on."""
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
    query: str = ""

    @property
    def path_qs(self) -> str:
        return f"{self.path}?{self.query}" if self.query else self.path

    @property
    def authorization(self) -> str | None:
        return self.headers.get("authorization", [None])[0]


@dataclass
class Auth:
    """Who may read what, as a registry behind sign-in has it.

    ``users`` (name → password) sign in with Basic; with ``bearer`` the registry wants tokens
    instead, from its own realm ``/token`` (asked with Basic, or anonymously for an anonymous
    token). Repositories under ``private/`` are read only by ``readers`` (None: every user);
    any other by anyone signed in, an anonymous token included. ``/v2/`` answers anyone signed
    in. Not signed in is a 401 with the challenge (the repository's pull scope in it); signed
    in but not a reader is a 401 with the challenge too for a token (its scope falls short), a
    403 ``DENIED`` with Basic. ``cookies`` puts ``Set-Cookie: session=<who>-<n>`` on every
    answer, naming whom it was for (``anon`` without credentials, ``invalid`` with wrong
    ones)."""

    users: dict[str, str]
    bearer: bool = False
    readers: set[str] | None = None
    cookies: bool = False

    def basic_user(self, authorization: str) -> str | None:
        """The user a Basic ``Authorization`` signs in, or None."""
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            user, _, password = base64.b64decode(value).decode().partition(":")
        except ValueError:
            return None
        return user if self.users.get(user) == password else None

    def may_read(self, user: str | None, name: str) -> bool:
        if not name.startswith("private/"):
            return True
        return user is not None and user in (self.users if self.readers is None else self.readers)

    def challenge(self, request: web.Request, scope: str | None) -> dict[str, str]:
        if not self.bearer:
            return {"WWW-Authenticate": 'Basic realm="test"'}
        realm = f'Bearer realm="http://{request.host}/token",service="token.test"'
        return {"WWW-Authenticate": realm + (f',scope="{scope}"' if scope else "")}


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
    front of registries do (their length unknown until the end).

    ``auth`` makes it want sign-in (:class:`Auth`); the tokens its realm issued, and each token
    request (scope, user) with the loop time it came, are kept. ``blobs_at`` sends every blob
    read elsewhere: a 307 to that URL prefix with the blob's path after it (and ``?signed=1``),
    as registries send them to storage on another origin; any registry serves those reads at
    ``/storage/...`` (by the digest at the end, without sign-in)."""

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
    auth: Auth | None = None
    blobs_at: str | None = None
    tokens: dict[str, str | None] = field(default_factory=dict)  # token → user (None: anonymous)
    token_requests: list[tuple[str, str | None]] = field(default_factory=list)  # scope, user
    token_times: list[float] = field(default_factory=list)
    cookies: list[str] = field(default_factory=list)  # whom each Set-Cookie named, in order

    def reads(self, kind: str = "manifests") -> list[Seen]:
        return [s for s in self.seen if f"/{kind}/" in s.path]

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.guard] if self.auth is not None else [])
        app.router.add_get("/v2/", self.ping)
        app.router.add_route("*", "/v2/{name:.+}/manifests/{reference}", self.manifest)
        app.router.add_route("*", "/v2/{name:.+}/blobs/{digest}", self.blob)
        app.router.add_get("/v2/{name:.+}/tags/list", self.tag_list)
        app.router.add_get("/v2/{name:.+}/referrers/{digest}", self.referrers)
        app.router.add_get("/storage/{tail:.+}", self.stored)
        if self.auth is not None:
            app.router.add_get("/token", self.token)
            if self.auth.cookies:
                app.on_response_prepare.append(self.cookie)
        return app

    def caller(self, request: web.Request) -> tuple[bool, str | None]:
        """(signed in, user) from the request's ``Authorization``; an anonymous token signs
        in no user."""
        assert self.auth is not None
        authorization = request.headers.get("Authorization", "")
        if not self.auth.bearer:
            user = self.auth.basic_user(authorization)
            return user is not None, user
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or token not in self.tokens:
            return False, None
        return True, self.tokens[token]

    @web.middleware
    async def guard(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """The sign-in :class:`Auth` asks for, before every ``/v2/`` answer; a refusal is
        recorded like any request."""
        assert self.auth is not None
        if not request.path.startswith("/v2/"):
            return await handler(request)
        name = request.match_info.get("name")
        scope = f"repository:{name}:pull" if name else None
        signed_in, user = self.caller(request)
        if signed_in and (name is None or self.auth.may_read(user, name)):
            return await handler(request)
        self.record(request)
        if signed_in and not self.auth.bearer:
            body = {"errors": [{"code": "DENIED", "message": "requested access is denied"}]}
            return web.json_response(body, status=403)
        body = {"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]}
        return web.json_response(body, status=401, headers=self.auth.challenge(request, scope))

    async def token(self, request: web.Request) -> web.Response:
        """The token realm: a token for the Basic user asking, or an anonymous one."""
        assert self.auth is not None
        authorization = request.headers.get("Authorization")
        user = self.auth.basic_user(authorization or "")
        if authorization is not None and user is None:
            return web.json_response({"details": "bad credentials"}, status=401)
        self.token_requests.append((request.query.get("scope", ""), user))
        self.token_times.append(asyncio.get_running_loop().time())
        token = secrets.token_hex(8)
        self.tokens[token] = user
        return web.json_response({"token": token, "expires_in": 300})

    async def cookie(self, request: web.Request, response: web.StreamResponse) -> None:
        """``Set-Cookie`` naming whom the answer is for (:attr:`Auth.cookies`)."""
        _, user = self.caller(request)
        who = user or ("invalid" if "Authorization" in request.headers else "anon")
        response.headers.add("Set-Cookie", f"session={who}-{len(self.cookies)}")
        self.cookies.append(who)

    async def stored(self, request: web.Request) -> web.Response:
        """Blob storage: the content of the digest the path ends with, to anyone."""
        self.record(request)
        digest = request.path.rpartition("/")[2]
        body = _CONTENT.get(digest)
        if body is None:
            return _unknown("BLOB_UNKNOWN", digest)
        return web.Response(body=body, content_type="application/octet-stream")

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
        self.seen.append(
            Seen(request.method, request.path, loop.time(), headers, request.query_string)
        )

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
        if self.blobs_at is not None:
            location = f"{self.blobs_at}{request.path}?signed=1"
            return web.Response(status=307, headers={"Location": location, **extra})
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
