"""Content negotiation and what it does to reuse (R2, R3).

A registry negotiates a manifest's type with each request's ``Accept``: it may answer a type
outside it (old registries label manifests ``application/json``), or 404 when nothing fits a
narrow one. Neither may leave a request parked for ever, and neither may turn into a verdict
for a client that asked differently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from tests.upstream_app import MANIFEST_TYPE, Registry, digest_of, manifest_of

pytestmark = pytest.mark.looptime

HOST = "registry.test"
DOCKER_V2 = "application/vnd.docker.distribution.manifest.v2+json"
BODY = manifest_of("app", "v1")
Client = TestClient[Any, Any]


def negotiating(legacy: bool = False) -> Registry:
    """Serves ``app:v1`` as ``MANIFEST_TYPE`` to requests that accept it, 404 to the others
    (gzipped to those that accept it); ``legacy`` labels every manifest ``application/json``
    whatever was asked."""
    return Registry(negotiate=True, content_type="application/json" if legacy else None, gzip=True)


Start = Callable[..., Awaitable[tuple[Client, Registry]]]


@pytest.fixture
def start(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    aiohttp_client: Callable[..., Awaitable[Client]],
) -> Start:
    async def run(legacy: bool = False) -> tuple[Client, Registry]:
        fake = negotiating(legacy)
        server = await aiohttp_server(fake.app())
        config = parse_config(
            f"registries:\n  {HOST}:\n    upstream: http://127.0.0.1:{server.port}\n"
            "    check: {interval: 200ms}\n"
        )
        client = await aiohttp_client(
            build_app(config), server_kwargs={"handler_cancellation": True}
        )
        return client, fake

    return run


def check(client: Client, resource: str, *accept: str) -> Any:
    headers = [("Kuik-Resource", resource), *(("Accept", a) for a in accept)]
    return client.head(f"/v2/app/manifests/v1?ns={HOST}", headers=headers)


@pytest.mark.parametrize("method", ["HEAD", "GET"])
async def test_r2_the_request_a_window_takes_is_answered_whatever_type_comes_back(
    start: Start, method: str
) -> None:
    """An old registry labels the manifest ``application/json``, outside the request's
    ``Accept``: the request whose read it was is answered by it (the registry negotiated with
    that very request), once — it is not parked while the registry is read at every window."""
    client, fake = await start(legacy=True)
    headers = {"Kuik-Resource": "kuik", "Accept": MANIFEST_TYPE, "Kuik-Operation": "check"}
    async with client.request(
        method, f"/v2/app/manifests/v1?ns={HOST}", headers=headers
    ) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "application/json"
    await asyncio.sleep(1)  # five more windows
    assert len(fake.reads()) == 1


@pytest.mark.parametrize(
    ("narrow", "broad"),
    [
        ((DOCKER_V2,), (MANIFEST_TYPE, DOCKER_V2)),
        ((DOCKER_V2,), ()),
        ((DOCKER_V2,), ("*/*",)),
        ((f"{DOCKER_V2};q=0.9",), (MANIFEST_TYPE,)),
    ],
)
async def test_r3_a_404_of_a_narrow_accept_is_no_verdict_for_a_broader_one(
    start: Start, narrow: tuple[str, ...], broad: tuple[str, ...]
) -> None:
    """One client's narrow ``Accept`` gets a 404 (nothing fits it); another resource asking
    with a broader one is not answered from that 404 (kuik would record NotFound, containerd
    would fall back to the registry): it waits for its own read and gets the 200."""
    client, fake = await start()
    assert (await check(client, "narrow", *narrow)).status == 404
    assert (await check(client, "broad", *broad)).status == 200
    assert len(fake.reads()) == 2


async def test_r3_a_kept_404_serves_the_same_accept_set_in_any_order(start: Start) -> None:
    """The same set of types, in another order or with other parameters, negotiates alike: the
    kept 404 answers it without a read."""
    client, fake = await start()
    assert (await check(client, "a", DOCKER_V2, "application/x-other")).status == 404
    assert (await check(client, "b", "application/x-other;q=0.5", DOCKER_V2)).status == 404
    assert len(fake.reads()) == 1


async def test_r3_a_head_served_from_a_kept_get_carries_the_exact_length(start: Start) -> None:
    """A registry that gzips manifests for clients that accept it: kuikproxy asks for
    manifests unencoded, so the kept GET is the manifest's own bytes and a HEAD answered from
    it carries their exact ``Content-Length`` and digest (containerd otherwise turns its check
    into a GET by tag and waits for a copy window)."""
    client, fake = await start()
    headers = {"Kuik-Resource": "node", "Accept-Encoding": "gzip", "Kuik-Operation": "check"}
    url = f"/v2/app/manifests/v1?ns={HOST}"
    async with client.get(url, headers=headers, auto_decompress=False) as response:
        assert response.status == 200
        assert "Content-Encoding" not in response.headers
        assert await response.read() == BODY
    head = await client.head(url, headers={"Kuik-Resource": "other", "Accept-Encoding": "gzip"})
    assert head.status == 200 and len(fake.reads()) == 1  # from the kept GET (R1)
    assert head.headers["Content-Length"] == str(len(BODY))
    assert head.headers["Docker-Content-Digest"] == digest_of(BODY)
