"""The ``kuikproxy`` command line: check-config, serve's config handling, --version (§7.1)."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from kuikproxy.cli import main
from kuikproxy.config import Config
from tests.config.test_config_loading import NO_DOCUMENT, nothing_in

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "config.yaml"


def test_check_config_valid(capsys: pytest.CaptureFixture[str]) -> None:
    """A valid file exits 0 and prints each host's effective settings with Go durations."""
    assert main(["check-config", str(EXAMPLE)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert "\ndocker.io\n" in out
    assert "check: interval 30s, timeout 10s, mode hold" in out
    assert "mode prefetch, maxHold 2m0s" in out
    assert "\nregistry.internal:5000\n  upstream: http://registry.internal:5000\n" in out
    assert "paced: no" in out
    assert "default (every other host)" in out
    assert "copy: interval 5m0s, timeout none, idle 5s" in out
    # Credentials are shown by file, never read.
    assert "passwordFile /secrets/dockerhub/token" in out
    # Flow control and quotas, as they will run.
    assert "\nflowControl: serverConcurrencyLimit 64\n" in out
    assert "    monitoring: Limited, nominalConcurrencyShares 10, lendablePercent 50" in out
    assert "    image-monitors: precedence 500 → monitoring, distinguisher ByResource\n" in out
    assert "  quota: preset dockerhub-authenticated" in out
    assert "    DataplaneRead per identity: 1000/min, burst 20 (explicit)\n" in out
    assert "  quota: none\n" in out


def test_check_config_invalid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An invalid file exits 1 and prints every error, one per line, on stderr."""
    path = tmp_path / "bad.yaml"
    path.write_text("registries:\n  docker.io: {check: {interval: 1x}}\nquota: {}\n")
    assert main(["check-config", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        "quota: unknown key",
        'registries.docker.io.check.interval: invalid duration "1x"',
    ]


def test_check_config_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing file is an invalid config (exit 1), not a traceback."""
    assert main(["check-config", str(tmp_path / "nope.yaml")]) == 1
    assert "No such file or directory" in capsys.readouterr().err


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    """No command, or check-config without a file, is a usage error (exit 2)."""
    assert main([]) == 2
    assert main(["check-config"]) == 2
    assert main(["serve", "--log-level", "loud"]) == 2
    capsys.readouterr()


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    """--version prints the program name and version and exits 0."""
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("kuikproxy ")


def test_serve_invalid_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """serve refuses to start on an invalid config: every error on stderr, exit 2."""
    path = tmp_path / "bad.yaml"
    path.write_text("listen: nowhere\ncache: {maxAge: 1x}\n")
    assert main(["serve", "--config", str(path)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        'listen: invalid listen address "nowhere" (expected host:port)',
        'cache.maxAge: invalid duration "1x"',
    ]


@pytest.mark.parametrize("with_file", [True, False])
def test_serve_calls_run(with_file: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """serve loads the config (or the embedded default) and hands it to server.run."""
    calls: list[tuple[Config, dict[str, Any]]] = []
    server = types.ModuleType("kuikproxy.server")

    def run(config: Config, **kwargs: Any) -> None:
        calls.append((config, kwargs))

    server.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kuikproxy.server", server)
    monkeypatch.setattr("kuikproxy.cli.configure_logging", lambda level, fmt: None)
    path = tmp_path / "kuik.yaml"
    path.write_text("listen: ':9999'\n")
    argv = ["serve", "--config", str(path)] if with_file else ["serve"]
    assert main(argv) == 0
    [(config, kwargs)] = calls
    assert kwargs == {"config_path": str(path) if with_file else None}
    assert config.listen == (":9999" if with_file else "127.0.0.1:7439")


@pytest.mark.parametrize(
    ("command", "code"), [("check-config", 1), ("serve", 2)], ids=["check-config", "serve"]
)
@pytest.mark.parametrize("text", NO_DOCUMENT.values(), ids=NO_DOCUMENT.keys())
def test_a_file_without_a_document_is_refused_at_start(
    command: str,
    code: int,
    text: str,
    *,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A named file with nothing in it is an invalid config, not the embedded default:
    check-config exits 1 and serve refuses to start (2), both saying why on stderr."""
    server = types.ModuleType("kuikproxy.server")
    server.run = lambda config, **kwargs: pytest.fail("serve started")  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kuikproxy.server", server)
    path = tmp_path / "kuik.yaml"
    path.write_text(text)
    argv = [command, str(path)] if command == "check-config" else [command, "--config", str(path)]
    assert main(argv) == code
    out, err = capsys.readouterr()
    assert out == ""
    assert err == nothing_in(path) + "\n"


def test_check_config_shows_the_limits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """check-config prints the memory budget's split: a bound written as written, the others
    sized from what it leaves, and maxRingImages within maxImages."""
    path = tmp_path / "limits.yaml"
    path.write_text("limits: {memory: 256Mi, maxHosts: 50, maxRingImages: 2000}\n")
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "\nmemory: 256.0Mi (limits.memory): 64.0Mi for the process, 51.2Mi headroom" in out
    assert "\n  limits.maxHosts: 50 (0.8Mi, 16384 B each) as written\n" in out
    assert "\n  limits.maxImages: 133376 (32.6Mi, 256 B each)\n" in out  # sized, not written
    assert ("\nlimits: maxRingImages 2000 (of maxImages)\n") in out
