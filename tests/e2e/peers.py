"""Real peers on loopback for the end-to-end tests and the bench.

* :class:`DistributionRegistry` — the CNCF distribution registry (Debian ``docker-registry``),
  anonymous or behind token auth, with its request log readable as :class:`LoggedRequest` rows.
* :class:`TokenServer` — a docker token server (RS256 JWTs with ``x5c``) the registry trusts,
  users from a dict, grants from a small ACL.
* :func:`build_image` / :func:`push_image` — a small multi-arch OCI image, pushed with the plain
  registry HTTP API; :class:`SeededImage` holds every digest for comparisons.
* :class:`Nginx` — nginx in the foreground with the caller's ``http`` and ``server`` directives,
  its access log readable line by line.
* :class:`Kuikproxy` — ``python -m kuikproxy serve --config FILE`` as a subprocess.
* :class:`Prometheus` — Debian's ``prometheus`` scraping loopback targets, queried over its API.
* :class:`FaultRelay` — a TCP relay whose faults a test switches while it runs (cut, blackhole,
  slow): between a fleet's proxy and its Redis.

Everything listens on 127.0.0.1 on a port the kernel picked, writes under a directory the caller
owns, and is stopped by ``stop()`` (each class is also a context manager).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import fnmatch
import gzip
import hashlib
import io
import itertools
import json
import os
import random
import re
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import jwt
import yaml
from aiohttp import web

from tests.certs import cert_der, cert_pem, certificate, rsa_key

LOOPBACK = "127.0.0.1"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
MANIFEST_TYPES = (
    OCI_INDEX,
    OCI_MANIFEST,
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then released)."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a peer or client: no proxy variables, so nothing leaves loopback."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(extra)
    return env


def wait_until_http(
    url: str, process: subprocess.Popen[bytes], log: Path, timeout: float = 20
) -> None:
    """Poll ``url`` until it answers anything over HTTP; fail with ``log`` if the process dies."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            http(url, timeout=1)
            return
        except OSError:
            pass
        if process.poll() is not None:
            raise RuntimeError(f"{process.args} exited {process.returncode}:\n{tail(log)}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer in {timeout}s:\n{tail(log)}")
        time.sleep(0.05)


def tail(path: Path, lines: int = 60) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"


_SETPRIV = shutil.which("setpriv")


def spawn(
    args: Sequence[str], log: Path, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a peer with stdout and stderr to ``log``, in its own session. Where util-linux's
    ``setpriv`` exists the peer is SIGKILLed if the test process dies without tearing it down
    (``PR_SET_PDEATHSIG``)."""
    prefix = [_SETPRIV, "--pdeathsig", "KILL", "--"] if _SETPRIV else []
    with log.open("ab") as out:
        return subprocess.Popen(
            [*prefix, *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else clean_env(),
            start_new_session=True,
        )


def stop_process(process: subprocess.Popen[bytes] | None, timeout: float = 10) -> None:
    """SIGTERM, then SIGKILL after ``timeout``; always reaps the process."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def rss_kib(pid: int) -> int:
    """VmRSS of ``pid`` in KiB (0 if it is gone)."""
    return vm_kib(pid, "VmRSS")


def vm_kib(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` figure in KiB (``VmHWM``: the peak RSS); 0 if ``pid`` is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


_SKMEM = re.compile(r"skmem:\(r(\d+),rb\d+,t\d+,tb\d+,f\d+,w(\d+)")


def socket_queues(pid: int) -> tuple[int, int]:
    """Bytes queued in ``pid``'s TCP sockets, received and to send (``ss -tmp``): kernel memory
    the pod's memory cgroup is charged for, not in the process's RSS."""
    out = subprocess.run(["ss", "-tmnpH"], capture_output=True, text=True, check=True).stdout
    received = sending = 0
    owned = False
    for line in out.splitlines():
        if "users:" in line:
            owned = f"pid={pid}," in line
        elif owned and (queued := _SKMEM.search(line)) is not None:
            received += int(queued.group(1))
            sending += int(queued.group(2))
    return received, sending


def cpu_seconds(pids: Sequence[int]) -> float:
    """utime + stime of ``pids``, in seconds."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / ticks


# --- plain HTTP, never through a proxy -----------------------------------------------------

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER_NO_REDIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


def http(
    url: str,
    method: str = "GET",
    body: bytes | None = None,
    headers: Mapping[str, str] | Sequence[tuple[str, str]] = (),
    timeout: float = 30,
) -> tuple[int, Any, bytes]:
    """One request: ``(status, headers, body)`` whatever the status (redirects not followed)."""
    request = urllib.request.Request(url, data=body, method=method)
    for name, value in headers.items() if isinstance(headers, Mapping) else headers:
        request.add_header(name, value)
    try:
        with _OPENER_NO_REDIRECT.open(request, timeout=timeout) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers, error.read()


def basic(username: str, password: str) -> str:
    """The value of an ``Authorization: Basic`` header."""
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def parse_challenge(value: str) -> tuple[str, dict[str, str]]:
    """``Bearer realm="...",service="..."`` → ``("bearer", {"realm": ..., ...})``."""
    scheme, _, rest = value.partition(" ")
    params = dict(re.findall(r'(\w+)="([^"]*)"', rest))
    return scheme.lower(), params


class RegistryClient:
    """A minimal OCI distribution client with the docker token dance, for seeding and probing.

    ``base`` is the registry (or kuikproxy) URL; ``credentials`` a ``(user, password)`` sent
    to the token realm (or as Basic when the registry asks for Basic)."""

    def __init__(self, base: str, credentials: tuple[str, str] | None = None) -> None:
        self.base = base.rstrip("/")
        self.credentials = credentials
        self._tokens: dict[str, str] = {}

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, Any, bytes]:
        url = path if "://" in path else self.base + path
        sent = dict(headers or {})
        status, answer_headers, data = http(url, method, body, sent)
        if status != 401:
            return status, answer_headers, data
        scheme, params = parse_challenge(answer_headers.get("WWW-Authenticate", ""))
        if scheme == "basic" and self.credentials:
            sent["Authorization"] = basic(*self.credentials)
        elif scheme == "bearer":
            sent["Authorization"] = "Bearer " + self.token(params)
        else:
            return status, answer_headers, data
        return http(url, method, body, sent)

    def token(self, challenge: Mapping[str, str]) -> str:
        """A token from the challenge's realm for its service and scope (cached by scope)."""
        key = challenge.get("scope", "")
        if key not in self._tokens:
            query = {"service": challenge.get("service", "")}
            if "scope" in challenge:
                query["scope"] = challenge["scope"]
            url = challenge["realm"] + "?" + urllib.parse.urlencode(query)
            auth = {"Authorization": basic(*self.credentials)} if self.credentials else {}
            status, _, data = http(url, headers=auth)
            if status != 200:
                raise RuntimeError(f"token {url}: {status} {data[:200]!r}")
            self._tokens[key] = json.loads(data)["token"]
        return self._tokens[key]

    def push_blob(self, repository: str, blob: Blob) -> None:
        status, headers, data = self.request("POST", f"/v2/{repository}/blobs/uploads/")
        if status != 202:
            raise RuntimeError(f"upload {repository}: {status} {data[:300]!r}")
        location = urllib.parse.urljoin(self.base + "/", headers["Location"])
        separator = "&" if "?" in location else "?"
        status, _, data = self.request(
            "PUT",
            f"{location}{separator}digest={blob.digest}",
            blob.data,
            {"Content-Type": "application/octet-stream"},
        )
        if status != 201:
            raise RuntimeError(f"blob {blob.digest}: {status} {data[:300]!r}")

    def push_manifest(self, repository: str, reference: str, manifest: Blob) -> None:
        status, _, data = self.request(
            "PUT",
            f"/v2/{repository}/manifests/{reference}",
            manifest.data,
            {"Content-Type": manifest.media_type},
        )
        if status != 201:
            raise RuntimeError(f"manifest {repository}:{reference}: {status} {data[:300]!r}")


# --- images ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Blob:
    """Content and its descriptor fields."""

    media_type: str
    data: bytes

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.data).hexdigest()

    def descriptor(self, **extra: Any) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": len(self.data)} | extra


@dataclass(frozen=True)
class PlatformImage:
    platform: str  # "linux/amd64"
    manifest: Blob
    config: Blob
    layers: tuple[Blob, ...]

    @property
    def layer(self) -> Blob:
        """Its first layer (most images here have one)."""
        return self.layers[0]

    @property
    def blobs(self) -> tuple[Blob, ...]:
        return (self.config, *self.layers)

    @property
    def content(self) -> dict[str, str]:
        """What a pull of this platform reads, by digest: ``{digest: what}``."""
        return (
            {self.manifest.digest: f"{self.platform} manifest"}
            | {self.config.digest: f"{self.platform} config"}
            | {layer.digest: f"{self.platform} layer {n}" for n, layer in enumerate(self.layers)}
        )


@dataclass(frozen=True)
class SeededImage:
    """An OCI index and its platform images, as pushed to ``repository:tag``."""

    repository: str
    tag: str
    index: Blob
    platforms: tuple[PlatformImage, ...]

    def platform(self, name: str) -> PlatformImage:
        return next(p for p in self.platforms if p.platform == name)

    @property
    def blob_digests(self) -> set[str]:
        return {b.digest for p in self.platforms for b in p.blobs}

    @property
    def manifest_digests(self) -> set[str]:
        return {self.index.digest} | {p.manifest.digest for p in self.platforms}

    @property
    def digests(self) -> set[str]:
        return self.manifest_digests | self.blob_digests


def canonical_json(value: Any) -> bytes:
    """JSON as registries hash it here: sorted keys, no spaces (one digest per document)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def _layer(text: str, filler: int = 0) -> tuple[bytes, bytes]:
    """A gzip'd tar holding ``/hello.txt`` (and ``/filler.bin``, ``filler`` bytes that do not
    compress, when asked); returns ``(gzipped, uncompressed tar)``, both byte-for-byte
    reproducible."""
    files = {"hello.txt": text.encode()}
    if filler:
        files["filler.bin"] = random.Random(text).randbytes(filler)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, payload in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(payload), 0o644, 0
            tar.addfile(info, io.BytesIO(payload))
    raw = buffer.getvalue()
    return gzip.compress(raw, mtime=0), raw


def build_image(
    repository: str,
    tag: str,
    platforms: Iterable[str] = ("linux/amd64", "linux/arm64"),
    filler: int = 0,
    layers: int = 1,
) -> SeededImage:
    """A multi-arch image whose content names the repository, tag and platform, so that two
    images never share a digest; each platform has ``layers`` layers, each holding ``filler``
    more bytes when asked."""
    built = []
    for platform in platforms:
        os_name, arch = platform.split("/")
        made = [
            _layer(f"{repository}:{tag} on {platform}, layer {n}\n" if n else
                   f"{repository}:{tag} on {platform}\n", filler)
            for n in range(layers)
        ]  # fmt: skip
        blobs = tuple(Blob(OCI_LAYER, gzipped) for gzipped, _ in made)
        config = Blob(
            OCI_CONFIG,
            canonical_json(
                {
                    "architecture": arch,
                    "os": os_name,
                    "config": {"Cmd": ["/bin/true"]},
                    "rootfs": {
                        "type": "layers",
                        "diff_ids": [
                            "sha256:" + hashlib.sha256(raw).hexdigest() for _, raw in made
                        ],
                    },
                }
            ),
        )
        manifest = Blob(
            OCI_MANIFEST,
            canonical_json(
                {
                    "schemaVersion": 2,
                    "mediaType": OCI_MANIFEST,
                    "config": config.descriptor(),
                    "layers": [layer.descriptor() for layer in blobs],
                }
            ),
        )
        built.append(PlatformImage(platform, manifest, config, blobs))
    index = Blob(
        OCI_INDEX,
        canonical_json(
            {
                "schemaVersion": 2,
                "mediaType": OCI_INDEX,
                "manifests": [
                    p.manifest.descriptor(
                        platform={
                            "os": p.platform.split("/")[0],
                            "architecture": p.platform.split("/")[1],
                        }
                    )
                    for p in built
                ],
            }
        ),
    )
    return SeededImage(repository, tag, index, tuple(built))


def push_image(client: RegistryClient, image: SeededImage) -> SeededImage:
    """Push blobs, platform manifests (by digest) and the index (by tag)."""
    for p in image.platforms:
        for blob in p.blobs:
            client.push_blob(image.repository, blob)
        client.push_manifest(image.repository, p.manifest.digest, p.manifest)
    client.push_manifest(image.repository, image.tag, image.index)
    return image


def seed(client: RegistryClient, repository: str, tag: str = "v1") -> SeededImage:
    """Build and push ``repository:tag``."""
    return push_image(client, build_image(repository, tag))


# --- the token server -----------------------------------------------------------------------

ANYONE = "*"


@dataclass(frozen=True)
class Grant:
    """``users`` (or ``ANYONE``, anonymous included) may do ``actions`` on repositories
    matching the glob ``repositories``."""

    repositories: str
    users: frozenset[str] | str
    actions: tuple[str, ...]


DEFAULT_USERS = {"alice": "s3cret", "writer": "wr1ter"}
DEFAULT_ACL = (
    Grant("public/*", ANYONE, ("pull",)),
    Grant("private/*", frozenset({"alice"}), ("pull",)),
    Grant("*", frozenset({"writer"}), ("pull", "push")),
)


@dataclass(frozen=True)
class IssuedToken:
    user: str | None
    scopes: tuple[str, ...]
    access: tuple[tuple[str, tuple[str, ...]], ...]


class OnLoopback:
    """Something listening on ``port`` of 127.0.0.1."""

    port = 0

    @property
    def host_port(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host_port}"


class ThreadedServer(OnLoopback):
    """An aiohttp server on a free port of 127.0.0.1, run by a loop in a thread of its own, so
    that blocking tests (subprocess clients) can use it. Subclasses say what it serves
    (:meth:`server`) and what else to close on stop (:meth:`closing`)."""

    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.BaseRunner | None = None

    def server(self) -> web.BaseRunner:
        raise NotImplementedError

    async def closing(self) -> None:
        """Called on the server's loop after the runner is cleaned up."""

    def start(self) -> Self:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()

        async def up() -> int:
            self._runner = self.server()
            await self._runner.setup()
            site = web.TCPSite(self._runner, LOOPBACK, 0)
            await site.start()
            return int(self._runner.addresses[0][1])

        self.port = asyncio.run_coroutine_threadsafe(up(), self._loop).result(10)
        return self

    def stop(self) -> None:
        if self._loop is None or self._thread is None:
            return

        async def down() -> None:
            if self._runner is not None:
                await self._runner.cleanup()
            await self.closing()

        asyncio.run_coroutine_threadsafe(down(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._loop = self._thread = self._runner = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class TokenServer(ThreadedServer):
    """A docker token server: ``GET /token?service=&scope=`` (Basic or anonymous) and the OAuth2
    ``POST /token`` password grant. Tokens are RS256 JWTs carrying the signing certificate in
    ``x5c``; the registry trusts ``cert_file`` as its ``rootcertbundle``."""

    def __init__(
        self,
        workdir: Path,
        users: Mapping[str, str] = DEFAULT_USERS,
        acl: Sequence[Grant] = DEFAULT_ACL,
        service: str = "kuik-e2e-registry",
        issuer: str = "kuik-e2e-token-server",
    ) -> None:
        self.users, self.acl, self.service, self.issuer = dict(users), tuple(acl), service, issuer
        self.issued: list[IssuedToken] = []
        self._key = rsa_key()
        self._cert = certificate(
            issuer,
            self._key,
            ca=True,
            before=dt.timedelta(days=1),
            valid=dt.timedelta(days=30),
        )
        workdir.mkdir(parents=True, exist_ok=True)
        self.cert_file = workdir / "token-ca.pem"
        self.cert_file.write_bytes(cert_pem(self._cert))
        self._x5c = base64.b64encode(cert_der(self._cert)).decode()

    @property
    def realm(self) -> str:
        return f"http://{LOOPBACK}:{self.port}/token"

    def allowed(self, user: str | None, repository: str, wanted: Iterable[str]) -> tuple[str, ...]:
        granted: set[str] = set()
        for grant in self.acl:
            who_ok = grant.users == ANYONE or (user is not None and user in grant.users)
            if who_ok and fnmatch.fnmatchcase(repository, grant.repositories):
                granted.update(grant.actions)
        return tuple(a for a in wanted if a in granted)

    def sign(self, user: str | None, scopes: Sequence[str]) -> str:
        access = []
        for scope in scopes:
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            if kind == "repository" and name:
                access.append((name, self.allowed(user, name, actions.split(","))))
        self.issued.append(IssuedToken(user, tuple(scopes), tuple(access)))
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "sub": user or "",
            "aud": self.service,
            "exp": now + 300,
            "nbf": now - 30,
            "iat": now,
            "jti": secrets.token_hex(12),
            "access": [
                {"type": "repository", "name": name, "actions": list(actions)}
                for name, actions in access
            ],
        }
        return jwt.encode(claims, self._key, algorithm="RS256", headers={"x5c": [self._x5c]})

    def _user(self, username: str | None, password: str | None) -> str | None:
        if username is None:
            return None
        if self.users.get(username) != password:
            raise web.HTTPUnauthorized(text='{"details":"invalid credentials"}')
        return username

    async def _token(self, request: web.Request) -> web.Response:
        if request.method == "POST":
            form = await request.post()
            username = form.get("username")
            password = form.get("password")
            user = self._user(
                str(username) if username is not None else None,
                str(password) if password is not None else None,
            )
            scopes = [s for value in form.getall("scope", []) for s in str(value).split(" ")]
        else:
            header = request.headers.get("Authorization", "")
            user = None
            if header.lower().startswith("basic "):
                decoded = base64.b64decode(header[6:].strip()).decode()
                name, _, password = decoded.partition(":")
                user = self._user(name, password)
            scopes = [s for value in request.query.getall("scope", []) for s in value.split(" ")]
        if request.query.get("service", self.service) != self.service and request.method == "GET":
            raise web.HTTPBadRequest(text="unknown service")
        token = self.sign(user, scopes)
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {"token": token, "access_token": token, "expires_in": 300, "issued_at": now}
        return web.json_response(body)

    def server(self) -> web.BaseRunner:
        app = web.Application()
        app.router.add_route("GET", "/token", self._token)
        app.router.add_route("POST", "/token", self._token)
        return web.AppRunner(app, access_log=None)


# --- the registry ---------------------------------------------------------------------------

_LOGFMT = re.compile(r'([\w.]+)=("(?:[^"\\]|\\.)*"|\S+)')
_DURATION = re.compile(r"([\d.]+)(ns|µs|us|ms|s|m|h)")
_UNITS = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _rfc3339(text: str) -> float:
    """POSIX seconds of ``2026-11-29T19:27:01.538843595Z`` (Go's RFC3339Nano, UTC)."""
    whole, _, fraction = text.rstrip("Z").partition(".")
    seconds = dt.datetime.fromisoformat(whole + "+00:00").timestamp()
    return seconds + (float("0." + fraction) if fraction else 0.0)


def _go_duration(text: str) -> float:
    return sum(float(n) * _UNITS[u] for n, u in _DURATION.findall(text))


@dataclass(frozen=True)
class LoggedRequest:
    """One request as the registry logged it. ``started`` and ``finished`` are POSIX seconds
    from the registry's own clock (nanosecond resolution)."""

    method: str
    uri: str
    status: int
    started: float
    finished: float
    user_agent: str = ""

    @property
    def path(self) -> str:
        return self.uri.partition("?")[0]

    @property
    def kind(self) -> str:
        """``manifests``, ``blobs``, ``uploads``, ``ping`` or ``other``."""
        if self.path in ("/v2/", "/v2"):
            return "ping"
        for kind in ("uploads", "manifests", "blobs"):
            if f"/{kind}/" in self.path:
                return kind
        return "other"

    @property
    def repository(self) -> str:
        return self.path.removeprefix("/v2/").rpartition(f"/{self.kind}/")[0]

    @property
    def reference(self) -> str:
        return self.path.rpartition("/")[2]


def parse_registry_log(text: str) -> list[LoggedRequest]:
    """One row per request from distribution's log: its ``response completed`` lines (every
    answer but auth refusals) and its ``error authorizing context`` lines (a 401 with a
    challenge, logged when refused: ``started == finished``)."""
    rows = []
    for line in text.splitlines():
        refused = 'msg="error authorizing context' in line
        if not refused and 'msg="response completed' not in line:
            continue
        fields = {k: v.strip('"') for k, v in _LOGFMT.findall(line)}
        end = _rfc3339(fields["time"])
        rows.append(
            LoggedRequest(
                method=fields["http.request.method"],
                uri=fields["http.request.uri"],
                status=401 if refused else int(fields["http.response.status"]),
                started=end - _go_duration(fields.get("http.response.duration", "0s")),
                finished=end,
                user_agent=fields.get("http.request.useragent", ""),
            )
        )
    return rows


class LoopbackServer(OnLoopback):
    """A server process of the suite's on a free port of 127.0.0.1, logging to ``workdir``:
    what the registry and kuikproxy launchers share. Subclasses write their config and
    start the process in ``launch`` and say which ``health`` path answers once ready."""

    log_name = "server.log"
    health = "/"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = 0
        self.log_file = workdir / self.log_name
        self._process: subprocess.Popen[bytes] | None = None

    def launch(self) -> subprocess.Popen[bytes]:
        raise NotImplementedError

    def start(self) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self._process = self.launch()
        wait_until_http(self.url + self.health, self._process, self.log_file)
        return self

    @property
    def pid(self) -> int:
        """The running process's id."""
        assert self._process is not None, "not started"
        return self._process.pid

    def stop(self) -> None:
        stop_process(self._process)
        self._process = None

    def kill(self) -> None:
        """SIGKILL, reaped: no shutdown of its own (``start()`` runs it again)."""
        if self._process is not None:
            self._process.kill()
            self._process.wait(10)
        self._process = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class DistributionRegistry(LoopbackServer):
    """``docker-registry serve CONFIG`` on 127.0.0.1, storage under ``workdir``.

    ``token`` makes it trust a :class:`TokenServer`; ``htpasswd`` a file of bcrypt users
    (``htpasswd -Bbn``). ``requests()`` reads its request log."""

    binary = "docker-registry"
    log_name = "registry.log"
    health = "/v2/"

    def __init__(
        self,
        workdir: Path,
        token: TokenServer | None = None,
        htpasswd: Path | None = None,
    ) -> None:
        super().__init__(workdir)
        self.token, self.htpasswd = token, htpasswd

    def config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "version": 0.1,
            "log": {"level": "info", "accesslog": {"disabled": False}},
            "storage": {
                "filesystem": {"rootdirectory": str(self.workdir / "storage")},
                "delete": {"enabled": True},
            },
            "http": {"addr": self.host_port, "secret": secrets.token_hex(16)},
        }
        if self.token is not None:
            config["auth"] = {
                "token": {
                    "realm": self.token.realm,
                    "service": self.token.service,
                    "issuer": self.token.issuer,
                    "rootcertbundle": str(self.token.cert_file),
                }
            }
        elif self.htpasswd is not None:
            config["auth"] = {"htpasswd": {"realm": "kuik-e2e", "path": str(self.htpasswd)}}
        return config

    def launch(self) -> subprocess.Popen[bytes]:
        config_file = self.workdir / "registry.yml"
        config_file.write_text(yaml.safe_dump(self.config()))
        # stdout gets the combined access log, stderr the structured one parsed by requests().
        return spawn([self.binary, "serve", str(config_file)], self.log_file)

    def requests(self, since: float = 0.0) -> list[LoggedRequest]:
        """Requests the registry answered that started at or after ``since`` (POSIX time)."""
        rows = parse_registry_log(self.log_file.read_text(errors="replace"))
        return [r for r in rows if r.started >= since]

    def wait_for_requests(
        self, count: int, since: float = 0.0, timeout: float = 5
    ) -> list[LoggedRequest]:
        """Requests since ``since``, once at least ``count`` are logged (the log trails)."""
        deadline = time.monotonic() + timeout
        while len(rows := self.requests(since)) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return rows


class TLSRegistry(DistributionRegistry):
    """The distribution registry serving TLS with a certificate of its own for 127.0.0.1."""

    def __init__(self, workdir: Path, cert: Path, key: Path) -> None:
        super().__init__(workdir)
        self.cert, self.key = cert, key

    def config(self) -> dict[str, object]:
        config = super().config()
        config["http"]["tls"] = {"certificate": str(self.cert), "key": str(self.key)}  # type: ignore[index]
        return config

    def start(self) -> Self:
        # its health URL answers over TLS only: wait for the port instead
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self._process = self.launch()
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, self.port), 1):
                return self
            assert self._process.poll() is None, self.log_file.read_text()
            assert time.monotonic() < deadline, "the TLS registry did not start"
            time.sleep(0.05)


# --- nginx ----------------------------------------------------------------------------------


class Nginx(LoopbackServer):
    """nginx in the foreground (``daemon off``) on 127.0.0.1, everything it writes under
    ``workdir``: its pid file, temp paths, ``access.log`` and its error log (to stderr, so in
    ``nginx.log`` with anything it prints at start-up).

    ``http`` holds the caller's ``http``-level directives (``upstream``, ``map``,
    ``limit_req_zone``, ``log_format``...), ``server`` those of the one ``server`` block, which
    listens on the port picked at start (``listen`` is added here). ``access_log`` is the format
    name and options of the access log (``"combined buffer=64k"``); unbuffered by default, so
    that :meth:`access_lines` sees a request as soon as it is answered."""

    binary = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin") or "nginx"
    log_name = "nginx.log"

    def __init__(
        self,
        workdir: Path,
        *,
        server: str,
        http: str = "",
        workers: int = 1,
        access_log: str = "combined",
    ) -> None:
        super().__init__(workdir)
        self.server, self.http, self.workers, self.access_log = server, http, workers, access_log
        self.access_log_file = workdir / "access.log"

    def config(self) -> str:
        w = self.workdir
        user = "user root;\n" if os.geteuid() == 0 else ""  # workers must reach the workdir
        return (
            f"{user}worker_processes {self.workers};\n"
            "daemon off;\n"
            f"pid {w}/nginx.pid;\n"
            "error_log stderr warn;\n"
            "events { worker_connections 1024; }\n"
            "http {\n"
            f"    client_body_temp_path {w}/client_body;\n"
            f"    proxy_temp_path {w}/proxy;\n"
            f"    fastcgi_temp_path {w}/fastcgi;\n"
            f"    uwsgi_temp_path {w}/uwsgi;\n"
            f"    scgi_temp_path {w}/scgi;\n"
            f"{self.http}\n"  # before access_log, which may name one of its log_formats
            f"    access_log {self.access_log_file} {self.access_log};\n"
            "    server {\n"
            f"        listen {self.host_port};\n"
            f"{self.server}\n"
            "    }\n"
            "}\n"
        )

    def launch(self) -> subprocess.Popen[bytes]:
        config_file = self.workdir / "nginx.conf"
        config_file.write_text(self.config())
        args = [self.binary, "-p", str(self.workdir), "-c", str(config_file), "-e", "stderr"]
        return spawn(args, self.log_file)

    @property
    def process(self) -> subprocess.Popen[bytes]:
        """The master process (its workers are its children); only while started."""
        assert self._process is not None, "nginx is not running"
        return self._process

    def access_lines(self) -> list[str]:
        """The access log so far, one string per request."""
        try:
            return self.access_log_file.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return []


# --- kuikproxy ------------------------------------------------------------------------------

FAST = {
    "check": {"interval": "200ms", "timeout": "10s"},
    "copy": {"interval": "200ms", "idle": "200ms"},
}
"""Short windows for tests: a check and a copy every 200 ms, copies close 200 ms after use."""


def registry_block(upstream: str, **settings: Any) -> dict[str, Any]:
    """A ``registries.<host>`` block: ``upstream``, FAST windows, then ``settings`` merged in."""
    block: dict[str, Any] = {"upstream": upstream, **json.loads(json.dumps(FAST))}
    for key, value in settings.items():
        if isinstance(value, dict) and isinstance(block.get(key), dict):
            block[key] = {**block[key], **value}
        else:
            block[key] = value
    return block


class Kuikproxy(LoopbackServer):
    """``python -m kuikproxy serve --config FILE`` on a free loopback port.

    ``config`` is the YAML document as a dict, without ``listen`` (added here)."""

    log_name = "kuikproxy.log"
    health = "/healthz"

    def __init__(self, workdir: Path, config: Mapping[str, Any]) -> None:
        super().__init__(workdir)
        self.settings = dict(config)

    def launch(self) -> subprocess.Popen[bytes]:
        config_file = self.workdir / "kuikproxy.yaml"
        config_file.write_text(yaml.safe_dump({"listen": self.host_port, **self.settings}))
        return spawn(
            [sys.executable, "-m", "kuikproxy", "serve", "--config", str(config_file)],
            self.log_file,
            clean_env(PYTHONUNBUFFERED="1"),
        )

    def log(self) -> str:
        return tail(self.log_file, 200)

    def status(self) -> dict[str, Any]:
        code, _, body = http(self.url + "/status")
        assert code == 200, body
        result: dict[str, Any] = json.loads(body)
        return result


@contextlib.contextmanager
def running(*peers: Any) -> Iterator[None]:
    """Start ``peers`` in order and stop them in reverse, whatever happens."""
    with contextlib.ExitStack() as stack:
        for peer in peers:
            stack.enter_context(peer)
        yield


@dataclass
class Run:
    """A finished client command, for assertion messages."""

    args: list[str]
    returncode: int
    output: str
    seconds: float = field(default=0.0)

    def __str__(self) -> str:
        return (
            f"$ {' '.join(self.args)}\n(exit {self.returncode}, {self.seconds:.2f}s)\n{self.output}"
        )


def run(args: Sequence[str], timeout: float = 60, env: Mapping[str, str] | None = None) -> Run:
    """Run a client to completion (killed at ``timeout``), output captured."""
    started = time.monotonic()
    completed = subprocess.run(
        list(args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(env) if env is not None else clean_env(),
        timeout=timeout,
        check=False,
    )
    return Run(
        list(args),
        completed.returncode,
        completed.stdout.decode(errors="replace"),
        time.monotonic() - started,
    )


# --- containerd -----------------------------------------------------------------------------


class Containerd:
    """A private ``containerd``: root, state and sockets under ``workdir``, CRI disabled (no
    kubelet here), images pulled with the ``native`` snapshotter. ``ctr(...)`` runs ``ctr``
    against it in namespace ``e2e``."""

    binary = "containerd"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.socket = workdir / "containerd.sock"
        self.log_file = workdir / "containerd.log"
        self._process: subprocess.Popen[bytes] | None = None

    def config(self) -> str:
        w = self.workdir
        return (
            "version = 2\n"
            f'root = "{w}/root"\n'
            f'state = "{w}/state"\n'
            'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
            f'[grpc]\n  address = "{self.socket}"\n'
            f'[ttrpc]\n  address = "{self.socket}.ttrpc"\n'
            f'[debug]\n  address = "{w}/debug.sock"\n  level = "info"\n'
            f'[plugins."io.containerd.internal.v1.opt"]\n  path = "{w}/opt"\n'
        )

    def start(self) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_file = self.workdir / "config.toml"
        config_file.write_text(self.config())
        self._process = spawn([self.binary, "--config", str(config_file)], self.log_file)
        deadline = time.monotonic() + 20
        while self.ctr("version").returncode != 0:
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"containerd did not start:\n{tail(self.log_file)}")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        stop_process(self._process)
        self._process = None

    def ctr(self, *args: str, timeout: float = 60) -> Run:
        return run(["ctr", "--address", str(self.socket), "--namespace", "e2e", *args], timeout)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- prometheus -----------------------------------------------------------------------------


class Prometheus(LoopbackServer):
    """Debian's ``prometheus`` on 127.0.0.1 with a config of the caller's (``config``, a dict
    written to ``workdir``) and its TSDB under ``workdir``: never the package's default config,
    which scrapes other things. Every scrape target must be on 127.0.0.1. ``query(expr)``
    evaluates PromQL through the HTTP API (``/api/v1/query``); ``api(path)`` reads any other
    endpoint (``/api/v1/alerts``...)."""

    binary = "prometheus"
    log_name = "prometheus.log"
    health = "/-/ready"

    def __init__(self, workdir: Path, config: Mapping[str, Any]) -> None:
        super().__init__(workdir)
        self.settings = dict(config)
        for job in self.settings.get("scrape_configs", []):
            for group in job.get("static_configs", []):
                for target in group.get("targets", []):
                    if not str(target).startswith(f"{LOOPBACK}:"):
                        raise ValueError(f"{target}: a test Prometheus scrapes loopback only")

    def launch(self) -> subprocess.Popen[bytes]:
        config_file = self.workdir / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(self.settings))
        return spawn(
            [
                self.binary,
                f"--config.file={config_file}",
                f"--web.listen-address={self.host_port}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
            ],
            self.log_file,
        )

    def start(self) -> Self:
        """Started once ``/-/ready`` says 200 (it answers 503 while the TSDB opens)."""
        super().start()
        deadline = time.monotonic() + 20
        while http(self.url + self.health, timeout=1)[0] != 200:
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"prometheus not ready in 20s:\n{tail(self.log_file)}")
            time.sleep(0.05)
        return self

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of a successful API answer (raises with Prometheus's error otherwise)."""
        query = "?" + urllib.parse.urlencode(params) if params else ""
        status, _, body = http(f"{self.url}{path}{query}", timeout=5)
        answer = json.loads(body)
        if status != 200 or answer.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {status} {body[:500]!r}")
        return answer["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant vector ``expr`` evaluated now: ``[{"metric": {...}, "value": [t, "v"]}]``."""
        data = self.api("/api/v1/query", query=expr)
        if data["resultType"] != "vector":
            raise RuntimeError(f"{expr}: a {data['resultType']}, not a vector")
        result: list[dict[str, Any]] = data["result"]
        return result


# --- examples and pacing --------------------------------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE_PROXY = "127.0.0.1:7439"
EXAMPLE_REGISTRY = "registry.example:5000"


def render_example(relative: str, proxy: str, registry: str, **replacements: str) -> str:
    """An example file with literal ``replacements`` made first, then the proxy address and the
    registry name of the test substituted (the ``<host>-<port>`` spelling too)."""
    text = (EXAMPLES / relative).read_text()
    pairs = {
        **replacements,
        EXAMPLE_PROXY: proxy,
        EXAMPLE_REGISTRY: registry,
        EXAMPLE_REGISTRY.replace(":", "-"): registry.replace(":", "-"),
    }
    for old, new in pairs.items():
        text = text.replace(old, new)
    return text


def gaps(rows: Sequence[LoggedRequest]) -> list[float]:
    """Seconds between the starts of consecutive rows, in start order."""
    starts = sorted(r.started for r in rows)
    return [b - a for a, b in itertools.pairwise(starts)]


def fenced_blocks(markdown: str, language: str = "sh") -> list[str]:
    """The fenced code blocks of ``language`` in a Markdown document, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", markdown, flags=re.M | re.S)


# --- a recording forwarder ------------------------------------------------------------------


@dataclass(frozen=True)
class Contact:
    """One HTTP request a :class:`RecordingForwarder` got, as it answered it."""

    method: str
    uri: str
    status: int
    at: float  # POSIX seconds, when it arrived
    user_agent: str = ""

    def __str__(self) -> str:
        return f"{self.method} {self.uri} -> {self.status} ({self.user_agent})"


class _CountingServer(web.Server):
    """aiohttp's low-level server, telling ``on_connect`` of every TCP connection it accepts:
    a TLS hello or anything else that is not HTTP is counted too, though no request is."""

    def __init__(self, handler: Any, on_connect: Any, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._on_connect = on_connect

    def connection_made(self, handler: Any, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        self._on_connect()


_HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "upgrade", "te", "trailer", "host"}
)


class RecordingForwarder(ThreadedServer):
    """Plain HTTP on a free port of 127.0.0.1 in front of ``target`` (``http://127.0.0.1:N``),
    recording every TCP connection (``connections``) and every HTTP request (``contacts``) it
    gets: the *direct port* of a registry, the address a client that bypassed kuikproxy would
    read, or the front of a registry that kuikproxy reads.

    ``refuse`` — ``(status, headers)`` — makes it answer every request but the ``/v2/`` ping
    itself instead of forwarding it (a registry that says ``429`` with ``Retry-After``); it can
    be set and cleared while running."""

    def __init__(self, target: str, refuse: tuple[int, Mapping[str, str]] | None = None) -> None:
        self.target = target.rstrip("/")
        self.refuse = refuse
        self.contacts: list[Contact] = []
        self.connections = 0
        self._lock = threading.Lock()
        self._session: Any = None

    def snapshot(self) -> tuple[int, list[Contact]]:
        """``(connections, contacts)`` so far."""
        with self._lock:
            return self.connections, list(self.contacts)

    def _connected(self) -> None:
        with self._lock:
            self.connections += 1

    def _record(self, request: web.BaseRequest, status: int, at: float) -> None:
        contact = Contact(
            request.method, request.path_qs, status, at, request.headers.get("User-Agent", "")
        )
        with self._lock:
            self.contacts.append(contact)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        import aiohttp

        at = time.time()
        refuse = self.refuse
        if refuse is not None and request.path.rstrip("/") != "/v2":
            status, headers = refuse
            self._record(request, status, at)
            body = canonical_json({"errors": [{"code": "TOOMANYREQUESTS", "message": "slow down"}]})
            return web.Response(
                status=status, body=body, headers={"Content-Type": "application/json", **headers}
            )
        if self._session is None:
            self._session = aiohttp.ClientSession(auto_decompress=False)
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP]
        try:
            async with self._session.request(
                request.method,
                self.target + request.path_qs,
                headers=headers,
                data=await request.read() or None,
                allow_redirects=False,
            ) as upstream:
                self._record(request, upstream.status, at)
                response = web.StreamResponse(status=upstream.status)
                for name, value in upstream.headers.items():
                    if name.lower() not in _HOP_BY_HOP:
                        response.headers.add(name, value)
                await response.prepare(request)
                if request.method != "HEAD":
                    async for chunk in upstream.content.iter_chunked(65536):
                        await response.write(chunk)
                await response.write_eof()
                return response
        except aiohttp.ClientError as error:
            self._record(request, 502, at)
            return web.Response(status=502, text=f"forwarder: {error}")

    def server(self) -> web.BaseRunner:
        return web.ServerRunner(_CountingServer(self._handle, self._connected), access_log=None)

    async def closing(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


# --- containerd's CRI plugin ----------------------------------------------------------------


class CriContainerd(Containerd):
    """A private ``containerd`` with its CRI plugin on (no kubelet, no CNI: image pulls only),
    reading registry hosts from ``certs`` (``registry.config_path``, the directory of
    ``hosts.toml`` files a node has under ``/etc/containerd/certs.d``). :meth:`pull_image` is
    the kubelet's ``PullImage``; ``ctr(...)`` works as on :class:`Containerd`."""

    def __init__(self, workdir: Path, certs: Path) -> None:
        super().__init__(workdir)
        self.certs = certs

    def config(self) -> str:
        w = self.workdir
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return (
            super().config().replace('disabled_plugins = ["io.containerd.grpc.v1.cri"]\n', "")
            + f"[{cri}]\n"
            # Never pulled: no pod sandbox is ever made here.
            + '  sandbox_image = "registry.invalid/pause:3.9"\n'
            + f'  [{cri}.containerd]\n    snapshotter = "native"\n'
            + f'  [{cri}.cni]\n    bin_dir = "{w}/cni/bin"\n    conf_dir = "{w}/cni/conf"\n'
            + f'  [{cri}.registry]\n    config_path = "{self.certs}"\n'
        )

    def pull_image(self, image: str, timeout: float = 60) -> Run:
        """CRI ``runtime.v1.ImageService/PullImage`` of ``image`` over the daemon's socket, as
        the kubelet makes it. Exit 0 and the image id on success; else exit 1 and the error
        containerd logged for the pull (the gRPC status itself is not decoded), or ``timeout``."""
        args = ["PullImage", image]
        started = time.monotonic()
        try:
            image_ref = grpc_unary(
                self.socket,
                "/runtime.v1.ImageService/PullImage",
                _proto_bytes(1, _proto_bytes(1, image.encode())),  # {image: {image: ...}}
                timeout,
            )
        except TimeoutError:
            return Run(args, 124, f"(no answer in {timeout}s)", time.monotonic() - started)
        if image_ref is not None:
            ref = _proto_field(image_ref, 1).decode()  # PullImageResponse.image_ref
            return Run(args, 0, ref, time.monotonic() - started)
        return Run(args, 1, self.pull_error(image), time.monotonic() - started)

    def pull_error(self, image: str) -> str:
        """The error containerd logged for the last failed ``PullImage`` of ``image``."""
        needle = f'msg="PullImage \\"{image}\\" failed"'
        lines = [line for line in tail(self.log_file, 400).splitlines() if needle in line]
        if not lines:
            return "(PullImage failed; containerd logged no error for it)"
        fields = dict((k, v.strip('"')) for k, v in _LOGFMT.findall(lines[-1]))
        return fields.get("error", lines[-1]).replace('\\"', '"')


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _read_varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _proto_bytes(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _proto_field(message: bytes, number: int) -> bytes:
    """The first length-delimited field ``number`` of a protobuf message (b"" if absent)."""
    at = 0
    while at < len(message):
        key, at = _read_varint(message, at)
        kind = key & 7
        if kind == 0:
            _, at = _read_varint(message, at)
        elif kind == 2:
            size, at = _read_varint(message, at)
            if key >> 3 == number:
                return message[at : at + size]
            at += size
        else:  # fixed 64/32: not in the messages read here
            at += 8 if kind == 1 else 4
    return b""


def _hpack_string(text: str) -> bytes:
    raw = text.encode()
    if len(raw) < 0x7F:
        return bytes([len(raw)]) + raw
    rest, out = len(raw) - 0x7F, bytearray([0x7F])
    while rest >= 0x80:
        out.append(rest % 0x80 | 0x80)
        rest //= 0x80
    return bytes([*out, rest]) + raw


_DATA, _HEADERS, _RST_STREAM, _SETTINGS, _PING, _GOAWAY = 0, 1, 3, 4, 6, 7  # HTTP/2 frame types
_END_STREAM = _ACK = 0x1
_END_HEADERS = 0x4


def _h2_frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    head = len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big")
    return head + payload


def grpc_unary(socket_path: Path, method: str, request: bytes, timeout: float) -> bytes | None:
    """One unary gRPC call over HTTP/2 cleartext on a unix socket, enough of the protocol for
    containerd's CRI service without a gRPC library: the reply message, or None when the call
    ended without one (an error status). Raises ``TimeoutError`` after ``timeout``."""
    headers = b"".join(
        b"\x00" + _hpack_string(name) + _hpack_string(value)  # literal, never Huffman
        for name, value in (
            (":method", "POST"), (":scheme", "http"), (":path", method),
            (":authority", "localhost"), ("content-type", "application/grpc"), ("te", "trailers"),
        )
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(timeout)
        conn.connect(str(socket_path))
        conn.sendall(
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
            + _h2_frame(_SETTINGS, 0, 0)
            + _h2_frame(_HEADERS, _END_HEADERS, 1, headers)
            + _h2_frame(_DATA, _END_STREAM, 1, b"\x00" + len(request).to_bytes(4, "big") + request)
        )
        buffer, reply = b"", b""

        def read(size: int) -> bytes:
            nonlocal buffer
            while len(buffer) < size:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                conn.settimeout(left)
                chunk = conn.recv(65536)  # TimeoutError past the deadline
                if not chunk:
                    return b""
                buffer += chunk
            out, buffer = buffer[:size], buffer[size:]
            return out

        while head := read(9):
            size, kind, flags = int.from_bytes(head[:3], "big"), head[3], head[4]
            stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
            payload = read(size)
            if kind == _SETTINGS and not flags & _ACK:
                conn.sendall(_h2_frame(_SETTINGS, _ACK, 0))
            elif kind == _PING and not flags & _ACK:
                conn.sendall(_h2_frame(_PING, _ACK, 0, payload))
            elif kind in (_GOAWAY, _RST_STREAM) and stream in (0, 1):
                break
            elif kind == _DATA and stream == 1:
                reply += payload
            if stream == 1 and kind in (_DATA, _HEADERS) and flags & _END_STREAM:
                break
    if len(reply) < 5:
        return None
    return reply[5 : 5 + int.from_bytes(reply[1:5], "big")]


def run_at_most(args: Sequence[str], seconds: float, env: Mapping[str, str] | None = None) -> Run:
    """Run a client for at most ``seconds``: a client still running then (waiting for a
    window, or for a ``Retry-After``) is killed with its process group, exit code ``-9``, and
    what it printed so far is kept."""
    started = time.monotonic()
    process = subprocess.Popen(
        list(args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=dict(env) if env is not None else clean_env(),
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
    return Run(
        list(args), process.returncode, output.decode(errors="replace"), time.monotonic() - started
    )


# --- Redis Sentinel, Redis Cluster and a fleet of kuikproxy -----------------------------------
# (one redis-server is ``tests/fleet/conftest.RedisServer``; these run beside it)

REDIS_CLI = "redis-cli"


def cluster_node() -> tuple[str, ...]:
    """The extra options of a ``redis-server`` that is a node of a Redis Cluster: its bus on a
    port of its own (not port + 10000: the kernel's free ports may be above 55535)."""
    return (
        *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
        *("--cluster-node-timeout", "2000", "--cluster-port", str(free_port())),
    )


def redis_cli(
    port: int, *args: str, user: tuple[str, str] | None = None, tls_ca: Path | None = None
) -> str:
    """``redis-cli`` against 127.0.0.1:``port`` (``user``: ACL user and password), its output;
    a non-zero exit or an error reply fails."""
    command = [REDIS_CLI, "-h", LOOPBACK, "-p", str(port), "--no-auth-warning"]
    if user is not None:
        command += ["--user", user[0], "--pass", user[1]]
    if tls_ca is not None:
        command += ["--tls", "--cacert", str(tls_ca)]
    done = run([*command, *args], timeout=30)
    # redis-cli exits 0 on an error reply when it is not a terminal: look at the text too
    assert done.returncode == 0 and not done.output.startswith("ERR"), done
    return done.output


def wait_for(what: str, check: Any, timeout: float = 30.0) -> None:
    """Poll ``check()`` every 0.1 s until it is true; fail after ``timeout`` with ``what``."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not {what} within {timeout}s"
        time.sleep(0.1)


class RedisSentinel:
    """``redis-sentinel`` on 127.0.0.1 watching the master on ``master_port`` as
    ``master_name`` (``quorum`` Sentinels agreeing it is down; it is after 0.5 s without an
    answer), with ``password`` its own ``requirepass``. Its config file is Sentinel's to
    rewrite, under ``directory``."""

    binary = "redis-sentinel"

    def __init__(
        self,
        directory: Path,
        master_port: int,
        *,
        master_name: str = "fleet",
        quorum: int = 2,
        password: str | None = None,
    ) -> None:
        self.directory = directory
        self.port = free_port()
        self.master_name = master_name
        self.password = password
        lines = [
            f"port {self.port}",
            f"bind {LOOPBACK}",
            f"dir {directory}",
            f"sentinel monitor {master_name} {LOOPBACK} {master_port} {quorum}",
            f"sentinel down-after-milliseconds {master_name} 500",
            f"sentinel failover-timeout {master_name} 3000",
        ]
        if password is not None:  # its clients' password, and the one it gives the others
            lines += [f"requirepass {password}", f"sentinel sentinel-pass {password}"]
        self._config = "\n".join(lines) + "\n"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def host_port(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def start(self) -> Self:
        self.directory.mkdir(parents=True, exist_ok=True)
        config = self.directory / "sentinel.conf"
        config.write_text(self._config)
        self._process = spawn([self.binary, str(config)], self.directory / "sentinel.log")
        wait_for(f"answering on {self.port}", self._answers, 10)
        return self

    def _answers(self) -> bool:
        try:
            self.ask("PING")
        except AssertionError:
            return False
        return True

    def ask(self, *args: str) -> str:
        user = None if self.password is None else ("default", self.password)
        return redis_cli(self.port, *args, user=user)

    def master(self) -> str:
        """``host:port`` of the master, as this Sentinel says now."""
        host, port = self.ask("SENTINEL", "get-master-addr-by-name", self.master_name).split()
        return f"{host}:{port}"

    def sees(self, replicas: int, sentinels: int) -> bool:
        """Whether this Sentinel knows the master's ``replicas``, and ``sentinels`` watching
        it (itself included)."""
        info = self.ask("INFO", "sentinel")
        return f"slaves={replicas},sentinels={sentinels}" in info

    def stop(self) -> None:
        stop_process(self._process)
        self._process = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def create_cluster(ports: Sequence[int], user: tuple[str, str] | None = None) -> None:
    """A Redis Cluster of the nodes on ``ports`` (started with :func:`cluster_node`), every
    node a master, each slot served once all of them say ``cluster_state:ok``."""
    nodes = [f"{LOOPBACK}:{port}" for port in ports]
    redis_cli(ports[0], "--cluster", "create", *nodes, "--cluster-replicas", "0",
              "--cluster-yes", user=user)  # fmt: skip
    for port in ports:
        wait_for(
            f"cluster_state:ok on {port}",
            lambda port=port: "cluster_state:ok" in redis_cli(port, "CLUSTER", "INFO", user=user),
        )


def cluster_slot_owner(ports: Sequence[int], slot: int, user: tuple[str, str] | None = None) -> int:
    """The port of the node serving ``slot``, as the node on ``ports[0]`` says."""
    for line in redis_cli(ports[0], "CLUSTER", "NODES", user=user).splitlines():
        fields = line.split()
        port = int(fields[1].split("@")[0].rsplit(":", 1)[1])
        for taken in fields[8:]:
            first, _, last = taken.partition("-")
            if not first.startswith("[") and int(first) <= slot <= int(last or first):
                return port
    raise AssertionError(f"no node serves slot {slot}")


def move_slot(
    slot: int, source: int, target: int, ports: Sequence[int], user: tuple[str, str] | None = None
) -> int:
    """Reshard ``slot`` from the node on ``source`` to the one on ``target`` as ``redis-cli
    --cluster reshard`` does, while clients keep using it: IMPORTING / MIGRATING, its keys
    moved by MIGRATE in batches (clients get ASK, or TRYAGAIN, meanwhile), then the slot the
    target's on every node. Returns how many keys moved."""
    source_id = redis_cli(source, "CLUSTER", "MYID", user=user).strip()
    target_id = redis_cli(target, "CLUSTER", "MYID", user=user).strip()
    redis_cli(target, "CLUSTER", "SETSLOT", str(slot), "IMPORTING", source_id, user=user)
    redis_cli(source, "CLUSTER", "SETSLOT", str(slot), "MIGRATING", target_id, user=user)
    auth = [] if user is None else ["AUTH2", *user]
    moved = 0
    while keys := redis_cli(source, "CLUSTER", "GETKEYSINSLOT", str(slot), "100",
                            user=user).split():  # fmt: skip
        redis_cli(source, "MIGRATE", LOOPBACK, str(target), "", "0", "5000", *auth, "KEYS", *keys,
                  user=user)  # fmt: skip
        moved += len(keys)
    for port in (target, source, *(p for p in ports if p not in (source, target))):
        redis_cli(port, "CLUSTER", "SETSLOT", str(slot), "NODE", target_id, user=user)
    return moved


@contextlib.contextmanager
def fleet_of(
    count: int,
    upstream: str,
    registry: str,
    redis: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    workdir: Path,
    *,
    fleet: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    **block: Any,
) -> Iterator[list[Kuikproxy]]:
    """``count`` kuikproxy processes ``p0``, ``p1``... of one fleet on ``redis`` (the config's
    ``fleet.redis``; a sequence: proxy *n*'s is its *n*-th), each pacing ``registry`` (reached
    at ``upstream``; ``block`` merged into its block, as :func:`registry_block` does) and
    nothing else. ``fleet``: more of the ``fleet`` block, for all or (a sequence) for each."""

    def of(settings: Mapping[str, Any] | Sequence[Mapping[str, Any]], n: int) -> dict[str, Any]:
        return dict(settings) if isinstance(settings, Mapping) else dict(settings[n])

    with contextlib.ExitStack() as stack:
        proxies = []
        for n in range(count):
            more = {} if fleet is None else of(fleet, n)
            config = {
                "defaultRegistry": registry,
                "allowedHosts": [],
                "fleet": {"redis": of(redis, n), "name": f"p{n}", **more},
                "registries": {registry: registry_block(upstream, **block)},
            }
            proxies.append(stack.enter_context(Kuikproxy(workdir / f"p{n}", config)))
        yield proxies


# --- faults between a proxy and its fleet's store -------------------------------------------


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close ``writer``'s connection with an RST (SO_LINGER 0), as a dropped route or a killed
    peer would: the other end's next read or write fails at once."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultRelay(OnLoopback):
    """A TCP relay on 127.0.0.1 to ``target_port`` whose mode a test switches while it runs
    (its own event loop, in a thread):

    * :meth:`heal` — ``pass``: forward both ways (the mode it starts in);
    * :meth:`cut` — reset (RST) every open connection, and every new one as it is accepted;
    * :meth:`blackhole` — keep every connection, new ones too, and forward nothing either way:
      no answer, no error, until healed (what it held then flows, as TCP would resend it);
    * :meth:`slow` — deliver each chunk ``ms`` after it arrived, in both directions (a request
      and its answer: ``2 * ms`` more per round trip).

    Each proxy of a fleet reaching its store through a relay of its own, a test faults one
    proxy, several, or all."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.mode = "pass"
        self.accepted = 0  # connections accepted, in any mode
        self._delay = 0.0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._flowing = asyncio.Event()  # clear while blackholed
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()

    def start(self) -> Self:
        self._thread.start()

        async def up() -> int:
            self._flowing.set()
            self._server = await asyncio.start_server(self._accept, LOOPBACK, 0)
            return int(self._server.sockets[0].getsockname()[1])

        self.port = asyncio.run_coroutine_threadsafe(up(), self._loop).result(10)
        return self

    def heal(self) -> None:
        self._switch("pass")

    def cut(self) -> None:
        self._switch("cut")

    def blackhole(self) -> None:
        self._switch("blackhole")

    def slow(self, ms: float) -> None:
        self._switch("slow", ms / 1000)

    def _switch(self, mode: str, delay: float = 0.0) -> None:
        async def switch() -> None:
            self.mode, self._delay = mode, delay
            if mode == "blackhole":
                self._flowing.clear()
            else:
                self._flowing.set()
            if mode == "cut":
                for link in list(self._links):
                    for writer in link:
                        _reset(writer)

        asyncio.run_coroutine_threadsafe(switch(), self._loop).result(10)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.mode == "cut":
            _reset(writer)
            return
        try:
            upstream, towards = await asyncio.open_connection(LOOPBACK, self.target_port)
        except OSError:  # the store is down: so is the relay, to its client
            _reset(writer)
            return
        link = (writer, towards)
        self._links.add(link)
        pipes = [
            asyncio.ensure_future(self._pipe(reader, towards)),
            asyncio.ensure_future(self._pipe(upstream, writer)),
        ]
        try:  # either way ending (EOF, reset) ends both: Redis' clients never half-close
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._links.discard(link)
            for pipe in pipes:
                pipe.cancel()
            for side in link:
                side.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read chunks as they come, deliver each once flowing and its delay is over: the
        delay is latency, not a slower rate (a chunk's wait starts when it arrives)."""
        chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                arrived, chunk = await chunks.get()
                if not chunk:  # the sender closed: all it sent is delivered
                    return
                await self._flowing.wait()
                await asyncio.sleep(max(0.0, arrived + self._delay - self._loop.time()))
                writer.write(chunk)
                await writer.drain()

        delivering = asyncio.ensure_future(deliver())
        try:
            while chunk := await reader.read(65536):
                chunks.put_nowait((self._loop.time(), chunk))
            chunks.put_nowait((self._loop.time(), b""))
            await delivering
        except OSError:
            pass
        finally:
            delivering.cancel()

    def stop(self) -> None:
        if not self._thread.is_alive():
            return

        async def down() -> None:
            if self._server is not None:
                self._server.close()
            for link in list(self._links):
                for writer in link:
                    _reset(writer)
            # every link ends on its own once reset (its reads see the end)
            pending = asyncio.all_tasks() - {asyncio.current_task()}
            if pending:
                await asyncio.wait(pending, timeout=5)

        asyncio.run_coroutine_threadsafe(down(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
