"""The chart's PrometheusRule and Grafana dashboard are the monitoring examples, not copies that
drift: the chart's files are the same bytes as ``examples/monitoring/``, what it renders is their
content, and the rule passes ``promtool check rules``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart import CHART, ROOT, render
from tests.monitoring import promtool

EXAMPLES = ROOT / "examples" / "monitoring"
MONITORING = {
    "serviceMonitor": {"create": True},
    "prometheusRule": {"create": True},
    "grafanaDashboard": {"create": True},
}


@pytest.mark.parametrize("name", ["alerts.yaml", "grafana-dashboard.json"])
def test_chart_files_are_the_examples(name: str) -> None:
    """The chart reads its own copy (Helm reads nothing outside the chart); after editing an
    example, copy it: ``cp examples/monitoring/{name} charts/kuikproxy/files/``."""
    assert (CHART / "files" / name).read_bytes() == (EXAMPLES / name).read_bytes()


@pytest.mark.parametrize("mode", ["service", "injector"])
def test_prometheus_rule_is_the_example_alert(mode: str, tmp_path: Path) -> None:
    rule = render({**MONITORING, "mode": mode}).one("PrometheusRule")
    example = yaml.safe_load((EXAMPLES / "alerts.yaml").read_text())
    assert rule["spec"] == example
    alerts = [r["alert"] for group in rule["spec"]["groups"] for r in group["rules"]]
    assert "KuikRingLapSlow" in alerts
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rule["spec"]))
    code, output = promtool("check", "rules", str(rules))
    assert code == 0, output


def dashboard(values: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    configmap = render({**MONITORING, **values}).one("ConfigMap", "demo-kuikproxy-dashboard")
    return configmap, json.loads(configmap["data"]["kuikproxy.json"])


def test_dashboard_configmap() -> None:
    example = (EXAMPLES / "grafana-dashboard.json").read_text()
    # As it is, for importing by hand.
    configmap, document = dashboard({"grafanaDashboard": {"create": True, "datasourceUid": ""}})
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["data"]["kuikproxy.json"] == example
    assert document == json.loads(example)
    # Provisioned (the default): the import-time input replaced by a datasource uid.
    configmap, document = dashboard({})
    assert "${DS_PROMETHEUS}" not in configmap["data"]["kuikproxy.json"]
    assert document == json.loads(example.replace("${DS_PROMETHEUS}", "prometheus"))
    configmap, _ = dashboard(
        {
            "grafanaDashboard": {
                "create": True,
                "namespace": "monitoring",
                "annotations": {"grafana_folder": "Registries"},
            }
        }
    )
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "Registries"}


def test_monitoring_is_opt_in() -> None:
    kinds = render({}).kinds()
    assert not kinds & {"ServiceMonitor", "PrometheusRule"}
    assert len(render({}).of("ConfigMap")) == 1
