"""Reload of a real ``kuikproxy serve`` while the config's directory is busy (SPEC §7.2).

Beside the config, a thread appends to a log and creates and removes a journal every 10 ms
(what a log file or a state file next to the config does). Whatever that traffic, a valid
edit of the config is applied (``/status.config.generation`` goes up) and an invalid one is
refused (``lastError`` set, the generation kept) within 1 s. The config is changed three ways:
renamed over, swapped as a mounted ConfigMap is (``kuikproxy.yaml -> ..data/kuikproxy.yaml``,
``..data`` a link to a timestamped directory, replaced by renaming a ``..data_tmp`` link over
it), and beside kuikproxy's own SQLite state file (``state.path``), written as it paces.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import REGISTRY
from tests.e2e.peers import DistributionRegistry, Kuikproxy, registry_block
from tests.e2e.test_reload import Load

pytestmark = pytest.mark.e2e

EVERY = 0.01  # seconds between two writes beside the config
WITHIN = 1.0  # seconds an edit may take to be applied or refused
CONFIG = "kuikproxy.yaml"  # the name the harness gives the config in its workdir


def settings(upstream: str, **top: Any) -> dict[str, Any]:
    """The document ``start_proxy`` would run (``top`` merged in)."""
    return {
        "defaultRegistry": REGISTRY,
        "allowedHosts": [],
        "registries": {REGISTRY: registry_block(upstream)},
        **top,
    }


def document(proxy: Kuikproxy, interval: str) -> str:
    """``proxy``'s config with the registry's ``check.interval`` set to ``interval``."""
    block = {**proxy.settings["registries"][REGISTRY], "check": {"interval": interval}}
    registries = {REGISTRY: block}
    return yaml.safe_dump({"listen": proxy.host_port, **proxy.settings, "registries": registries})


def renamed_over(proxy: Kuikproxy, text: str) -> None:
    path = proxy.workdir / CONFIG
    fresh = path.with_suffix(".tmp")
    fresh.write_text(text)
    fresh.replace(path)


def swapped(proxy: Kuikproxy, text: str) -> None:
    """The kubelet's update of a mounted ConfigMap: a new timestamped directory, a
    ``..data_tmp`` link to it renamed over ``..data``, then the old directory removed."""
    directory = proxy.workdir
    old = os.readlink(directory / "..data")
    fresh = directory / time.strftime(f"..%Y_%m_%d_%H_%M_%S.{time.time_ns()}")
    fresh.mkdir()
    (fresh / CONFIG).write_text(text)
    os.symlink(fresh.name, directory / "..data_tmp")
    os.rename(directory / "..data_tmp", directory / "..data")
    shutil.rmtree(directory / old)


class Mounted(Kuikproxy):
    """kuikproxy reading a mounted ConfigMap: its config is ``kuikproxy.yaml ->
    ..data/kuikproxy.yaml``, ``..data -> ..<timestamp>`` (the harness writes through the link)."""

    def launch(self) -> subprocess.Popen[bytes]:
        first = self.workdir / time.strftime("..%Y_%m_%d_%H_%M_%S.0")
        first.mkdir(exist_ok=True)
        os.symlink(first.name, self.workdir / "..data")
        os.symlink(f"..data/{CONFIG}", self.workdir / CONFIG)
        return super().launch()


class Beside:
    """A thread writing beside the config every :data:`EVERY` seconds: a log appended, and a
    journal created, written and removed."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.writes = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stop.wait(EVERY):
            with (self.directory / "beside.log").open("a") as log:
                log.write(f"write {self.writes}\n")
            journal = self.directory / "beside.db-journal"
            journal.write_bytes(b"page")
            journal.unlink()
            self.writes += 1

    def __enter__(self) -> Beside:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=5)


def within(proxy: Kuikproxy, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """``/status.config`` once ``done`` holds of it; fails if it does not within 1 s."""
    deadline = time.monotonic() + WITHIN
    while True:
        config: dict[str, Any] = proxy.status()["config"]
        if done(config):
            return config
        assert time.monotonic() < deadline, (config, proxy.log())
        time.sleep(0.02)


def edited_twice(proxy: Kuikproxy, write: Callable[[Kuikproxy, str], None]) -> None:
    """A valid edit is applied, then an invalid one refused, each within 1 s."""
    with Beside(proxy.workdir) as beside:
        time.sleep(0.3)  # the neighbour's traffic is under way before the edit
        assert proxy.status()["config"]["generation"] == 1
        write(proxy, document(proxy, "300ms"))
        config = within(proxy, lambda c: c["generation"] == 2)
        assert config["lastError"] is None
        write(proxy, document(proxy, "1x"))
        config = within(proxy, lambda c: c["lastError"] is not None)
        assert config["generation"] == 2
        assert "check.interval" in config["lastError"], config
        assert beside.writes >= 10  # the neighbour wrote all along
    assert proxy.status()["registries"][REGISTRY]["check"]["interval"] == "300ms"


def test_an_edit_renamed_over_is_applied_beside_a_busy_file(
    registry: DistributionRegistry, tmp_path: Path
) -> None:
    with Kuikproxy(tmp_path, settings(registry.url)) as proxy:
        edited_twice(proxy, renamed_over)


def test_a_configmap_swap_is_applied_beside_a_busy_file(
    registry: DistributionRegistry, tmp_path: Path
) -> None:
    with Mounted(tmp_path, settings(registry.url)) as proxy:
        assert (tmp_path / CONFIG).resolve().parent.name.startswith("..")
        edited_twice(proxy, swapped)


def test_an_edit_is_applied_beside_the_state_file_while_it_is_written(
    registry: DistributionRegistry, tmp_path: Path
) -> None:
    """``state.path`` in the config's directory: kuikproxy's own SQLite file and its WAL,
    written as the clients keep checks and copies due, plus the neighbour's writes."""
    state = tmp_path / "state.db"
    with (
        Kuikproxy(tmp_path, settings(registry.url, state={"path": str(state)})) as proxy,
        Load(proxy, f"beside/app{time.time_ns()}"),
    ):
        edited_twice(proxy, renamed_over)
        assert state.exists() and state.with_name("state.db-wal").exists()
