"""A ``Range`` read of a blob is its client's alone (R2): it is relayed as the registry sends it,
however large, and never given to a request for the whole blob that comes while it is under
way. The registry here honours ``Range``, as distribution does (the suite's recording registry
always sends the whole blob)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from kuikproxy.app import build_app
from kuikproxy.config import parse_config

BLOB = bytes(range(256)) * 1024  # 256 KiB: more than a whole answer may hold
DIGEST = "sha256:" + hashlib.sha256(BLOB).hexdigest()
MANIFEST = b'{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json"}'
NODE = {"Kuik-Resource": "node"}
URL = f"/v2/app/blobs/{DIGEST}?ns=registry.test"

Client = TestClient[Any, Any]


class RangedRegistry:
    """Manifests, and one blob served whole or by ``Range``; ``hold`` keeps blob answers back
    until released, and ``seen`` is each blob read's ``Range`` (None: the whole)."""

    def __init__(self) -> None:
        self.seen: list[str | None] = []
        self.hold = asyncio.Event()
        self.hold.set()
        self.arrived = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v2/{name:.+}/manifests/{ref}", self.manifest)
        app.router.add_get("/v2/{name:.+}/blobs/{digest}", self.blob)
        return app

    async def manifest(self, request: web.Request) -> web.Response:
        kind = "application/vnd.oci.image.manifest.v1+json"
        digest = "sha256:" + hashlib.sha256(MANIFEST).hexdigest()
        return web.Response(
            body=MANIFEST, headers={"Content-Type": kind, "Docker-Content-Digest": digest}
        )

    async def blob(self, request: web.Request) -> web.Response:
        wanted = request.headers.get("Range")
        self.seen.append(wanted)
        self.arrived.set()
        await self.hold.wait()
        if wanted is None:
            return web.Response(body=BLOB, headers={"Docker-Content-Digest": DIGEST})
        start, _, end = wanted.removeprefix("bytes=").partition("-")
        first, last = int(start), int(end) if end else len(BLOB) - 1
        return web.Response(
            status=206,
            body=BLOB[first : last + 1],
            headers={
                "Content-Range": f"bytes {first}-{last}/{len(BLOB)}",
                "Docker-Content-Digest": DIGEST,
            },
        )


@pytest.fixture
async def ranged(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    aiohttp_client: Callable[..., Awaitable[Client]],
) -> tuple[RangedRegistry, Client]:
    registry = RangedRegistry()
    server = await aiohttp_server(registry.app())
    config = parse_config(
        f"registries:\n  registry.test:\n    upstream: http://127.0.0.1:{server.port}\n"
        "    copy: {interval: 100ms, idle: 0s}\n"
    )
    client = await aiohttp_client(build_app(config), server_kwargs={"handler_cancellation": True})
    opened = await client.get("/v2/app/manifests/v1?ns=registry.test", headers=NODE)
    assert opened.status == 200  # the copy is open: blobs follow it up (P9)
    return registry, client


async def test_a_range_of_a_blob_is_relayed_however_large(
    ranged: tuple[RangedRegistry, Client],
) -> None:
    registry, client = ranged
    answer = await client.get(URL, headers={**NODE, "Range": "bytes=100-"})
    assert (answer.status, await answer.read()) == (206, BLOB[100:])
    assert answer.headers["Content-Range"] == f"bytes 100-{len(BLOB) - 1}/{len(BLOB)}"
    assert registry.seen == ["bytes=100-"]


async def test_a_whole_blob_asked_for_while_a_range_of_it_is_read_is_read_whole(
    ranged: tuple[RangedRegistry, Client],
) -> None:
    registry, client = ranged
    registry.hold.clear()
    part = asyncio.ensure_future(client.get(URL, headers={**NODE, "Range": "bytes=0-9"}))
    await registry.arrived.wait()
    registry.arrived.clear()
    whole = asyncio.ensure_future(client.get(URL, headers=NODE))
    async with asyncio.timeout(10):  # it does not wait for the part: it reads for itself
        await registry.arrived.wait()
    registry.hold.set()
    part_answer, whole_answer = await part, await whole
    assert (part_answer.status, await part_answer.read()) == (206, BLOB[:10])
    assert (whole_answer.status, await whole_answer.read()) == (200, BLOB)
    assert registry.seen == ["bytes=0-9", None]


async def test_r3_a_head_of_a_blob_whose_get_is_in_flight_is_answered_from_it(
    ranged: tuple[RangedRegistry, Client],
) -> None:
    """A GET's answer serves a HEAD (R3), from memory too: a HEAD that comes while the GET of
    its blob is in flight gets that answer's headers (its length, its digest) and no body, and
    the registry is read once."""
    registry, client = ranged
    registry.hold.clear()
    whole = asyncio.ensure_future(client.get(URL, headers=NODE))
    await registry.arrived.wait()
    head = asyncio.ensure_future(client.head(URL, headers=NODE))
    await asyncio.sleep(0.05)  # it is in flight with the GET (nothing else to wait on)
    registry.hold.set()
    head_answer, whole_answer = await head, await whole
    assert (whole_answer.status, await whole_answer.read()) == (200, BLOB)
    assert head_answer.status == 200
    assert head_answer.headers["Content-Length"] == str(len(BLOB))
    assert head_answer.headers["Docker-Content-Digest"] == DIGEST
    assert await head_answer.read() == b""
    assert registry.seen == [None]
