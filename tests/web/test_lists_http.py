"""Tag lists and referrers are paced on the check series (§4.1), page by page."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from kuikproxy.core.images import Image
from tests.upstream_app import Registry

pytestmark = pytest.mark.looptime

DIGEST = "sha256:" + "e" * 64


Lists = Callable[[], Awaitable[tuple[TestClient[Any, Any], Registry]]]


@pytest.fixture
def lists(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    aiohttp_client: Callable[..., Awaitable[TestClient[Any, Any]]],
) -> Lists:
    """Starts, inside the test (so on its virtual clock), a registry serving tag lists and
    referrers, and kuikproxy before it."""
    return lambda: _start(aiohttp_server, aiohttp_client)


async def _start(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    aiohttp_client: Callable[..., Awaitable[TestClient[Any, Any]]],
) -> tuple[TestClient[Any, Any], Registry]:
    fake = Registry(tags={"app": ["v1", "v2"]})
    server = await aiohttp_server(fake.app())
    text = (
        f"registries:\n  registry.test:\n    upstream: http://127.0.0.1:{server.port}\n"
        "    check: {interval: 200ms}\n"
    )
    client = await aiohttp_client(build_app(parse_config(text)))
    return client, fake


async def test_s4_1_tag_lists_and_referrers_take_check_windows(
    lists: Lists,
) -> None:
    """A tag list, a second page of it and a referrers list are three reads, one per check
    window, the first a full interval after start; their answers come back whole."""
    client, fake = await lists()
    start = asyncio.get_running_loop().time()
    responses = await asyncio.gather(
        client.get("/v2/app/tags/list?ns=registry.test"),
        client.get("/v2/app/tags/list?ns=registry.test&n=1&last=v1"),
        client.get(f"/v2/app/referrers/{DIGEST}?ns=registry.test"),
    )
    assert [r.status for r in responses] == [200, 200, 200]
    assert (await responses[0].json())["tags"] == ["v1", "v2"]
    seen = [(s.path_qs, s.at) for s in fake.seen]
    assert sorted(path for path, _ in seen) == sorted(
        ["/v2/app/tags/list", "/v2/app/tags/list?n=1&last=v1", f"/v2/app/referrers/{DIGEST}"]
    )
    assert sorted(round(at - start, 3) for _, at in seen) == [0.2, 0.4, 0.6]


async def test_r1_a_kept_tag_list_answers_another_resource(
    lists: Lists,
) -> None:
    """One resource's tag list read serves another resource at once (R1)."""
    client, fake = await lists()
    first = await client.get("/v2/app/tags/list?ns=registry.test", headers={"Kuik-Resource": "a"})
    second = await client.get("/v2/app/tags/list?ns=registry.test", headers={"Kuik-Resource": "b"})
    assert first.status == second.status == 200
    assert len(fake.seen) == 1


def test_ring_keys_of_lists_never_collide_with_images() -> None:
    """A repository's tag list, its referrers and its images have distinct ring keys, and each
    key names its image back."""
    images = [
        Image("r", "app/tags/list", "v1"),
        Image("r", "app", "list", "tags"),
        Image("r", "app", "list", "tags", "n=1"),
        Image("r", "app", DIGEST, "referrers"),
        Image("r", "app", DIGEST),
        Image("r", "app", "list"),
    ]
    assert len({image.key for image in images}) == len(images)
    for image in images:
        assert Image.from_key("r", image.key) == image
