"""``/``, the status page: what a scenario leaves on it, on virtual time, and that names from
clients are escaped. (The same page in a real browser: ``tests/e2e/test_status_page_browser.py``.)
"""

from __future__ import annotations

import asyncio
import re

import pytest

from kuikproxy.core.rings import Ring
from kuikproxy.observe.page_rows import OUTCOME_COLORS
from tests.conftest import HOST, ProxyFactory, head
from tests.upstream_app import Registry

INTERVAL = 0.2
HOSTILE = "<script>alert(1)</script>"


async def laps(client, resources: dict[str, list[str]], count: int) -> None:  # type: ignore[no-untyped-def]
    for _ in range(count):
        responses = await asyncio.gather(
            *(head(client, ref, who) for who, refs in resources.items() for ref in refs)
        )
        assert {r.status for r in responses} == {200}


@pytest.mark.looptime
async def test_page_shows_each_host_its_series_and_the_window_timeline(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """A host's card has both series with their interval, mode and next window ("in 0.2s"
    right after a window), the window counters, and one timeline cell per logged window in the
    outcome's color; the page reloads itself and loads nothing from anywhere."""
    _ = registry
    client = await proxy("check: {interval: 200ms}\ncopy: {interval: 200ms}")
    await laps(client, {"monitor-a": ["v1", "v2"]}, 1)  # windows at 0.2 and 0.4
    response = await client.get("/")
    assert response.status == 200
    assert response.content_type == "text/html"
    page = await response.text()
    assert f"<h2>{HOST}" in page
    assert page.count("every 200ms") == 2  # checks and copies
    assert "mode</span> hold" in page
    assert page.count("in 0.2s") == 2  # both series: the next window is 0.6
    assert '<meta http-equiv="refresh" content="2">' in page
    assert not re.search(r"(src|href)=|@import|url\(|<script", page)
    # two used check windows; the copy series had two idle ones
    assert page.count(f'fill="{OUTCOME_COLORS["used"]}"') == 2
    assert page.count(f'fill="{OUTCOME_COLORS["idle"]}"') == 2
    assert "used <b>2</b>" in page
    for outcome in ("used", "idle", "busy", "blocked"):  # the legend
        assert f"<b>{outcome}</b>" in page


@pytest.mark.looptime
async def test_page_shows_each_ring_its_lap_progress_and_ratio_to_its_best_case(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """Each ring has a row: images, the cursor's place as a bar (position/images), the last
    lap against images × check interval, flagged above 1.5, and the requests waiting."""
    _ = registry
    client = await proxy()
    # alone, two images: laps in 2 windows, its best case (×1.00)
    await laps(client, {"alone": ["a1", "a2"]}, 3)
    # two resources, disjoint images on one host: each laps in 4 windows, best case 2 (×2.00)
    await laps(client, {"left": ["l1", "l2"], "right": ["r1", "r2"]}, 3)
    waiting = asyncio.ensure_future(head(client, "l1", "left"))
    await asyncio.sleep(INTERVAL / 2)
    page = await (await client.get("/")).text()
    rows = {
        m.group(1): m.group(0)
        for m in re.finditer(r'<tr><td class="name">([^<]+)</td>.*?</tr>', page)
    }
    assert set(rows) == {"alone", "left", "right"}
    assert '<span class="ratio">×1.00</span>' in rows["alone"]
    assert "0.4s / 0.4s" in rows["alone"]
    assert '<span class="ratio slow">×2.00</span>' in rows["right"]
    assert '<span class="of">2/2</span>' in rows["right"]  # cursor on its last image
    assert 'style="width:100.0%"' in rows["right"]
    assert re.search(r'class="hot">1</b></td><td class="num"><b class="zero">0', rows["left"])
    assert 'waiting</span> <b class="hot">1</b>' in page
    assert (await waiting).status == 200


@pytest.mark.looptime
async def test_page_escapes_resource_names_from_clients(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """A resource named ``<script>alert(1)</script>`` (the Kuik-Resource header is the
    client's) appears on the page as text, never as markup."""
    _ = registry
    client = await proxy()
    assert (await head(client, "v1", HOSTILE)).status == 200
    page = await (await client.get("/")).text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script" not in page


@pytest.mark.looptime
async def test_page_before_any_request_shows_the_host_and_no_resource_yet(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """Right after start the configured host is there with its first windows ahead and an
    empty timeline, and the resources part says none asked yet instead of being blank; `/` is
    the page while other unknown paths stay 404."""
    _ = registry
    client = await proxy()
    page = await (await client.get("/")).text()
    assert f"<h2>{HOST}" in page
    assert page.count("no window yet") == 4  # the aria label and the caption, per series
    assert "No resource has asked for an image yet" in page
    assert (await client.get("/nothing-here")).status == 404


def test_ring_position_is_the_cursors_rank_in_both_modes() -> None:
    """Ring.position (the page's lap bar): images at or before the cursor, 0 before the first
    turn; the same in hold (counted) and prefetch (from the ordered index); None for a hold
    ring over the limit, so a page never scans a huge ring."""
    for prefetch in (False, True):
        ring = Ring()
        if prefetch:
            ring.walk_in_order()
        for image in ("d", "b", "a", "c"):
            ring.ask(image, 0.0)
            ring.wait(image)
        assert ring.position(limit=10) == 0
        assert ring.take(1.0, prefetch) == "a"
        assert ring.take(2.0, prefetch) == "b"
        assert ring.position(limit=10) == 2
        assert ring.waiting_requests() == 4
        ring.unwait("a")
        assert ring.waiting_requests() == 3
        assert ring.position(limit=3) == (2 if prefetch else None)


@pytest.mark.looptime
async def test_page_shows_each_priority_level_and_what_waits_on_it(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """The flow-control table: a row per priority level, with the checks parked for their
    window counted on the checks level while they wait, and the seats it may use."""
    _ = registry
    client = await proxy()
    held = [asyncio.ensure_future(head(client, ref)) for ref in ("a", "b", "c")]
    await asyncio.sleep(0.05)
    page = await (await client.get("/")).text()
    rows = re.findall(r'<tr><td class="name level">([^<]+)</td><td>(\w+)</td>(.*?)</tr>', page)
    levels = {
        name: (
            kind,
            [re.sub("<[^>]+>", "", n) for n in re.findall(r'class="num">(.*?)</td>', cells)],
        )
        for name, kind, cells in rows
    }
    assert levels["checks"] == ("Limited", ["30", "0", "0", "3", "0"])  # 3 parked
    assert levels["exempt"][0] == "Exempt"
    assert set(levels) == {"exempt", "checks", "copies", "catch-all"}
    assert {r.status for r in await asyncio.gather(*held)} == {200}
