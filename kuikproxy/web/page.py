"""``/``: the status page, for a person in front of a browser.

The same snapshots as ``/status`` (:class:`~kuikproxy.core.scheduler.HostView`, taken at one
``now``), drawn as HTML: per host, both series' next windows, counters and the recent window
outcomes as a timeline (:class:`~kuikproxy.runtime.windowlog.WindowLog`); per resource, each
ring's place in its lap and its last lap against its best case, ``cycleDuration / (images ×
check.interval)`` (the pacing document's "Watching the pace" ratio). Nothing here computes
pacing: the only figure not in a snapshot is the cursor's place in its ring, asked of the
scheduler at the same moment (:meth:`~kuikproxy.core.scheduler.HostScheduler.ring_progress`).

Everything is inline (CSS, SVG), nothing is fetched from anywhere, and the page reloads itself
every :data:`REFRESH` seconds. Resource and image names come from clients: every string is
escaped.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

from aiohttp import web

from kuikproxy.core.flowcontrol import LevelView
from kuikproxy.core.rings import SLOW_LAP, lap_ratio
from kuikproxy.core.scheduler import HostView, Operation, SeriesView
from kuikproxy.durations import format_duration, human_span
from kuikproxy.runtime.metrics import NO_HOST
from kuikproxy.web.keys import PACER, WINDOW_LOG

REFRESH = 2
"""Seconds between reloads of the page."""
POSITION_BUDGET = 100_000
PAGE_HOSTS = 50
"""Host cards one page draws (configured hosts first): with a thousand hosts under wildcards,
a page of them all would take the event loop for a tenth of a second and be unreadable."""
PAGE_RESOURCES = 200
"""Resources whose rings one page lists, in name order; every one of them is in ``/status``."""
"""How many hold-ring images one page may count to place cursors (~10 ms in all): past it,
rings get no lap bar, so that a page never holds the event loop for long, however many rings."""
OUTCOMES = ("used", "idle", "busy", "blocked", "fleet")
OUTCOME_COLORS = {
    "used": "#2f9e44",
    "idle": "#ced4da",
    "busy": "#f08c00",
    "blocked": "#e03131",
    "fleet": "#7048e8",
}
OUTCOME_MEANINGS = {
    "used": "read one image",
    "idle": "nothing was due",
    "busy": "previous image still being read",
    "blocked": "the registry asked us to stop",
    "fleet": "another proxy of the fleet used it",
}
CELL = 9  # px per window in a timeline
TIMELINE = 60  # windows in a timeline
CELL_GAP = 2


@dataclass(frozen=True, slots=True)
class RingRow:
    resource: str
    registry: str
    images: int
    cursor: str | None
    position: int | None
    cycle_started: float | None
    cycle_duration: float | None
    check_interval: float
    waiting: int

    @property
    def ratio(self) -> float | None:
        return lap_ratio(self.cycle_duration, self.images, self.check_interval)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the page shows, taken at one ``now`` (loop time); ``offset`` turns loop time into
    wall time, for display only."""

    now: float
    offset: float
    started: float
    views: dict[str, HostView]
    recent: dict[tuple[str, Operation], list[tuple[float, str]]]
    rings: list[RingRow]
    copy_queues: dict[str, dict[str, int]]  # resource → host → queued
    levels: tuple[LevelView, ...]  # flow control's priority levels (§10)
    hosts_total: int  # hosts with state, shown or not
    resources_total: int  # resources with state, shown or not
    refused: dict[str, dict[str, int]]  # host ("-": no host's state) → reason → count (§12)


def snapshot(app: web.Application) -> Snapshot:
    """Every host's view at one moment, with the window log and the rings' progress."""
    pacer, log = app[PACER], app[WINDOW_LOG]
    now = pacer.loop.time()
    schedulers = pacer.hosts
    names, _ = pacer.census.page(None, PAGE_RESOURCES)
    configured = pacer.config.registries
    cards = sorted(schedulers, key=lambda host: (host not in configured, host))[:PAGE_HOSTS]
    # the hosts drawn, and those the listed resources have rings on: no other is viewed
    wanted = {*cards, *(host for name in names for host in pacer.census.hosts(name))}
    every = pacer.views(now, names, wanted)
    views = {host: every[host] for host in sorted(cards)}
    rings: list[RingRow] = []
    queues: dict[str, dict[str, int]] = {}
    budget = POSITION_BUDGET
    for host, view in every.items():
        for ring in view.rings:
            position, waiting = schedulers[host].ring_progress(ring.resource, budget)
            if position is not None:
                budget -= ring.images  # an upper bound of what was counted
            rings.append(
                RingRow(
                    resource=ring.resource,
                    registry=host,
                    images=ring.images,
                    cursor=ring.cursor,
                    position=position,
                    cycle_started=ring.cycle_started,
                    cycle_duration=ring.cycle_duration,
                    check_interval=view.check.interval,
                    waiting=waiting,
                )
            )
        for name, queued in view.copy_queues.items():
            queues.setdefault(name, {})[host] = queued
    rings.sort(key=lambda r: (r.resource, r.registry))
    recent = {
        (host, operation): log.recent(host, operation)
        for host in views
        for operation in (Operation.CHECK, Operation.COPY)
    }
    return Snapshot(
        now,
        pacer.wall_offset,
        pacer.started,
        views,
        recent,
        rings,
        queues,
        pacer.levels(),
        len(schedulers),
        len(pacer.census),
        {NO_HOST: dict(pacer.refused.counts), **pacer.refusals()},
    )


async def status_page(request: web.Request) -> web.StreamResponse:
    """``GET /``: the status page."""
    return web.Response(
        text=render(snapshot(request.app)),
        content_type="text/html",
        charset="utf-8",
        headers={"Cache-Control": "no-store"},
    )


# -- rendering ----------------------------------------------------------------------------------


def _clock(snap: Snapshot, loop_time: float) -> str:
    moment = datetime.fromtimestamp(loop_time + snap.offset, UTC)
    return moment.strftime("%H:%M:%S.") + f"{moment.microsecond // 1000:03d}"


def _until(snap: Snapshot, at: float) -> str:
    left = at - snap.now
    return "now" if left <= 0 else f"in {human_span(left)}"


def _counts(windows: dict[str, int]) -> str:
    cells = "".join(
        f'<span class="count"><i style="background:{OUTCOME_COLORS[o]}"></i>'
        f"{o} <b>{windows.get(o, 0)}</b></span>"
        for o in OUTCOMES
    )
    return f'<div class="counts">{cells}</div>'


def on_grid(
    series: SeriesView, logged: list[tuple[float, str]], slots: int
) -> list[tuple[float, str]]:
    """The last ``slots`` windows of a series up to its latest, on its grid (P1): each with its
    logged outcome, or idle when none was logged — a series with nothing due sleeps and fires
    no window, so the windows it let pass were idle (P3). Windows of a grid the series left
    (a restart, P12) are not on this one."""
    origin, interval = series.origin, series.interval
    outcomes = {}
    for at, outcome in logged:
        k = (at - origin) / interval
        if abs(k - round(k)) < 1e-6:
            outcomes[round(k)] = outcome
    last = round((series.next_window - origin) / interval) - 1
    first = max(1, last - slots + 1)
    return [(origin + k * interval, outcomes.get(k, "idle")) for k in range(first, last + 1)]


def timeline(snap: Snapshot, windows: list[tuple[float, str]], slots: int) -> str:
    """The last windows of a series, oldest left, as colored cells (an SVG); each cell's
    tooltip gives its time and outcome. Empty slots on the left until the series has had
    ``slots`` windows."""
    width = slots * (CELL + CELL_GAP)
    cells = []
    start = slots - len(windows)
    for i in range(start):
        x = i * (CELL + CELL_GAP)
        cells.append(f'<rect x="{x}" y="0" width="{CELL}" height="18" class="empty"/>')
    for i, (at, outcome) in enumerate(windows, start):
        x = i * (CELL + CELL_GAP)
        color = OUTCOME_COLORS.get(outcome, "#868e96")
        label = escape(f"{_clock(snap, at)} {outcome}")
        cells.append(
            f'<rect x="{x}" y="0" width="{CELL}" height="18" rx="1.5" fill="{color}">'
            f"<title>{label}</title></rect>"
        )
    if windows:
        span = f"{len(windows)} windows since {_clock(snap, windows[0][0])}"
    else:
        span = "no window yet"
    return (
        f'<svg class="timeline" viewBox="0 0 {width} 18" preserveAspectRatio="none" '
        f'role="img" aria-label="{escape(span)}">{"".join(cells)}</svg>'
        f'<div class="span">{escape(span)} · newest on the right</div>'
    )


def _series(
    snap: Snapshot,
    title: str,
    *,
    series: SeriesView,
    facts: list[tuple[str, str]],
    state: tuple[str, str],
    windows: list[tuple[float, str]],
) -> str:
    state_class, state_text = state
    rows = "".join(f'<span class="fact"><span class="k">{k}</span> {v}</span>' for k, v in facts)
    return (
        f'<div class="series"><div class="series-head"><h3>{title}</h3>'
        f'<span class="every">every {escape(format_duration(series.interval))}</span>'
        f'<span class="state {state_class}">{state_text}</span></div>'
        f'<div class="next">next window <b>{_clock(snap, series.next_window)}</b> '
        f'<span class="until">{_until(snap, series.next_window)}</span></div>'
        f'<div class="facts">{rows}</div>'
        f"{_counts(series.windows)}"
        f"{timeline(snap, on_grid(series, windows, TIMELINE), TIMELINE)}</div>"
    )


def host_card(snap: Snapshot, host: str, view: HostView) -> str:
    check, copy = view.check, view.copy
    check_state = ("busy", "reading an image") if check.busy else ("free", "ready")
    if view.copy_open is not None:
        copy_state = ("busy", "copy open")
        opened = f'<span class="mono">{escape(view.copy_open)}</span>'
    else:
        copy_state = ("free", "no copy open")
        opened = '<span class="muted">—</span>'
    mode = "prefetch" if view.prefetch else "hold"
    check_html = _series(
        snap,
        "Checks",
        series=check,
        facts=[("mode", mode), ("waiting", _number(view.check_waiting))],
        state=check_state,
        windows=snap.recent.get((host, Operation.CHECK), []),
    )
    copy_html = _series(
        snap,
        "Copies",
        series=copy,
        facts=[("open", opened), ("queued", _number(view.copy_queued))],
        state=copy_state,
        windows=snap.recent.get((host, Operation.COPY), []),
    )
    blocked = ""
    if view.blocked_until is not None:
        blocked = (
            f'<span class="blocked">blocked by the registry until '
            f"{_clock(snap, view.blocked_until)} ({_until(snap, view.blocked_until)})</span>"
        )
    return (
        f'<section class="card host"><h2>{escape(host)}{blocked}</h2>'
        f'<div class="pair">{check_html}{copy_html}</div></section>'
    )


def _number(n: int) -> str:
    return f'<b class="{"hot" if n else "zero"}">{n}</b>'


def _bar(row: RingRow) -> str:
    if row.position is None:
        return '<span class="muted">ring too large to place the cursor</span>'
    done = row.position / row.images if row.images else 0.0
    done = min(done, 1.0)
    return (
        f'<div class="bar" title="{row.position} of {row.images}">'
        f'<div style="width:{done * 100:.1f}%"></div></div>'
        f'<span class="of">{row.position}/{row.images}</span>'
    )


def _ratio(row: RingRow) -> str:
    ratio = row.ratio
    if ratio is None:
        return '<span class="muted">no lap yet</span>'
    slow = " slow" if round(ratio, 2) > SLOW_LAP else ""  # as shown: ×1.50 is not above
    assert row.cycle_duration is not None
    return (
        f'<span class="ratio{slow}">×{ratio:.2f}</span> '
        f'<span class="muted">{human_span(row.cycle_duration)} / '
        f"{human_span(row.images * row.check_interval)}</span>"
    )


def ring_rows(snap: Snapshot) -> str:
    rows = []
    for row in snap.rings:
        queued = snap.copy_queues.get(row.resource, {}).get(row.registry, 0)
        cursor = (
            '<span class="muted">—</span>'
            if row.cursor is None
            else f'<span class="mono">{escape(row.cursor)}</span>'
        )
        started = (
            '<span class="muted">—</span>'
            if row.cycle_started is None
            else f"{human_span(max(snap.now - row.cycle_started, 0.0))} ago"
        )
        rows.append(
            "<tr>"
            f'<td class="name">{escape(row.resource)}</td>'
            f"<td>{escape(row.registry)}</td>"
            f'<td class="num">{row.images}</td>'
            f'<td class="lap">{_bar(row)}</td>'
            f'<td class="cursor">{cursor}</td>'
            f"<td>{started}</td>"
            f"<td>{_ratio(row)}</td>"
            f'<td class="num">{_number(row.waiting)}</td>'
            f'<td class="num">{_number(queued)}</td>'
            "</tr>"
        )
    with_ring = {(r.resource, r.registry) for r in snap.rings}
    ringless = sorted(
        (resource, host, queued)
        for resource, hosts in snap.copy_queues.items()
        for host, queued in hosts.items()
        if (resource, host) not in with_ring
    )
    for resource, host, queued in ringless:
        rows.append(
            f'<tr><td class="name">{escape(resource)}</td><td>{escape(host)}</td>'
            '<td class="num muted">—</td><td class="muted" colspan="4">no checks here</td>'
            f'<td class="num">{_number(0)}</td><td class="num">{_number(queued)}</td></tr>'
        )
    if not rows:
        return '<p class="muted">No resource has asked for an image yet.</p>'
    shown = len({row.resource for row in snap.rings} | set(snap.copy_queues))
    more = (
        f'<p class="note">The first {shown} of {snap.resources_total} resources; the others '
        "are in /status, a page at a time (?after=).</p>"
        if snap.resources_total > shown
        else ""
    )
    return (
        '<table class="rings"><thead><tr><th>resource</th><th>registry</th>'
        '<th class="num">images</th><th>lap progress (cursor)</th><th>cursor</th>'
        "<th>lap started</th>"
        '<th title="cycleDuration / (images × check interval)">last lap vs best case</th>'
        '<th class="num">waiting</th><th class="num">copies queued</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
        '<p class="note">lap progress: the cursor\'s place in the ring. last lap vs best case: '
        "cycleDuration / (images × check interval); above 1 the ring shares its host or loses "
        f'windows, <span class="ratio slow">red</span> above {SLOW_LAP}.</p>{more}'
    )


def level_rows(snap: Snapshot) -> str:
    """Flow control (§10): each priority level's seats, places and refusals."""
    rows = []
    for level in snap.levels:
        saturated = next((c for c in level.conditions if c.type == "Saturated"), None)
        limit = "—" if level.limit_response is None else str(level.current_cl)
        rows.append(
            "<tr>"
            f'<td class="name level">{escape(level.name)}</td>'
            f"<td>{escape(level.type.value)}</td>"
            f'<td class="num">{limit}</td>'
            f'<td class="num">{_number(level.executing)}</td>'
            f'<td class="num">{_number(level.in_queue)}</td>'
            f'<td class="num">{_number(level.parked)}</td>'
            f'<td class="num">{_number(sum(level.rejected.values()))}</td>'
            f"<td>{'—' if saturated is None else escape(saturated.message)}</td>"
            "</tr>"
        )
    return (
        '<table class="rings"><thead><tr><th>priority level</th><th>type</th>'
        '<th class="num" title="seats it may use now">seats</th><th class="num">executing</th>'
        '<th class="num">waiting for a seat</th><th class="num">waiting for a window</th>'
        '<th class="num">refused</th><th>saturation</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
        '<p class="note">A request holds a seat while it goes upstream, and a place in its '
        "flow's queues while it waits; a flow whose queues are full is refused (429).</p>"
    )


def refusal_rows(snap: Snapshot) -> str:
    """Refusals kuikproxy made itself (§12), by host and reason: a client that falls back to
    the registry after one must never do so unseen."""
    rows = [
        "<tr>"
        f'<td class="name">{escape(host)}</td><td>{escape(reason)}</td>'
        f'<td class="num">{_number(count)}</td>'
        "</tr>"
        for host, counts in sorted(snap.refused.items())
        for reason, count in sorted(counts.items())
    ]
    if not rows:
        return '<p class="muted">Nothing refused.</p>'
    return (
        '<table class="rings"><thead><tr><th>registry</th><th>reason</th>'
        '<th class="num">refused</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
        f'<p class="note">{NO_HOST}: requests no host&#39;s state answers for (a host not '
        "allowed, two names for one registry, a host past limits.maxHosts). A client that "
        "falls back to the registry on a refusal reads it unpaced: see the strict mirror "
        "examples.</p>"
    )


def _legend() -> str:
    items = "".join(
        f'<span class="count"><i style="background:{OUTCOME_COLORS[o]}"></i>'
        f"<b>{o}</b>&nbsp;{OUTCOME_MEANINGS[o]}</span>"
        for o in OUTCOMES
    )
    return f'<div class="legend">windows: {items}</div>'


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


def render(snap: Snapshot) -> str:
    hosts = "".join(host_card(snap, host, view) for host, view in snap.views.items())
    if not hosts:
        hosts = (
            '<p class="muted">No registry has been asked for anything yet: a host appears '
            "here at its first request.</p>"
        )
    elif snap.hosts_total > len(snap.views):
        hosts += (
            f'<p class="note">{len(snap.views)} of {snap.hosts_total} hosts (configured ones '
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
        f'<span class="meta">{_clock(snap, snap.now)} UTC · up {uptime} · '
        f"refreshes every {REFRESH}s · JSON at /status</span></header>"
        f"<main>{_legend()}"
        f'<h2 class="section-title">Registries</h2>{hosts}'
        f'<h2 class="section-title">Resources</h2>{ring_rows(snap)}'
        f'<h2 class="section-title">Flow control</h2>{level_rows(snap)}'
        f'<h2 class="section-title">Refused</h2>{refusal_rows(snap)}'
        "</main></body></html>"
    )
