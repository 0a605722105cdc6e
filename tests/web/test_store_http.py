"""The pull-through store over HTTP (§15): one registry read per blob whoever asks, content by
digest from the disk without a window, R5 for what the store holds, stale manifests while a
registry cannot be asked, and manifests kept across a restart."""

from __future__ import annotations

import asyncio
import base64
import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from kuikproxy.app import build_app
from kuikproxy.blobs import disk
from kuikproxy.config import parse_config
from tests.certs import self_signed
from tests.conftest import HOST, ProxyFactory
from tests.upstream_app import (
    _CONTENT,
    MANIFEST_TYPE,
    Auth,
    Registry,
    blob_of,
    digest_of,
    manifest_of,
)

pytestmark = pytest.mark.looptime

Client = TestClient[Any, Any]
BLOB = bytes(range(256)) * 4096  # 1 MiB
BLOB_DIGEST = blob_of(BLOB)
COPY = "copy: {interval: 200ms, idle: 200ms}\ncheck: {interval: 200ms}"


def store_at(path: Path, max_bytes: str = "64Mi", cache: str = "") -> str:
    return f"cache: {{{cache}blobs: {{path: {str(path)!r}, maxBytes: {max_bytes}}}}}"


def config(server: TestServer, store: Path) -> str:
    """A config of its own, for a test that starts kuikproxy itself."""
    return (
        f"{store_at(store)}\nregistries:\n  {HOST}:\n"
        f"    upstream: http://127.0.0.1:{server.port}\n    check: {{interval: 200ms}}\n"
        "    copy: {interval: 200ms, idle: 200ms}\n"
    )


def stored_files(store: Path) -> list[Path]:
    """The files of blobs in ``store``, whole or being written."""
    return [
        p
        for p in store.glob("*/**/*")
        if p.is_file() and p.relative_to(store).parts[0] in ("blobs", "tmp")
    ]


def get(client: Client, path: str, resource: str = "node", **headers: str) -> Any:
    return client.get(f"/v2/app/{path}?ns={HOST}", headers={"Kuik-Resource": resource, **headers})


def signed(client: Client, path: str, user: str) -> Any:
    """A GET of ``/v2/<path>`` as ``user`` (Basic, the password its first letter), a resource
    of its own."""
    authorization = "Basic " + base64.b64encode(f"{user}:{user[0]}".encode()).decode()
    return client.get(
        f"/v2/{path}?ns={HOST}", headers={"Kuik-Resource": user, "Authorization": authorization}
    )


async def test_ten_clients_of_one_blob_cost_the_registry_one_read(
    proxy: ProxyFactory, registry: tuple[Registry, TestServer], tmp_path: Path
) -> None:
    """Ten resources ask for one blob at once: one registry read, every client gets it whole
    and right; an eleventh later gets it from the disk, at once, without a window."""
    fake, _ = registry
    client = await proxy(COPY, top=store_at(tmp_path))
    loop = asyncio.get_running_loop()

    async def pull(resource: str) -> bytes:
        response = await get(client, f"blobs/{BLOB_DIGEST}", resource)
        assert response.status == 200
        assert response.headers["Docker-Content-Digest"] == BLOB_DIGEST
        return await response.read()

    bodies = await asyncio.gather(*(pull(f"node-{n}") for n in range(10)))
    assert all(body == BLOB for body in bodies)
    assert len(fake.reads("blobs")) == 1
    start = loop.time()
    assert await pull("node-late") == BLOB
    assert loop.time() - start < 0.1  # no window
    head = await client.head(
        f"/v2/app/blobs/{BLOB_DIGEST}?ns={HOST}", headers={"Kuik-Resource": "other"}
    )
    assert head.status == 200
    assert head.headers["Content-Length"] == str(len(BLOB))
    assert head.headers["Docker-Content-Digest"] == BLOB_DIGEST
    assert len(fake.reads("blobs")) == 1
    status = await (await client.get("/status")).json()
    store = status["cache"]["store"]
    assert store["blobs"] >= 1 and store["reads"]["registry"] == 1
    assert store["reads"]["shared"] == 9 and store["reads"]["store"] == 2
    assert store["servedBytes"]["store"] == len(BLOB)  # the HEAD sent none
    assert store["servedBytes"]["shared"] + store["servedBytes"]["registry"] == 10 * len(BLOB)
    text = await (await client.get("/metrics")).text()
    samples = {
        (s.name, s.labels.get("source")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples["kuik_proxy_cache_bytes_total", "store"] == len(BLOB)
    assert samples["kuik_proxy_cache_reads_total", "shared"] == 9
    assert samples["kuik_proxy_store_blobs", None] == 1
    page = await (await client.get("/")).text()
    assert "saved the registries</span> 91%" in page  # all but the one registry read


@pytest.mark.parametrize(
    "case",
    [
        ("bytes=10-19", 206, (10, 20)),
        ("bytes=-5", 206, (len(BLOB) - 5, len(BLOB))),
        (f"bytes={len(BLOB) - 3}-", 206, (len(BLOB) - 3, len(BLOB))),
        ("bytes=0-", 200, (0, len(BLOB))),
        ("bytes=1-2,5-6", 200, (0, len(BLOB))),  # several ranges: the whole (RFC 9110)
        (f"bytes={len(BLOB)}-", 416, None),
        ("bytes=²-", 200, (0, len(BLOB))),  # a digit to str.isdigit, not to int()
        ("bytes=0-" + "9" * 5000, 200, (0, len(BLOB))),  # past int()'s 4,300 digits
        ("bytes=" + "9" * 5000 + "-", 416, None),
    ],
)
async def test_ranges_are_served_from_the_store(
    proxy: ProxyFactory,
    registry: tuple[Registry, TestServer],
    tmp_path: Path,
    case: tuple[str, int, tuple[int, int] | None],
) -> None:
    asked, status, span = case
    fake, _ = registry
    client = await proxy(COPY, top=store_at(tmp_path))
    assert await (await get(client, f"blobs/{BLOB_DIGEST}")).read() == BLOB
    response = await get(client, f"blobs/{BLOB_DIGEST}", Range=asked)
    assert response.status == status
    body = await response.read()
    if span is None:
        assert response.headers["Content-Range"] == f"bytes */{len(BLOB)}"
    else:
        assert body == BLOB[span[0] : span[1]]
    if status == 206:
        assert span is not None
        assert response.headers["Content-Range"] == f"bytes {span[0]}-{span[1] - 1}/{len(BLOB)}"
    assert len(fake.reads("blobs")) == 1


async def test_a_blob_that_is_not_its_digest_is_never_stored_nor_served_whole(
    proxy: ProxyFactory, registry: tuple[Registry, TestServer], tmp_path: Path
) -> None:
    """The registry sends other bytes under a digest: every client's connection is broken off
    before the last bytes, nothing is stored, and the next client goes to the registry again."""
    fake, _ = registry
    digest = "sha256:" + "0" * 64
    _CONTENT[digest] = BLOB  # not that digest's content
    client = await proxy(COPY, top=store_at(tmp_path))

    async def pull(resource: str) -> bytes | None:
        response = await get(client, f"blobs/{digest}", resource)
        try:
            body = await response.read()
        except Exception:  # the connection broken off: the client never sees a clean end
            return None
        return body if len(body) == len(BLOB) else None

    assert await asyncio.gather(pull("a"), pull("b")) == [None, None]
    assert await pull("c") is None
    assert len(fake.reads("blobs")) == 2
    assert not list((tmp_path / "blobs").rglob("0" * 64))


async def test_r5_a_blob_read_with_a_clients_credentials_needs_proof_of_access(
    aiohttp_server: Any, aiohttp_client: Any, tmp_path: Path
) -> None:
    """A private blob read with alice's credentials is not given to bob from the store until a
    manifest of that repository was answered 200 to bob: bob's blob read goes to the registry,
    which refuses him; once the registry gave bob the repository's manifest, the store serves
    him."""
    fake = Registry(auth=Auth({"alice": "a", "bob": "b", "eve": "e"}, readers={"alice", "bob"}))
    server = await aiohttp_server(fake.app())
    client = await aiohttp_client(build_app(parse_config(config(server, tmp_path))))
    response = await signed(client, f"private/app/blobs/{BLOB_DIGEST}", "alice")
    assert response.status == 200 and await response.read() == BLOB
    response = await signed(client, f"private/app/blobs/{BLOB_DIGEST}", "eve")
    assert response.status == 403  # the registry's answer: the store gave eve nothing
    assert len(fake.reads("blobs")) == 2
    manifest = await signed(client, "private/app/manifests/v1", "bob")
    assert manifest.status == 200
    await manifest.read()
    response = await signed(client, f"private/app/blobs/{BLOB_DIGEST}", "bob")
    assert response.status == 200 and await response.read() == BLOB
    assert len(fake.reads("blobs")) == 2  # bob proved access: served from the store


async def test_r5_a_proof_opens_only_content_read_from_that_repository(
    aiohttp_server: Any, aiohttp_client: Any, tmp_path: Path
) -> None:
    """The store holds a digest once, for every repository; a proof of access to one's own
    repository (here a public one) opens nothing read from another: eve, who may read ``app``
    but not ``private/app``, names the digest of alice's private blob under ``app``. The
    registry decides (it has no such blob in ``app``), not the store."""
    fake = Registry(auth=Auth({"alice": "a", "eve": "e"}, readers={"alice"}))
    fake.fail[f"/v2/app/blobs/{BLOB_DIGEST}"] = 404
    server = await aiohttp_server(fake.app())
    client = await aiohttp_client(build_app(parse_config(config(server, tmp_path))))
    response = await signed(client, f"private/app/blobs/{BLOB_DIGEST}", "alice")
    assert response.status == 200 and await response.read() == BLOB
    manifest = await signed(client, "app/manifests/v1", "eve")
    assert manifest.status == 200
    await manifest.read()
    response = await signed(client, f"app/blobs/{BLOB_DIGEST}", "eve")
    assert response.status == 404  # the registry's answer
    assert len(fake.reads("blobs")) == 2


async def two_registries(
    aiohttp_server: Any, aiohttp_client: Any, store: Path, ours: Registry, other: Registry
) -> Client:
    """kuikproxy with a store before ``ours`` (``HOST``) and ``other`` (``other.test``, as a
    registry a client runs under a wildcard would be), neither paced."""
    servers = [await aiohttp_server(fake.app()) for fake in (ours, other)]
    registries = "".join(
        f"  {host}:\n    upstream: http://127.0.0.1:{server.port}\n    paced: false\n"
        for host, server in zip((HOST, "other.test"), servers, strict=True)
    )
    text = f"{store_at(store)}\nregistries:\n{registries}"
    client: Client = await aiohttp_client(build_app(parse_config(text)))
    return client


async def test_a_read_under_way_from_one_registry_is_not_followed_for_another(
    aiohttp_server: Any, aiohttp_client: Any, tmp_path: Path
) -> None:
    """A blob is being read from one registry when a client names its digest on another (one
    it may run itself, under a wildcard): it is that registry's to answer, not the read under
    way's, nor does the read under way hold it back."""
    slow, other = Registry(blob_chunks=100), Registry()  # 100 chunks 10 ms apart: 1 s
    other.fail[f"/v2/app/blobs/{BLOB_DIGEST}"] = 404
    client = await two_registries(aiohttp_server, aiohttp_client, tmp_path, slow, other)

    async def pull(host: str) -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        response = await client.get(f"/v2/app/blobs/{BLOB_DIGEST}?ns={host}")
        await response.read()
        return response.status, loop.time()

    filling = asyncio.create_task(pull(HOST))
    await asyncio.sleep(0.3)
    assert await pull("other.test") == (404, pytest.approx(0.3, abs=0.05))
    assert (await filling)[0] == 200
    assert len(slow.reads("blobs")) == len(other.reads("blobs")) == 1


async def test_a_manifest_from_the_store_has_the_type_its_body_declares(
    aiohttp_server: Any, aiohttp_client: Any, tmp_path: Path
) -> None:
    """The bytes of this registry's manifest were first read from another registry, through
    its blobs route, labelled ``application/octet-stream``: the store holds them once, under
    that label. Served from the store to this registry's clients, the manifest carries the
    type its body declares, as its registry answers it, not the other registry's label."""
    ours = Registry()
    client = await two_registries(aiohttp_server, aiohttp_client, tmp_path, ours, Registry())
    body = manifest_of("app", "v1")
    digest = digest_of(body)
    planted = await client.get(f"/v2/x/blobs/{digest}?ns=other.test")
    assert planted.status == 200 and await planted.read() == body
    for _ in range(2):
        manifest = await client.get(
            f"/v2/app/manifests/{digest}?ns={HOST}", headers={"Accept": f"{MANIFEST_TYPE}, */*"}
        )
        assert manifest.status == 200 and await manifest.read() == body
        assert manifest.headers["Content-Type"] == MANIFEST_TYPE
    assert len(ours.reads()) == 1  # the second from the store


async def test_a_blob_read_whole_for_another_repository_is_then_served_from_the_store(
    proxy: ProxyFactory, registry: tuple[Registry, TestServer], tmp_path: Path
) -> None:
    """A layer stored from one repository and asked for under another (images share base
    layers) is read from the registry there once: relayed whole and checked, it is that
    repository's too, and its next clients get it from the disk."""
    fake, _ = registry
    client = await proxy(COPY, top=store_at(tmp_path))

    async def pull(repository: str, resource: str) -> bytes:
        response = await client.get(
            f"/v2/{repository}/blobs/{BLOB_DIGEST}?ns={HOST}",
            headers={"Kuik-Resource": resource},
        )
        assert response.status == 200
        return await response.read()

    assert await pull("app", "a") == BLOB
    assert await pull("base", "b") == BLOB
    assert len(fake.reads("blobs")) == 2
    assert await pull("base", "c") == BLOB
    assert await pull("app", "d") == BLOB
    assert len(fake.reads("blobs")) == 2
    assert await pull("other", "e") == BLOB
    assert len(fake.reads("blobs")) == 3


async def test_serve_stale_answers_a_tag_while_the_registry_is_unreachable(
    proxy: ProxyFactory, registry: tuple[Registry, TestServer], tmp_path: Path
) -> None:
    """Pulled once; the registry goes away; the tag is answered from the store, stale, and
    the manifest by digest and the blob come from the disk."""
    _, server = registry
    client = await proxy(
        f"{COPY}\nserveStale: true", top=store_at(tmp_path, cache="maxAge: 100ms, ")
    )
    body = manifest_of("app", "v1")
    digest = digest_of(body)
    head = await client.head(f"/v2/app/manifests/v1?ns={HOST}", headers={"Kuik-Resource": "n"})
    assert head.status == 200
    manifest = await get(client, f"manifests/{digest}", "n")
    assert await manifest.read() == body
    assert await (await get(client, f"blobs/{BLOB_DIGEST}", "n")).read() == BLOB
    await server.close()
    await asyncio.sleep(3)  # past check.followUp, and the kept answers past maxAge (R1)
    for method in ("HEAD", "GET"):
        # a node: no Kuik-Resource header (kuik's checks would need serveStale: checks)
        stale = await client.request(method, f"/v2/app/manifests/v1?ns={HOST}")
        assert stale.status == 200, await stale.text()
        assert stale.headers["Docker-Content-Digest"] == digest
        assert stale.headers["Warning"].startswith("110")
        if method == "GET":
            assert await stale.read() == body
    assert await (await get(client, f"manifests/{digest}", "fresh")).read() == body
    assert await (await get(client, f"blobs/{BLOB_DIGEST}", "fresh")).read() == BLOB


@pytest.mark.parametrize("status", [502, 503, 504, 500])
async def test_serve_stale_answers_a_tag_while_a_gateway_cannot_reach_the_registry(
    proxy: ProxyFactory, registry: tuple[Registry, TestServer], tmp_path: Path, status: int
) -> None:
    """The load balancer or CDN in front of a registry answers 502 or 504 (it cannot reach
    the registry), or the registry 503 (down for maintenance): as unreachable as no
    connection, the tag is answered stale. A 500 is the registry's own answer: relayed."""
    fake, _ = registry
    client = await proxy(
        f"{COPY}\nserveStale: true", top=store_at(tmp_path, cache="maxAge: 100ms, ")
    )
    fresh = await client.get(f"/v2/app/manifests/v1?ns={HOST}")
    assert fresh.status == 200
    await fresh.read()
    await asyncio.sleep(0.5)  # the kept answer past maxAge (R1)
    fake.fail["/v2/app/manifests/v1"] = status
    answer = await client.get(f"/v2/app/manifests/v1?ns={HOST}")
    if status == 500:
        assert answer.status == 500 and "Warning" not in answer.headers
    else:
        assert answer.status == 200 and answer.headers["Warning"].startswith("110")
        assert await answer.read() == manifest_of("app", "v1")
    assert len(fake.reads()) == 2


async def test_serve_stale_answers_a_tag_while_the_registry_blocks_kuikproxy(
    proxy: ProxyFactory, registry: tuple[Registry, TestServer], tmp_path: Path
) -> None:
    """A 429 with an hour's Retry-After blocks the host; the tag is answered stale at once,
    and the registry is not asked; a kuik check (``Kuik-Resource``) is not answered stale
    unless ``serveStale: checks``."""
    fake, _ = registry
    client = await proxy(
        "copy: {interval: 200ms, idle: 200ms}\ncheck: {interval: 200ms, maxHold: 300ms}\n"
        "serveStale: true",
        top=store_at(tmp_path, cache="maxAge: 100ms, "),
    )
    get_v1 = await client.get(f"/v2/app/manifests/v1?ns={HOST}")
    assert get_v1.status == 200
    await get_v1.read()
    fake.script = [(429, {"Retry-After": "3600"})]
    await asyncio.sleep(0.5)
    # told to stop: this one waits through the block (§11)
    blocked = asyncio.create_task(client.get(f"/v2/app/manifests/v2?ns={HOST}"))
    await asyncio.sleep(0.5)
    assert fake.seen[-1].path.endswith("/v2")
    asked = len(fake.seen)
    stale = await client.get(f"/v2/app/manifests/v1?ns={HOST}")
    assert stale.status == 200 and stale.headers["Warning"].startswith("110")
    assert await stale.read() == manifest_of("app", "v1")
    assert len(fake.seen) == asked
    check = await client.head(
        f"/v2/app/manifests/v1?ns={HOST}", headers={"Kuik-Resource": "ImageMonitor/a/b"}
    )
    assert check.status == 429  # held past maxHold through the block, as §11 says
    blocked.cancel()


async def test_a_restart_keeps_the_manifests_of_the_store(
    registry: tuple[Registry, TestServer],
    aiohttp_client: Any,
    tmp_path: Path,
) -> None:
    """Manifests read before a restart are kept answers after it (R1, with their age): a HEAD
    within maxAge is answered at once, without the registry."""
    fake, server = registry
    text = config(server, tmp_path)
    first = await aiohttp_client(build_app(parse_config(text)))
    response = await first.get(f"/v2/app/manifests/v1?ns={HOST}")
    assert response.status == 200
    await response.read()
    await first.close()
    asked = len(fake.seen)
    second = await aiohttp_client(build_app(parse_config(text)))
    head = await second.head(f"/v2/app/manifests/v1?ns={HOST}")
    assert head.status == 200
    assert head.headers["Docker-Content-Digest"] == digest_of(manifest_of("app", "v1"))
    assert head.headers["Content-Type"] == MANIFEST_TYPE
    assert len(fake.seen) == asked


async def test_a_fill_goes_on_when_the_client_that_started_it_leaves(
    proxy: ProxyFactory, registry: tuple[Registry, TestServer], tmp_path: Path
) -> None:
    """The first client reads a few bytes and hangs up: the registry's read still ends in the
    store (the bytes were paid for), and the next client gets them from the disk."""
    fake, _ = registry
    fake.blob_chunks = 16
    client = await proxy(COPY, top=store_at(tmp_path))
    response = await get(client, f"blobs/{BLOB_DIGEST}", "leaver")
    assert response.status == 200
    await response.content.readexactly(1024)
    response.close()
    await asyncio.sleep(1)
    again = await get(client, f"blobs/{BLOB_DIGEST}", "next")
    assert await again.read() == BLOB
    assert len(fake.reads("blobs")) == 1
    store = (await (await client.get("/status")).json())["cache"]["store"]
    assert store["reads"]["store"] == 1


def cut_registry(body: bytes, sent: int) -> tuple[web.Application, list[str]]:
    """A registry that announces ``body`` whole and breaks the connection after ``sent`` bytes."""
    reads: list[str] = []

    async def blob(request: web.Request) -> web.StreamResponse:
        reads.append(request.path)
        response = web.StreamResponse(headers={"Docker-Content-Digest": digest_of(body)})
        response.content_length = len(body)
        await response.prepare(request)
        await response.write(body[:sent])
        assert request.transport is not None
        request.transport.abort()
        return response

    app = web.Application()
    app.router.add_get("/v2/{name:.+}/blobs/{digest}", blob)
    return app, reads


async def test_a_read_cut_short_by_the_registry_is_never_stored_nor_ended_cleanly(
    aiohttp_server: Any, aiohttp_client: Any, tmp_path: Path
) -> None:
    """The registry breaks off in the middle: every client's connection is broken off (never a
    clean end), nothing is left in the store, and the next client asks the registry again."""
    app, reads = cut_registry(BLOB, len(BLOB) // 2)
    server = await aiohttp_server(app)
    client = await aiohttp_client(build_app(parse_config(config(server, tmp_path / "store"))))

    async def pull(resource: str) -> bool:
        response = await get(client, f"blobs/{BLOB_DIGEST}", resource)
        try:
            return await response.read() == BLOB
        except Exception:  # broken off
            return False

    assert await asyncio.gather(pull("a"), pull("b")) == [False, False]
    assert not await pull("c")
    assert len(reads) == 2
    assert not stored_files(tmp_path / "store")


async def test_shutdown_in_the_middle_of_a_fill_leaves_nothing_half_written(
    registry: tuple[Registry, TestServer], aiohttp_client: Any, tmp_path: Path
) -> None:
    fake, server = registry
    fake.blob_chunks = 64
    client = await aiohttp_client(build_app(parse_config(config(server, tmp_path))))
    response = await get(client, f"blobs/{BLOB_DIGEST}", "node")
    assert response.status == 200
    await response.content.readexactly(1024)
    await client.close()
    assert not stored_files(tmp_path)


async def test_a_flood_of_distinct_blobs_never_passes_max_bytes(
    proxy: ProxyFactory, registry: tuple[Registry, TestServer], tmp_path: Path
) -> None:
    """Twelve distinct 1 MiB blobs at once against a 3 MiB store: every client gets its blob
    right (those that do not fit stream through), and the store never holds more than 3 MiB."""
    client = await proxy(COPY, top=store_at(tmp_path, max_bytes="3Mi"))
    blobs = {blob_of(bytes([n]) * len(BLOB)): bytes([n]) * len(BLOB) for n in range(12)}
    highest = 0

    async def watch() -> None:
        nonlocal highest
        while True:
            on_disk = sum(p.stat().st_size for p in stored_files(tmp_path))
            highest = max(highest, on_disk)
            await asyncio.sleep(0.005)

    async def pull(digest: str) -> bool:
        response = await get(client, f"blobs/{digest}", digest[-8:])
        return await response.read() == blobs[digest]

    watcher = asyncio.create_task(watch())
    assert all(await asyncio.gather(*(pull(d) for d in blobs)))
    watcher.cancel()
    store = (await (await client.get("/status")).json())["cache"]["store"]
    assert store["bytes"] <= 3 * 1024**2 and store["blobs"] >= 1
    assert highest <= 3 * 1024**2


async def test_a_full_volume_lets_blobs_stream_through(
    proxy: ProxyFactory,
    registry: tuple[Registry, TestServer],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The store's volume is full (``maxBytes`` larger than it, or others filled it): blobs
    are not stored, and every client still gets its blob whole from the registry."""
    fake, _ = registry
    monkeypatch.setattr(disk, "free", lambda path: 0)
    client = await proxy(COPY, top=store_at(tmp_path))
    for resource in ("a", "b"):
        response = await get(client, f"blobs/{BLOB_DIGEST}", resource)
        assert response.status == 200 and await response.read() == BLOB
    assert len(fake.reads("blobs")) == 2
    assert stored_files(tmp_path) == []


async def test_a_client_over_tls_gets_stored_blobs_whole_and_in_ranges(
    registry: tuple[Registry, TestServer], aiohttp_server: Any, tmp_path: Path
) -> None:
    """kuikproxy's own listener on TLS (a forward proxy's interception is too): no sendfile
    there, the bytes go through the TLS writer — whole and in ranges, from a fill and from
    the disk."""
    fake, upstream = registry
    cert, key = self_signed(tmp_path)
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    app = build_app(parse_config(config(upstream, tmp_path / "store")))
    server = await aiohttp_server(app, ssl=server_tls)
    client_tls = ssl.create_default_context(cafile=str(cert))
    url = f"https://127.0.0.1:{server.port}/v2/app/blobs/{BLOB_DIGEST}?ns={HOST}"
    async with aiohttp.ClientSession() as session:

        async def fetch(resource: str, **headers: str) -> tuple[int, bytes]:
            async with session.get(
                url, ssl=client_tls, headers={"Kuik-Resource": resource, **headers}
            ) as response:
                return response.status, await response.read()

        first = await asyncio.gather(fetch("a"), fetch("b"))
        assert first == [(200, BLOB), (200, BLOB)]
        assert await fetch("c") == (200, BLOB)
        assert await fetch("d", Range="bytes=100-299999") == (206, BLOB[100:300000])
    assert len(fake.reads("blobs")) == 1
