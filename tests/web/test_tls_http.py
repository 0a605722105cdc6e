"""TLS to upstreams is verified by default; ``tls.caFile`` and ``insecureSkipVerify`` per host."""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from tests.certs import self_signed
from tests.upstream_app import Registry

pytestmark = pytest.mark.looptime


@pytest.fixture
async def https_upstream(
    aiohttp_server: Callable[..., Awaitable[TestServer]], tmp_path: Path
) -> tuple[int, Path]:
    cert, key = self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server = await aiohttp_server(Registry().app(), ssl=context)
    return server.port, cert


@pytest.mark.parametrize(
    ("tls", "status"),
    [("", 502), ("caFile: {cert}", 200), ("insecureSkipVerify: true", 200)],
    ids=["verified-by-default", "ca-file", "insecure-skip-verify"],
)
async def test_upstream_tls_is_verified_unless_the_host_says_otherwise(
    https_upstream: tuple[int, Path],
    aiohttp_client: Callable[..., Awaitable[TestClient[Any, Any]]],
    tls: str,
    status: int,
) -> None:
    """A registry with a certificate no system root trusts is refused (502 with the reason);
    trusting its CA with ``tls.caFile``, or ``insecureSkipVerify``, lets the read through."""
    port, cert = https_upstream
    block = f"upstream: https://127.0.0.1:{port}\n    check: {{interval: 10ms}}\n"
    if tls:
        block += "    tls: {" + tls.format(cert=cert) + "}\n"
    client = await aiohttp_client(
        build_app(parse_config(f"registries:\n  registry.test:\n    {block}"))
    )
    response = await client.get(
        "/v2/app/manifests/v1?ns=registry.test", headers={"Kuik-Operation": "check"}
    )
    assert response.status == status
    if status == 502:
        assert "certificate" in (await response.json())["errors"][0]["message"].lower()
