"""Forward-proxy mode (SPEC §13) in process: kuikproxy as a client's proxy, on loopback.

The client is aiohttp's, with ``proxy=``: a ``CONNECT`` for an ``https://`` registry (kuikproxy
intercepts it with a leaf from its own CA, which the client trusts), and absolute-URI requests
for an ``http://`` one. The registries are the recording test registry, one over TLS with a
certificate of its own. These run on the real clock (TLS handshakes are real I/O) with 50 ms
windows, and assert what was read and in which order, never when.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from kuikproxy.app import build_app
from kuikproxy.config import load_config
from kuikproxy.forward.front import FrontSite
from kuikproxy.web.keys import FORWARDING
from tests.certs import self_signed
from tests.upstream_app import Registry

SECURE, PLAIN = "registry.test", "plain.test"
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Setup:
    proxy: str
    https_port: int
    secure: Registry
    plain: Registry
    client_tls: ssl.SSLContext
    ca_file: Path


@asynccontextmanager
async def forward_proxy(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    tmp_path: Path,
    tunnel_hosts: tuple[str, ...] = (),
    more_hosts: tuple[str, ...] = (),
) -> AsyncIterator[Setup]:
    """kuikproxy as a forward proxy for the two registries; ``more_hosts`` get an empty
    registries block each: allowed, and never read unless a test sends them a request."""
    secure, plain = Registry(), Registry()
    cert, key = self_signed(tmp_path)
    upstream_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    upstream_tls.load_cert_chain(cert, key)
    https = await aiohttp_server(secure.app(), ssl=upstream_tls)
    http = await aiohttp_server(plain.app())
    ca_cert, ca_key = tmp_path / "ca.crt", tmp_path / "ca.key"
    config_file = tmp_path / "kuikproxy.yaml"
    config_file.write_text(
        "allowedHosts: []\n"
        f"defaultRegistry: {SECURE}:{https.port}\n"
        f"forwardProxy:\n  enabled: true\n  ca: {{certFile: {ca_cert}, keyFile: {ca_key}}}\n"
        f"  tunnelHosts: {json.dumps(list(tunnel_hosts))}\n"
        "registries:\n"
        f"  {SECURE}:{https.port}:\n"
        f"    upstream: https://127.0.0.1:{https.port}\n"
        f"    tls: {{caFile: {cert}}}\n"
        "    check: {interval: 50ms}\n    copy: {interval: 50ms}\n"
        f"  {PLAIN}:{http.port}:\n"
        f"    upstream: http://127.0.0.1:{http.port}\n"
        "    check: {interval: 50ms}\n    copy: {interval: 50ms}\n"
        + "".join(f"  {json.dumps(host)}: {{}}\n" for host in more_hosts)
    )
    app = build_app(load_config(config_file), config_path=str(config_file))
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    forwarding = app[FORWARDING]
    assert forwarding is not None
    site = FrontSite(runner, forwarding, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    client_tls = ssl.create_default_context(cafile=str(ca_cert))
    try:
        yield Setup(f"http://127.0.0.1:{port}", https.port, secure, plain, client_tls, ca_cert)
    finally:
        await runner.cleanup()


async def test_a_connect_is_intercepted_and_its_reads_are_paced_as_a_mirrors(
    aiohttp_server: Callable[..., Awaitable[TestServer]], tmp_path: Path
) -> None:
    """Two HEADs and a GET through the proxy for an HTTPS registry: the client trusts
    kuikproxy's leaf for the registry's name; the registry sees one read per window, in
    byte-wise order; the answers carry the manifest and its digest."""
    async with forward_proxy(aiohttp_server, tmp_path) as setup:
        base = f"https://{SECURE}:{setup.https_port}/v2/app/manifests"
        async with aiohttp.ClientSession() as session:

            async def head(ref: str) -> tuple[int, str | None]:
                async with session.head(
                    f"{base}/{ref}", proxy=setup.proxy, ssl=setup.client_tls
                ) as response:
                    return response.status, response.headers.get("Docker-Content-Digest")

            results = await asyncio.gather(head("b"), head("a"))
            async with session.get(f"{base}/a", proxy=setup.proxy, ssl=setup.client_tls) as got:
                body = await got.read()
                assert got.status == 200
        assert [status for status, _ in results] == [200, 200]
        assert all(digest and digest.startswith("sha256:") for _, digest in results)
        assert json.loads(body)["annotations"]["ref"] == "app:a"
        reads = [(s.method, s.path.rsplit("/", 1)[1]) for s in setup.secure.reads()]
        assert reads[:2] == [("HEAD", "a"), ("HEAD", "b")]  # one per window, byte-wise


async def test_the_proxy_user_names_the_resource(
    aiohttp_server: Callable[..., Awaitable[TestServer]], tmp_path: Path
) -> None:
    """kube-image-keeper's controllers can only say who they are in the proxy URL: the Basic
    user name of the CONNECT's Proxy-Authorization is the resource of every request in it."""
    async with forward_proxy(aiohttp_server, tmp_path) as setup:
        url = f"https://{SECURE}:{setup.https_port}/v2/app/manifests/v1"
        user = base64.b64encode(b"ImageMonitor/default/web:x").decode()
        async with aiohttp.ClientSession() as session:
            async with session.head(
                url,
                proxy=setup.proxy,
                proxy_headers={"Proxy-Authorization": f"Basic {user}"},
                ssl=setup.client_tls,
            ) as response:
                assert response.status == 200
            async with session.get(f"{setup.proxy}/status") as response:
                status = await response.json()
        assert "ImageMonitor/default/web" in status["resources"]
        # the client's proxy credentials are kuikproxy's business, never the registry's
        assert all("proxy-authorization" not in s.headers for s in setup.secure.seen)


async def test_an_absolute_uri_request_is_read_for_its_host(
    aiohttp_server: Callable[..., Awaitable[TestServer]], tmp_path: Path
) -> None:
    async with forward_proxy(aiohttp_server, tmp_path) as setup:
        plain_port = int(
            next(h for h in load_config(tmp_path / "kuikproxy.yaml").configured_hosts()
                 if h.startswith(PLAIN)).rsplit(":", 1)[1]
        )  # fmt: skip
        url = f"http://{PLAIN}:{plain_port}/v2/app/manifests/v1"
        async with (
            aiohttp.ClientSession() as session,
            session.head(url, proxy=setup.proxy) as response,
        ):
            assert response.status == 200
        assert [s.path for s in setup.plain.reads()] == ["/v2/app/manifests/v1"]


async def test_a_connect_to_a_host_not_allowed_is_refused(
    aiohttp_server: Callable[..., Awaitable[TestServer]], tmp_path: Path
) -> None:
    async with forward_proxy(aiohttp_server, tmp_path) as setup:
        host, port = setup.proxy.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n")
        answer = await reader.read()
        writer.close()
        # counted as every refusal is (§12), under no host's name
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{setup.proxy}/status") as response,
        ):
            status = await response.json()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 403 ")
    assert json.loads(body)["errors"][0]["code"] == "DENIED"
    assert status["refused"] == {"notAllowed": 1}


@pytest.mark.parametrize(
    ("sent", "status"),
    [
        (b"CONNECT registry.test HTTP/1.1\r\n\r\n", b"400"),  # no port
        (b"CONNECT a b c\r\n\r\n", b"400"),
        (b"CONNECT registry.test:443 HTTP/1.1\r\n\r\nearly bytes", b"400"),
    ],
    ids=["no-port", "bad-line", "early-data"],  # heads too large: test_hostile_forward.py
)
async def test_a_malformed_connect_is_refused_and_the_proxy_keeps_serving(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    tmp_path: Path,
    sent: bytes,
    status: bytes,
) -> None:
    async with forward_proxy(aiohttp_server, tmp_path) as setup:
        host, port = setup.proxy.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(sent)
        answer = await reader.read()
        writer.close()
        assert answer.split(b" ")[1] == status
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{setup.proxy}/healthz") as response,
        ):
            assert response.status == 200


async def test_tunnel_hosts_are_tunnelled_blind(
    aiohttp_server: Callable[..., Awaitable[TestServer]], tmp_path: Path
) -> None:
    """A CONNECT to a tunnelHosts host gets the bytes through untouched: here an echo
    server on loopback."""

    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(await reader.readline())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    echo_port = server.sockets[0].getsockname()[1]
    async with forward_proxy(aiohttp_server, tmp_path, ("127.0.0.1",)) as setup:
        host, port = setup.proxy.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"CONNECT 127.0.0.1:{echo_port} HTTP/1.1\r\n\r\n".encode())
        assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
        writer.write(b"ping\n")
        assert await reader.readline() == b"ping\n"
        writer.close()
    server.close()
    await server.wait_closed()


def test_cryptography_is_imported_only_by_a_forward_proxy() -> None:
    """The dependency the forward proxy adds costs the other ways of use nothing."""
    code = (
        "import sys\n"
        "from kuikproxy.config import load_config\n"
        "from kuikproxy.app import build_app\n"
        "build_app(load_config(None))\n"
        "print('cryptography' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert result.stdout.strip() == "False"
