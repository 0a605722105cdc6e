"""A proxy that takes a thousand connections at once, for tests that hold that many requests.

aiohttp's test server listens with a backlog of 128: a burst of more connections leaves the
kernel retrying SYNs in real time while looptime's clock runs ahead, and the client gives up on
virtual time. This one listens with a backlog of 2,048, and its client may open 1,000
connections.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from kuikproxy.app import build_app
from kuikproxy.config import load_config, parse_config
from tests.upstream_app import Registry


@dataclass
class Proxy:
    session: aiohttp.ClientSession
    base: str
    app: web.Application
    registry: Registry

    def get(self, path: str, resource: str = "") -> Any:
        # a check, as a GET so that refusals carry their body (a GET by tag would open a copy)
        headers = {"Kuik-Resource": resource, "Kuik-Operation": "check"}
        return self.session.get(self.base + path, headers=headers)


@asynccontextmanager
async def proxy(
    aiohttp_server: Callable[..., Awaitable[TestServer]], config: str, path: Path | None = None
) -> AsyncIterator[Proxy]:
    """kuikproxy before a recording registry (``PORT`` in ``config`` is the registry's); with
    ``path``, the config is written there and reloaded from it (§7.2)."""
    fake = Registry()
    server = await aiohttp_server(fake.app())
    text = config.replace("PORT", str(server.port))
    if path is None:
        app = build_app(parse_config(text))
    else:
        path.write_text(text)  # noqa: ASYNC240 (a small file, before the server starts)
        app = build_app(load_config(path), config_path=str(path))
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=2048)
    await site.start()
    port = runner.addresses[0][1]
    connector = aiohttp.TCPConnector(limit=1000)
    timeout = aiohttp.ClientTimeout(total=None)
    try:
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            yield Proxy(session, f"http://127.0.0.1:{port}", app, fake)
    finally:
        await runner.cleanup()
