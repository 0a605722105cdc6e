"""A registry that wants tokens, for the auth tests: an aiohttp app serving ``/v2/`` and
manifests behind Bearer (or Basic) challenges, with its own token realm at ``/token``.

``public/*`` is readable anonymously (with an anonymous token); ``private/*`` only with a token
issued to ``alice``. Every request is recorded with the Authorization it carried, and every
token request with the loop time it arrived at.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
from dataclasses import dataclass, field

from aiohttp import web

from tests.upstream_app import MANIFEST_TYPE, digest_of, manifest_of

USERS = {"alice": "s3cret"}


@dataclass
class TokenRegistry:
    scheme: str = "bearer"  # or "basic"
    seen: list[tuple[str, str, str | None]] = field(default_factory=list)  # method, path, auth
    tokens: dict[str, str | None] = field(default_factory=dict)  # token → user (None: anonymous)
    token_requests: list[tuple[str, str | None]] = field(default_factory=list)  # scope, user
    token_times: list[float] = field(default_factory=list)  # when each token request came
    port: int = 0
    storage_port: int = 0  # where blobs redirect to (another origin), 0: no redirect

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/token", self.token)
        app.router.add_get("/v2/", self.ping)
        app.router.add_route("*", "/v2/{name:.+}/manifests/{reference}", self.manifest)
        app.router.add_route("*", "/v2/{name:.+}/blobs/{digest}", self.blob)
        return app

    def _user(self, request: web.Request) -> tuple[bool, str | None]:
        """(signed in, user) from the request's Authorization."""
        auth = request.headers.get("Authorization", "")
        if self.scheme == "basic":
            user = _basic_user(auth)
            return user is not None, user
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or token not in self.tokens:
            return False, None
        return True, self.tokens[token]

    def challenge(self, scope: str | None) -> dict[str, str]:
        if self.scheme == "basic":
            return {"WWW-Authenticate": 'Basic realm="test"'}
        realm = f'Bearer realm="http://127.0.0.1:{self.port}/token",service="token.test"'
        return {"WWW-Authenticate": realm + (f',scope="{scope}"' if scope else "")}

    async def token(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization")
        user = _basic_user(auth or "")
        if auth is not None and user is None:
            return web.json_response({"details": "bad credentials"}, status=401)
        self.token_requests.append((request.query.get("scope", ""), user))
        self.token_times.append(asyncio.get_running_loop().time())
        token = secrets.token_hex(8)
        self.tokens[token] = user
        return web.json_response({"token": token, "expires_in": 300})

    async def ping(self, request: web.Request) -> web.Response:
        self.seen.append((request.method, request.path, request.headers.get("Authorization")))
        signed_in, _ = self._user(request)
        if not signed_in:
            return web.json_response({}, status=401, headers=self.challenge(None))
        return web.json_response({})

    async def manifest(self, request: web.Request) -> web.Response:
        self.seen.append((request.method, request.path, request.headers.get("Authorization")))
        name, reference = request.match_info["name"], request.match_info["reference"]
        scope = f"repository:{name}:pull"
        signed_in, user = self._user(request)
        if not signed_in or (name.startswith("private/") and user != "alice"):
            errors = {"errors": [{"code": "UNAUTHORIZED", "message": "authentication required"}]}
            return web.json_response(errors, status=401, headers=self.challenge(scope))
        body = manifest_of(name, reference)
        headers = {"Content-Type": MANIFEST_TYPE, "Docker-Content-Digest": digest_of(body)}
        if request.method == "HEAD":
            return web.Response(headers={**headers, "Content-Length": str(len(body))})
        return web.Response(body=body, headers=headers)

    async def blob(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.method, request.path, request.headers.get("Authorization")))
        signed_in, _ = self._user(request)
        if not signed_in:
            return web.json_response({}, status=401, headers=self.challenge(None))
        location = f"http://127.0.0.1:{self.storage_port}/storage{request.path}?signed=1"
        raise web.HTTPTemporaryRedirect(location)


def _basic_user(auth: str) -> str | None:
    scheme, _, value = auth.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, _, password = base64.b64decode(value).decode().partition(":")
    except ValueError:
        return None
    return user if USERS.get(user) == password else None


def storage_app(seen: list[tuple[str, str, str | None]]) -> web.Application:
    """Blob storage on another origin: answers any path, records the Authorization it got."""

    async def serve(request: web.Request) -> web.Response:
        seen.append((request.method, request.path, request.headers.get("Authorization")))
        return web.Response(body=b"layer-bytes", content_type="application/octet-stream")

    app = web.Application()
    app.router.add_get("/{tail:.*}", serve)
    return app
