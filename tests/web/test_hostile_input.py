"""Nothing a client sends crashes kuikproxy, leaks a task or corrupts state (SPEC §12).

Acceptance 3 of the registry-realism work: a table of malformed and malicious requests, each
sent as raw bytes (client libraries would normalise ``..``, NUL bytes, absolute URIs and
``CONNECT`` away), each with the status and OCI error code it is documented to get, the
requests the recording registry may have seen because of it (none, for every refusal), and a
healthy proxy afterwards: ``/healthz`` answers, no request is parked, no pacer task is left.

What aiohttp's HTTP parser refuses before kuikproxy sees the request (oversized lines and
headers, control characters, a missing ``Host``) is answered by ``web/malformed.py``: an OCI
body (``UNSUPPORTED``) with the parser's message, ``414`` for a target too long, ``431`` for
headers too large, ``400`` otherwise (``tests/web/test_malformed_http.py`` has the rest).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from kuikproxy.web.keys import PACER
from tests.conftest import HOST
from tests.upstream_app import Registry
from tests.web.raw import exchange, is_closed_by_peer

pytestmark = pytest.mark.looptime

NS = f"ns={HOST}"
DIGEST = "sha256:" + "d" * 64

# §3: bare paths go to defaultRegistry; here that is the recording registry, so nothing a
# case gets wrong can leave for the Internet.
MIRROR = """\
defaultRegistry: registry.test
registries:
  registry.test:
    upstream: http://127.0.0.1:{port}
    check: {{interval: 200ms, timeout: 1s}}
    copy: {{interval: 200ms, idle: 0s, timeout: 1s}}
"""
# Every host allowed: what stands between a client and a loopback or metadata address is then
# the address guard of §3.1 alone.
OPEN = """\
defaultRegistry: registry.test
allowedHosts: ["*"]
registries:
  default:
    check: {{interval: 200ms, timeout: 1s}}
    copy: {{interval: 200ms, idle: 0s, timeout: 1s}}
  registry.test:
    upstream: http://127.0.0.1:{port}
"""

# The features still being built; their cases keep the spec's answer and are expected to fail.

Starter = Callable[[str], Awaitable[TestClient[object, object]]]


@pytest.fixture
def start(
    registry: tuple[Registry, TestServer],
    aiohttp_client: Callable[..., Awaitable[TestClient[object, object]]],
) -> Starter:
    """kuikproxy on ``config`` (``MIRROR`` or ``OPEN``) before the recording registry."""
    _, server = registry

    async def run(config: str) -> TestClient[object, object]:
        app = build_app(parse_config(config.format(port=server.port)))
        return await aiohttp_client(app, server_kwargs={"handler_cancellation": True})

    return run


def req(
    method: str,
    target: str,
    *headers: str,
    version: str = "HTTP/1.1",
    host: bool = True,
    close: bool = True,
) -> str:
    """A request head exactly as written; ``Host`` and ``Connection: close`` unless told not."""
    lines = [f"{method} {target} {version}"]
    lines += ["Host: x"] if host else []
    lines += headers
    lines += ["Connection: close"] if close else []
    return "\r\n".join(lines) + "\r\n\r\n"


def basic(user: bytes) -> str:
    return "Proxy-Authorization: Basic " + base64.b64encode(user + b":pw").decode()


@dataclass(frozen=True)
class Case:
    """One hostile request and what it is documented to get.

    ``answers`` holds ``(status, OCI code)`` per answer (several when pipelined; code None for
    an answer without an OCI body); ``parser`` is the message of the parser's refusal.
    ``reaches`` is every request the registry may see because of it; ``resource`` the resource
    the request must be counted for (§4.2, when a hostile identity falls back to the next
    source)."""

    id: str
    request: str
    answers: tuple[tuple[int, str | None], ...]
    config: str = MIRROR
    heads: int = 0
    reaches: tuple[str, ...] = ()
    resource: str | None = None
    parser: str | None = None


def refused(id: str, request: str, status: int, code: str, *, config: str = MIRROR) -> Case:
    heads = int(request.startswith("HEAD "))
    return Case(id, request, ((status, code),), config=config, heads=heads)


def by_parser(id: str, request: str, message: str, status: int = 400) -> Case:
    return Case(id, request, ((status, "UNSUPPORTED"),), parser=message)


def held(id: str, request: str, resource: str) -> Case:
    """A well-formed check whose identity header is hostile: read at its window, counted for
    the next identity source."""
    return Case(
        id,
        request,
        ((200, None),),
        heads=1,
        reaches=("HEAD /v2/app/manifests/t",),
        resource=resource,
    )


def get(path: str, *headers: str) -> str:
    return req("GET", f"{path}?{NS}", *headers)


CHECK = f"/v2/app/manifests/t?{NS}"

CASES = [
    # -- path traversal and malformed names (404 NAME_UNKNOWN: §12 gives reads no 400) ---
    refused("traversal-leading", get("/v2/../x/manifests/t"), 404, "NAME_UNKNOWN"),
    refused("traversal-up-two", get("/v2/app/../../manifests/t"), 404, "NAME_UNKNOWN"),
    refused("traversal-encoded", get("/v2/%2e%2e/x/manifests/t"), 404, "NAME_UNKNOWN"),
    refused("traversal-mixed-case", get("/v2/app/%2E%2e/.%2e/manifests/t"), 404, "NAME_UNKNOWN"),
    refused("dot-segment", get("/v2/./app/manifests/t"), 404, "NAME_UNKNOWN"),
    refused("encoded-slash", get("/v2/app%2fx/manifests/t"), 404, "NAME_UNKNOWN"),
    refused("double-slash-in-name", get("/v2/a//b/manifests/t"), 404, "NAME_UNKNOWN"),
    refused("leading-empty-segment", get("/v2//app/manifests/t"), 404, "NAME_UNKNOWN"),
    refused("trailing-empty-segment", get("/v2/app//manifests/t"), 404, "NAME_UNKNOWN"),
    refused("empty-name", get("/v2//manifests/t"), 404, "NAME_UNKNOWN"),
    refused("uppercase-name", get("/v2/App/manifests/t"), 404, "NAME_UNKNOWN"),
    refused("name-256-chars", get(f"/v2/{'a' * 256}/manifests/t"), 404, "NAME_UNKNOWN"),
    refused("name-256-in-parts", get(f"/v2/{'a/' * 127}ab/manifests/t"), 404, "NAME_UNKNOWN"),
    refused("empty-reference", get("/v2/app/manifests/"), 404, "NAME_UNKNOWN"),
    # -- malformed tags (404 MANIFEST_UNKNOWN) -------------------------------------------
    refused("tag-129-chars", get(f"/v2/app/manifests/{'t' * 129}"), 404, "MANIFEST_UNKNOWN"),
    refused("tag-leading-dash", get("/v2/app/manifests/-t"), 404, "MANIFEST_UNKNOWN"),
    refused("tag-leading-dot", get("/v2/app/manifests/.t"), 404, "MANIFEST_UNKNOWN"),
    refused("tag-bang", get("/v2/app/manifests/v1!"), 404, "MANIFEST_UNKNOWN"),
    refused("tag-encoded-space", get("/v2/app/manifests/v%201"), 404, "MANIFEST_UNKNOWN"),
    # -- malformed digests (400 DIGEST_INVALID) -------------------------------------------
    refused("digest-md5", get(f"/v2/app/manifests/md5:{'a' * 32}"), 400, "DIGEST_INVALID"),
    refused("digest-uppercase-hex", get(f"/v2/app/blobs/sha256:{'A' * 64}"), 400, "DIGEST_INVALID"),
    refused("digest-uppercase-alg", get(f"/v2/app/blobs/SHA256:{'a' * 64}"), 400, "DIGEST_INVALID"),
    refused("digest-short", get("/v2/app/manifests/sha256:abc"), 400, "DIGEST_INVALID"),
    refused("digest-sha256-63", get(f"/v2/app/blobs/sha256:{'a' * 63}"), 400, "DIGEST_INVALID"),
    refused("digest-sha256-65", get(f"/v2/app/blobs/sha256:{'a' * 65}"), 400, "DIGEST_INVALID"),
    refused("digest-sha512-64", get(f"/v2/app/blobs/sha512:{'a' * 64}"), 400, "DIGEST_INVALID"),
    refused("digest-not-hex", get(f"/v2/app/manifests/sha256:{'g' * 64}"), 400, "DIGEST_INVALID"),
    refused("digest-empty-hex", get("/v2/app/manifests/sha256:"), 400, "DIGEST_INVALID"),
    refused("blob-by-tag", get("/v2/app/blobs/latest"), 400, "DIGEST_INVALID"),
    # -- routes kuikproxy does not serve (404 NOT_FOUND) ----------------------------------
    refused("route-tags-lists", get("/v2/app/tags/lists"), 404, "NOT_FOUND"),
    refused("route-singular", get("/v2/app/manifest/t"), 404, "NOT_FOUND"),
    refused("route-v3", get("/v3/"), 404, "NOT_FOUND"),
    refused("route-admin", get("/admin"), 404, "NOT_FOUND"),
    refused("route-double-slash-root", get("//v2/app/manifests/t"), 404, "NOT_FOUND"),
    # -- writes and unknown methods on a paced host (405 UNSUPPORTED) ---------------------
    *(
        refused(
            f"write-{method.lower()}",
            req(method, CHECK, "Content-Length: 0"),
            405,
            "UNSUPPORTED",
        )
        for method in ("PUT", "POST", "PATCH", "DELETE", "OPTIONS", "TRACE")
    ),
    refused(
        "write-blob-upload-start",
        req("POST", f"/v2/app/blobs/uploads/?{NS}", "Content-Length: 0"),
        405,
        "UNSUPPORTED",
    ),
    refused(
        "write-blob-upload-chunk",
        req("PATCH", f"/v2/app/blobs/uploads/0f3e?{NS}", "Content-Length: 0"),
        405,
        "UNSUPPORTED",
    ),
    refused("write-blob-delete", req("DELETE", f"/v2/app/blobs/{DIGEST}?{NS}"), 405, "UNSUPPORTED"),
    # -- ?ns= naming a host that is not allowed, or no host at all (403 DENIED) -----------
    *(
        refused(f"ns-{name}", req("GET", f"/v2/app/manifests/t?ns={ns}"), 403, "DENIED")
        for name, ns in (
            ("not-allowed", "evil.example"),
            ("metadata-ip", "169.254.169.254"),
            ("metadata-name", "metadata.google.internal"),
            ("localhost", "localhost"),
            ("loopback", "127.0.0.1"),
            ("slash", "a/b"),
            ("space", "x%20y"),
            ("port-out-of-range", "evil.com:99999"),
            ("empty", ""),
            ("scheme", "https://registry.test"),
            ("userinfo", "registry.test@evil.example"),
            ("crlf-injection", "registry.test%0d%0aX-Injected:%201"),
        )
    ),
    # -- §12: ambiguous addressing, two names for the registry that disagree (400) --------
    *(
        refused(f"ambiguous-{name}", req("GET", target), 400, "UNSUPPORTED")
        for name, target in (
            ("two-ns", f"/v2/app/manifests/t?{NS}&ns=docker.io"),
            ("two-ns-one-not-allowed", f"/v2/app/manifests/t?{NS}&ns=evil.example"),
            ("ns-and-prefix", f"/v2/docker.io/app/manifests/t?{NS}"),
            ("ns-and-prefix-blob", f"/v2/docker.io/app/blobs/{DIGEST}?{NS}"),
            ("prefix-and-ns", "/v2/registry.test/app/manifests/t?ns=docker.io"),
        )
    ),
    held(
        "ns-and-prefix-agree", req("HEAD", f"/v2/registry.test/app/manifests/t?{NS}"), "127.0.0.1"
    ),
    held("ns-twice-the-same", req("HEAD", f"{CHECK}&{NS}"), "127.0.0.1"),
    # -- §3: a first segment with "." or ":" or "localhost" names the host ----------------
    *(
        refused(
            f"prefix-{name}",
            req("GET", f"/v2/{segment}/app/manifests/t"),
            403,
            "DENIED",
        )
        for name, segment in (
            ("dotted", "evil.example"),
            ("port", "evil.example:5000"),
            ("localhost", "localhost"),
            ("kuik-v1-port", "evil.example-5000"),
            ("metadata-ip", "169.254.169.254"),
        )
    ),
    # -- §3.1: allowed by glob, but a loopback/link-local address without an explicit upstream
    *(
        refused(
            f"guard-{name}",
            req("GET", f"/v2/app/manifests/t?ns={ns}"),
            403,
            "DENIED",
            config=OPEN,
        )
        for name, ns in (
            ("localhost", "localhost:{port}"),
            ("loopback-other", "127.0.0.2:{port}"),
            ("ipv6-loopback", "[::1]:{port}"),
            ("metadata-ip", "169.254.169.254"),
            # the registry's own endpoint on 127.0.0.1 is the explicit upstream of
            # registry.test; another port of 127.0.0.1 is not trusted (port 9: discard)
            ("loopback-upstream-host-other-port", "127.0.0.1:9"),
        )
    ),
    refused(
        "guard-prefix-loopback",
        req("GET", "/v2/127.0.0.2:{port}/app/manifests/t"),
        403,
        "DENIED",
        config=OPEN,
    ),
    # -- §13: no forward proxy unless enabled (405) ---------------------------------------
    refused(
        "connect-other-host",
        req("CONNECT", "evil.example:443", "Host: evil.example:443", host=False),
        405,
        "UNSUPPORTED",
    ),
    refused(
        "connect-allowed-host",
        req("CONNECT", f"{HOST}:443", f"Host: {HOST}:443", host=False),
        405,
        "UNSUPPORTED",
    ),
    refused(
        "absolute-uri-ping",
        req("GET", "http://evil.example/v2/", "Host: evil.example", host=False),
        405,
        "UNSUPPORTED",
    ),
    refused(
        "absolute-uri-manifest",
        req("GET", f"http://evil.example{CHECK}", "Host: evil.example", host=False),
        405,
        "UNSUPPORTED",
    ),
    # -- refused by aiohttp's parser before kuikproxy sees them (web/malformed.py) ---------
    by_parser("header-over-8k", get("/v2/app/manifests/t", "X-Big: " + "a" * 9000), "8190", 431),
    by_parser(
        "many-headers",
        get("/v2/app/manifests/t", *(f"X-{i}: a" for i in range(200))),
        "Too many headers",
        431,
    ),
    by_parser("url-over-8k", get("/v2/" + "a/" * 5000 + "manifests/t"), "8190", 414),
    by_parser(
        "authorization-100k",
        get("/v2/app/manifests/t", "Authorization: Bearer " + "a" * 100_000),
        "8190",
        431,
    ),
    by_parser(
        "resource-10k", get("/v2/app/manifests/t", "Kuik-Resource: " + "r" * 10_000), "8190", 431
    ),
    by_parser(
        "resource-control-char",
        get("/v2/app/manifests/t", "Kuik-Resource: a\x01b"),
        "Invalid header value char",
    ),
    by_parser(
        "resource-escape-sequence",
        get("/v2/app/manifests/t", "Kuik-Resource: \x1b[31mred"),
        "Invalid header value char",
    ),
    by_parser("nul-in-request-line", get("/v2/app\x00/manifests/t"), "Invalid char in url"),
    by_parser(
        "control-char-in-method",
        req("G\x01T", CHECK),
        "Invalid method",
    ),
    by_parser("http11-without-host", req("GET", CHECK, host=False), "Missing 'Host'"),
    by_parser(
        "smuggling-cl-and-te",
        req("GET", CHECK, "Content-Length: 3", "Transfer-Encoding: chunked") + "0\r\n\r\n",
        "Transfer-Encoding can't be present with Content-Length",
    ),
    # -- hostile identities fall back to the next source (§4.2) and are still paced -------
    held("resource-with-tab", req("HEAD", CHECK, "Kuik-Resource: a\tb"), "127.0.0.1"),
    held("resource-8k", req("HEAD", CHECK, "Kuik-Resource: " + "r" * 8000), "127.0.0.1"),
    held(
        "resource-8k-then-proxy-user",
        req("HEAD", CHECK, "Kuik-Resource: " + "r" * 8000, basic(b"bob")),
        "bob",
    ),
    held(
        "proxy-auth-not-base64",
        req("HEAD", CHECK, "Proxy-Authorization: Basic !!!not-base64!!!"),
        "127.0.0.1",
    ),
    held("proxy-auth-not-utf8", req("HEAD", CHECK, basic(b"\xff\xfe")), "127.0.0.1"),
    held("proxy-auth-nul-in-user", req("HEAD", CHECK, basic(b"bo\x00b")), "127.0.0.1"),
    held("proxy-auth-not-basic", req("HEAD", CHECK, "Proxy-Authorization: Bearer x"), "127.0.0.1"),
    held(
        "proxy-auth-user-over-253",
        req("HEAD", CHECK, basic(b"u" * 254)),
        "127.0.0.1",
    ),
    # -- HTTP/1.0, and requests pipelined on one connection --------------------------------
    held(
        "http10-check", req("HEAD", CHECK, version="HTTP/1.0", host=False, close=False), "127.0.0.1"
    ),
    refused(
        "http10-bad-name",
        req("GET", f"/v2/App/manifests/t?{NS}", version="HTTP/1.0", host=False, close=False),
        404,
        "NAME_UNKNOWN",
    ),
    Case(
        "pipelined",
        req("HEAD", CHECK, close=False)
        + req("GET", f"/v2/App/manifests/t?{NS}", close=False)
        + req("PUT", CHECK, "Content-Length: 2", close=False)
        + "{}"
        + req("GET", f"/v2/app/blobs/latest?{NS}", close=False)
        + req("GET", "/healthz"),
        (
            (200, None),
            (404, "NAME_UNKNOWN"),
            (405, "UNSUPPORTED"),
            (400, "DIGEST_INVALID"),
            (200, None),
        ),
        heads=1,
        reaches=("HEAD /v2/app/manifests/t",),
        resource="127.0.0.1",
    ),
]


@pytest.mark.parametrize("case", [pytest.param(case, id=case.id) for case in CASES])
async def test_s12_hostile_request_gets_its_documented_answer(
    start: Starter, registry: tuple[Registry, TestServer], case: Case
) -> None:
    """Each hostile request gets the status and OCI code the spec documents for it (or
    the parser's message for what it refuses), the registry sees nothing it should not
    (no proxy or identity header either), and the proxy is healthy afterwards."""
    fake, server = registry
    client = await start(case.config)
    data = case.request.replace("{port}", str(server.port)).encode("latin-1")
    result = await exchange(
        client.host, client.port, data, heads=case.heads, expect=len(case.answers)
    )
    got = [(r.status, r.oci_code) for r in result.responses]
    assert got == list(case.answers), (got, result.responses[:1], result.rest[:200])
    if case.parser is not None:
        assert case.parser.encode() in result.first.body, result.first.body[:300]
    for response in result.responses:
        assert "X-Injected" not in response.headers
    assert [f"{s.method} {s.path}" for s in fake.seen] == list(case.reaches)
    for seen in fake.seen:
        assert not {"proxy-authorization", "kuik-resource"} & seen.headers.keys(), seen.headers
    if case.resource is not None:
        status = await (await client.get("/status")).json()
        assert list(status["resources"]) == [case.resource]
    await assert_healthy(client)


def test_the_table_has_at_least_thirty_cases() -> None:
    """Acceptance 3 asks for at least 30 hostile requests; each id is unique."""
    assert len(CASES) >= 30
    assert len({case.id for case in CASES}) == len(CASES)


async def assert_healthy(client: TestClient[object, object]) -> None:
    """``/healthz`` answers, nothing is parked, no read task is left behind."""
    await asyncio.sleep(0.5)  # let a window's read task finish; virtual time
    assert (await client.get("/healthz")).status == 200
    pacer = client.server.app[PACER]
    assert pacer.held() == 0
    assert pacer.tasks == set()


async def test_s12_slow_loris_is_closed_within_the_keepalive_timeout(
    registry: tuple[Registry, TestServer],
    aiohttp_client: Callable[..., Awaitable[TestClient[object, object]]],
) -> None:
    """A client that sends its headers one byte a second is cut off 75 s after it connected:
    aiohttp arms its keep-alive timer when a connection is made and data does not re-arm it;
    75 s is ``web.run_app``'s default, which ``kuikproxy serve`` runs with. (aiohttp's test
    server defaults to 3630 s, so the server here is started with serve's parameters.) Other
    clients are served meanwhile."""
    fake, upstream = registry
    app = build_app(parse_config(MIRROR.format(port=upstream.port)))
    server = TestServer(app)
    await server.start_server(keepalive_timeout=75.0)
    client = await aiohttp_client(server)
    loop = asyncio.get_running_loop()
    began = loop.time()
    reader, writer = await asyncio.open_connection(client.host, client.port)
    closing = asyncio.ensure_future(is_closed_by_peer(reader))
    data = f"HEAD {CHECK} HTTP/1.1\r\nHost: x\r\nX-Slow: ".encode() + b"a" * 1000
    sent = 0
    try:
        for byte in data:
            if closing.done():
                break
            writer.write(bytes([byte]))
            await asyncio.sleep(1.0)
            sent += 1
            if sent == 10:  # meanwhile, a well-behaved client is served at its window
                response = await client.head(CHECK)
                assert response.status == 200
    except ConnectionError:
        pass
    finally:
        writer.close()
    assert await closing
    assert loop.time() - began <= 76.0
    assert sent < len(data)
    assert [f"{s.method} {s.path}" for s in fake.seen] == ["HEAD /v2/app/manifests/t"]
    await assert_healthy(client)


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    requests=st.lists(
        st.tuples(
            st.sampled_from(["GET", "HEAD", "PUT", "OPTIONS", "TRACE", "PROPFIND", "G\x01T"]),
            st.text(alphabet=st.sampled_from("abcAZ019._-/:@%?&=#~\\\u00e9\x00\x7f "), max_size=80),
            st.text(alphabet=st.sampled_from("ab/\x00\x01\u00e9 :"), max_size=20),
        ),
        min_size=40,
        max_size=40,
    )
)
async def test_s12_any_request_gets_an_answer_never_a_crash(
    start: Starter, requests: list[tuple[str, str, str]]
) -> None:
    """Arbitrary methods, paths and resource headers, sent as raw bytes: each gets a status
    line that is not a 500, no request stays held, and the proxy keeps serving."""
    client = await start(
        MIRROR.replace("200ms, timeout", "10ms, timeout").replace("200ms, idle", "10ms, idle")
    )
    for method, path, resource in requests:
        text = f"{method} /v2/{path}?{NS} HTTP/1.1\r\nHost: x\r\nKuik-Resource: {resource}\r\n"
        text += "Connection: close\r\n\r\n"
        result = await exchange(
            client.host,
            client.port,
            text.encode("utf-8", "surrogateescape"),
            heads=int(method == "HEAD"),
        )
        assert result.responses, (text, result.rest[:300])
        assert result.first.status != 500, (text, result.first)
    await assert_healthy(client)
