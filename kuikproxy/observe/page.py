"""``/``: the status page, for a person in front of a browser.

The same :class:`~kuikproxy.runtime.snapshot.Snapshot` as ``/status`` and ``/metrics``, drawn as
HTML (:mod:`kuikproxy.observe.page_rows` draws its parts): per host, both series' next windows,
counters and the recent window outcomes as a timeline
(:class:`~kuikproxy.runtime.windowhistory.WindowHistory`); per resource, each ring's place in its
lap and its last lap against its best case, ``cycleDuration / (images × check.interval)`` (the
pacing document's "Watching the pace" ratio). Nothing here computes pacing: the only figure not
in a host's view is the cursor's place in its ring, which the snapshot takes for the page.

Everything is inline (CSS, SVG), nothing is fetched from anywhere, and the page reloads itself
every :data:`REFRESH` seconds.
"""

from __future__ import annotations

from collections.abc import Collection

from aiohttp import web

from kuikproxy.durations import human_span
from kuikproxy.observe.observed import OBSERVED
from kuikproxy.observe.page_rows import (
    host_card,
    legend,
    level_rows,
    refusal_rows,
    ring_rows,
    store_rows,
    wall_clock,
)
from kuikproxy.runtime.snapshot import Snapshot, snapshot

REFRESH = 2
"""Seconds between reloads of the page."""
PAGE_HOSTS = 50
"""Host cards one page draws (configured hosts first): with a thousand hosts under wildcards,
a page of them all would take the event loop for a tenth of a second and be unreadable."""
PAGE_RESOURCES = 200
"""Resources whose rings one page lists, in name order; every one of them is in ``/status``."""
POSITION_BUDGET = 100_000
"""How many hold-ring images one page may count to place cursors (~10 ms in all): past it,
rings get no lap bar, so that a page never holds the event loop for long, however many rings."""


async def status_page(request: web.Request) -> web.StreamResponse:
    """``GET /``: the status page, of a snapshot of the cards' hosts and of those the listed
    resources have rings on (no other is viewed)."""
    observed = request.app[OBSERVED]
    pacer = observed.pacer
    now = pacer.loop.time()
    names, _ = pacer.census.page(None, PAGE_RESOURCES)
    configured = pacer.config.registries
    cards = sorted(pacer.hosts, key=lambda host: (host not in configured, host))[:PAGE_HOSTS]
    wanted = {*cards, *(host for name in names for host in pacer.census.hosts(name))}
    snap = snapshot(
        pacer,
        now,
        resources=names,
        hosts=wanted,
        quotas=False,  # the page shows none
        progress=POSITION_BUDGET,
        recent=True,
    )
    return web.Response(
        text=render(snap, cards),
        content_type="text/html",
        charset="utf-8",
        headers={"Cache-Control": "no-store"},
    )


STYLE = """
*{box-sizing:border-box}
body{margin:0;font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;
 color:#212529;background:#f1f3f5}
header{display:flex;align-items:baseline;gap:16px;padding:10px 20px;background:#212529;
 color:#f8f9fa}
header h1{margin:0;font-size:18px}
header .meta{color:#adb5bd;font-size:13px}
main{padding:12px 20px}
.legend{margin:0 0 10px;font-size:13px;color:#495057}
.card{background:#fff;border:1px solid #dee2e6;border-radius:6px;padding:10px 14px;
 margin-bottom:12px}
h2{margin:0 0 8px;font-size:16px}
h2 .blocked{margin-left:12px;font-size:13px;font-weight:600;color:#fff;background:#e03131;
 padding:2px 8px;border-radius:4px}
h1+.meta{margin-left:auto}
.section-title{margin:16px 0 6px;font-size:15px;color:#495057;text-transform:uppercase;
 letter-spacing:.04em}
.pair{display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:28px}
.series-head{display:flex;align-items:baseline;gap:10px}
h3{margin:0;font-size:15px}
.every{color:#495057}
.state{margin-left:auto;font-size:12px;font-weight:600;padding:1px 8px;border-radius:10px}
.state.free{background:#ebfbee;color:#2b8a3e}
.state.busy{background:#fff4e6;color:#d9480f}
.next{margin:4px 0 2px;font-size:15px}
.next b{font-variant-numeric:tabular-nums}
.until{color:#1971c2;font-weight:600}
.facts{display:flex;gap:4px 18px;margin:2px 0 4px;flex-wrap:wrap}
.fact{max-width:520px;overflow:hidden;text-overflow:ellipsis;white-space:nowrap}
.k{color:#868e96}
.counts,.legend{display:flex;flex-wrap:wrap;gap:4px 14px}
.count{white-space:nowrap}
.count i{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px;
 vertical-align:-1px}
.count b{font-variant-numeric:tabular-nums}
.timeline{display:block;width:100%;height:18px;margin-top:6px}
.timeline .empty{fill:none;stroke:#e9ecef}
.span{font-size:11px;color:#868e96}
.hot{color:#d9480f}.zero{color:#868e96;font-weight:400}
.muted{color:#868e96}
.note{margin:6px 2px;font-size:12px;color:#868e96}
.mono,.cursor{font-family:ui-monospace,"DejaVu Sans Mono",Menlo,monospace;font-size:13px}
table.rings{width:100%;border-collapse:collapse;background:#fff;border:1px solid #dee2e6}
.rings th,.rings td{padding:6px 10px;border-bottom:1px solid #e9ecef;text-align:left;
 vertical-align:middle;white-space:nowrap}
.rings th{font-size:12px;color:#495057;background:#f8f9fa;font-weight:600}
.rings td.name{font-weight:600;max-width:260px;overflow:hidden;text-overflow:ellipsis}
.rings td.cursor{max-width:240px;overflow:hidden;text-overflow:ellipsis}
.num{text-align:right!important;font-variant-numeric:tabular-nums}
.lap{min-width:170px}
.bar{display:inline-block;width:110px;height:10px;background:#e9ecef;border-radius:5px;
 overflow:hidden;vertical-align:middle;margin-right:6px}
.bar div{height:100%;background:#1c7ed6}
.of{font-variant-numeric:tabular-nums;color:#495057}
.ratio{font-weight:700;color:#2b8a3e;font-variant-numeric:tabular-nums}
.ratio.slow{color:#fff;background:#e03131;padding:0 6px;border-radius:4px}
"""


def render(snap: Snapshot, cards: Collection[str]) -> str:
    """The page of a snapshot, with the cards of the hosts ``cards`` (of those viewed)."""
    shown = sorted(cards)
    hosts = "".join(host_card(snap, host, snap.views[host]) for host in shown)
    if not hosts:
        hosts = (
            '<p class="muted">No registry has been asked for anything yet: a host appears '
            "here at its first request.</p>"
        )
    elif snap.hosts_total > len(shown):
        hosts += (
            f'<p class="note">{len(shown)} of {snap.hosts_total} hosts (configured ones '
            "first); every one is in /status.</p>"
        )
    uptime = human_span(max(snap.now - snap.started, 0.0))
    return (
        "<!doctype html>"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="refresh" content="{REFRESH}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        "<title>kuikproxy status</title>"
        f"<style>{STYLE}</style></head><body>"
        "<header><h1>kuikproxy</h1>"
        f'<span class="meta">{wall_clock(snap, snap.now)} UTC · up {uptime} · '
        f"refreshes every {REFRESH}s · JSON at /status</span></header>"
        f"<main>{legend()}"
        f'<h2 class="section-title">Registries</h2>{hosts}'
        f'<h2 class="section-title">Resources</h2>{ring_rows(snap)}'
        f'<h2 class="section-title">Store</h2>{store_rows(snap)}'
        f'<h2 class="section-title">Flow control</h2>{level_rows(snap)}'
        f'<h2 class="section-title">Refused</h2>{refusal_rows(snap)}'
        "</main></body></html>"
    )
