"""``kuikproxy inject-webhook``: flags, their environment fallbacks, and the real process."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import kuikproxy.inject.webhook
from kuikproxy.cli import main
from kuikproxy.inject.patch import SidecarSettings
from kuikproxy.inject.webhook import WebhookSettings
from tests.certs import Authority
from tests.inject.pods import REVIEW

ENVIRONMENT = ("KUIKPROXY_SIDECAR_IMAGE", "KUIKPROXY_CONFIG_MAP", "KUIKPROXY_CA_BUNDLE_SECRET")


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[WebhookSettings]:
    """The settings ``run`` is called with, instead of serving; no variable from outside."""
    for variable in ENVIRONMENT:
        monkeypatch.delenv(variable, raising=False)
    calls: list[WebhookSettings] = []
    monkeypatch.setattr(kuikproxy.inject.webhook, "run", calls.append)
    return calls


def test_flags(started: list[WebhookSettings]) -> None:
    """The flags the chart templates, as they reach the webhook."""
    code = main(
        [
            "inject-webhook",
            "--listen",
            "[::]:9443",
            "--tls-cert-file",
            "/certs/tls.crt",
            "--tls-key-file",
            "/certs/tls.key",
            "--sidecar-image",
            "ghcr.io/example/kuikproxy:1.0",
            "--config-map",
            "kuikproxy-config",
            "--ca-bundle-secret",
            "kuikproxy-ca",
        ]
    )
    assert code == 0
    assert started == [
        WebhookSettings(
            host="::",
            port=9443,
            cert_file=Path("/certs/tls.crt"),
            key_file=Path("/certs/tls.key"),
            sidecar=SidecarSettings(
                "ghcr.io/example/kuikproxy:1.0", "kuikproxy-config", "kuikproxy-ca"
            ),
        )
    ]


def test_environment_fallbacks_and_defaults(
    started: list[WebhookSettings], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each sidecar setting falls back to its environment variable, and a flag wins over
    it; listen and the TLS files have defaults."""
    monkeypatch.setenv("KUIKPROXY_SIDECAR_IMAGE", "from-env:1")
    monkeypatch.setenv("KUIKPROXY_CONFIG_MAP", "config-from-env")
    monkeypatch.setenv("KUIKPROXY_CA_BUNDLE_SECRET", "ca-from-env")
    assert main(["inject-webhook", "--config-map", "config-from-flag"]) == 0
    assert started == [
        WebhookSettings(
            host="0.0.0.0",
            port=8443,
            cert_file=Path("/tls/tls.crt"),
            key_file=Path("/tls/tls.key"),
            sidecar=SidecarSettings("from-env:1", "config-from-flag", "ca-from-env"),
        )
    ]


def test_missing_settings_are_a_usage_error(
    started: list[WebhookSettings], capsys: pytest.CaptureFixture[str]
) -> None:
    """Without them the webhook would inject broken pods: it does not start, and says which
    are missing."""
    assert main(["inject-webhook", "--config-map", "kuikproxy-config"]) == 2
    assert started == []
    assert capsys.readouterr().err.splitlines() == [
        "--sidecar-image (or KUIKPROXY_SIDECAR_IMAGE) is required",
        "--ca-bundle-secret (or KUIKPROXY_CA_BUNDLE_SECRET) is required",
    ]


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--listen", "8443"], '--listen: invalid listen address "8443" (expected host:port)'),
        (["--config-map", "Config"], "config map: not a Kubernetes object name: 'Config'"),
        (["--sidecar-image", "a b"], "sidecar image: not an image reference: 'a b'"),
    ],
)
def test_invalid_settings_are_a_usage_error(
    started: list[WebhookSettings],
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    error: str,
) -> None:
    """Refused at start, with the reason."""
    required = ["--sidecar-image", "i:1", "--config-map", "c", "--ca-bundle-secret", "s"]
    assert main(["inject-webhook", *required, *flags]) == 2
    assert started == []
    assert capsys.readouterr().err.splitlines() == [error]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_webhook_process_answers_over_https(tmp_path: Path) -> None:
    """`kuikproxy inject-webhook` as the chart runs it (settings in the environment): it
    serves an AdmissionReview over TLS with the sidecar image it was given, and stops
    cleanly on SIGTERM."""
    authority = Authority()
    authority.issue(tmp_path / "tls.crt", tmp_path / "tls.key", "kuikproxy-injector")
    port = _free_port()
    environment = {
        **os.environ,
        "KUIKPROXY_SIDECAR_IMAGE": "registry.example/kuikproxy:9",
        "KUIKPROXY_CONFIG_MAP": "kuikproxy-config",
        "KUIKPROXY_CA_BUNDLE_SECRET": "kuikproxy-ca",
    }
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kuikproxy",
            "inject-webhook",
            "--listen",
            f"127.0.0.1:{port}",
            "--tls-cert-file",
            str(tmp_path / "tls.crt"),
            "--tls-key-file",
            str(tmp_path / "tls.key"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=environment,
    )
    context = authority.client_context()
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", context=context)
                break
            except OSError:
                assert process.poll() is None, process.stdout.read()  # type: ignore[union-attr]
                assert time.monotonic() < deadline, "the webhook did not start"
                time.sleep(0.1)
        request = urllib.request.Request(
            f"https://127.0.0.1:{port}/mutate",
            data=REVIEW.read_bytes(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, context=context) as answer:
            response: dict[str, Any] = json.load(answer)["response"]
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=20)[0].decode()
    assert process.returncode == 0, output
    patch = json.loads(base64.b64decode(response["patch"]))
    assert patch[-1]["value"]["image"] == "registry.example/kuikproxy:9"
    assert "sidecar injected into pod kuik-system/kube-image-keeper-controllers-" in output
