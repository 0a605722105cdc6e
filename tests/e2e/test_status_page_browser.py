"""The status page in a real browser: headless Chromium loads ``/`` from a running kuikproxy.

Real time, not ``looptime``: the browser is a separate process that reads the page over a real
socket. With 200 ms check windows the laps of the scenario complete in a few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import struct
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from tests.upstream_app import Registry

pytestmark = pytest.mark.e2e

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHARED, ALONE = "registry.test", "other.test"
HOSTILE = "<script>alert(1)</script>"
WIDTH, HEIGHT = 1280, 800


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """``app`` on a free loopback port, as its base URL."""
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def config_text(upstream: str) -> str:
    block = (
        f"    upstream: {upstream}\n    check: {{interval: 200ms}}\n    copy: {{interval: 200ms}}\n"
    )
    top = f"allowedHosts: []\ndefaultRegistry: {SHARED}\n"
    return f"{top}registries:\n  {SHARED}:\n{block}  {ALONE}:\n{block}"


async def check(session: aiohttp.ClientSession, base: str, host: str, ref: str, who: str) -> int:
    url = f"{base}/v2/app/manifests/{ref}?ns={host}"
    async with session.head(url, headers={"Kuik-Resource": who}) as response:
        return response.status


async def lap(session: aiohttp.ClientSession, base: str, rings: dict[str, tuple[str, list[str]]]):  # type: ignore[no-untyped-def]
    """Every resource asks once for each image of its ring, all at once; one lap each."""
    statuses = await asyncio.gather(
        *(
            check(session, base, host, ref, who)
            for who, (host, refs) in rings.items()
            for ref in refs
        )
    )
    assert set(statuses) == {200}


async def chromium(*args: str) -> bytes:
    """Run headless Chromium (without blocking the loop that serves the page)."""
    assert CHROMIUM is not None
    process = await asyncio.create_subprocess_exec(
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--window-size={WIDTH},{HEIGHT}",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=90)
    assert process.returncode == 0, err.decode(errors="replace")[-2000:]
    return out


def png_size(path: Path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    return width, height


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
async def test_status_page_renders_hosts_rings_and_timelines_in_headless_chromium(
    tmp_path: Path,
) -> None:
    """After a few laps — two resources sharing one host, one alone on another, and one with a
    hostile name — Chromium renders ``/`` at 1280×800: both hosts, every ring with its lap
    ratio, the window timelines, and the hostile name as text, not markup. The screenshot is
    left in the test's tmp dir for a person to look at."""
    fake = Registry()
    rings = {
        "ImageMonitor/default/web": (SHARED, ["v1", "v2", "v3"]),
        "ImageMonitor/default/batch": (SHARED, ["v2", "v3", "v4", "v5"]),
        "node-7": (ALONE, ["v1", "v2", "v3"]),
        HOSTILE: (ALONE, ["v9"]),
    }
    async with (
        serving(fake.app()) as upstream,
        serving(build_app(parse_config(config_text(upstream)))) as base,
        aiohttp.ClientSession() as session,
    ):
        for _ in range(3):
            await lap(session, base, rings)
        # a copy, and a lap in progress while the browser looks: requests are waiting
        async with session.get(
            f"{base}/v2/app/manifests/v1?ns={ALONE}", headers={"Kuik-Resource": "node-7"}
        ) as response:
            assert response.status == 200
        pending = asyncio.ensure_future(lap(session, base, rings))
        await asyncio.sleep(0.3)
        status = await (await session.get(f"{base}/status")).json()

        profile = tmp_path / "profile"
        screenshot = tmp_path / "page.png"
        await chromium(f"--user-data-dir={profile}", f"--screenshot={screenshot}", f"{base}/")
        dom = (await chromium(f"--user-data-dir={profile}", "--dump-dom", f"{base}/")).decode()
        await pending

    assert screenshot.is_file()
    assert png_size(screenshot) == (WIDTH, HEIGHT)
    for host in (SHARED, ALONE):
        assert host in dom
    for resource, (host, refs) in rings.items():
        ring = status["resources"][resource]["checks"]["registries"][0]
        assert ring["registry"] == host and ring["images"] == len(refs)
        if resource != HOSTILE:
            assert resource in dom
    # the hostile name is text in the document, never an element
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in dom
    assert "<script>" not in dom
    assert dom.count('class="timeline"') == 4  # check and copy, per host
    assert 'fill="#2f9e44"' in dom  # used windows drawn
    assert "×" in dom  # completed laps have a ratio
