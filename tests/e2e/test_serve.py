"""`kuikproxy serve` as a newcomer runs it: no config file, the embedded default."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

pytestmark = pytest.mark.e2e

DEFAULT_LISTEN = ("127.0.0.1", 7439)


def _port_free() -> bool:
    with socket.socket() as s:
        return s.connect_ex(DEFAULT_LISTEN) != 0


def _get(path: str) -> tuple[int, bytes]:
    url = f"http://{DEFAULT_LISTEN[0]}:{DEFAULT_LISTEN[1]}{path}"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


@pytest.mark.skipif(not _port_free(), reason="the default port 7439 is taken on this machine")
def test_serve_without_a_config_file_runs_the_embedded_default() -> None:
    """With no --config, kuikproxy listens on 127.0.0.1:7439, answers /healthz and /status,
    refuses a host that is not allowed, and stops cleanly on SIGTERM."""
    process = subprocess.Popen(
        [sys.executable, "-m", "kuikproxy", "serve"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                status, _ = _get("/healthz")
                break
            except OSError:
                assert process.poll() is None, process.stdout.read()  # type: ignore[union-attr]
                assert time.monotonic() < deadline, "kuikproxy did not start"
                time.sleep(0.1)
        assert status == 200
        status, body = _get("/status")
        assert status == 200
        assert json.loads(body)["registries"] == {}
        status, body = _get("/v2/app/manifests/v1?ns=evil.example")
        assert status == 403
        assert json.loads(body)["errors"][0]["code"] == "DENIED"
    finally:
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=20)[0].decode()
    assert process.returncode == 0, output
    assert "127.0.0.1:7439" in output
