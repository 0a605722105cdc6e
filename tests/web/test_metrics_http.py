"""/metrics (SPEC §9): the pacing document's names, the event counters, bounded labels."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from kuikproxy.upstream.auth import basic
from tests.conftest import HOST, ProxyFactory, head
from tests.upstream_app import Registry

pytestmark = pytest.mark.looptime

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def scrape(client: TestClient[Any, Any]) -> Samples:
    """``/metrics`` now: each sample's value by its name and its sorted labels."""
    text = await (await client.get("/metrics")).text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def named(samples: Samples, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of one name, by their labels."""
    return {labels: value for (n, labels), value in samples.items() if n == name}


async def test_s9_metrics_expose_laps_rings_intervals_windows_and_requests(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """After two laps of one ring and a kept answer served to another resource: the three
    names of the pacing document with their labels, window outcomes, requests by cache and
    code, upstream requests — and no image reference in any label."""
    client = await proxy("check: {interval: 200ms}")
    for _ in range(3):
        await asyncio.gather(head(client, "a", "lone"), head(client, "b", "lone"))
    assert (await head(client, "a", "other")).status == 200  # a kept answer
    samples = await scrape(client)

    def value(name: str, **labels: str) -> float:
        return samples[(name, tuple(sorted(labels.items())))]

    assert value("kuik_check_ring_images", resource="lone", registry=HOST) == 2
    lap = value("kuik_check_cycle_duration_seconds", resource="lone", registry=HOST)
    assert lap == pytest.approx(0.4)  # 2 images × 200 ms: alone, the best case
    assert value("kuik_registry_interval_seconds", registry=HOST, operation="Check") == 0.2
    assert value("kuik_registry_interval_seconds", registry=HOST, operation="Copy") == 300
    assert (
        value("kuik_registry_windows_total", registry=HOST, operation="Check", outcome="used") == 6
    )
    assert value("kuik_proxy_waiting_requests", registry=HOST, operation="Check") == 0
    assert (
        value(
            "kuik_proxy_requests_total", registry=HOST, operation="Check", code="200", cache="hit"
        )
        == 1
    )
    assert (
        value(
            "kuik_proxy_requests_total", registry=HOST, operation="Check", code="200", cache="miss"
        )
        == 6
    )
    assert (
        value("kuik_registry_upstream_requests_total", registry=HOST, method="HEAD", code="200")
        == 6
    )
    assert value("kuik_registry_blocked_until_timestamp_seconds", registry=HOST) == 0
    assert value("kuik_proxy_wait_seconds_count", registry=HOST, operation="Check") == 6
    label_values = {v for _, labels in samples for _, v in labels}
    assert not [v for v in label_values if v.startswith("app") or (":" in v and "/" in v)]


async def test_s11_quota_tokens_fall_with_each_read_and_refill_over_time(
    proxy: ProxyFactory,
) -> None:
    """``kuik_registry_quota_tokens``: the registry's read bucket (60 a minute, burst 5) loses a
    token per read and refills at one a second; the identity-scoped one (6 a minute, burst 3)
    is one series for every identity: the identity with the fewest tokens. A learnt bucket that
    has learnt nothing is not shown."""
    client = await proxy(
        "paced: false\n"
        "quota:\n"
        "  preset: dockerhub-anonymous\n"
        "  buckets:\n"
        "  - {category: DataplaneRead, scope: registry, ratePerMinute: 60, burst: 5}\n"
        "  - {category: DataplaneRead, scope: identity, ratePerMinute: 6, burst: 3}"
    )
    registry = (("category", "DataplaneRead"), ("registry", HOST), ("scope", "registry"))
    identity = (("category", "DataplaneRead"), ("registry", HOST), ("scope", "identity"))

    async def read(ref: str, user: str) -> None:
        headers = {"Authorization": basic(user, "pw")}
        response = await client.get(f"/v2/app/manifests/{ref}?ns={HOST}", headers=headers)
        assert response.status == 200
        await response.read()

    await read("v1", "alice")
    tokens = named(await scrape(client), "kuik_registry_quota_tokens")
    # no ManifestGet series: the learnt bucket has seen no ratelimit-* header yet
    assert tokens == {registry: pytest.approx(4), identity: pytest.approx(2)}
    await read("v2", "alice")
    await read("v3", "bob")
    tokens = named(await scrape(client), "kuik_registry_quota_tokens")
    assert tokens == {registry: pytest.approx(2), identity: pytest.approx(1)}  # alice's; bob: 2
    await asyncio.sleep(10)
    tokens = named(await scrape(client), "kuik_registry_quota_tokens")
    assert tokens == {registry: pytest.approx(5), identity: pytest.approx(2)}  # alice's; bob: 3


async def test_s9_ratelimit_remaining_is_the_last_count_the_registry_sent(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    aiohttp_client: Callable[..., Awaitable[TestClient[Any, Any]]],
) -> None:
    """``kuik_registry_ratelimit_remaining`` has no sample until a registry sends
    ``ratelimit-remaining``, then follows its last answer."""
    fake = Registry(
        script=[
            (200, {"ratelimit-limit": "100;w=21600", "ratelimit-remaining": f"{count};w=21600"})
            for count in (99, 98)
        ]
    )
    server = await aiohttp_server(fake.app())
    text = (
        f"registries:\n  {HOST}:\n    upstream: http://127.0.0.1:{server.port}\n    paced: false\n"
    )
    client = await aiohttp_client(build_app(parse_config(text)))
    assert named(await scrape(client), "kuik_registry_ratelimit_remaining") == {}
    for ref, remaining in (("v1", 99), ("v2", 98)):
        assert (await head(client, ref)).status == 200
        samples = await scrape(client)
        assert named(samples, "kuik_registry_ratelimit_remaining") == {
            (("registry", HOST),): remaining
        }
