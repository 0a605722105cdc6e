"""The parts of the status page (:mod:`kuikproxy.observe.page`): each host's card with its series'
window timelines, the legend, and the tables of rings, priority levels and refusals — each
drawn from the :class:`~kuikproxy.runtime.snapshot.Snapshot` the page took. Resource and image
names come from clients: every string is escaped.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

from kuikproxy.core.rings import SLOW_LAP, lap_ratio
from kuikproxy.core.tickets import Operation
from kuikproxy.core.views import HostView, SeriesView
from kuikproxy.durations import format_duration, human_span
from kuikproxy.runtime.egress import NO_HOST
from kuikproxy.runtime.snapshot import Snapshot

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


def rings(snap: Snapshot) -> list[RingRow]:
    """Every ring the snapshot viewed, by resource then registry, with its cursor's place."""
    rows = []
    for host, view in snap.views.items():
        for ring in view.rings:
            position, waiting = snap.progress[(host, ring.resource)]
            rows.append(
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
    rows.sort(key=lambda r: (r.resource, r.registry))
    return rows


def copy_queues(snap: Snapshot) -> dict[str, dict[str, int]]:
    """The copies queued in the snapshot's views: resource → host → queued."""
    queues: dict[str, dict[str, int]] = {}
    for host, view in snap.views.items():
        for name, queued in view.copy_queues.items():
            queues.setdefault(name, {})[host] = queued
    return queues


def wall_clock(snap: Snapshot, loop_time: float) -> str:
    """A loop time as the wall clock's ``HH:MM:SS.mmm`` (UTC)."""
    moment = datetime.fromtimestamp(loop_time + snap.wall_offset, UTC)
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
    series: SeriesView, logged: list[tuple[float, str, float]], slots: int
) -> list[tuple[float, str]]:
    """The last ``slots`` windows of a series up to its latest, on its grid (P1): each with its
    logged outcome, or idle when none was logged — a series with nothing due sleeps and fires
    no window, so the windows it let pass were idle (P3). Windows of a grid the series left
    (a restart, P12) are not on this one."""
    origin, interval = series.origin, series.interval
    outcomes = {}
    for at, outcome, _ in logged:
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
        label = escape(f"{wall_clock(snap, at)} {outcome}")
        cells.append(
            f'<rect x="{x}" y="0" width="{CELL}" height="18" rx="1.5" fill="{color}">'
            f"<title>{label}</title></rect>"
        )
    if windows:
        span = f"{len(windows)} windows since {wall_clock(snap, windows[0][0])}"
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
    windows: list[tuple[float, str, float]],
) -> str:
    state_class, state_text = state
    rows = "".join(f'<span class="fact"><span class="k">{k}</span> {v}</span>' for k, v in facts)
    return (
        f'<div class="series"><div class="series-head"><h3>{title}</h3>'
        f'<span class="every">every {escape(format_duration(series.interval))}</span>'
        f'<span class="state {state_class}">{state_text}</span></div>'
        f'<div class="next">next window <b>{wall_clock(snap, series.next_window)}</b> '
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
            f"{wall_clock(snap, view.blocked_until)} ({_until(snap, view.blocked_until)})</span>"
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
    """Each ring's lap progress and last lap against its best case, and the copies queued."""
    ringed, queues = rings(snap), copy_queues(snap)
    rows = []
    for row in ringed:
        queued = queues.get(row.resource, {}).get(row.registry, 0)
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
    with_ring = {(r.resource, r.registry) for r in ringed}
    ringless = sorted(
        (resource, host, queued)
        for resource, hosts in queues.items()
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
    shown = len({row.resource for row in ringed} | set(queues))
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
        for host, counts in sorted({NO_HOST: snap.refused_elsewhere, **snap.refused}.items())
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


def store_rows(snap: Snapshot) -> str:
    """The pull-through store (§15): what it holds, and what it saved the registries."""
    store = snap.store
    if store is None:
        return '<p class="muted">No store (cache.blobs.path): blobs stream through.</p>'
    served = store.served_bytes
    disk, shared, read = served["store"], served["shared"], served["registry"]
    given = disk + shared + read
    saving = f"{100 * (disk + shared) / given:.0f}%" if given else "nothing yet"
    facts = (
        ("given from the store", _mib(disk)),
        ("given from another client's read", _mib(shared)),
        ("read from registries", _mib(read)),
        ("saved the registries", saving),
        ("on disk", f"{_mib(store.bytes)} of {_mib(store.max_bytes)}"),
        ("blobs", _number(store.blobs)),
        ("evicted", _number(store.evictions)),
        ("stale answers", _number(store.stale)),
    )
    items = "".join(f'<span class="fact"><span class="k">{k}</span> {v}</span>' for k, v in facts)
    return f'<div class="card"><div class="facts">{items}</div></div>'


def _mib(size: int) -> str:
    return f"{size / 1024**2:,.1f} MiB"


def legend() -> str:
    items = "".join(
        f'<span class="count"><i style="background:{OUTCOME_COLORS[o]}"></i>'
        f"<b>{o}</b>&nbsp;{OUTCOME_MEANINGS[o]}</span>"
        for o in OUTCOMES
    )
    return f'<div class="legend">windows: {items}</div>'
