"""Hosts kuik owns (``paced: false``) take every method; blob ranges pass (§4.1)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from kuikproxy.app import build_app
from kuikproxy.config import parse_config

pytestmark = pytest.mark.looptime

HOST = "dest.test:5000"
DIGEST = "sha256:" + "d" * 64
BLOB = bytes(range(256)) * 4


# Not tests/upstream_app.py's Registry: that one is a read-only, content-addressed registry;
# this destination takes writes (uploads, manifests) and records their bodies, takes them
# under the placeholder digests the tests send without checking, and serves ranges of a blob
# under such a digest — what a proxy passing writes through must carry untouched.
def destination() -> tuple[web.Application, list[tuple[str, str, bytes]]]:
    """A destination registry that takes uploads the way distribution does."""
    seen: list[tuple[str, str, bytes]] = []

    async def start_upload(request: web.Request) -> web.Response:
        seen.append((request.method, request.path_qs, await request.read()))
        location = f"/v2/{request.match_info['name']}/blobs/uploads/u-1?_state=abc"
        return web.Response(status=202, headers={"Location": location})

    async def finish_upload(request: web.Request) -> web.Response:
        seen.append((request.method, request.path_qs, await request.read()))
        location = f"/v2/{request.match_info['name']}/blobs/{request.query['digest']}"
        return web.Response(status=201, headers={"Location": location})

    async def put_manifest(request: web.Request) -> web.Response:
        seen.append((request.method, request.path_qs, await request.read()))
        return web.Response(status=201)

    async def blob(request: web.Request) -> web.Response:
        seen.append((request.method, request.path_qs, b""))
        first, _, last = (
            request.headers.get("Range", "bytes=0-").removeprefix("bytes=").partition("-")
        )
        start, end = int(first), int(last) if last else len(BLOB) - 1
        status = 206 if "Range" in request.headers else 200
        headers = {"Content-Range": f"bytes {start}-{end}/{len(BLOB)}"} if status == 206 else {}
        return web.Response(status=status, body=BLOB[start : end + 1], headers=headers)

    app = web.Application()
    app.router.add_post("/v2/{name:.+}/blobs/uploads/", start_upload)
    app.router.add_put("/v2/{name:.+}/blobs/uploads/{uuid}", finish_upload)
    app.router.add_put("/v2/{name:.+}/manifests/{reference}", put_manifest)
    app.router.add_get("/v2/{name:.+}/blobs/{digest}", blob)
    return app, seen


@pytest.fixture
async def through(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    aiohttp_client: Callable[..., Awaitable[TestClient[Any, Any]]],
) -> tuple[TestClient[Any, Any], list[tuple[str, str, bytes]]]:
    app, seen = destination()
    server = await aiohttp_server(app)
    text = (
        f"registries:\n  {HOST}:\n    upstream: http://127.0.0.1:{server.port}\n    paced: false\n"
    )
    client = await aiohttp_client(build_app(parse_config(text)))
    return client, seen


async def test_s4_1_writes_pass_through_to_an_unpaced_host_with_locations_pointed_back(
    through: tuple[TestClient[Any, Any], list[tuple[str, str, bytes]]],
) -> None:
    """A push to a ``paced: false`` host goes through with its body; the upload ``Location`` a
    client must follow names the host again the way the client did (path prefix or ``ns``)."""
    client, seen = through
    started = await client.post("/v2/dest.test-5000/mirror/app/blobs/uploads/")
    assert started.status == 202
    assert (
        started.headers["Location"] == "/v2/dest.test-5000/mirror/app/blobs/uploads/u-1?_state=abc"
    )
    finished = await client.put(
        started.headers["Location"] + f"&digest={DIGEST}", data=b"layer bytes"
    )
    assert finished.status == 201
    by_ns = await client.post(f"/v2/mirror/app/blobs/uploads/?ns={HOST}")
    location = by_ns.headers["Location"]
    assert location == "/v2/mirror/app/blobs/uploads/u-1?_state=abc&ns=dest.test:5000"
    manifest = await client.put(
        "/v2/dest.test-5000/mirror/app/manifests/v1",
        data=b'{"schemaVersion":2}',
        headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"},
    )
    assert manifest.status == 201
    assert [(m, body) for m, _, body in seen] == [
        ("POST", b""),
        ("PUT", b"layer bytes"),
        ("POST", b""),
        ("PUT", b'{"schemaVersion":2}'),
    ]
    assert seen[1][1] == f"/v2/mirror/app/blobs/uploads/u-1?_state=abc&digest={DIGEST}"


async def test_s4_1_writes_to_a_paced_host_are_unsupported(
    aiohttp_client: Callable[..., Awaitable[TestClient[Any, Any]]],
) -> None:
    """On a paced host every write is 405 UNSUPPORTED, before any connection."""
    text = "registries:\n  registry.test:\n    upstream: http://127.0.0.1:9\n"
    client = await aiohttp_client(build_app(parse_config(text)))
    response = await client.put("/v2/registry.test/app/manifests/v1", data=b"{}")
    assert response.status == 405
    assert (await response.json())["errors"][0]["code"] == "UNSUPPORTED"


async def test_blob_range_requests_pass_through(
    through: tuple[TestClient[Any, Any], list[tuple[str, str, bytes]]],
) -> None:
    """A ``Range`` request for a blob reaches the registry and its 206 comes back whole."""
    client, _ = through
    response = await client.get(
        f"/v2/dest.test-5000/mirror/app/blobs/{DIGEST}", headers={"Range": "bytes=10-19"}
    )
    assert response.status == 206
    assert response.headers["Content-Range"] == f"bytes 10-19/{len(BLOB)}"
    assert await response.read() == BLOB[10:20]
