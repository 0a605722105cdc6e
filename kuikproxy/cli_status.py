"""``kuikproxy status``: a running kuikproxy's ``/status`` (SPEC §8) as tables for a terminal.

Fetched with ``urllib`` (no dependency beyond the standard library, and nothing of the web stack
is imported). ``--watch`` redraws every ``--interval`` seconds until Ctrl-C. Names in the
document come from clients: control characters are shown escaped, never sent to the terminal.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from kuikproxy.core.rings import SLOW_LAP, lap_ratio
from kuikproxy.durations import human_span, parse_duration

TIMEOUT = 5.0
CLEAR = "\x1b[H\x1b[2J"
RED, RESET = "\x1b[31;1m", "\x1b[0m"
MAX_CELL = 60

EXIT_UNREACHABLE = 1

Document = dict[str, Any]


class Unreachable(Exception):
    """``/status`` could not be fetched or was not a status document."""


def fetch(url: str, timeout: float = TIMEOUT) -> Document:
    """``URL/status`` as JSON."""
    target = url.rstrip("/") + "/status"
    try:
        with urllib.request.urlopen(target, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as error:
        raise Unreachable(f"{target} answered {error.code} {error.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", error)
        raise Unreachable(f"cannot reach {target}: {reason}") from None
    try:
        document = json.loads(body)
    except ValueError:
        raise Unreachable(f"{target} did not answer JSON: is it a kuikproxy?") from None
    if not isinstance(document, dict) or "registries" not in document:
        raise Unreachable(f"{target} did not answer a kuikproxy status document")
    return document


# -- rendering ----------------------------------------------------------------------------------


def _text(value: object) -> str:
    """A cell: control characters escaped (a client's name must not drive the terminal), and
    cut to :data:`MAX_CELL` characters."""
    text = "-" if value is None else str(value)
    text = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in text)
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: frozenset[int]) -> str:
    """Columns padded to their widest cell; the columns in ``right`` are right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(headers), *(line(r) for r in rows)])


def _moment(value: str | None) -> datetime | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _at(value: str | None, now: datetime) -> str:
    """``HH:MM:SS.mmm (in 1.2s)`` or ``(3.0s ago)``, UTC."""
    moment = _moment(value)
    if moment is None:
        return "-"
    clock = moment.strftime("%H:%M:%S.") + f"{moment.microsecond // 1000:03d}"
    delta = (moment - now).total_seconds()
    if delta > 0:
        return f"{clock} (in {human_span(delta)})"
    return f"{clock} ({human_span(-delta)} ago)"


def ring_ratio(ring: Document, check_interval: str | None) -> float | None:
    """The ring's :func:`~kuikproxy.core.rings.lap_ratio`, from /status's Go durations."""
    if ring.get("cycleDuration") is None or check_interval is None:
        return None
    duration = parse_duration(ring["cycleDuration"])
    return lap_ratio(duration, int(ring.get("images") or 0), parse_duration(check_interval))


def render(document: Document, now: datetime, color: bool = False) -> str:
    """The registries and rings tables of a status document, at ``now`` (for "in 1.2s")."""
    registries: dict[str, Document] = document.get("registries", {})
    host_rows = []
    blocked = []
    for host, entry in sorted(registries.items()):
        check, copy = entry["check"], entry["copy"]
        windows = check["windows"]
        host_rows.append(
            [
                _text(host),
                _text(check["interval"]),
                _text(check["mode"]),
                _at(check["nextWindow"], now),
                str(check["waiting"]),
                "/".join(str(windows[k]) for k in ("used", "idle", "busy", "blocked")),
                _text(copy["interval"]),
                _at(copy["nextWindow"], now),
                _text(copy["open"]),
                str(copy["queued"]),
            ]
        )
        if entry.get("blockedUntil"):
            until = _at(entry["blockedUntil"], now)
            blocked.append(f"{_text(host)} is blocked by the registry until {until}")
    ring_rows = []
    for resource, entry in sorted(document.get("resources", {}).items()):
        for ring in entry["checks"]["registries"]:
            interval = registries.get(ring["registry"], {}).get("check", {}).get("interval")
            ratio = ring_ratio(ring, interval)
            shown = "-" if ratio is None else f"x{ratio:.2f}"
            if ratio is not None and round(ratio, 2) > SLOW_LAP:
                shown = f"{RED}{shown}{RESET}" if color else f"{shown} !"
            ring_rows.append(
                [
                    _text(resource),
                    _text(ring["registry"]),
                    str(ring["images"]),
                    _text(ring["cursor"]),
                    _at(ring["cycleStarted"], now),
                    _text(ring["cycleDuration"]),
                    shown,
                ]
            )
    parts = []
    config = document.get("config") or {}
    if config.get("lastError"):
        refused = "; ".join(_text(line) for line in config["lastError"].splitlines())
        parts += [f"CONFIG generation {config.get('generation')}: the last reload was refused:",
                  f"  {refused}", ""]  # fmt: skip
    parts.append(f"REGISTRIES ({len(host_rows)})")
    if host_rows:
        parts.append(
            table(
                ["HOST", "CHECK", "MODE", "NEXT CHECK", "WAITING", "USED/IDLE/BUSY/BLOCKED",
                 "COPY", "NEXT COPY", "OPEN", "QUEUED"],
                host_rows,
                frozenset({4, 9}),
            )
        )  # fmt: skip
    else:
        parts.append("no registry has been asked for anything yet")
    parts.extend(blocked)
    parts += ["", f"RINGS ({len(ring_rows)})"]
    if ring_rows:
        parts.append(
            table(
                ["RESOURCE", "REGISTRY", "IMAGES", "CURSOR", "CYCLE STARTED", "CYCLE DURATION",
                 "LAP RATIO"],
                ring_rows,
                frozenset({2}),
            )
        )  # fmt: skip
        parts.append(
            f"lap ratio: cycleDuration / (images x check interval); above 1 the ring shares "
            f"its host or loses windows; flagged above {SLOW_LAP}"
        )
    else:
        parts.append("no ring yet")
    listed, total = len(document.get("resources", {})), document.get("resourcesTotal", 0)
    if total > listed:
        parts.append(f"the first {listed} of {total} resources: /status?after= for the others")
    parts += ["", *refusals(document), "", *priority_levels(document)]
    return "\n".join(parts) + "\n"


def refusals(document: Document) -> list[str]:
    """What kuikproxy refused itself (§12), by registry and reason; ``-`` for what no host's
    state answers for (a host not allowed, two names for one registry, ``limits.maxHosts``)."""
    counts: list[tuple[str, Document]] = [("-", document.get("refused") or {})]
    counts += [(h, e.get("refused") or {}) for h, e in document.get("registries", {}).items()]
    rows = [
        [_text(host), _text(reason), str(count)]
        for host, by_reason in sorted(counts)
        for reason, count in sorted(by_reason.items())
    ]
    if not rows:
        return ["REFUSED (0)", "nothing refused"]
    return [
        f"REFUSED ({len(rows)})",
        table(["REGISTRY", "REASON", "REFUSED"], rows, frozenset({2})),
    ]


def priority_levels(document: Document) -> list[str]:
    """The flow-control table (§10): each level's seats, queues and refusals."""
    levels: list[Document] = document.get("flowControl", {}).get("priorityLevels", [])
    rows = []
    for level in levels:
        saturated = next((c for c in level["conditions"] if c["type"] == "Saturated"), None)
        borrowing = "-" if level["borrowingCL"] is None else level["borrowingCL"]
        rows.append(
            [
                _text(level["name"]),
                _text(level["type"]),
                f"{level['nominalCL']}/{level['lendableCL']}/{borrowing}",
                str(level["currentCL"]),
                str(level["executing"]),
                str(level["inQueue"] - level["parked"]),
                str(level["parked"]),
                str(level["rejected"]),
                "-" if saturated is None else _text(saturated["reason"]),
            ]
        )
    title = f"PRIORITY LEVELS ({len(rows)})"
    if not rows:
        return [title, "no priority level"]
    return [
        title,
        table(
            ["LEVEL", "TYPE", "NOMINAL/LENDABLE/BORROWING", "LIMIT", "EXECUTING", "QUEUED",
             "PARKED", "REJECTED", "SATURATED"],
            rows,
            frozenset({3, 4, 5, 6, 7}),
        ),
        "QUEUED waits for a seat, PARKED for its window; both hold places in the level's queues",
    ]  # fmt: skip


# -- the command --------------------------------------------------------------------------------


def run(
    url: str,
    *,
    watch: bool = False,
    interval: float = 2.0,
    out: TextIO | None = None,
    iterations: int | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Print the tables once, or with ``watch`` redraw them every ``interval`` seconds until
    Ctrl-C (exit 0). ``iterations`` bounds the redraws, for tests; the command line has no
    such option. Exit 1 when the first fetch fails; while watching, a failure is shown and the
    next redraw tries again (a proxy that restarts comes back on the screen)."""
    stream = sys.stdout if out is None else out
    color = stream.isatty()
    try:
        document: Document | Unreachable = fetch(url)
    except Unreachable as error:
        print(f"kuikproxy status: {error}", file=sys.stderr)
        return EXIT_UNREACHABLE
    if not watch:
        assert not isinstance(document, Unreachable)
        stream.write(render(document, datetime.now(UTC), color))
        return 0
    drawn = 0
    try:
        while True:
            now = datetime.now(UTC)
            head = (
                f"kuikproxy status  {url}  {now.strftime('%H:%M:%S')} UTC  "
                f"every {interval:g}s, Ctrl-C to stop\n\n"
            )
            body = (
                f"{document}\n(trying again every {interval:g}s)\n"
                if isinstance(document, Unreachable)
                else render(document, now, color)
            )
            stream.write(CLEAR + head + body)
            stream.flush()
            drawn += 1
            if iterations is not None and drawn >= iterations:
                return 0
            sleep(interval)
            try:
                document = fetch(url)
            except Unreachable as error:
                document = error
    except KeyboardInterrupt:
        stream.write("\n")
        return 0
