"""The walk of one HEAD (``docs/architecture.md``) is what the code does: a profiler follows a
held HEAD of a manifest from the moment aiohttp parsed it to the registry and back, and a HEAD a
kept answer serves, and finds

* every module of the documented walk's table on the held one's way;
* exactly the modules the doc lists for each (one more entered, or one listed and no longer
  entered, fails: the doc says what the code does);
* no call from a lower layer into a higher one (the layers are import-linter's, in
  ``pyproject.toml``): answers go back up by returning and by resolving futures, and what is
  shown of them is read from the runtime's snapshot."""

from __future__ import annotations

import re
import sys
import threading
import tomllib
from collections.abc import Awaitable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from tests.conftest import HOST, ProxyFactory
from tests.upstream_app import Registry

pytestmark = pytest.mark.looptime

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
PACKAGE = "/kuikproxy/"


def walk_section() -> str:
    return DOC.split("## The walk of one HEAD", 1)[1].split("\n## ", 1)[0]


def walk_steps() -> list[str]:
    """The modules of the walk's table, in order of first appearance."""
    found = re.findall(r"^\| \d+ \| `([\w/]+\.py)` \|", walk_section(), re.M)
    return list(dict.fromkeys(found))


def listed(name: str) -> set[str]:
    """The modules the doc says a walk enters: its ```walk-<name>``` block."""
    block = re.search(rf"```walk-{name}\n(.*?)```", walk_section(), re.S)
    assert block is not None, f"docs/architecture.md has no walk-{name} block"
    return set(block.group(1).split())


def layer_ranks() -> dict[str, int]:
    """Each top-level package or module of kuikproxy → its row in the layers contract (0: the
    top); siblings of a row share it."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    return {
        name.strip().removeprefix("kuikproxy."): rank
        for rank, row in enumerate(layers)
        for name in row.split("|")
    }


RANKS = layer_ranks()


def module_of(frame: FrameType) -> str | None:
    name = frame.f_code.co_filename
    before, found, rest = name.rpartition(PACKAGE)
    return rest if found and "/tests/" not in before else None


def rank_of(module: str) -> int:
    return RANKS[module.split("/", 1)[0].removesuffix(".py")]


class Trace:
    """The modules of kuikproxy that run code while it is on, and the calls that go up."""

    def __init__(self) -> None:
        self.entered: set[str] = set()
        self.upcalls: set[str] = set()

    def profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or (module := module_of(frame)) is None:
            return
        self.entered.add(module)
        caller = frame.f_back
        while caller is not None and (below := module_of(caller)) is None:
            caller = caller.f_back  # through the standard library and aiohttp, to our caller
        if caller is not None and rank_of(below) > rank_of(module):  # type: ignore[arg-type]
            self.upcalls.add(f"{below}:{caller.f_code.co_name} → {module}:{frame.f_code.co_name}")

    async def run(self, call: Awaitable[Any]) -> Any:
        sys.setprofile(self.profile)
        threading.setprofile(self.profile)
        try:
            return await call
        finally:
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]


def test_the_doc_lists_walks_and_layers_the_trace_can_check() -> None:
    """The checks below read what they check from the doc and the contract: both are there."""
    steps = walk_steps()
    assert steps and set(steps) <= listed("held")
    assert listed("kept") < listed("held")
    assert {"core", "runtime", "web", "upstream", "observe"} <= set(RANKS)
    assert RANKS["core"] > RANKS["runtime"] > RANKS["web"] > RANKS["app"]


async def test_a_held_and_a_kept_head_enter_what_the_doc_lists_and_nothing_calls_back_up(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    client = await proxy()
    web = {"Kuik-Resource": "web"}
    await client.head(f"/v2/app/manifests/warm?ns={HOST}", headers=web)  # the host made
    held = Trace()
    response = await held.run(client.head(f"/v2/app/manifests/v1?ns={HOST}", headers=web))
    assert response.status == 200
    kept = Trace()  # another resource, the same image: the kept answer serves it (R1)
    other = {"Kuik-Resource": "other"}
    response = await kept.run(client.head(f"/v2/app/manifests/v1?ns={HOST}", headers=other))
    assert response.status == 200
    assert [m for m in walk_steps() if m not in held.entered] == []
    assert (sorted(held.entered - listed("held")), sorted(listed("held") - held.entered)) == (
        [],
        [],
    )
    assert (sorted(kept.entered - listed("kept")), sorted(listed("kept") - kept.entered)) == (
        [],
        [],
    )
    assert held.upcalls | kept.upcalls == set()
