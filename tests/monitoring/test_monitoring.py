"""The monitoring examples and ``/metrics`` checked with Prometheus's own ``promtool``: the alert
rule's unit tests, the example scrape config, the Grafana dashboard and its queries, and the
``/metrics`` exposition linted after a small scenario (SPEC §9)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import HOST, ProxyFactory, head
from tests.monitoring import (
    MONITORING,
    PACING_RATIO,
    dashboard,
    dashboard_queries,
    datasources,
    promtool,
)
from tests.upstream_app import blob_digest

DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}

SPEC_METRICS = {
    # SPEC §9: name → (type, labels); counters by their family name (without ``_total``)
    "kuik_check_cycle_duration_seconds": ("gauge", {"resource", "registry"}),
    "kuik_check_ring_images": ("gauge", {"resource", "registry"}),
    "kuik_registry_interval_seconds": ("gauge", {"registry", "operation"}),
    "kuik_registry_windows": ("counter", {"registry", "operation", "outcome"}),
    "kuik_proxy_requests": ("counter", {"registry", "operation", "code", "cache"}),
    "kuik_proxy_waiting_requests": ("gauge", {"registry", "operation"}),
    "kuik_proxy_wait_seconds": ("histogram", {"registry", "operation"}),
    "kuik_registry_upstream_requests": ("counter", {"registry", "method", "code"}),
    "kuik_registry_blocked_until_timestamp_seconds": ("gauge", {"registry"}),
    # and §11's quota buckets
    "kuik_registry_quota_tokens": ("gauge", {"registry", "category", "scope"}),
}


def test_alert_rule_unit_tests_pass() -> None:
    """``promtool test rules``: KuikRingLapSlow fires on a ring above 1.5 for 30 minutes, and
    stays silent on one that dips below for a lap, one at 1.2 and one at exactly 1.5."""
    code, output = promtool("test", "rules", "alerts.test.yaml", cwd=MONITORING)
    assert code == 0, output
    assert "SUCCESS" in output, output


def test_alert_rule_is_the_pacing_ratio_above_one_and_a_half_for_30_minutes() -> None:
    """The rule is the pacing document's query, unchanged, compared with 1.5, held 30 minutes,
    and its summary names the resource and the registry."""
    groups = yaml.safe_load((MONITORING / "alerts.yaml").read_text())["groups"]
    (rule,) = [r for g in groups for r in g["rules"] if r.get("alert") == "KuikRingLapSlow"]
    assert " ".join(rule["expr"].split()) == f"{PACING_RATIO} > 1.5"
    assert rule["for"] == "30m"
    for text in rule["annotations"].values():
        assert "$labels.resource" in text
        assert "$labels.registry" in text


def test_example_prometheus_config_is_valid() -> None:
    """``promtool check config`` accepts ``prometheus.yml`` and the rule file it loads."""
    code, output = promtool("check", "config", "prometheus.yml", cwd=MONITORING)
    assert code == 0, output
    assert "1 rules found" in output, output


def test_dashboard_is_an_importable_grafana_document() -> None:
    """The dashboard declares its datasource as the ``DS_PROMETHEUS`` input and every panel,
    target and variable uses it; panels have unique ids, a place and queries."""
    document = dashboard()
    assert [(i["name"], i["type"], i["pluginId"]) for i in document["__inputs"]] == [
        ("DS_PROMETHEUS", "datasource", "prometheus")
    ]
    assert document["uid"] and document["title"] and document["schemaVersion"] >= 36
    assert document.get("id") is None  # set by Grafana at import
    sources = list(datasources(document))
    assert sources and all(s == DS for s in sources), sources
    panels = document["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        assert set(panel["gridPos"]) == {"h", "w", "x", "y"}, panel["title"]
        assert panel["targets"], panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])


def test_dashboard_shows_the_pacing_ratio_windows_waits_upstream_codes_and_cache_hits() -> None:
    """One panel each for the lap ratio (the pacing document's query, narrowed by the
    ``$registry`` variable), window outcomes, waiting requests, upstream codes and cache hits."""
    queries = [" ".join(q.split()) for q in dashboard_queries().values()]
    unnarrowed = [q.replace(',registry=~".*"', "").replace('{registry=~".*"}', "") for q in queries]
    assert PACING_RATIO in unnarrowed
    assert any("kuik_registry_windows_total" in q and "outcome" in q for q in queries)
    assert any("kuik_proxy_waiting_requests" in q for q in queries)
    assert any("kuik_registry_upstream_requests_total" in q and "code" in q for q in queries)
    assert any('cache="miss"' in q and 'cache=~"hit|miss"' in q for q in queries)


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    """Every panel's query parses (``promtool check rules`` on them as recording rules)."""
    rules = [
        {"record": f"dashboard:query_{i}", "expr": expr}
        for i, expr in enumerate(dashboard_queries().values())
    ]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    code, output = promtool("check", "rules", str(path))
    assert code == 0, output


@pytest.mark.looptime
async def test_metrics_pass_promtool_lint_after_a_small_scenario(proxy: ProxyFactory) -> None:
    """After checks (a lap of one image, then two resources answered from the kept answer), a
    copy with its blob and a refused host, on a host with a read quota, ``promtool check
    metrics`` finds nothing to say about ``/metrics``, and the families SPEC §9 names are there
    with their types and labels."""
    client = await proxy(
        "check: {interval: 200ms}\ncopy: {interval: 200ms, idle: 200ms}\n"
        "quota: {buckets: [{category: DataplaneRead, scope: identity, ratePerMinute: 600, "
        "burst: 10}]}"
    )
    assert (await head(client, "v1", "web")).status == 200  # web's first turn: its lap starts
    assert (await head(client, "v1", "web")).status == 200  # the next window: the lap ends
    for response in await asyncio.gather(head(client, "v1", "batch"), head(client, "v1", "ci")):
        assert response.status == 200  # R1: the kept answer, no window
    headers = {"Kuik-Resource": "web"}
    manifest = await client.get(f"/v2/app/manifests/v2?ns={HOST}", headers=headers)
    assert manifest.status == 200
    await manifest.read()
    blob = await client.get(f"/v2/app/blobs/{blob_digest('a')}?ns={HOST}", headers=headers)
    assert blob.status == 200
    await blob.read()
    refused = await client.head("/v2/app/manifests/v1?ns=elsewhere.example")
    assert refused.status == 403
    response = await client.get("/metrics")
    assert response.status == 200
    text = await response.text()

    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name, (kind, labels) in SPEC_METRICS.items():
        assert name in families, name
        family = families[name]
        assert family.type == kind, name
        assert family.samples, name
        for sample in family.samples:
            assert set(sample.labels) - {"le"} == labels, (name, sample)
    lap = families["kuik_check_cycle_duration_seconds"].samples
    assert [(s.labels["resource"], s.value) for s in lap] == [("web", pytest.approx(0.2))]

    # last: skipped without promtool, once the checks above have run
    code, output = promtool("check", "metrics", stdin=text.encode())
    assert (code, output.strip()) == (0, ""), output
