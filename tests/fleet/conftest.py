"""A real ``redis-server`` on loopback for the fleet's tests (Debian package ``redis-server``):
one per test, in its own directory, with nothing persisted; it can be killed and started again
on the same port, as an outage would."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kuikproxy.fleet.redis import RedisFleet
from kuikproxy.fleet.redisstore import RedisStore
from tests.certs import Authority, cert_pem

REDIS_SERVER = shutil.which("redis-server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path
    ca: Path

    @classmethod
    def issued(cls, directory: Path) -> TlsFiles:
        """A server certificate for ``redis`` and its key, issued by a test CA whose
        certificate is ``ca``: all three written in ``directory``."""
        authority = Authority()
        files = cls(directory / "redis.crt", directory / "redis.key", directory / "ca.crt")
        authority.issue(files.cert, files.key, "redis")
        files.ca.write_bytes(cert_pem(authority.cert))
        return files


class RedisServer:
    """``redis-server`` as a subprocess: :meth:`start`, :meth:`stop` (SIGKILL), :meth:`start`
    again on the same port. ``args`` are extra command-line options."""

    def __init__(self, directory: Path, *args: str, tls: TlsFiles | None = None) -> None:
        assert REDIS_SERVER is not None
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.tls = tls
        scheme = "redis" if tls is None else "rediss"
        self.url = f"{scheme}://127.0.0.1:{self.port}/0"
        self.args = list(args)
        if tls is not None:  # TLS only: the plain port is off
            self.args += ["--port", "0", "--tls-port", str(self.port), "--tls-auth-clients", "no"]
            self.args += ["--tls-cert-file", str(tls.cert), "--tls-key-file", str(tls.key)]
            self.args += ["--tls-ca-cert-file", str(tls.ca)]
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert self._process is None
        log = (self.directory / "redis.log").open("ab")
        with log:
            self._process = subprocess.Popen(
                [
                    *(REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1"),
                    *("--save", "", "--appendonly", "no", "--dir", str(self.directory)),
                    *self.args,
                ],
                cwd=self.directory,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        assert self._process is not None
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                log = (self.directory / "redis.log").read_text(errors="replace")
                self._process = None
                pytest.fail(f"redis-server exited at start:\n{log}")
            try:
                with self._connect() as s:
                    s.sendall(b"PING\r\n")
                    # "+PONG", or "-NOAUTH" when a password is required: either way it answers
                    if s.recv(64)[:1] in (b"+", b"-"):
                        return
            except OSError:
                pass
            time.sleep(0.02)
        self.stop()
        pytest.fail("redis-server did not answer PING within 10 s")

    def _connect(self) -> socket.socket:
        plain = socket.create_connection(("127.0.0.1", self.port), timeout=0.5)
        if self.tls is None:
            return plain
        context = ssl.create_default_context(cafile=self.tls.ca)
        return context.wrap_socket(plain, server_hostname="127.0.0.1")

    def stop(self) -> None:
        """Kill it (SIGKILL: an outage, not a shutdown), keeping the port for :meth:`start`."""
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None


@pytest.fixture
def redis_server_factory(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """Start ``redis-server``s (``args``: extra options; ``tls``: serve TLS only); every one is
    killed at the end."""
    if REDIS_SERVER is None:
        pytest.skip("redis-server is not installed (Debian package redis-server)")
    servers: list[RedisServer] = []

    def start(*args: str, tls: TlsFiles | None = None) -> RedisServer:
        server = RedisServer(tmp_path / f"redis-{len(servers)}", *args, tls=tls)
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def redis_server(redis_server_factory: Callable[..., RedisServer]) -> RedisServer:
    return redis_server_factory()


FleetFactory = Callable[..., Awaitable[RedisFleet]]


@pytest.fixture
async def fleet(redis_server: RedisServer) -> AsyncIterator[FleetFactory]:
    """``await fleet(name, url=..., **options)``: a proxy joined to the test's Redis (or to
    ``url``); every one is closed at the end."""
    made: list[RedisFleet] = []

    async def join(
        name: str,
        url: str | None = None,
        *,
        key_prefix: str = "kuikproxy:",
        confirmed_by: int = 0,
        **where: Any,
    ) -> RedisFleet:
        store = RedisStore(url=url or redis_server.url, **where)
        proxy = await RedisFleet.connect(
            store, name, key_prefix=key_prefix, confirmed_by=confirmed_by
        )
        made.append(proxy)
        return proxy

    yield join
    for proxy in made:
        await proxy.close()
