"""A malformed request is its client's error (SPEC §12): answered, counted, never a traceback.

Each request below is one aiohttp's parser refuses (or parses, in a version that is no
HTTP/1.x), sent as raw bytes on 127.0.0.1: it gets the OCI error body with the status its
reason has, ``Connection: close`` and the connection closed after it; nothing is logged at
error or with a traceback; it is counted under its reason in ``/status.clientErrors`` and
``kuik_proxy_client_errors_total``, and warned of at most once a minute per reason (the loop's
clock, virtual here: looptime).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import pytest

from tests.conftest import ProxyFactory
from tests.web.raw import Exchange, exchange
from tests.web.test_metrics_http import named, scrape

pytestmark = pytest.mark.looptime

CHECK = "/v2/app/manifests/t?ns=registry.test"


def head(*lines: str, target: str = CHECK, version: str = "HTTP/1.1") -> bytes:
    return "\r\n".join([f"GET {target} {version}", "Host: x", *lines, "", ""]).encode("latin-1")


@dataclass(frozen=True)
class Case:
    reason: str
    status: int
    request: bytes
    what: str  # the test's id beside the reason


CASES = [
    Case("line-too-long", 414, head(target="/v2/" + "a/" * 5000 + "manifests/t"), "target-9k"),
    Case("header-too-large", 431, head("X-Big: " + "a" * 9000), "header-9k"),
    Case("header-too-large", 431, head(*(f"X-{i}: a" for i in range(200))), "200-headers"),
    Case("bad-header", 400, head("NoColonHere"), "no-colon"),
    Case("bad-header", 400, head("Kuik-Resource: a\x01b"), "control-char"),
    Case("bad-header", 400, b"GET / HTTP/1.1\r\n\r\n", "no-host"),  # no Host (RFC 9112 §3.2)
    Case(
        "bad-framing", 400,
        head("Content-Length: 3", "Transfer-Encoding: chunked") + b"0\r\n\r\n", "cl-and-te",
    ),
    Case("bad-framing", 400, head("Transfer-Encoding: chunked") + b"zz\r\n", "chunk-size"),
    Case("bad-framing", 400, head("Content-Length: 1", "Content-Length: 2"), "two-lengths"),
    Case("bad-path", 400, head(target="/v2/app\x00/manifests/t"), "nul"),
    Case("bad-method", 400, b"G\x01T / HTTP/1.1\r\nHost: x\r\n\r\n", "method"),
    Case("bad-method", 400, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(40), "tls"),
    Case("bad-version", 505, head(version="HTTP/1.2"), "http-1.2"),
    Case("bad-version", 505, head(version="HTTP/2.0"), "http-2.0"),  # parsed, but no HTTP/1.x
    Case("bad-version", 505, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", "h2-preface"),
    Case("other", 400, b"GET / HTTP/1.1\nHost: x\n\n", "bare-lf"),  # bare line feeds
]  # fmt: skip
REASONS = sorted({case.reason for case in CASES})


def assert_answered(result: Exchange, case: Case) -> None:
    """One answer, the case's status with an OCI error body naming its reason, and the
    connection closed after it."""
    answer = result.first
    assert answer.status == case.status, (answer, result.rest[:200])
    assert answer.headers["Content-Type"] == "application/json"
    assert answer.headers["Connection"] == "close"
    (error,) = answer.json()["errors"]
    assert error["code"] == "UNSUPPORTED"
    assert error["detail"] == {"reason": case.reason}
    assert error["message"].startswith("malformed request from 127.0.0.1: ")
    assert len(result.responses) == 1 and result.closed


def warnings_of(caplog: pytest.LogCaptureFixture, reason: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if f"({reason}, " in r.getMessage()]


def assert_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    loud = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not loud, [r.getMessage() for r in loud]


async def counted(client: Any) -> tuple[dict[str, int], dict[str, float]]:
    """The client errors by reason, as ``/status`` and as the metric show them."""
    status = await (await client.get("/status")).json()
    samples = named(await scrape(client), "kuik_proxy_client_errors_total")
    return status["clientErrors"], {dict(labels)["reason"]: v for labels, v in samples.items()}


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.reason}-{c.what}")
async def test_s12_a_malformed_request_gets_an_oci_error_and_is_counted(
    proxy: ProxyFactory, caplog: pytest.LogCaptureFixture, case: Case
) -> None:
    caplog.set_level(logging.DEBUG)
    client = await proxy()
    result = await exchange(client.host, client.port, case.request, expect=2)
    assert_answered(result, case)
    assert_no_traceback(caplog)
    shown, metric = await counted(client)
    assert shown == {case.reason: 1} and metric == {case.reason: 1.0}
    (warned,) = warnings_of(caplog, case.reason)
    assert "malformed request from 127.0.0.1" in warned
    assert (await client.get("/healthz")).status == 200  # the next connection is served


async def test_s12_each_reason_is_warned_of_once_a_minute_and_every_one_counted(
    proxy: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Three of every case within a minute: each reason warned of once, the first time; a
    minute later one more of each is warned of again, saying how many came so far."""
    caplog.set_level(logging.WARNING)
    client = await proxy()
    for _ in range(3):
        for case in CASES:
            assert_answered(await exchange(client.host, client.port, case.request, expect=2), case)
    per_reason = {r: sum(c.reason == r for c in CASES) for r in REASONS}
    assert {r: len(warnings_of(caplog, r)) for r in REASONS} == dict.fromkeys(REASONS, 1)
    await asyncio.sleep(61)
    for reason in REASONS:
        case = next(c for c in CASES if c.reason == reason)
        await exchange(client.host, client.port, case.request, expect=2)
        *_, last = warnings_of(caplog, reason)
        assert f"({reason}, {3 * per_reason[reason] + 1} so far)" in last
    assert {r: len(warnings_of(caplog, r)) for r in REASONS} == dict.fromkeys(REASONS, 2)
    assert_no_traceback(caplog)
    shown, metric = await counted(client)
    expected = {r: 3 * n + 1 for r, n in per_reason.items()}
    assert shown == expected and metric == {r: float(n) for r, n in expected.items()}


async def test_s12_a_flood_of_malformed_requests_costs_counters_only(
    proxy: ProxyFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """Ten malformed requests pipelined on each of a hundred connections: one answer a
    connection (the first refused closes it), one count each, one warning for them all."""
    caplog.set_level(logging.WARNING)
    client = await proxy()
    flood = head("NoColonHere") * 10
    results = await asyncio.gather(
        *(exchange(client.host, client.port, flood, expect=2) for _ in range(100))
    )
    assert all(len(r.responses) == 1 and r.first.status == 400 for r in results)
    shown, metric = await counted(client)
    assert shown == {"bad-header": 100} and metric == {"bad-header": 100.0}
    assert len(warnings_of(caplog, "bad-header")) == 1
    assert_no_traceback(caplog)
