"""What ``helm install`` prints in mode service (NOTES.txt): the strict node configurations
first (SPEC §14), naming the Service's address and port, and the available variant
only in words, with what it costs."""

from __future__ import annotations

import re
import textwrap
import tomllib
from typing import Any

from tests.chart import render_raw


def notes(values: dict[str, Any]) -> str:
    return render_raw(values)["kuikproxy/templates/NOTES.txt"]


def snippet(text: str, heading: str) -> dict[str, Any]:
    """The indented TOML block under the line ending with ``heading``."""
    match = re.search(rf"{re.escape(heading)}\n\n((?:    .*\n)+)", text)
    assert match, f"no block under {heading!r} in:\n{text}"
    return tomllib.loads(textwrap.dedent(match[1]))


def test_notes_show_strict_node_configs_for_the_pinned_service_address() -> None:
    text = notes({"service": {"clusterIP": "10.96.0.74", "port": 7439}})
    hosts = snippet(text, "/etc/containerd/certs.d/docker.io/hosts.toml:")
    assert hosts["server"] == "http://10.96.0.74:7439"
    assert hosts["host"] == {"http://10.96.0.74:7439": {"capabilities": ["pull", "resolve"]}}
    conf = snippet(text, "/etc/containers/registries.conf.d/50-kuikproxy.conf:")
    assert conf["registry"] == [
        {"prefix": "docker.io", "location": "10.96.0.74:7439/docker.io", "insecure": True}
    ]
    strict, _, rest = text.partition("Strict configuration")
    assert "available" not in strict.lower()
    assert "unpaced read of the registry" in rest


def test_notes_name_a_placeholder_until_the_address_is_pinned() -> None:
    text = notes({"service": {"port": 80}})
    assert "set service.clusterIP to pin it" in text
    hosts = snippet(text, "/etc/containerd/certs.d/docker.io/hosts.toml:")
    assert hosts["server"] == "http://SERVICE_IP:80"
