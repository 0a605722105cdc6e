"""Every refusal kuikproxy makes itself is counted, shown and logged (SPEC §12).

A client that falls back to the registry after a refusal (containerd does, §14) must never do
so unseen: each reason is counted by host in ``kuik_proxy_refusals_total{registry,reason}``,
shown in ``/status`` (``registries.<h>.refused``, or the top-level ``refused`` for what no
host's state answers for — a host not allowed is an outsider's name, never a label of its
own), and logged at ``warning`` at most once a minute per host and reason.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from kuikproxy.cli_status import render
from kuikproxy.web.keys import PACER
from tests.conftest import HOST, ProxyFactory, head
from tests.upstream_app import Registry
from tests.web.test_flow_control_http import ONE_QUEUE, level
from tests.web.test_metrics_http import named, scrape

pytestmark = pytest.mark.looptime

Client = Any
NO_HOST = "-"


async def not_allowed(client: Client) -> Any:
    return await client.head("/v2/app/manifests/v1?ns=evil.example")


async def ambiguous(client: Client) -> Any:
    return await client.head(f"/v2/app/manifests/v1?ns={HOST}&ns=docker.io")


async def max_hold(client: Client) -> Any:
    return await head(client, "v1")


async def flow_control(client: Client) -> Any:
    # one queue of 2 places: a third check of the same flow is refused at once
    waiting = [asyncio.ensure_future(head(client, ref)) for ref in ("a", "b")]
    await asyncio.sleep(0.01)
    response = await head(client, "c")
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    return response


async def blocked(client: Client) -> Any:
    client.registry.fail["/v2/app/manifests/v1"] = 429
    client.registry.retry_after = "600"
    first = asyncio.ensure_future(head(client, "v1", "a"))
    await asyncio.sleep(1.5)  # the window's read got the 429: the host is blocked 10 minutes
    response = await head(client, "v2", "b")  # its maxHold (1s) ends long before the block
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    return response


async def address_guard(client: Client) -> Any:
    # allowed by the glob, but a loopback address without an explicit upstream (§3.1)
    return await client.head("/v2/app/manifests/v1?ns=127.7.0.1", headers={"Kuik-Resource": "w"})


async def shutdown(client: Client) -> Any:
    held = asyncio.ensure_future(head(client, "v1"))
    await asyncio.sleep(0.01)
    await client.server.app.shutdown()
    return await held


@dataclass(frozen=True)
class Case:
    reason: str
    send: Callable[[Client], Awaitable[Any]]
    status: int
    host: str  # where it is counted: a host with state, or "-"
    host_block: str = "check: {interval: 1s}"
    top: str = ""


CASES = [
    Case("notAllowed", not_allowed, 403, NO_HOST),
    Case("ambiguous", ambiguous, 400, NO_HOST),
    Case("maxHold", max_hold, 429, HOST, "check: {interval: 10s, maxHold: 100ms}"),
    Case("flowControl", flow_control, 429, HOST,
         top="flowControl:\n  priorityLevels:\n" + level("checks", ONE_QUEUE)),
    Case("blocked", blocked, 429, HOST, "check: {interval: 1s, maxHold: 1s}"),
    Case("addressGuard", address_guard, 403, "127.7.0.1",
         top=f'defaultRegistry: {HOST}\nallowedHosts: ["127.7.*"]'),
    Case("shutdown", shutdown, 503, HOST, "check: {interval: 10s}"),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.reason)
async def test_s12_each_refusal_is_counted_shown_and_logged_once_a_minute(
    proxy: ProxyFactory,
    registry: tuple[Registry, object],
    caplog: pytest.LogCaptureFixture,
    case: Case,
) -> None:
    """The refusal gets its status; it is counted under its host (or ``-``) and reason in the
    metric and ``/status``, and logged at warning — once, however many follow within the
    minute, and again after it."""
    caplog.set_level(logging.WARNING, logger="kuikproxy.runtime.refusals")
    client = await proxy(case.host_block, case.top)
    client.registry = registry[0]
    response = await case.send(client)
    assert response.status == case.status
    if case.reason == "shutdown":
        return  # the site is gone: nothing more to ask it (counted: see the next test)
    refusals = named(await scrape(client), "kuik_proxy_refusals_total")
    assert refusals.get((("reason", case.reason), ("registry", case.host)), 0) >= 1
    status = await (await client.get("/status")).json()
    refused = (
        status["refused"] if case.host == NO_HOST else status["registries"][case.host]["refused"]
    )
    assert refused[case.reason] >= 1
    warned = [r for r in caplog.records if case.reason in r.getMessage()]
    assert len(warned) == 1
    if case.reason in ("notAllowed", "ambiguous"):  # refused at once: cheap to repeat
        await case.send(client)
        await case.send(client)
        assert len([r for r in caplog.records if case.reason in r.getMessage()]) == 1
        await asyncio.sleep(61)
        await case.send(client)
        assert len([r for r in caplog.records if case.reason in r.getMessage()]) == 2


async def test_s12_shutdown_refusals_are_counted_per_client(
    proxy: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Requests held when kuikproxy stops are each answered 503, each counted (one error
    object shared by all of them is still one refusal per client), logged once."""
    caplog.set_level(logging.WARNING, logger="kuikproxy.runtime.refusals")
    client = await proxy("check: {interval: 10s}")
    runtime = client.server.app[PACER]
    held = [asyncio.ensure_future(head(client, ref)) for ref in ("a", "b", "c")]
    await asyncio.sleep(0.01)
    await runtime.close()
    assert [r.status for r in await asyncio.gather(*held)] == [503, 503, 503]
    assert runtime.refusals()[HOST] == {"shutdown": 3}
    assert len([r for r in caplog.records if "shutdown" in r.getMessage()]) == 1


async def test_s12_refusals_are_shown_on_the_page_and_by_kuikproxy_status(
    proxy: ProxyFactory,
) -> None:
    """The status page and ``kuikproxy status`` show the refusals by registry and reason,
    beside everything else a person looks at."""
    client = await proxy("check: {interval: 10s, maxHold: 100ms}")
    assert (await not_allowed(client)).status == 403
    assert (await max_hold(client)).status == 429
    page = await (await client.get("/")).text()
    assert "Refused" in page and "notAllowed" in page and "maxHold" in page
    document = await (await client.get("/status")).json()
    text = render(document, datetime.now(UTC))
    lines = text.splitlines()
    table = lines[lines.index("REFUSED (2)") :]
    assert any(line.split()[:3] == ["-", "notAllowed", "1"] for line in table)
    assert any(line.split()[:3] == [HOST, "maxHold", "1"] for line in table)
