"""/status (SPEC §8) and its JSON Schema: what a scenario leaves there, and that it validates."""

from __future__ import annotations

import asyncio
from typing import Any

import jsonschema
import pytest

from tests.conftest import HOST, ProxyFactory, head
from tests.upstream_app import Registry

pytestmark = pytest.mark.looptime


async def test_s8_status_validates_against_its_schema_after_laps_copies_and_filters(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """After laps complete and copies queue, /status (whole and filtered by resource and by
    registry) validates against /status/schema, with SPEC §8's field names."""
    _ = registry
    # the first copy stays open (idle 30 s after its read): the others queue behind it
    client = await proxy("check: {interval: 200ms}\ncopy: {interval: 200ms, idle: 30s}")

    async def lapping(resource: str) -> None:
        for _ in range(3):  # three laps of two images
            responses = await asyncio.gather(
                head(client, "a", resource), head(client, "b", resource)
            )
            assert all(r.status == 200 for r in responses)

    copies = [
        asyncio.ensure_future(
            client.get(f"/v2/app/manifests/{ref}?ns={HOST}", headers={"Kuik-Resource": "node"})
        )
        for ref in ("c1", "c2", "c3")
    ]
    await asyncio.gather(lapping("monitor-a"), lapping("monitor-b"))
    schema = await (await client.get("/status/schema")).json()
    whole: dict[str, Any] = await (await client.get("/status")).json()
    jsonschema.validate(whole, schema)
    assert set(whole) == {
        "startedAt", "config", "registries", "resources", "cache", "flowControl", "fleet",
        "resourcesTotal", "resourcesNext", "refused", "reads", "budget", "clientErrors",
        "upstream",
    }  # fmt: skip
    registry_part = whole["registries"][HOST]
    assert set(registry_part) == {"check", "copy", "blockedUntil", "quota", "refused"}
    assert registry_part["copy"]["queued"] >= 1
    ring = whole["resources"]["monitor-a"]["checks"]["registries"][0]
    assert ring["cycleDuration"] is not None  # a lap completed
    assert set(ring) == {"registry", "images", "cursor", "cycleStarted", "cycleDuration"}
    assert whole["resources"]["node"]["copies"]["registries"][0]["queued"] >= 1
    assert {"entries", "bytes", "hits", "misses", "store"} == set(whole["cache"])
    assert whole["cache"]["store"] is None  # no pull-through store configured (§15)
    assert whole["config"]["generation"] == 1
    for query in ({"resource": "monitor-a"}, {"registry": HOST}, {"registry": "nowhere.test"}):
        narrowed = await (await client.get("/status", params=query)).json()
        jsonschema.validate(narrowed, schema)
    only_a = await (await client.get("/status", params={"resource": "monitor-a"})).json()
    assert list(only_a["resources"]) == ["monitor-a"]
    for copy in copies:
        copy.cancel()
    await asyncio.gather(*copies, return_exceptions=True)
