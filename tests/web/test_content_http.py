"""Content addressing: what a registry answers by digest is that digest's content, or nothing.

The registry here lies in one way per case — a body that is not its digest's, a
``Docker-Content-Digest`` that is not its body's, an encoding kuikproxy did not ask for — and
each case says what the client gets: a ``502`` before a byte of a manifest is served, a broken
connection at the end of a blob (never a clean end), a tag's answer under its body's true
digest. Nothing that failed a check is kept or given to another resource.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from kuikproxy.upstream.detached import DETACH_MIN, READ_SIZE
from tests.certs import self_signed
from tests.upstream_app import MANIFEST_TYPE, digest_of

pytestmark = pytest.mark.looptime

HOST = "registry.test"
GOOD = b'{"schemaVersion":2,"mediaType":"' + MANIFEST_TYPE.encode() + b'","layers":[]}'
GOOD_DIGEST = digest_of(GOOD)
EVIL = GOOD.replace(b"[]", b'[{"evil":1}]')
EVIL_DIGEST = digest_of(EVIL)
GOOD512 = "sha512:" + hashlib.sha512(GOOD).hexdigest()
BLOB = b"layer" * 1000
BLOB_DIGEST = digest_of(BLOB)
BIG = bytes(range(256)) * (12 * 1024)  # 3 MiB: hashed in batches off the loop
BIG_DIGEST = digest_of(BIG)

Client = TestClient[Any, Any]


@dataclass
class Lie:
    """How the registry answers one path: the body, the digest it announces, extra headers."""

    body: bytes
    digest: str | None
    headers: dict[str, str] = field(default_factory=dict)
    # announce twice the body, send the body, then break the connection off (cut) or wait for
    # the test to let go (stall)
    cut: bool = False
    stall: bool = False


# Not tests/upstream_app.py's Registry: that one is content-addressed (what it serves by digest
# is that digest's content, and it says so); this one's whole job is to lie about it, one lie
# per path, which would turn the shared registry's every answer into a special case.
@dataclass
class LyingRegistry:
    lies: dict[str, Lie] = field(default_factory=dict)  # reference → answer
    seen: list[tuple[str, str, str | None]] = field(default_factory=list)
    transports: list[asyncio.BaseTransport | None] = field(default_factory=list)
    let_go: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/v2/{name:.+}/{route:manifests|blobs}/{reference}", self.serve)
        return app

    async def serve(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((request.method, request.path, request.headers.get("Accept-Encoding")))
        self.transports.append(request.transport)
        lie = self.lies[request.match_info["reference"]]
        headers = {"Content-Type": MANIFEST_TYPE, **lie.headers}
        if lie.digest is not None:
            headers["Docker-Content-Digest"] = lie.digest
        if request.match_info["route"] == "blobs":
            headers["Content-Type"] = "application/octet-stream"
        response = web.StreamResponse(headers=headers)
        response.content_length = len(lie.body) * (2 if lie.cut or lie.stall else 1)
        await response.prepare(request)
        if request.method == "GET":
            await response.write(lie.body)
        if lie.cut and request.transport is not None:
            request.transport.abort()
        if lie.stall:
            await self.let_go.wait()
            raise ConnectionResetError  # never the rest: its client has left
        await response.write_eof()
        return response


@dataclass(frozen=True)
class Case:
    """A read (``method``, ``path`` under the repository) of a registry that answers ``lie``;
    the client gets ``status`` (None: the connection is broken off after the body), and the
    ``Docker-Content-Digest`` ``digest`` when it gets a 200."""

    id: str
    method: str
    path: str
    reference: str
    lie: Lie
    status: int | None
    digest: str | None = None
    headers: tuple[tuple[str, str], ...] = ()


CASES = [
    Case("manifest-by-digest-other-body", "GET", "manifests", GOOD_DIGEST,
         Lie(EVIL, GOOD_DIGEST), 502),
    Case("manifest-by-digest-other-body-no-header", "GET", "manifests", GOOD_DIGEST,
         Lie(EVIL, None), 502),
    Case("manifest-by-digest-announces-other", "GET", "manifests", GOOD_DIGEST,
         Lie(GOOD, EVIL_DIGEST), 502),
    Case("manifest-head-by-digest-announces-other", "HEAD", "manifests", GOOD_DIGEST,
         Lie(GOOD, EVIL_DIGEST), 502),
    Case("manifest-by-digest-as-check", "GET", "manifests", GOOD_DIGEST,
         Lie(EVIL, GOOD_DIGEST), 502, headers=(("Kuik-Operation", "check"),)),
    Case("manifest-by-sha512-other-body", "GET", "manifests", GOOD512,
         Lie(EVIL, GOOD512), 502),
    Case("manifest-gzip-encoded", "GET", "manifests", "v1",
         Lie(GOOD, GOOD_DIGEST, {"Content-Encoding": "gzip"}), 502),
    Case("manifest-by-digest-gzip-encoded", "GET", "manifests", GOOD_DIGEST,
         Lie(GOOD, GOOD_DIGEST, {"Content-Encoding": "gzip"}), 502),
    Case("tag-announces-other-digest", "GET", "manifests", "v1",
         Lie(GOOD, EVIL_DIGEST), 200, GOOD_DIGEST),
    Case("tag-announces-no-digest", "GET", "manifests", "v1", Lie(GOOD, None), 200, GOOD_DIGEST),
    Case("tag-announces-malformed-digest", "GET", "manifests", "v1",
         Lie(GOOD, "sha256:zzz"), 200, GOOD_DIGEST),
    Case("tag-check-announces-other-digest", "GET", "manifests", "v1",
         Lie(GOOD, EVIL_DIGEST), 200, GOOD_DIGEST, (("Kuik-Operation", "check"),)),
    Case("blob-other-content", "GET", "blobs", BLOB_DIGEST, Lie(b"x" * 5000, BLOB_DIGEST), None),
    Case("blob-head-announces-other", "HEAD", "blobs", BLOB_DIGEST, Lie(BLOB, EVIL_DIGEST), 502),
    Case("blob-announces-other", "GET", "blobs", BLOB_DIGEST, Lie(BLOB, EVIL_DIGEST), 502),
    # controls: honest answers go through untouched
    Case("manifest-by-digest-honest", "GET", "manifests", GOOD_DIGEST,
         Lie(GOOD, GOOD_DIGEST), 200, GOOD_DIGEST),
    Case("manifest-by-sha512-honest", "GET", "manifests", GOOD512, Lie(GOOD, GOOD512), 200,
         GOOD512),
    Case("blob-honest", "GET", "blobs", BLOB_DIGEST, Lie(BLOB, BLOB_DIGEST), 200, BLOB_DIGEST),
    Case("big-blob-other-content", "GET", "blobs", BIG_DIGEST,
         Lie(BIG[:-1] + b"x", BIG_DIGEST), None),
    Case("big-blob-honest", "GET", "blobs", BIG_DIGEST, Lie(BIG, BIG_DIGEST), 200, BIG_DIGEST),
]  # fmt: skip


Start = Callable[..., Awaitable[tuple[Client, LyingRegistry]]]


async def serve_lying(
    aiohttp_server: Callable[..., Awaitable[TestServer]], tls: Path | None
) -> tuple[LyingRegistry, str]:
    """A :class:`LyingRegistry` on 127.0.0.1 (over TLS with a certificate written in ``tls``),
    and the lines of its registry block that say where it is and how to trust it."""
    fake = LyingRegistry()
    scheme, trust, context = "http", "", None
    if tls is not None:
        cert, key = self_signed(tls)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        scheme, trust = "https", f"    tls: {{caFile: {cert}}}\n"
    server = await aiohttp_server(fake.app(), ssl=context)
    return fake, f"    upstream: {scheme}://127.0.0.1:{server.port}\n{trust}"


@pytest.fixture
def start(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    aiohttp_client: Callable[..., Awaitable[Client]],
) -> Start:
    """kuikproxy before a lying registry, started in the test's own (virtual-time) loop."""

    async def run(
        idle: str = "0s", tls: Path | None = None, timeout: str = "0s"
    ) -> tuple[Client, LyingRegistry]:
        """``tls``: a directory to write a certificate in; the registry serves TLS with it.
        ``timeout``: the copies' ``copy.timeout``."""
        fake, upstream = await serve_lying(aiohttp_server, tls)
        config = parse_config(
            f"registries:\n  {HOST}:\n{upstream}    check: {{interval: 200ms}}\n"
            f"    copy: {{interval: 200ms, idle: {idle}, timeout: {timeout}}}\n"
        )
        app = build_app(config)
        return await aiohttp_client(app, server_kwargs={"handler_cancellation": True}), fake

    return run


async def read(client: Client, case: Case, resource: str) -> tuple[int | None, Any, bytes]:
    headers = {"Kuik-Resource": resource, "Accept-Encoding": "gzip", **dict(case.headers)}
    url = f"/v2/app/{case.path}/{case.reference}?ns={HOST}"
    try:
        async with client.request(case.method, url, headers=headers) as response:
            return response.status, response.headers, await response.read()
    except aiohttp.ClientPayloadError:  # broken off: the client knows the body is not whole
        return None, None, b""


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
async def test_content_is_what_its_digest_says_or_it_is_not_served(
    start: Start, case: Case
) -> None:
    """Each lie gets its documented answer; a second resource asking afterwards is never
    given what failed a check (it gets the same verdict, from a read of its own); a 502 says
    why in an OCI error body; manifests are always asked for unencoded."""
    client, fake = await start()
    fake.lies[case.reference] = case.lie
    for resource in ("r1", "r2"):
        status, headers, body = await read(client, case, resource)
        assert status == case.status, resource
        if status == 502 and case.method == "GET":
            error = json.loads(body)["errors"][0]
            assert error["code"] == "UNAVAILABLE"
            assert "content" in error["message"] or "Content-Encoding" in error["message"]
        if status == 200:
            assert headers["Docker-Content-Digest"] == case.digest
            if case.method == "GET":
                assert digest_of(body) == case.digest or case.digest == GOOD512
                assert headers["Content-Length"] == str(len(body))
    if case.path == "manifests":
        assert {encoding for _, _, encoding in fake.seen} == {"identity"}


async def test_r3_a_head_served_from_a_kept_tag_read_carries_the_bodys_digest_and_length(
    start: Start,
) -> None:
    """A tag read is kept under its body's digest: a check by another resource, answered from
    the kept answer, carries that digest and the body's exact length, not what the registry
    announced."""
    client, fake = await start()
    fake.lies["v1"] = Lie(GOOD, EVIL_DIGEST, {"Content-Length": "1"})
    check = Case(
        "", "GET", "manifests", "v1", fake.lies["v1"], 200, headers=(("Kuik-Operation", "check"),)
    )
    assert (await read(client, check, "r1"))[0] == 200
    reads = len(fake.seen)
    head = Case("", "HEAD", "manifests", "v1", fake.lies["v1"], 200)
    status, headers, _ = await read(client, head, "r2")
    assert status == 200 and len(fake.seen) == reads  # R1: from the kept answer
    assert headers["Docker-Content-Digest"] == GOOD_DIGEST
    assert headers["Content-Length"] == str(len(GOOD))


async def test_a_manifest_by_digest_inside_an_open_copy_is_checked_before_it_is_served(
    start: Start,
) -> None:
    """A copy's child read by digest goes without a window (P9) and is streamed, not read for
    a window: it is checked all the same, and a lie is a 502, not a relayed body."""
    client, fake = await start(idle="5s")
    fake.lies["v1"] = Lie(GOOD, GOOD_DIGEST)
    fake.lies[GOOD_DIGEST] = Lie(EVIL, GOOD_DIGEST)
    tag = Case("", "GET", "manifests", "v1", fake.lies["v1"], 200)
    child = Case("", "GET", "manifests", GOOD_DIGEST, fake.lies[GOOD_DIGEST], 502)
    assert (await read(client, tag, "node"))[0] == 200
    started = asyncio.get_running_loop().time()
    assert (await read(client, child, "node"))[0] == 502
    assert asyncio.get_running_loop().time() - started < 0.2  # in the copy: no window


def blob_of(size: int) -> bytes:
    return (bytes(range(256)) * (size // 256 + 1))[:size]


def flipped(body: bytes, at: int) -> bytes:
    changed = bytearray(body)
    changed[at] ^= 1
    return bytes(changed)


@pytest.mark.parametrize(
    "size",
    [1, DETACH_MIN - 1, DETACH_MIN, DETACH_MIN + 1, 2 * READ_SIZE, 3 * 2**20 + 7],
)
@pytest.mark.parametrize("wrong", [None, 0, -1], ids=["honest", "first-byte", "last-byte"])
@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_a_blob_of_any_size_is_served_whole_or_broken_off(
    start: Start, tmp_path: Path, size: int, wrong: int | None, tls: bool
) -> None:
    """Whatever its size (one read or many; through the loop, or off the socket in a thread
    of its own past DETACH_MIN) and whether the registry speaks TLS, a blob is served whole
    when it is its digest's content and broken off otherwise, however little of it differs:
    its first byte or its last."""
    body = blob_of(size)
    digest = digest_of(body)
    client, fake = await start(tls=tmp_path if tls else None)
    served = body if wrong is None else flipped(body, wrong)
    fake.lies[digest] = Lie(served, digest)
    status, headers, got = await read(client, Case("", "GET", "blobs", digest, fake.lies[digest],
                                                   None), "r1")  # fmt: skip
    if wrong is None:
        assert (status, got) == (200, body)
        assert headers["Content-Length"] == str(size)
    else:
        assert status is None


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
async def test_a_registry_that_breaks_off_mid_blob_breaks_the_client_off(
    start: Start, tmp_path: Path, tls: bool
) -> None:
    """A blob relayed in a thread whose registry breaks off: the client's answer is broken
    off too (never a clean end), and the next read of the blob is served whole."""
    body = blob_of(4 * READ_SIZE)
    digest = digest_of(body)
    client, fake = await start(tls=tmp_path if tls else None)
    fake.lies[digest] = Lie(body[: len(body) // 2], digest, cut=True)
    case = Case("", "GET", "blobs", digest, fake.lies[digest], None)
    assert (await read(client, case, "r1"))[0] is None
    fake.lies[digest] = Lie(body, digest)
    assert (await read(client, case, "r2"))[:1] == (200,)
