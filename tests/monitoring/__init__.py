"""The monitoring examples (``examples/monitoring/``) as the tests read them."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

MONITORING = Path(__file__).resolve().parents[2] / "examples" / "monitoring"
DASHBOARD = MONITORING / "grafana-dashboard.json"

PACING_RATIO = (
    "kuik_check_cycle_duration_seconds / (kuik_check_ring_images * on(registry) group_left "
    'kuik_registry_interval_seconds{operation="Check"})'
)
"""The pacing document's health query (SPEC §9), verbatim: a lap over its best case."""

APT = "apt-get install -y --no-install-recommends prometheus"


def promtool(*args: str, stdin: bytes | None = None, cwd: Path | None = None) -> tuple[int, str]:
    """``promtool ARGS`` to completion: ``(exit code, stdout and stderr)``; the test is skipped
    when promtool is not installed (CI installs it)."""
    binary = shutil.which("promtool")
    if binary is None:
        pytest.skip(f"promtool is not installed ({APT})")
    done = subprocess.run(
        [binary, *args],
        input=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=cwd,
        timeout=60,
        check=False,
    )
    return done.returncode, done.stdout.decode(errors="replace")


def dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return document


def datasources(node: Any) -> Iterator[Any]:
    """Every ``datasource`` value anywhere in a dashboard document."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                yield value
            yield from datasources(value)
    elif isinstance(node, list):
        for item in node:
            yield from datasources(item)


def dashboard_queries(registry: str = ".*", rate_interval: str = "1m") -> dict[str, str]:
    """``{panel title: PromQL}`` of every panel target, with Grafana's variables replaced as
    Grafana would (``$registry`` by its All value, ``$__rate_interval`` by a range)."""
    queries = {}
    for panel in dashboard()["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", rate_interval)
            queries[f"{panel['title']} {target['refId']}"] = expr.replace("$registry", registry)
    return queries
