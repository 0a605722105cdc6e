"""Bounded state over HTTP: each limit refuses with its body, counter and /status entry; a quiet
host costs no timer and is forgotten after the retention; rings expire with no window;
/status pages its resources; /metrics caps the per-ring series.

Hosts under the wildcard are IP literals (``127.9.x.y`` under ``allowedHosts: ["127.9.*"]``):
never resolved, never connected to — the address guard refuses loopback literals when a window
reads them (403), so nothing leaves the test.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from kuikproxy.config import LimitsSettings
from kuikproxy.observe import metrics
from kuikproxy.runtime.host import Host
from kuikproxy.runtime.pacer import Pacer
from kuikproxy.web.keys import PACER
from tests.conftest import HOST, ProxyFactory, head
from tests.upstream_app import Registry
from tests.web.test_metrics_http import named, scrape

pytestmark = pytest.mark.looptime

WILD = "127.9.*"
RETENTION = 10.0


def top(retention: float = RETENTION, **limits: int) -> str:
    """The top of a config with hosts under :data:`WILD` allowed (their windows a minute
    apart, the default), a short retention and ``limits``."""
    inline = ", ".join(f"{key}: {value}" for key, value in limits.items())
    return (
        f"defaultRegistry: {HOST}\n"
        f'allowedHosts: ["{WILD}"]\n'
        f"unusedImageRetention: {retention:g}s\n"
        f"limits: {{{inline}}}\n"
    )


def check(client: TestClient[Any, Any], ref: str, resource: str, host: str = HOST) -> Any:
    """A check as a GET (``Kuik-Operation: check``), so that a refusal carries its body."""
    return client.get(
        f"/v2/app/manifests/{ref}?ns={host}",
        headers={"Kuik-Resource": resource, "Kuik-Operation": "check"},
    )


async def refused(response: Any, limit: str, value: int, host: str) -> None:
    assert response.status == 503
    assert "Retry-After" not in response.headers
    error = (await response.json())["errors"][0]
    assert error["code"] == "UNAVAILABLE"
    assert f"limits.{limit}" in error["message"]
    assert error["detail"] == {"host": host, "limit": limit, "value": value}


def pacer_of(client: TestClient[Any, Any]) -> Pacer:
    pacer: Pacer = client.server.app[PACER]
    return pacer


def window_timers(host: Host) -> list[asyncio.TimerHandle]:
    """The loop's live timers that fire ``host``'s windows."""
    scheduled = asyncio.get_running_loop()._scheduled  # type: ignore[attr-defined]
    return [
        handle
        for handle in scheduled
        if not handle.cancelled() and getattr(handle._callback, "__self__", None) is host.timers
    ]


async def test_max_hosts_refuses_a_new_host_under_the_wildcard(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """At ``maxHosts``, a host under the wildcard with no state is refused 503 before anything
    of it is made, counted at the top level (no host state answers for it, registry "-");
    the configured host is never refused and the admitted one keeps being served."""
    _ = registry
    client = await proxy(top=top(maxHosts=1))
    first = await check(client, "v1", "web", "127.9.0.1")
    assert first.status == 403  # admitted: its window's read is refused by the address guard
    await refused(await check(client, "v1", "web", "127.9.0.2"), "maxHosts", 1, "127.9.0.2")
    assert (await check(client, "v1", "web", "127.9.0.1")).status == 403
    assert (await check(client, "v1", "web")).status == 200
    status = await (await client.get("/status")).json()
    assert status["refused"] == {"maxHosts": 1}
    assert set(status["registries"]) == {HOST, "127.9.0.1"}
    refusals = named(await scrape(client), "kuik_proxy_refusals_total")
    assert refusals == {
        (("reason", "maxHosts"), ("registry", "-")): 1,
        # the admitted host's reads, refused by the address guard (§12 counts those too)
        (("reason", "addressGuard"), ("registry", "127.9.0.1")): 2,
    }
    requests = named(await scrape(client), "kuik_proxy_requests_total")
    assert not any(dict(labels)["registry"] == "127.9.0.2" for labels in requests)


async def test_max_resources_refuses_a_new_resource_and_serves_the_others(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """At ``maxResources``, a new resource is refused 503 (counted on its host); the resources
    with state are answered as before — here from the kept answer. On a host without state the
    refusal makes none (counted at the top level)."""
    _ = registry
    client = await proxy(top=top(maxResources=2))
    assert (await head(client, "v1", "a")).status == 200
    assert (await head(client, "v1", "b")).status == 200  # a kept answer (R1)
    await refused(await check(client, "v1", "c"), "maxResources", 2, HOST)
    await refused(await check(client, "v2", "c"), "maxResources", 2, HOST)
    await refused(await check(client, "v1", "c", "127.9.0.1"), "maxResources", 2, "127.9.0.1")
    assert "127.9.0.1" not in pacer_of(client).hosts
    assert (await head(client, "v1", "b")).status == 200  # its next lap: held, then read
    status = await (await client.get("/status")).json()
    assert status["registries"][HOST]["refused"] == {"maxResources": 2}
    assert status["refused"] == {"maxResources": 1}
    assert status["resourcesTotal"] == 2 and set(status["resources"]) == {"a", "b"}
    refusals = named(await scrape(client), "kuik_proxy_refusals_total")
    assert refusals == {
        (("reason", "maxResources"), ("registry", HOST)): 2,
        (("reason", "maxResources"), ("registry", "-")): 1,
    }


async def test_max_ring_images_and_max_images_refuse_a_new_image(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """A full ring takes no new image (``maxRingImages``), nor do the rings together past
    ``maxImages``; images already in a ring are asked as before."""
    _ = registry
    client = await proxy(top=top(maxRingImages=1, maxImages=2))
    assert (await head(client, "v1", "a")).status == 200
    await refused(await check(client, "v2", "a"), "maxRingImages", 1, HOST)
    assert (await head(client, "v1", "b")).status == 200
    await refused(await check(client, "v2", "c"), "maxImages", 2, HOST)
    assert (await head(client, "v1", "a")).status == 200
    status = await (await client.get("/status")).json()
    assert status["registries"][HOST]["refused"] == {"maxRingImages": 1, "maxImages": 1}


async def test_a_quiet_host_has_no_timer_and_is_forgotten_after_the_retention(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """A host under the wildcard arms a window only while something is due there: once its
    one request is answered it has no timer at all. A retention after that request it is
    forgotten — gone from /status, its metrics series and its window log — and its place is
    free for another host."""
    _ = registry
    retention = 300.0
    client = await proxy(top=top(retention, maxHosts=1))
    pacer = pacer_of(client)
    wild = "127.9.0.1"
    assert (await check(client, "v1", "web", wild)).status == 403  # read at its window, 1m
    host = pacer.runtime_of(wild)
    assert host is not None
    await asyncio.sleep(61.0)  # the window after the read found nothing due: the series sleeps
    assert host.timers.armed == {} and window_timers(host) == []
    assert window_timers(pacer.runtime_of(HOST)) == []  # nor does the configured host
    status = await (await client.get("/status")).json()
    windows = status["registries"][wild]["check"]["windows"]
    assert (windows["used"], windows["idle"]) == (1, 1)  # at 1m its read, at 2m nothing
    await asyncio.sleep(retention)
    assert wild not in pacer.hosts and wild not in pacer.sweeps
    status = await (await client.get("/status")).json()
    assert set(status["registries"]) == {HOST}
    series = await scrape(client)
    assert not any(("registry", wild) in labels for _, labels in series)
    assert pacer.runtime_of(wild) is None  # its recent windows went with its state
    assert (await check(client, "v1", "web", "127.9.0.2")).status == 403  # admitted now


async def test_rings_expire_after_the_retention_without_any_window(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """P8 with sleeping series: a ring whose images nobody asks for leaves a retention after
    its last ask though no window fires meanwhile, and its resource leaves the census."""
    _ = registry
    client = await proxy(top=top())
    assert (await head(client, "v1", "a")).status == 200
    await asyncio.sleep(RETENTION / 2)
    assert (await head(client, "v2", "a")).status == 200
    pacer = pacer_of(client)
    await asyncio.sleep(RETENTION / 2 + 0.5)  # v1: unasked for the retention
    status = await (await client.get("/status")).json()
    assert status["resources"]["a"]["checks"]["registries"][0]["images"] == 1
    await asyncio.sleep(RETENTION / 2)
    status = await (await client.get("/status")).json()
    assert status["resources"] == {} and status["resourcesTotal"] == 0
    assert len(pacer.census) == 0 and pacer.census.images == 0
    assert status["registries"][HOST]["check"]["windows"]["used"] == 2  # no other window read


async def test_status_lists_resources_a_page_at_a_time(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """/status lists at most ``?limit=`` resources after ``?after=``, in name order, with the
    total and the ``after`` of the next page; ``?resource=`` still narrows to one."""
    _ = registry
    client = await proxy(top=top())
    for name in ("r3", "r1", "r4", "r2", "r5"):
        assert (await head(client, "v1", name)).status == 200
    first = await (await client.get("/status", params={"limit": "2"})).json()
    assert list(first["resources"]) == ["r1", "r2"]
    assert (first["resourcesTotal"], first["resourcesNext"]) == (5, "r2")
    rest = await (await client.get("/status", params={"limit": "3", "after": "r2"})).json()
    assert list(rest["resources"]) == ["r3", "r4", "r5"] and rest["resourcesNext"] is None
    one = await (await client.get("/status", params={"resource": "r4"})).json()
    assert list(one["resources"]) == ["r4"]
    assert (await client.get("/status", params={"limit": "x"})).status == 400


async def test_metrics_cap_the_ring_series_and_count_every_ring(
    proxy: ProxyFactory, registry: tuple[Registry, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``RING_SERIES`` rings, a scrape leaves the rest out of the per-ring families;
    ``kuik_check_rings`` still counts every ring of a host."""
    _ = registry
    monkeypatch.setattr(metrics, "RING_SERIES", 2)
    client = await proxy(top=top())
    for name in ("a", "b", "c"):
        assert (await head(client, "v1", name)).status == 200
    samples = await scrape(client)
    assert len(named(samples, "kuik_check_ring_images")) == 2
    assert named(samples, "kuik_check_rings") == {(("registry", HOST),): 3}


async def test_a_reload_changes_the_limits_from_then_on(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """§7.2: new limits refuse from the reload on and drop nothing: a lower ``maxResources``
    keeps serving the resources that have state, and refuses new ones."""
    _ = registry
    client = await proxy(top=top(maxResources=1))
    pacer = pacer_of(client)
    assert (await head(client, "v1", "a")).status == 200
    await refused(await check(client, "v1", "b"), "maxResources", 1, HOST)
    pacer.reconfigure(replace(pacer.config, limits=LimitsSettings(max_resources=3)))
    assert (await head(client, "v1", "b")).status == 200
    assert (await head(client, "v1", "c")).status == 200
    pacer.reconfigure(replace(pacer.config, limits=LimitsSettings(max_resources=1)))
    assert (await head(client, "v2", "c")).status == 200
    await refused(await check(client, "v1", "d"), "maxResources", 1, HOST)


async def test_max_held_refuses_a_request_past_it_and_the_budget_shows_each_bound(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """At ``maxHeld`` held requests (over every host), one more that would wait is refused 503
    and counted; one that needs no wait (a kept answer) is still served; as the held ones are
    answered, room comes back. ``/status.budget`` and ``kuik_proxy_bound_*`` show each bound's
    limit and use, the written one marked."""
    _ = registry
    client = await proxy(top=top(maxHeld=2))
    assert (await head(client, "v0", "a")).status == 200  # the window: read at once
    held = [asyncio.ensure_future(check(client, f"v{n}", f"r{n}")) for n in (1, 2)]
    await asyncio.sleep(0.01)  # both parked for the next windows (200 ms apart)
    status = await (await client.get("/status")).json()
    bounds = status["budget"]["bounds"]
    assert bounds["limits.maxHeld"] == {
        "limit": 2, "each": 9216, "bytes": 18432, "used": 2, "set": True
    }  # fmt: skip
    assert bounds["limits.maxImages"]["used"] == 3 and not bounds["limits.maxImages"]["set"]
    assert bounds["cache.maxEntries"]["used"] == 1
    await refused(await check(client, "v3", "r3"), "maxHeld", 2, HOST)
    assert (await head(client, "v0", "b")).status == 200  # a kept answer needs no wait
    assert [r.status for r in await asyncio.gather(*held)] == [200, 200]
    assert (await (await client.get("/status")).json())["budget"]["bounds"]["limits.maxHeld"][
        "used"
    ] == 0
    metrics_text = await scrape(client)
    assert named(metrics_text, "kuik_proxy_bound_limit")[(("bound", "limits.maxHeld"),)] == 2
    assert named(metrics_text, "kuik_proxy_refusals_total") == {
        (("reason", "maxHeld"), ("registry", HOST)): 1
    }
