"""TLS to upstreams is verified by default; ``tls.caFile`` and ``insecureSkipVerify`` per host."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kuikproxy.config import parse_config
from kuikproxy.web.app import build_app
from tests.upstream_app import Registry

pytestmark = pytest.mark.looptime


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key (so no system root trusts it)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kuikproxy test registry")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


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
