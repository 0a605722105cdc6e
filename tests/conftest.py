"""Fixtures shared by the runtime and web tests: a recording registry and a proxy before it."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from tests.upstream_app import Registry

HOST = "registry.test"

ProxyFactory = Callable[..., Awaitable[TestClient[object, object]]]


@pytest.fixture(autouse=True)
def _no_stray_event_loop(request: pytest.FixtureRequest) -> Iterator[None]:
    """looptime asks the event loop policy for a loop around every test, sync ones too, and in
    a sync test that creates a loop nobody closes (a ResourceWarning, an error here). With the
    loop explicitly unset, the policy answers "no loop" instead of making one."""
    if not inspect.iscoroutinefunction(request.function):
        asyncio.set_event_loop(None)
    yield


@pytest.fixture
async def registry(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
) -> tuple[Registry, TestServer]:
    fake = Registry()
    server = await aiohttp_server(fake.app())
    return fake, server


@pytest.fixture
def proxy(
    registry: tuple[Registry, TestServer],
    aiohttp_client: Callable[..., Awaitable[TestClient[object, object]]],
) -> ProxyFactory:
    """Start kuikproxy before the recording registry, as ``host`` (``registry.test``);
    ``host_block`` is YAML for that host's block (e.g. ``check: {interval: 200ms}``), ``top`` for
    the top level."""
    _, server = registry

    async def start(
        host_block: str = "check: {interval: 200ms}", top: str = "", host: str = HOST
    ) -> TestClient[object, object]:
        text = (
            f"{top}\n"
            "registries:\n"
            f"  {host}:\n"
            f"    upstream: http://127.0.0.1:{server.port}\n"
            + "".join(f"    {line}\n" for line in host_block.splitlines())
        )
        app = build_app(parse_config(text))
        return await aiohttp_client(app, server_kwargs={"handler_cancellation": True})

    return start


def head(client, ref: str, resource: str = "web", **headers: str):  # type: ignore[no-untyped-def]
    """A check (HEAD) of ``app:<ref>`` on the test registry, as ``resource``."""
    return client.head(
        f"/v2/app/manifests/{ref}?ns={HOST}", headers={"Kuik-Resource": resource, **headers}
    )
