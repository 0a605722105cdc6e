"""Unpaced routes: the /v2/ ping, hosts with ``paced: false``, health and status (§4.1)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from tests.conftest import HOST, ProxyFactory
from tests.upstream_app import Registry

pytestmark = pytest.mark.looptime


async def test_s4_1_ping_is_unpaced_and_kept_sixty_seconds(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """/v2/ is answered at once from the registry's own answer, which is kept for 60 s."""
    fake, _ = registry
    client = await proxy()
    loop = asyncio.get_running_loop()
    before = loop.time()
    for _ in range(3):
        response = await client.get(f"/v2/?ns={HOST}")
        assert response.status == 200
        assert response.headers["Docker-Distribution-API-Version"] == "registry/2.0"
    assert loop.time() - before < 0.01
    assert [s.path for s in fake.seen] == ["/v2/"]
    await asyncio.sleep(61)
    assert (await client.get(f"/v2/?ns={HOST}")).status == 200
    assert [s.path for s in fake.seen] == ["/v2/", "/v2/"]


async def test_s4_3_unpaced_host_passes_straight_through(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """A host with ``paced: false`` (a destination kuik owns) is read at once, every time."""
    fake, _ = registry
    client = await proxy("paced: false")
    loop = asyncio.get_running_loop()
    before = loop.time()
    for _ in range(3):
        response = await client.head(f"/v2/app/manifests/v1?ns={HOST}")
        assert response.status == 200
    assert loop.time() - before < 0.05
    assert len(fake.reads()) == 3


async def test_health_and_status_endpoints(proxy: ProxyFactory) -> None:
    """/healthz and /readyz answer 200; unknown routes get the OCI NOT_FOUND body."""
    client = await proxy()
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/readyz")).status == 200
    missing = await client.get("/nope")
    assert missing.status == 404
    assert (await missing.json())["errors"][0]["code"] == "NOT_FOUND"


async def test_s8_status_filters_by_resource_and_registry(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """?resource= and ?registry= narrow /status."""
    client = await proxy()
    await asyncio.gather(
        client.head(f"/v2/app/manifests/a?ns={HOST}", headers={"Kuik-Resource": "one"}),
        client.head(f"/v2/app/manifests/b?ns={HOST}", headers={"Kuik-Resource": "two"}),
    )
    one = await (await client.get("/status", params={"resource": "one"})).json()
    assert list(one["resources"]) == ["one"]
    none = await (await client.get("/status", params={"registry": "other.example"})).json()
    assert none["registries"] == {}


async def test_held_requests_are_answered_503_at_shutdown(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """Shutting down answers every held request 503 UNAVAILABLE at once, without reading."""
    fake, _ = registry
    client = await proxy("check: {interval: 1h}")
    held = asyncio.ensure_future(client.head(f"/v2/app/manifests/v1?ns={HOST}"))
    await asyncio.sleep(0.1)
    await client.server.runner.shutdown()
    response = await held
    assert response.status == 503
    assert fake.reads() == []


async def test_s3_bare_ping_answers_200_when_the_default_registry_cannot(
    aiohttp_client: Callable[..., Awaitable[TestClient[Any, Any]]],
) -> None:
    """A bare ``/v2/`` names no registry; path-prefix mirrors (podman, skopeo) ask it before
    every pull and skip the mirror unless it answers 200 or 401. When ``defaultRegistry`` cannot
    be reached, kuikproxy answers for itself rather than take every other registry down."""
    text = (
        "defaultRegistry: dead.test\nallowedHosts: []\n"
        "registries:\n  dead.test:\n    upstream: http://127.0.0.1:9\n"
    )
    client = await aiohttp_client(build_app(parse_config(text)))
    response = await client.get("/v2/")
    assert response.status == 200
    assert response.headers["Docker-Distribution-API-Version"] == "registry/2.0"
    # a ping that names its registry still says how that registry answered
    named = await client.get("/v2/?ns=dead.test")
    assert named.status == 502
