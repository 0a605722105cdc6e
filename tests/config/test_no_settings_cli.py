"""The ``kuikproxy`` command itself, run as an operator runs it, on a file with no settings in
it (``{}``, ``null``, comments only): ``check-config`` exits 1 and ``serve`` refuses to start
(2), each saying why on stderr, rather than running on the embedded default."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.config.test_config_loading import nothing_in


@pytest.mark.parametrize("text", ["{}\n", "null\n", "# the hosts were here\n"])
@pytest.mark.parametrize(("command", "code"), [("check-config", 1), ("serve", 2)])
def test_the_command_refuses_a_file_with_no_settings(
    command: str, code: int, text: str, tmp_path: Path
) -> None:
    path = tmp_path / "kuikproxy.yaml"
    path.write_text(text)
    argv = [command, str(path)] if command == "check-config" else [command, "--config", str(path)]
    done = subprocess.run(
        [sys.executable, "-m", "kuikproxy", *argv],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (code, "", nothing_in(path) + "\n")
