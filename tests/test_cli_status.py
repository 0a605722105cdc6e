"""``kuikproxy status``: /status as terminal tables, once or ``--watch``ed.

These run on real time (the command is a blocking ``urllib`` client in a thread or another
process, reading a proxy served by the test's own loop); a 50 ms check interval keeps the laps
short.
"""

from __future__ import annotations

import asyncio
import io
import signal
import socket
import sys
from datetime import UTC, datetime
from typing import Any

import pytest

from kuikproxy import cli_status
from kuikproxy.cli import main
from kuikproxy.cli_status import CLEAR, render, ring_ratio, run
from tests.conftest import HOST, ProxyFactory, head
from tests.upstream_app import Registry

FAST = "check: {interval: 50ms}\ncopy: {interval: 50ms}"
RINGS = {"monitor-a": ["v1", "v2", "v3"], "monitor-b": ["v2", "v4"]}


async def scenario(proxy: ProxyFactory) -> tuple[Any, str]:
    """Two resources on one host, two laps each; the client and the proxy's base URL."""
    client = await proxy(FAST)
    for _ in range(2):
        responses = await asyncio.gather(
            *(head(client, ref, who) for who, refs in RINGS.items() for ref in refs)
        )
        assert {r.status for r in responses} == {200}
    return client, str(client.make_url("")).rstrip("/")


def rings_in(output: str) -> list[list[str]]:
    """The rows of the RINGS table, split on runs of spaces."""
    lines = output.split("RINGS", 1)[1].splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("RESOURCE"))
    rows = []
    for line in lines[header + 1 :]:
        if not line.strip() or line.startswith("lap ratio"):
            break
        rows.append(line.split())
    return rows


async def test_status_prints_the_same_rings_as_the_status_document(
    proxy: ProxyFactory, registry: tuple[Registry, object], capsys: pytest.CaptureFixture[str]
) -> None:
    """``kuikproxy status --url URL`` prints one row per ring with the resource, registry,
    images and cursor that /status has, and the host's row with its interval and mode."""
    _ = registry
    client, url = await scenario(proxy)
    document = await (await client.get("/status")).json()
    code = await asyncio.to_thread(main, ["status", "--url", url])
    assert code == 0
    output = capsys.readouterr().out
    expected = sorted(
        [name, ring["registry"], str(ring["images"]), ring["cursor"]]
        for name, resource in document["resources"].items()
        for ring in resource["checks"]["registries"]
    )
    assert [row[:4] for row in rings_in(output)] == expected
    assert len(expected) == 2
    host_row = next(line for line in output.splitlines() if line.startswith(HOST))
    assert host_row.split()[1:3] == ["50ms", "hold"]
    intervals = {host: r["check"]["interval"] for host, r in document["registries"].items()}
    ratios = sorted(
        f"x{ring_ratio(ring, intervals[ring['registry']]):.2f}"
        for resource in document["resources"].values()
        for ring in resource["checks"]["registries"]
    )
    assert sorted(next(c for c in row if c.startswith("x")) for row in rings_in(output)) == ratios
    levels = output[output.index("PRIORITY LEVELS") :].splitlines()
    shown = {line.split()[0]: line.split()[1:4] for line in levels[2:-1]}
    borrowing = {None: "-"}
    assert shown == {
        level["name"]: [
            level["type"],
            f"{level['nominalCL']}/{level['lendableCL']}/"
            f"{borrowing.get(level['borrowingCL'], level['borrowingCL'])}",
            str(level["currentCL"]),
        ]
        for level in document["flowControl"]["priorityLevels"]
    }


def _interruptible() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def test_status_watch_redraws_until_ctrl_c_and_exits_0(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """``--watch --interval 0.1`` clears the screen and redraws the tables repeatedly; Ctrl-C
    (SIGINT) ends it with exit code 0."""
    _ = registry
    _, url = await scenario(proxy)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "kuikproxy",
        "status",
        "--url",
        url,
        "--watch",
        "--interval",
        "0.1",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        # as a terminal's Ctrl-C finds it: a suite started in the background by a
        # non-interactive shell has SIGINT ignored, and a child inherits that
        preexec_fn=_interruptible,
    )
    assert process.stdout is not None
    seen = b""
    async with asyncio.timeout(30):
        while seen.count(CLEAR.encode()) < 3:
            seen += await process.stdout.read(4096)
    process.send_signal(signal.SIGINT)
    out, err = await asyncio.wait_for(process.communicate(), timeout=30)
    assert process.returncode == 0, err.decode()
    renders = (seen + out).decode().split(CLEAR)[1:]
    assert len(renders) >= 3
    assert all("monitor-a" in r and "RINGS (2)" in r for r in renders[:3])


def test_status_watch_is_bounded_by_iterations_and_sleeps_the_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watch loop redraws once per interval (``iterations`` bounds it for tests; the
    command line has no such option)."""
    served = {"registries": {}, "resources": {}}
    slept: list[float] = []
    out = io.StringIO()

    monkeypatch.setattr(cli_status, "fetch", lambda url, timeout=5.0: served)
    code = run(
        "http://kuikproxy.test", watch=True, interval=0.5, out=out, iterations=3, sleep=slept.append
    )
    assert code == 0
    assert out.getvalue().count(CLEAR) == 3
    assert slept == [0.5, 0.5]


def test_status_exits_1_with_a_clear_message_when_kuikproxy_cannot_be_reached(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A URL where nothing listens: exit code 1 and a message naming the URL, no traceback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends
    code = main(["status", "--url", f"http://127.0.0.1:{port}"])
    assert code == 1
    err = capsys.readouterr().err
    assert f"cannot reach http://127.0.0.1:{port}/status" in err
    assert "Traceback" not in err


def test_status_interval_must_be_a_positive_number(capsys: pytest.CaptureFixture[str]) -> None:
    """``--interval 0`` and ``--interval soon`` are usage errors (exit 2)."""
    assert main(["status", "--watch", "--interval", "0"]) == 2
    assert main(["status", "--watch", "--interval", "soon"]) == 2
    assert "--interval" in capsys.readouterr().err


def test_status_tables_never_send_a_clients_control_characters_to_the_terminal() -> None:
    """A resource or image name with terminal escapes is printed with them escaped, and lap
    ratios above 1.5 are flagged without color when the output is not a terminal."""
    hostile = "\x1b]0;owned\x07\x1b[2J"
    document = {
        "registries": {
            HOST: {
                "check": {"interval": "1s", "mode": "hold", "nextWindow": None, "waiting": 0,
                          "windows": {"used": 1, "idle": 0, "busy": 0, "blocked": 0, "fleet": 0}},
                "copy": {"interval": "5m0s", "nextWindow": None, "open": hostile, "queued": 0},
                "blockedUntil": None,
            }
        },
        "resources": {
            hostile: {"checks": {"registries": [
                {"registry": HOST, "images": 2, "cursor": hostile, "cycleStarted": None,
                 "cycleDuration": "4s"}]}, "copies": {"registries": []}}
        },
    }  # fmt: skip
    output = render(document, datetime.now(UTC))
    assert "\x1b" not in output and "\x07" not in output
    assert "\\x1b]0;owned\\x07\\x1b[2J" in output
    assert "x2.00 !" in output


def test_status_says_when_the_last_reload_was_refused() -> None:
    document = {
        "config": {"generation": 3, "lastError": "kuikproxy.yaml: a\nregistries.x.check: b"},
        "registries": {},
        "resources": {},
    }
    output = render(document, datetime.now(UTC))
    assert output.startswith(
        "CONFIG generation 3: the last reload was refused:\n"
        "  kuikproxy.yaml: a; registries.x.check: b\n"
    )


def test_status_says_when_resources_are_left_to_other_pages() -> None:
    """/status lists a page of resources: the tables say how many there are."""
    document = {"registries": {}, "resources": {}, "resourcesTotal": 250, "resourcesNext": "x"}
    output = render(document, datetime.now(UTC))
    assert "the first 0 of 250 resources: /status?after= for the others" in output
