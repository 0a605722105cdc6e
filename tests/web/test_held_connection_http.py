"""What a held request's connection keeps while it waits (a held request's memory, bench/held.py).

aiohttp arms a keep-alive timer per connection and arms it again after each answer; a request
parked for its window has it cancelled (``RequestHandler.keep_alive(True)``, which aiohttp's own
websocket upgrade calls too). These tests pin the aiohttp behaviour that relies on: the timer is
gone while the request waits, and the connection is kept alive and timed again once answered.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from kuikproxy.runtime.heldread import not_idle
from kuikproxy.web.keys import PACER
from tests.conftest import ProxyFactory, head

pytestmark = pytest.mark.looptime

INTERVAL = 0.2


def connections(client: object) -> list[web.RequestHandler]:
    server = client.server.runner.server  # type: ignore[attr-defined]
    assert isinstance(server, web.Server)
    return list(server.connections)


async def test_a_held_requests_connection_has_no_keepalive_timer_until_it_is_answered(
    proxy: ProxyFactory,
) -> None:
    client = await proxy(f"check: {{interval: {int(INTERVAL * 1000)}ms}}")
    pacer = client.server.app[PACER]
    request = asyncio.ensure_future(head(client, "v1"))
    await asyncio.sleep(INTERVAL / 4)
    assert pacer.held() == 1
    (held,) = connections(client)
    assert held._keepalive_handle is None  # the aiohttp behaviour relied on
    response = await request
    assert response.status == 200
    assert held._keepalive_handle is not None  # timed again once answered
    # the connection was kept alive: the next request (a kept answer) comes on it
    assert (await head(client, "v1")).status == 200
    assert connections(client) == [held]
    assert pacer.held() == 0


async def test_a_request_answered_at_once_leaves_the_keepalive_timer_alone(
    proxy: ProxyFactory,
) -> None:
    client = await proxy()
    assert (await client.get("/v2/")).status == 200
    (connection,) = connections(client)
    timer = connection._keepalive_handle
    assert timer is not None
    assert (await client.get("/v2/")).status == 200
    assert connection._keepalive_handle is timer


def test_only_a_connection_with_keep_alive_is_told_it_is_not_idle() -> None:
    """``not_idle`` asks a connection that has ``keep_alive`` to stay alive (aiohttp's), and
    leaves any other as it is (a test's, another server's): nothing set, nothing raised."""

    class Told:
        def __init__(self) -> None:
            self.told: list[bool] = []

        def keep_alive(self, value: bool) -> None:
            self.told.append(value)

    class Other:
        keep_alive = None  # not a method

    told, other = Told(), Other()
    not_idle(told)
    not_idle(other)
    not_idle(object())
    assert told.told == [True]
    assert other.keep_alive is None
