"""/metrics (SPEC §9): the pacing document's names, the event counters, bounded labels."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import HOST, ProxyFactory, head
from tests.upstream_app import Registry

pytestmark = pytest.mark.looptime


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
    text = await (await client.get("/metrics")).text()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

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
