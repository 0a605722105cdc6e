"""What the injection tests share: the sidecar settings and kube-image-keeper's pod."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kuikproxy.inject.patch import SidecarSettings

SETTINGS = SidecarSettings(
    image="ghcr.io/example/kuikproxy:0.1.0",
    config_map="kuikproxy-sidecar",
    ca_bundle_secret="kuikproxy-ca",
)
REVIEW = Path(__file__).with_name("kuik_controllers_review.json")
"""The AdmissionReview the API server sends for a pod of kube-image-keeper's controllers
Deployment (v1 chart, `cache-manager`), defaults and built-in admission applied, labelled."""


def kuik_review() -> dict[str, Any]:
    review: dict[str, Any] = json.loads(REVIEW.read_text())
    return review
