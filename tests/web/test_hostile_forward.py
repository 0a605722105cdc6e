"""Hostile clients of the forward proxy (SPEC §13): nobody gets in where they don't
belong.

* The leaf kuikproxy presents in a ``CONNECT`` tunnel is signed by the CA every intercepted pod
  trusts, so it must name the ``CONNECT``'s host and nothing else: a TLS ClientHello whose SNI
  names another host ends the handshake before any certificate is sent (asyncio closes the
  connection without flushing the ``unrecognized_name`` alert: the client sees a reset). A
  real TLS client (:mod:`ssl`) does the handshake through a real proxy on 127.0.0.1 and
  reports the certificate it was shown.
* A ``CONNECT`` head is bounded like every other request head (aiohttp's limits), and one that
  does not end in time is closed.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer
from cryptography import x509
from cryptography.x509.oid import NameOID

from kuikproxy.forward.front import HANDSHAKE_TIMEOUT
from tests.web.raw import exchange
from tests.web.test_forward_http import SECURE, Setup, forward_proxy

SECURE_TARGET = f"{SECURE}:PORT"  # PORT: the TLS registry's, known once it listens
TUNNELLED = "tunnel.test"
# hosts with a registries block of their own: allowed, never read (no request is sent)
MORE_HOSTS = ("docker.io", "127.0.0.1", "[::1]")


def address(setup: Setup) -> tuple[str, int]:
    host, port = setup.proxy.removeprefix("http://").split(":")
    return host, int(port)


async def presented(setup: Setup, target: str, sni: str | None) -> x509.Certificate | str:
    """``CONNECT target``, then a TLS handshake sending ``sni`` (None: no SNI at all, as for an
    IP address); the certificate the proxy presented, verified against kuikproxy's CA, or the
    reason the handshake failed."""
    reader, writer = await asyncio.open_connection(*address(setup))
    try:
        writer.write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200 ")
        client = ssl.create_default_context(cafile=str(setup.ca_file))
        # the chain is still verified; which name the leaf carries is what is asserted
        client.check_hostname = False
        try:
            await writer.start_tls(client, server_hostname=sni)
        except (ssl.SSLError, ConnectionError) as error:
            return repr(error)
        tls = writer.get_extra_info("ssl_object")
        assert isinstance(tls, ssl.SSLObject)
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return x509.load_der_x509_certificate(der)
    finally:
        writer.close()


def names(cert: x509.Certificate) -> tuple[str, list[str]]:
    """A leaf's common name and the names its subjectAltName lists."""
    common_name = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return str(common_name), [str(name.value) for name in san]


@pytest.mark.parametrize(
    ("target", "sni", "leaf"),
    [
        # refused: the SNI names a host other than the CONNECT's
        (SECURE_TARGET, "docker.io", None),  # another allowed host
        (SECURE_TARGET, "example.com", None),  # a host kuikproxy may not contact
        (SECURE_TARGET, TUNNELLED, None),  # a tunnelHosts host
        ("docker.io:443", "registry-1.docker.io", None),  # the same registry, another name
        # presented: the CONNECT's host, however the SNI spells it, or no SNI at all
        (SECURE_TARGET, SECURE, SECURE),
        (SECURE_TARGET, SECURE.upper(), SECURE),
        (SECURE_TARGET, f"{SECURE}.", SECURE),
        (SECURE_TARGET, None, SECURE),
        # the leaf names the host as the client wrote it, not the registry kuikproxy folds
        # it into (registry-1.docker.io is docker.io's): that is the name the client checks
        ("Registry-1.Docker.IO:443", "registry-1.docker.io", "registry-1.docker.io"),
        ("127.0.0.1:443", None, "127.0.0.1"),  # IP literals: clients send no SNI
        ("[::1]:443", None, "::1"),
    ],
    ids=[
        "other-allowed-host",
        "host-not-allowed",
        "tunnel-host",
        "docker-hub-alias",
        "same-host",
        "same-host-other-case",
        "same-host-trailing-dot",
        "no-sni",
        "connect-host-as-written",
        "ipv4-literal",
        "ipv6-literal",
    ],
)
async def test_the_leaf_presented_is_the_connect_hosts_and_no_other(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    tmp_path: Path,
    target: str,
    sni: str | None,
    leaf: str | None,
) -> None:
    """Whatever name a ClientHello asks for, the only leaf kuikproxy ever presents in a
    tunnel is for the CONNECT's host (compared without case or a trailing dot); an SNI for
    any other name ends the handshake."""
    async with forward_proxy(aiohttp_server, tmp_path, (TUNNELLED,), MORE_HOSTS) as setup:
        shown = await presented(setup, target.replace("PORT", str(setup.https_port)), sni)
    if leaf is None:
        assert isinstance(shown, str), f"a leaf was presented: {names(shown)}"
    else:
        assert isinstance(shown, x509.Certificate), f"the handshake failed: {shown}"
        assert names(shown) == (leaf, [leaf])


# an allowed host whose name has a fixed length, for heads of exact sizes
HEAD = "CONNECT 127.0.0.1:443 HTTP/1.1\r\nHost: 127.0.0.1:443\r\n"
LONG_HOST = "a" * (8190 - len("CONNECT .test:443 HTTP/1.1")) + ".test"  # a line of 8190 bytes


def head_of(size: int) -> str:
    """A CONNECT head of exactly ``size`` bytes before its final CRLF CRLF, in header lines
    well within the field limit."""
    head = HEAD.removesuffix("\r\n")
    while len(head) < size:
        head += "\r\nX-Pad: " + "p" * min(size - len(head) - len("\r\nX-Pad: "), 8000)
    assert len(head) == size
    return head + "\r\n\r\n"


@pytest.mark.parametrize(
    ("sent", "status"),
    [
        (f"CONNECT {LONG_HOST}:443 HTTP/1.1\r\n\r\n", 403),  # not allowed, but heard
        (HEAD + f"X-Pad: {'p' * (8190 - len('X-Pad: '))}\r\n\r\n", 200),
        (HEAD + "".join(f"X-{i}: p\r\n" for i in range(127)) + "\r\n", 200),  # Host is one
        (head_of(16 * 1024), 200),
    ],
    ids=["request-line-of-8190", "header-of-8190", "128-headers", "16-KiB"],
)
async def test_a_connect_head_at_the_limits_is_answered_as_any_connect(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    tmp_path: Path,
    sent: str,
    status: int,
) -> None:
    """The limits are aiohttp's to the byte, not stricter: a head right at each of them is
    intercepted (200), or refused only for its host (403)."""
    async with forward_proxy(aiohttp_server, tmp_path, more_hosts=MORE_HOSTS) as setup:
        reader, writer = await asyncio.open_connection(*address(setup))
        writer.write(sent.encode())
        line = await reader.readline()
        writer.close()
    assert line.split(b" ")[1] == str(status).encode()


@pytest.mark.looptime
@pytest.mark.parametrize(
    ("sent", "status"),
    [
        # aiohttp's limits for every other request: 8190 bytes a request line, 8190 a header
        # line, 128 headers; and 16 KiB for the whole head
        (f"CONNECT a{LONG_HOST}:443 HTTP/1.1\r\n\r\n", 431),
        (HEAD + f"X-Pad: {'p' * (8191 - len('X-Pad: '))}\r\n\r\n", 431),
        (HEAD + "".join(f"X-Pad-{i}: {'p' * 1000}\r\n" for i in range(20)) + "\r\n", 431),
        (head_of(16 * 1024 + 1), 431),
        (HEAD + "".join(f"X-{i}: p\r\n" for i in range(128)) + "\r\n", 431),
        (HEAD + "X-Pad: " + "p" * 20000, 431),  # too long before it even ends
        (HEAD, 408),  # a head that never ends
    ],
    ids=[
        "request-line-of-8191",
        "header-of-8191",
        "20-KB-of-headers",
        "16-KiB-and-1",
        "129-headers",
        "no-end",
        "slow",
    ],
)
async def test_a_connect_head_over_the_limits_is_refused_and_the_proxy_keeps_serving(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    tmp_path: Path,
    sent: str,
    status: int,
) -> None:
    """A CONNECT head larger than aiohttp lets any other head be gets 431, sent whole or in
    part; one that has not ended after the handshake timeout gets 408; either way the
    connection is closed, nothing is intercepted, and the proxy goes on serving."""
    async with forward_proxy(aiohttp_server, tmp_path, more_hosts=MORE_HOSTS) as setup:
        loop = asyncio.get_running_loop()
        started = loop.time()
        answer = await exchange(*address(setup), sent.encode(), expect=2, timeout=60)
        assert [r.status for r in answer.responses] == [status]
        assert answer.first.oci_code == "UNSUPPORTED"
        assert answer.closed
        if status == 408:
            assert loop.time() - started == pytest.approx(HANDSHAKE_TIMEOUT, abs=0.01)
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{setup.proxy}/healthz") as response,
        ):
            assert response.status == 200
