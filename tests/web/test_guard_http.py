"""kuikproxy is not a door into the machine it runs on (SPEC §3.1)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from kuikproxy.upstream.guard import AddressGuard, AddressRefused
from tests.upstream_app import Registry

pytestmark = pytest.mark.looptime


async def test_s3_1_host_resolving_to_loopback_without_explicit_upstream_is_refused(
    aiohttp_client: Callable[..., Awaitable[TestClient[Any, Any]]],
) -> None:
    """An allowed host with no explicit ``upstream`` whose name resolves to a loopback address
    is refused with 403 DENIED, not connected to."""
    config = parse_config(
        "allowedHosts: [localhost]\ndefaultRegistry: localhost\n"
        "registries: {default: {check: {interval: 10ms}}}"
    )
    client = await aiohttp_client(build_app(config))
    response = await client.get(
        "/v2/app/manifests/v1?ns=localhost", headers={"Kuik-Operation": "check"}
    )
    assert response.status == 403
    body = await response.json()
    assert body["errors"][0]["code"] == "DENIED"
    assert "loopback" in body["errors"][0]["message"]


async def test_s3_1_redirect_to_a_metadata_address_is_refused(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    aiohttp_client: Callable[..., Awaitable[TestClient[Any, Any]]],
) -> None:
    """A registry redirecting a blob to the cloud metadata address gets no request sent there:
    the client is answered 502 naming the address (its own host is allowed: what the registry
    sent kuikproxy to is what cannot be used). More such targets: test_hostile_upstream.py."""
    fake = Registry(blobs_at="http://169.254.169.254/latest/meta-data")
    server = await aiohttp_server(fake.app())
    text = (
        "registries:\n  registry.test:\n"
        f"    upstream: http://127.0.0.1:{server.port}\n"
        "    copy: {interval: 10ms}\n"
    )
    client = await aiohttp_client(build_app(parse_config(text)))
    digest = "sha256:" + "a" * 64
    response = await client.get(f"/v2/app/blobs/{digest}?ns=registry.test")
    assert response.status == 502
    assert "169.254.169.254" in (await response.json())["errors"][0]["message"]


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "::1",
        "169.254.169.254",
        "fe80::1",
        "0.0.0.0",
        "fd00:ec2::254",
        "100.100.100.200",
        "::ffff:127.0.0.1",
        "224.0.0.1",
        "2130706433",
        "127.1",
        "0x7f.0.0.1",
    ],
)
def test_s3_1_forbidden_addresses(address: str) -> None:
    """Loopback, link-local, unspecified, multicast and metadata addresses are refused unless
    the host is an explicit upstream's; so are the legacy numeric spellings of IPv4 the socket
    library reads as loopback (``2130706433``, ``127.1``)."""
    with pytest.raises(AddressRefused):
        AddressGuard().check_literal(address, 443)
    AddressGuard({(address, 443)}).check_literal(address, 443)
    with pytest.raises(AddressRefused):  # trust is per endpoint: another port is not trusted
        AddressGuard({(address, 443)}).check_literal(address, 6379)


@pytest.mark.parametrize("address", ["10.0.0.5", "192.168.1.10", "8.8.8.8", "2001:db8::1"])
def test_s3_1_other_addresses_pass(address: str) -> None:
    """Private and public addresses are ordinary registries (internal ones are common)."""
    AddressGuard().check_literal(address, 443)


@pytest.mark.parametrize(
    ("registry", "realm", "trusted"),
    [
        (("127.0.0.1", 5000), ("127.0.0.1", 5001), True),  # beside a trusted registry
        (("127.0.0.1", 5000), ("169.254.169.254", 80), False),  # another host
        (("127.0.0.2", 5000), ("127.0.0.2", 5001), False),  # beside an untrusted one
    ],
)
def test_s3_1_a_realm_beside_a_trusted_registry_is_trusted_for_token_requests_only(
    registry: tuple[str, int], realm: tuple[str, int], trusted: bool
) -> None:
    """A trusted registry may name another port of its own host for its token realm: token
    requests (``realm=True``) may go there, nothing else may — not a redirect — and a new
    configuration forgets it."""
    guard = AddressGuard({("127.0.0.1", 5000)})
    guard.trust_realm(registry, realm)
    if trusted:
        guard.check_literal(*realm, realm=True)
    else:
        with pytest.raises(AddressRefused):
            guard.check_literal(*realm, realm=True)
    with pytest.raises(AddressRefused):
        guard.check_literal(*realm)
    guard.configure({("127.0.0.1", 5000)})
    with pytest.raises(AddressRefused):
        guard.check_literal(*realm, realm=True)
