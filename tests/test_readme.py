"""The README's three ways of use, and ``examples/kuik/``, say what works.

Each ``helm upgrade --install`` in them is rendered with its own ``--set`` and ``-f`` values
and must give that way's objects, each validated by Kubernetes' schemas (1.30); the label the
``kubectl patch`` puts on kube-image-keeper's pods is the one the webhook selects; the configs
they name are valid kuikproxy configs. (The clients' side of each way runs for real in
``tests/e2e``; the webhook's patch in ``tests/inject``.)
"""

from __future__ import annotations

import itertools
import json
import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from kuikproxy.config import load_config, parse_config
from kuikproxy.core.flowcontrol import FlowTraits
from tests.chart import KUBE_VERSION, ROOT, Rendered, render

README = ROOT / "README.md"
KUIK = ROOT / "examples" / "kuik" / "README.md"


def blocks(path: Path, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", path.read_text(), re.S)


def commands(path: Path) -> list[list[str]]:
    """The shell commands of a document's ``sh`` blocks, continuation lines joined."""
    out = []
    for block in blocks(path, "sh"):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip():
                out.append(shlex.split(line))
    return out


def set_value(values: dict[str, Any], assignment: str) -> None:
    """Helm's ``--set key.path=value`` (``{a,b}`` is a list)."""
    key, _, raw = assignment.partition("=")
    value: Any = raw[1:-1].split(",") if raw.startswith("{") else raw
    *parents, last = key.split(".")
    for part in parents:
        values = values.setdefault(part, {})
    values[last] = value


def installs(path: Path) -> list[dict[str, Any]]:
    """The values of each ``helm upgrade --install`` in ``path``."""
    out = []
    for argv in commands(path):
        if argv[:3] != ["helm", "upgrade", "--install"]:
            continue
        values: dict[str, Any] = {}
        for flag, value in itertools.pairwise(argv):
            if flag == "--set":
                set_value(values, value)
            elif flag == "-f":
                values.update(yaml.safe_load((ROOT / value).read_text()))
        out.append(values)
    return out


def valid(rendered: Rendered) -> None:
    known = {"ServiceMonitor", "PrometheusRule", "Issuer", "Certificate"}
    for manifest in rendered:
        if manifest.kind not in known:
            kubernetes_validate.validate(manifest.doc, KUBE_VERSION, strict=True)


def config_of(rendered: Rendered) -> str:
    (configmap,) = [m.doc for m in rendered if m.name.endswith("kuikproxy-config")][:1]
    return str(configmap["data"]["config.yaml"])


def test_the_three_ways_render_what_they_promise() -> None:
    mirror, injector = installs(README)
    service = render(mirror)
    valid(service)
    assert {"Deployment", "Service"} <= service.kinds()
    assert service.one("Service")["spec"]["clusterIP"] == "10.96.0.74"
    parse_config(config_of(service))

    sidecar = render(injector)
    valid(sidecar)
    assert "MutatingWebhookConfiguration" in sidecar.kinds()
    assert {m.namespace for m in sidecar if m.name.endswith("kuikproxy-config")} == {"kuik-system"}


def test_the_node_snippets_are_strict_naming_the_service_alone() -> None:
    """containerd: the Service is ``server`` and the one ``[host]`` (the table containerd 1.6
    needs to take the file); CRI-O: it is the registry's ``location``, with no mirror. Neither
    names the registry, so no refusal of kuikproxy's makes a node read it directly (§14)."""
    containerd, crio = (tomllib.loads(snippet) for snippet in blocks(README, "toml"))
    assert containerd["server"] == "http://10.96.0.74:7439"
    assert containerd["host"] == {"http://10.96.0.74:7439": {"capabilities": ["pull", "resolve"]}}
    assert crio == {
        "registry": [
            {"prefix": "docker.io", "location": "10.96.0.74:7439/docker.io", "insecure": True}
        ]
    }


@pytest.mark.parametrize("document", [README, KUIK], ids=["README", "examples/kuik"])
def test_the_patch_labels_pods_the_way_the_webhook_selects_them(document: Path) -> None:
    (patch,) = [argv for argv in commands(document) if argv[:2] == ["kubectl", "-n"]]
    labels = json.loads(patch[patch.index("-p") + 1])["spec"]["template"]["metadata"]["labels"]
    (values,) = [v for v in installs(document) if v.get("mode") == "injector"]
    (webhook,) = render(values).one("MutatingWebhookConfiguration")["webhooks"]
    assert webhook["objectSelector"]["matchLabels"] == labels


def test_the_standalone_forward_proxy_config_is_valid() -> None:
    serve, bundle = [argv for argv in commands(README) if "examples/forward-proxy.yaml" in argv]
    path = ROOT / serve[serve.index("--config") + 1]
    assert path == ROOT / bundle[bundle.index("--config") + 1]
    assert load_config(path).forward_proxy.enabled


def test_the_kuik_example_runs_kuiks_registry_unpaced_and_its_webhook_exempt() -> None:
    (values,) = installs(KUIK)
    rendered = render(values)
    valid(rendered)
    config = parse_config(config_of(rendered))
    unpaced = [h for h in config.configured_hosts() if not config.registry(h).paced]
    assert unpaced == ["kube-image-keeper-registry.kuik-system.svc:5000"]
    schema = config.flow_control.match(
        FlowTraits(resource="webhook/pod-admission", host="ghcr.io", operation="check")
    )
    assert schema is not None and config.flow_control.level(schema.priority_level).type == "Exempt"
    monitor = config.flow_control.match(
        FlowTraits(resource="ImageMonitor/a", host="ghcr.io", operation="check")
    )
    assert monitor is not None and monitor.priority_level == "checks"


def test_the_fleet_config_is_valid() -> None:
    (fleet,) = [block for block in blocks(README, "yaml") if "fleet:" in block]
    config = parse_config(fleet)
    assert config.fleet is not None and config.fleet.name == "proxy-a"
    assert config.registry("docker.io").fleet == "shared"
