"""The Helm chart (``charts/kuikproxy``) as the tests see it: linted and rendered offline with
helm-python-sdk (Helm's Go SDK behind ctypes: no ``helm`` binary, no cluster, no network)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kuikproxy"
FULL_VALUES = Path(__file__).resolve().parent / "values-full.yaml"
RELEASE = "demo"
NAMESPACE = "registry-pacing"
KUBE_VERSION = "1.30"


@dataclass(frozen=True)
class Manifest:
    """One rendered object and the template it came from."""

    template: str
    doc: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.doc["kind"])

    @property
    def name(self) -> str:
        return str(self.doc["metadata"]["name"])

    @property
    def namespace(self) -> str | None:
        namespace = self.doc["metadata"].get("namespace")
        return None if namespace is None else str(namespace)


class Rendered(list[Manifest]):
    """Every object of one render, with look-ups by kind and name."""

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [m.doc for m in self if m.kind == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [doc for doc in self.of(kind) if name is None or doc["metadata"]["name"] == name]
        assert len(found) == 1, f"{len(found)} {kind} named {name}: {[m.name for m in self]}"
        return found[0]

    def kinds(self) -> set[str]:
        return {m.kind for m in self}


@cache
def _chart() -> helm.Chart:
    return helm.Chart.load(CHART)


@cache
def full_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(FULL_VALUES.read_text())
    return values


def with_mode(values: dict[str, Any], mode: str) -> dict[str, Any]:
    return {**copy.deepcopy(values), "mode": mode}


def render_raw(values: dict[str, Any] | None = None) -> dict[str, str]:
    """``{template path: rendered text}`` of an install of ``values``."""
    return _chart().render(values or {}, name=RELEASE, namespace=NAMESPACE, is_install=True)


def render(values: dict[str, Any] | None = None) -> Rendered:
    """The objects an install of ``values`` creates (NOTES.txt aside)."""
    out = Rendered()
    for template, text in sorted(render_raw(values).items()):
        if template.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc is not None:
                out.append(Manifest(template, doc))
    return out


def lint(values: dict[str, Any] | None = None) -> dict[str, Any]:
    """``helm lint --strict --kube-version 1.30`` of the chart with ``values``."""
    return helm.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}.0")


def pod_specs(rendered: Rendered) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(workload name, pod spec)`` of every workload."""
    for doc in rendered.of("Deployment"):
        yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]
