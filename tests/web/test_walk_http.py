"""The walk of one HEAD (``docs/architecture.md``) is what the code does: a profiler follows a
held HEAD of a manifest from the handler to the registry and back, and finds every module of
the documented walk on its way, and no call from the upstream client back into the web edge
(nor from the runtime: answers go back up by returning, and by resolving futures)."""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from tests.conftest import HOST, ProxyFactory
from tests.upstream_app import Registry

pytestmark = pytest.mark.looptime

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
PACKAGE = f"{Path('kuikproxy')}/"


def walk_modules() -> list[str]:
    """The modules of the walk's table, in order of first appearance."""
    section = DOC.split("## The walk of one HEAD", 1)[1].split("\n## ", 1)[0]
    return list(dict.fromkeys(re.findall(r"^\| \d+ \| `([\w/]+\.py)` \|", section, re.M)))


def module_of(frame: FrameType) -> str | None:
    name = frame.f_code.co_filename
    _, found, rest = name.rpartition(f"/{PACKAGE}")
    return rest if found else None


async def test_a_held_head_walks_the_documented_modules_and_nothing_calls_back_up(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    walk = walk_modules()
    assert 0 < len(walk) <= 12
    client = await proxy()
    await client.head(f"/v2/app/manifests/warm?ns={HOST}")  # the host and its caches made
    entered: set[str] = set()
    upcalls: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or (module := module_of(frame)) is None:
            return
        entered.add(module)
        if not module.startswith("web/"):
            return
        caller = frame.f_back
        while caller is not None:  # a web function called from below the web edge?
            below = module_of(caller)
            if below is not None and below.startswith(("upstream/", "runtime/")):
                upcalls.append(f"{below} → {module}:{frame.f_code.co_name}")
                break
            caller = caller.f_back

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        response = await client.head(f"/v2/app/manifests/v1?ns={HOST}")
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    assert response.status == 200
    assert [m for m in walk if m not in entered] == []
    assert upcalls == []
