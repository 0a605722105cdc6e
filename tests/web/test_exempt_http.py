"""Exempt reads (SPEC §10, §11, P14): never paced, and never sent to a registry that said stop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from tests.upstream_app import Registry

pytestmark = pytest.mark.looptime

HOST = "registry.test"
PROBE = {"Kuik-Probe": "webhook"}  # what the exempt flow schema below matches
CONFIG = """\
cache: {{maxAge: 1s}}
flowControl:
  flowSchemas:
    - name: webhook-availability
      matchingPrecedence: 100
      priorityLevelConfiguration: {{name: exempt}}
      rules: [{{headers: [{{name: Kuik-Probe, values: [webhook]}}]}}]
registries:
  {host}:
    upstream: http://127.0.0.1:{port}
    check: {{interval: 200ms}}
"""


@pytest.fixture
def start(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    aiohttp_client: Callable[..., Awaitable[TestClient[Any, Any]]],
) -> Callable[[], Awaitable[tuple[TestClient[Any, Any], Registry]]]:
    """A registry that answers 429 (Retry-After 5) to ``/v2/app/manifests/stop``, 200 to the
    rest; kuikproxy before it, with an exempt flow schema for ``Kuik-Probe: webhook``."""

    async def run() -> tuple[TestClient[Any, Any], Registry]:
        fake = Registry(fail={"/v2/app/manifests/stop": 429}, retry_after="5")
        server = await aiohttp_server(fake.app())
        config = parse_config(CONFIG.format(host=HOST, port=server.port))
        return await aiohttp_client(build_app(config)), fake

    return run


def head(client: TestClient[Any, Any], ref: str, headers: dict[str, str]) -> Any:
    return client.head(f"/v2/app/manifests/{ref}?ns={HOST}", headers=headers)


async def test_p14_an_exempt_read_goes_at_once_without_a_window(start: Any) -> None:
    """A read on an Exempt level is not paced: it reaches the registry at once."""
    client, fake = await start()
    t0 = asyncio.get_running_loop().time()
    assert (await head(client, "v1", PROBE)).status == 200
    assert [(s.path, round(s.at - t0, 3)) for s in fake.seen] == [("/v2/app/manifests/v1", 0.0)]


async def test_s11_an_exempt_read_to_a_blocked_host_gets_a_stale_kept_answer_or_429(
    start: Any,
) -> None:
    """While the host is blocked, an exempt read is answered from a kept answer even past
    cache.maxAge, marked ``Warning: 110``, or else refused 429 with the block's remaining time;
    either way the registry is not asked."""
    client, fake = await start()
    assert (await head(client, "v1", {"Kuik-Resource": "monitor"})).status == 200  # kept
    blocked = asyncio.ensure_future(head(client, "stop", {"Kuik-Resource": "monitor"}))
    await asyncio.sleep(1.5)  # the block is in force (5 s), the kept answer past maxAge (1 s)
    asked = len(fake.seen)
    stale = await head(client, "v1", PROBE)
    assert stale.status == 200
    assert stale.headers["Warning"] == '110 - "Response is Stale"'
    refused = await head(client, "v2", PROBE)
    assert refused.status == 429
    assert 3 <= int(refused.headers["Retry-After"]) <= 4
    assert len(fake.seen) == asked
    blocked.cancel()
    await asyncio.gather(blocked, return_exceptions=True)


async def test_r2_exempt_reads_of_one_image_at_once_make_one_registry_read(start: Any) -> None:
    """Webhook probes arriving while an exempt read of their image is under way follow it
    (R2: a read in flight is shared): each is answered when that read lands, and the registry
    is asked once."""
    client, fake = await start()
    fake.delay = 0.5  # the first probe's read is in flight while the others come
    first = asyncio.ensure_future(head(client, "v1", PROBE))
    await asyncio.sleep(0.1)
    t0 = asyncio.get_running_loop().time()
    others = [head(client, "v1", PROBE) for _ in range(3)]
    answers = await asyncio.gather(first, *others)
    assert [a.status for a in answers] == [200] * 4
    assert round(asyncio.get_running_loop().time() - t0, 3) == 0.4  # the first read's end
    assert [s.path for s in fake.seen] == ["/v2/app/manifests/v1"]
