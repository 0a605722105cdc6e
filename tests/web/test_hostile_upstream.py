"""A registry kuikproxy trusts cannot send it where it does not belong (SPEC §3.1, §12, R5).

A table of hostile answers to a blob read (or a manifest check), each from a registry with an
explicit loopback ``upstream`` (so trusted as written), in three classes:

* **redirect target** — a ``Location`` (or a token realm) naming a loopback, link-local or
  metadata address, another port of the registry's own host, or a scheme other than http(s):
  refused with a prompt ``502`` naming the host and the reason, and no request reaches the
  local service it named. A target that is a configured endpoint (another host's explicit
  ``upstream``) is followed;
* **malformed Location** — a port out of range, an unclosed IPv6 bracket, no host, a control
  character: a prompt ``502`` saying why, never a hang (a check read, which the pacer carries
  out, was held until its ``maxHold`` when a Location broke the registry client);
* **secret in output** — a signed storage URL (or a token realm URL, or userinfo) whose target
  fails to connect, times out, answers 5xx, resets mid-body or redirects for ever.

Every Location and realm carries :data:`SECRET` in its query (or userinfo): in no case does it
reach the error body, a log record (DEBUG, tracebacks included), ``/status`` or ``/metrics``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from kuikproxy.upstream.client import CONNECT_TIMEOUT
from tests.upstream_app import digest_of
from tests.web.raw import Behaviour, RawRequest, RawServer, reset

pytestmark = pytest.mark.looptime

HOST = "registry.test"
SECRET = "s3cr3t-5ignature"
SIGNED = f"X-Amz-Signature={SECRET}"
BLOB = b"b" * 1000  # what tests.web.raw.answer_blob serves
DIGEST = digest_of(BLOB)
COPY_TIMEOUT = 3 * CONNECT_TIMEOUT  # so that a connection that never completes shows its own
CEILING = 1.0  # aiohttp rounds a timeout over 5 s up to the next whole second of loop time
# storage.test and gone.test are there for their explicit upstreams: the operator's way to let
# redirects reach those loopback endpoints
CONFIG = f"""\
registries:
  {HOST}:
    upstream: http://127.0.0.1:{{registry}}
    check: {{{{interval: 10ms}}}}
    copy: {{{{interval: 10ms, idle: 0s, timeout: {COPY_TIMEOUT:g}s}}}}
  storage.test:
    upstream: http://127.0.0.1:{{storage}}
  gone.test:
    upstream: http://127.0.0.1:{{dead}}
"""

REDIRECT_TARGET = "redirect target"
MALFORMED = "malformed Location"
SECRET_OUT = "secret in output"


@dataclass(frozen=True)
class Case:
    """One hostile answer to ``GET /v2/app/blobs/<digest>`` (``check``: to a manifest check,
    ``GET /v2/app/manifests/v1`` with ``Kuik-Operation: check``) and what the client gets.

    ``location`` is the registry's ``Location`` (a ``307``), ``realm`` the token realm it
    challenges a read without ``Authorization`` with; both are formatted with the ports of the
    peers (``registry``: the hostile registry itself; ``storage``: a configured endpoint;
    ``dead``: a configured endpoint nothing listens on; ``admin``: a local service no
    configuration names) and ``secret``. ``status`` is the client's; for kuikproxy's own
    errors (502, 504) the OCI message contains ``reason``. ``admin_sees`` is every path the
    local service may be sent; ``within`` bounds the (virtual) seconds the answer takes;
    ``broken``: the answer's body is cut short (its headers were relayed)."""

    kind: str
    id: str
    status: int
    reason: str = ""
    location: str | None = None
    realm: str | None = None
    admin_sees: tuple[str, ...] = ()
    within: float = 1.0
    broken: bool = False
    check: bool = False


def redirect(id: str, location: str, reason: str, status: int = 502, check: bool = False) -> Case:
    return Case(REDIRECT_TARGET, id, status, reason, location=location, check=check)


def malformed(id: str, location: str, reason: str, check: bool = False) -> Case:
    return Case(MALFORMED, id, 502, reason, location=location, check=check)


CASES = [
    # -- redirect targets: the address guard holds for where a registry sends kuikproxy -----
    redirect("loopback-other-port", "http://127.0.0.1:{admin}/x?{secret}", "loopback"),
    redirect("loopback-ipv6", "http://[::1]:{admin}/x?{secret}", "loopback"),
    redirect("loopback-ipv4-mapped", "http://[::ffff:127.0.0.1]:{admin}/x?{secret}", "loopback"),
    redirect("loopback-by-name", "http://localhost:{admin}/x?{secret}", "loopback"),
    redirect("loopback-decimal", "http://2130706433:{admin}/x?{secret}", "loopback"),
    redirect("loopback-short-form", "http://127.1:{admin}/x?{secret}", "loopback"),
    redirect("unspecified", "http://0.0.0.0:{admin}/x?{secret}", "loopback"),
    redirect("metadata", "http://169.254.169.254/latest/meta-data/?{secret}", "169.254.169.254"),
    redirect("metadata-ipv6", "http://[fd00:ec2::254]/latest/?{secret}", "metadata"),
    redirect("scheme-file", "file:///etc/passwd?{secret}", "http"),
    redirect("scheme-ftp", "ftp://127.0.0.1:{admin}/x?{secret}", "http"),
    redirect("scheme-gopher", "gopher://127.0.0.1:{admin}/_x?{secret}", "http"),
    Case(
        REDIRECT_TARGET,
        "realm-port-is-no-redirect-target",
        502,
        "loopback",
        location="http://127.0.0.1:{admin}/leak?{secret}",
        realm="http://127.0.0.1:{admin}/token",
        admin_sees=("/token",),
    ),
    redirect(
        "check-loopback-other-port", "http://127.0.0.1:{admin}/x?{secret}", "loopback", check=True
    ),
    redirect(
        "configured-endpoint-followed", "http://127.0.0.1:{storage}/blobs/x?{secret}", "", 200
    ),
    redirect("same-origin-followed", "/v2/app/blobs/elsewhere/ok?{secret}", "", 200),
    # -- malformed Locations: a prompt 502, never a wait ----------------------------------
    malformed("port-out-of-range", "http://127.0.0.1:99999/x?{secret}", "port"),
    malformed("port-negative", "http://127.0.0.1:-1/x?{secret}", "port"),
    malformed("port-not-a-number", "http://127.0.0.1:http/x?{secret}", "port"),
    malformed("port-zero", "http://127.0.0.1:0/x?{secret}", "port"),
    malformed("check-port-out-of-range", "http://127.0.0.1:99999/x?{secret}", "port", check=True),
    malformed("unclosed-ipv6-bracket", "http://[::1/x?{secret}", "malformed"),
    malformed("unclosed-ipv6-bracket-bare", "http://[::1", "malformed"),
    malformed("empty-host", "http:///x?{secret}", "no host"),
    malformed("no-host-at-all", "http://", "no host"),
    malformed("empty", "", "empty"),
    malformed("space-in-host", "http://exa mple.test/x?{secret}", "malformed"),
    malformed("control-character", "http://127.0.0.1:{storage}/\x01x?{secret}", "malformed"),
    malformed("scheme-javascript", "javascript:alert(1)//{secret}", "http"),
    malformed("scheme-data", "data:,{secret}", "http"),
    # -- secrets: never in a body, a log line, /status or a metric ------------------------
    Case(
        SECRET_OUT,
        "signed-url-connection-refused",
        502,
        "Cannot connect",
        location="http://127.0.0.1:{dead}/blob?{secret}",
    ),
    Case(
        SECRET_OUT,
        "signed-url-with-userinfo",
        502,
        "userinfo",
        location=f"http://kuik:{SECRET}@127.0.0.1:{{dead}}/blob",
    ),
    Case(
        SECRET_OUT,
        "signed-url-never-answers",
        504,
        "no answer within",
        location="http://127.0.0.1:{storage}/hang?{secret}",
        within=COPY_TIMEOUT + CEILING,
    ),
    Case(
        SECRET_OUT,
        "signed-url-never-completes-tls",
        502,
        f"could not connect within {CONNECT_TIMEOUT:g}s",
        location="https://127.0.0.1:{storage}/blob?{secret}",
        within=CONNECT_TIMEOUT + CEILING,
    ),
    Case(
        SECRET_OUT,
        "signed-url-answers-5xx",
        503,
        location="http://127.0.0.1:{storage}/5xx?{secret}",
    ),
    Case(
        SECRET_OUT,
        "signed-url-answers-garbage",  # aiohttp's error quotes the URL it was reading
        502,
        "Bad status line",
        location="http://127.0.0.1:{storage}/garbage?{secret}",
    ),
    Case(
        SECRET_OUT,
        "signed-url-resets-mid-body",
        200,
        location="http://127.0.0.1:{storage}/reset?{secret}",
        broken=True,
    ),
    Case(
        SECRET_OUT,
        "signed-url-refused-by-the-guard",
        502,
        "169.254.169.254",
        location="http://169.254.169.254/blob?{secret}",
    ),
    Case(
        SECRET_OUT,
        "too-many-redirects",
        502,
        "redirects",
        location="http://127.0.0.1:{registry}/v2/app/blobs/" + DIGEST + "?{secret}",
    ),
    Case(
        SECRET_OUT,
        "token-realm-with-a-secret-query",
        502,
        "Cannot connect",
        realm="http://127.0.0.1:{dead}/token?{secret}",
    ),
    Case(
        SECRET_OUT,
        "token-realm-on-a-metadata-address",
        502,
        "169.254.169.254",
        realm="http://169.254.169.254/token?{secret}",
    ),
]


def test_the_table_covers_each_class() -> None:
    """At least 15 cases, each of a known class, every class present, ids unique."""
    assert len(CASES) >= 15
    assert {case.kind for case in CASES} == {REDIRECT_TARGET, MALFORMED, SECRET_OUT}
    assert len({case.id for case in CASES}) == len(CASES)


# -- the peers ------------------------------------------------------------------------------


async def write(writer: asyncio.StreamWriter, head: str, body: bytes = b"") -> None:
    writer.write(head.encode("latin-1") + b"\r\n\r\n" + body)
    await writer.drain()


def hostile_registry(case: Case, ports: dict[str, int]) -> Behaviour:
    """The registry's answer to a read: the case's challenge, else its redirect."""

    async def answer(request: RawRequest, reader: object, writer: asyncio.StreamWriter) -> None:
        if case.realm is not None and "Authorization" not in request.headers:
            realm = case.realm.format(**ports, secret=SIGNED)
            await write(
                writer,
                "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n"
                f'WWW-Authenticate: Bearer realm="{realm}",service="{HOST}"',
            )
        elif "/elsewhere/" in request.path:  # the same-origin redirect's target
            await write(writer, f"HTTP/1.1 200 OK\r\nContent-Length: {len(BLOB)}", BLOB)
        else:
            location = (case.location or "").format(**ports, secret=SIGNED)
            await write(
                writer,
                f"HTTP/1.1 307 Temporary Redirect\r\nContent-Length: 0\r\nLocation: {location}",
            )

    return answer


async def never_answer(request: RawRequest, reader: object, writer: object) -> None:
    await asyncio.Event().wait()


async def unavailable(request: RawRequest, reader: object, writer: asyncio.StreamWriter) -> None:
    await write(writer, "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4", b"busy")


async def reset_mid_body(request: RawRequest, reader: object, writer: asyncio.StreamWriter) -> None:
    await write(writer, f"HTTP/1.1 200 OK\r\nContent-Length: {len(BLOB)}", BLOB[:400])
    reset(writer)


async def garbage(request: RawRequest, reader: object, writer: asyncio.StreamWriter) -> None:
    await write(writer, "SSH-2.0-OpenSSH_9.6")


async def token(request: RawRequest, reader: object, writer: asyncio.StreamWriter) -> None:
    body = b'{"token": "t0ken", "expires_in": 300}'
    await write(writer, f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}", body)


@dataclass
class Peers:
    registry: RawServer
    storage: RawServer
    admin: RawServer
    dead: int  # a port bound and not listening: connections to it are refused

    @property
    def ports(self) -> dict[str, int]:
        return {
            "registry": self.registry.port,
            "storage": self.storage.port,
            "admin": self.admin.port,
            "dead": self.dead,
        }


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A loopback port kept bound but not listening, so nothing else can take it meanwhile."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture
async def peers(dead_port: int) -> AsyncIterator[Callable[[Case], Awaitable[Peers]]]:
    """The hostile registry for a case, storage, and a local service, as raw servers on
    127.0.0.1. Started from the test itself: looptime's clock begins with the test."""
    started: list[RawServer] = []

    async def start(case: Case) -> Peers:
        storage = await RawServer(
            {
                "/hang": never_answer,
                "/5xx": unavailable,
                "/reset": reset_mid_body,
                "/garbage": garbage,
            }
        ).start()
        admin = await RawServer({"/token": token}).start()
        registry = await RawServer().start()
        started.extend([storage, admin, registry])
        peers = Peers(registry, storage, admin, dead_port)
        registry.behaviours["/blobs/"] = hostile_registry(case, peers.ports)
        registry.behaviours["/manifests/"] = registry.behaviours["/blobs/"]
        return peers

    yield start
    for server in started:
        await server.close()


@pytest.mark.parametrize("case", CASES, ids=[f"{case.kind}: {case.id}" for case in CASES])
async def test_hostile_upstream(
    case: Case,
    peers: Callable[[Case], Awaitable[Peers]],
    aiohttp_client: Callable[..., Awaitable[TestClient[Any, Any]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client gets the case's status promptly: kuikproxy's own errors an OCI body naming
    the reason, the storage's answers relayed; no request reaches a local service the
    configuration does not name; the secret of the Location (or realm) is nowhere to be seen."""
    caplog.set_level(logging.DEBUG)
    started = await peers(case)
    app = build_app(parse_config(CONFIG.format(**started.ports)))
    client = await aiohttp_client(app, server_kwargs={"handler_cancellation": True})
    loop = asyncio.get_running_loop()
    began = loop.time()
    if case.check:
        headers = {"Kuik-Operation": "check"}
        response = await client.get(f"/v2/app/manifests/v1?ns={HOST}", headers=headers)
    else:
        response = await client.get(f"/v2/app/blobs/{DIGEST}?ns={HOST}")
    assert response.status == case.status
    try:
        body = await response.read()
    except aiohttp.ClientPayloadError:
        body = None
    took = loop.time() - began
    assert took <= case.within, took
    if case.broken:
        assert body is None, "the body should have been cut short"
    elif case.status == 200:
        assert body == BLOB
    elif case.status in (502, 504):
        assert body is not None
        error = (await response.json())["errors"][0]
        assert error["code"] == "UNAVAILABLE"
        assert case.reason in error["message"] and HOST in error["message"], error
    assert [target.partition("?")[0] for _, target, _ in started.admin.seen] == list(
        case.admin_sees
    )
    status = await (await client.get("/status")).text()
    metrics = await (await client.get("/metrics")).text()
    shown = {"body": (body or b"").decode("latin-1"), "status": status, "metrics": metrics}
    shown["logs"] = caplog.text + "\n".join(r.getMessage() for r in caplog.records)
    assert [where for where, text in shown.items() if SECRET in text] == []
