"""Nothing a client sends crashes kuikproxy, leaks a task or corrupts state (SPEC §12)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kuikproxy.web.app import PACER
from tests.conftest import HOST, ProxyFactory
from tests.upstream_app import Registry

pytestmark = pytest.mark.looptime


@pytest.mark.parametrize(
    ("path", "status", "code"),
    [
        ("/v2/../x/manifests/latest", 400, "NAME_INVALID"),
        ("/v2/App/manifests/latest", 400, "NAME_INVALID"),
        ("/v2/a//b/manifests/latest", 400, "NAME_INVALID"),
        ("/v2/a/b/manifests/", 400, "NAME_INVALID"),
        ("/v2/app/manifests/-bad-tag", 400, "MANIFEST_INVALID"),
        ("/v2/app/manifests/sha256:abc", 400, "DIGEST_INVALID"),
        ("/v2/app/blobs/latest", 400, "DIGEST_INVALID"),
        ("/v2/app/blobs/sha256:" + "A" * 64, 400, "DIGEST_INVALID"),
        ("/v2/app/blobs/md5:" + "a" * 32, 400, "DIGEST_INVALID"),
        ("/v2/app/tags/lists", 404, "NOT_FOUND"),
        ("/v3/app/manifests/latest", 404, None),
    ],
)
async def test_s12_malformed_names_and_references_get_oci_errors(
    proxy: ProxyFactory,
    registry: tuple[Registry, object],
    path: str,
    status: int,
    code: str | None,
) -> None:
    """Malformed names, tags and digests are refused with the OCI error body and never reach
    the registry."""
    fake, _ = registry
    client = await proxy()
    answer = await raw_request(client, f"GET {path}?ns={HOST} HTTP/1.1\r\nHost: x\r\n\r\n")
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer[:100]
    if code is not None:
        assert f'"code": "{code}"'.encode() in answer
    assert fake.seen == []


async def test_s12_writes_are_unsupported(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """PUT, POST, PATCH and DELETE on a paced host are 405 UNSUPPORTED."""
    fake, _ = registry
    client = await proxy()
    for method in ("PUT", "POST", "PATCH", "DELETE"):
        response = await client.request(method, f"/v2/app/manifests/v1?ns={HOST}", data=b"{}")
        assert response.status == 405
        assert (await response.json())["errors"][0]["code"] == "UNSUPPORTED"
    assert fake.seen == []


async def test_s3_1_host_not_allowed_is_denied_before_any_connection(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """A host that is neither configured nor allowed gets 403 DENIED; so does a malformed ns."""
    client = await proxy(top="allowedHosts: []\ndefaultRegistry: registry.test")
    for ns in ("evil.example", "169.254.169.254", "a/b", "x y"):
        response = await client.get("/v2/app/manifests/v1", params={"ns": ns})
        assert response.status == 403, ns
        assert (await response.json())["errors"][0]["code"] == "DENIED"


async def test_s12_unreachable_upstream_is_502_with_the_reason(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """A registry that cannot be reached answers the waiting request 502 with why."""
    _, server = registry
    client = await proxy()
    await server.close()  # type: ignore[attr-defined]
    response = await client.head(f"/v2/app/manifests/v1?ns={HOST}")
    assert response.status == 502
    response = await client.get(
        f"/v2/app/manifests/v1?ns={HOST}", headers={"Kuik-Operation": "check"}
    )
    assert response.status == 502
    body = await response.json()
    assert body["errors"][0]["code"] == "UNAVAILABLE"
    assert "127.0.0.1" in body["errors"][0]["message"]


async def test_s12_upstream_past_its_timeout_is_504(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """A registry slower than check.timeout answers the waiting request 504."""
    fake, _ = registry
    fake.delay = 5.0
    client = await proxy("check: {interval: 200ms, timeout: 1s}")
    response = await client.head(f"/v2/app/manifests/v1?ns={HOST}")
    assert response.status == 504


async def test_s12_oversized_headers_are_refused_and_the_proxy_survives(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """An oversized header or URL gets a 4xx from the HTTP layer; the proxy keeps serving."""
    client = await proxy()
    response = await client.get("/v2/app/manifests/v1", headers={"X-Big": "a" * 100_000})
    assert 400 <= response.status < 500
    response = await client.get("/v2/" + "a/" * 20_000 + "manifests/v1")
    assert 400 <= response.status < 500
    assert (await client.get("/healthz")).status == 200


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
    proxy: ProxyFactory, registry: tuple[Registry, object], requests: list[tuple[str, str, str]]
) -> None:
    """Arbitrary methods, paths and resource headers, sent as raw bytes: each gets a status
    line that is not a 500, no request stays held, and the proxy keeps serving."""
    client = await proxy("check: {interval: 10ms}\ncopy: {interval: 10ms, idle: 0s}")
    for method, path, resource in requests:
        headers = f"Host: x\r\nKuik-Resource: {resource}\r\n"
        text = f"{method} /v2/{path}?ns={HOST} HTTP/1.1\r\n{headers}\r\n"
        answer = await raw_request(client, text)
        assert answer.startswith((b"HTTP/1.1 ", b"HTTP/1.0 ")), answer[:100]
        assert answer[9:12] != b"500", (text, answer[:300])
    await asyncio.sleep(0.1)
    assert client.server.app[PACER].held() == 0
    assert (await client.get("/healthz")).status == 200


async def raw_request(client, text: str) -> bytes:  # type: ignore[no-untyped-def]
    """Send bytes exactly as written (client libraries normalise ``..`` away) and read the
    answer until the server closes or a second passes."""
    reader, writer = await asyncio.open_connection(client.host, client.port)
    request = text.replace("HTTP/1.1\r\n", "HTTP/1.1\r\nConnection: close\r\n", 1)
    writer.write(request.encode("utf-8", "surrogateescape"))
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(-1), 1.0)
    finally:
        writer.close()
