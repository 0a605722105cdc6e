"""The validated configuration (SPEC §7): frozen pydantic dataclasses.

Pydantic *dataclasses* rather than ``BaseModel``: a registry has a ``copy`` block, and a field
named ``copy`` would shadow ``BaseModel.copy`` (a warning at import, a type error under mypy).
Dataclasses keep the attribute names of the SPEC and are frozen and compared by value.

Every model refuses unknown keys and is written in YAML with the camelCase names of SPEC §7
(``maxHold``); in Python the snake_case attribute names work as keyword arguments too. Durations
are ``float`` seconds, accepted as Go-style strings or numbers (:mod:`kuikproxy.durations`).
Flow control (§10) lives in :mod:`kuikproxy.config.flow`, registry quotas (§11) in
:mod:`kuikproxy.config.quotas`.

Objects built here directly (tests, code) are validated field by field, but the cross-host rules
(the ``default`` block merged under each host, host keys normalised, ``defaultRegistry`` allowed)
live in :mod:`kuikproxy.config.loading`, which is how a config file becomes a :class:`Config`.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, Field, field_validator
from pydantic import model_validator as _model_validator
from pydantic.dataclasses import dataclass

from kuikproxy.config.base import MODEL_CONFIG, PositiveInt, camel, host_patterns
from kuikproxy.config.flow import FlowControl
from kuikproxy.config.quotas import QuotaSettings
from kuikproxy.core.images import DOCKER_HUB, normalize_host
from kuikproxy.durations import parse_duration, parse_size

__all__ = [
    "DEFAULT_BLOCK",
    "DOCKER_HUB",
    "DOCKER_HUB_UPSTREAM",
    "PUBLIC_REGISTRIES",
    "CacheSettings",
    "CheckSettings",
    "Config",
    "CopySettings",
    "Credentials",
    "FlowControl",
    "LimitsSettings",
    "QuotaSettings",
    "RegistrySettings",
    "StateSettings",
    "TLSSettings",
    "camel",
    "normalize_host",
    "validate_host",
]

DOCKER_HUB_UPSTREAM = "https://registry-1.docker.io"
"""Where Docker Hub's registry API is actually served."""
DEFAULT_BLOCK = "default"
"""The ``registries`` key whose block is merged under every host's own block."""

PUBLIC_REGISTRIES: tuple[str, ...] = (
    "docker.io",
    "ghcr.io",
    "quay.io",
    "registry.k8s.io",
    "gcr.io",
    "*.gcr.io",
    "*.pkg.dev",
    "public.ecr.aws",
    "mcr.microsoft.com",
    "*.azurecr.io",
)
"""``allowedHosts`` when the config does not set it (SPEC §3.1)."""


_MODEL_CONFIG = MODEL_CONFIG


_LABEL = r"[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?"
_HOST = re.compile(rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9a-f:.]+\])(?::(\d{{1,5}}))?")


@lru_cache(maxsize=4096)  # every request's host goes through it, from a handful of hosts
def validate_host(host: str) -> str:
    """A normalised ``host[:port]``, or ``ValueError`` if it is not one (no scheme, no path)."""
    normal = normalize_host(host)
    match = _HOST.fullmatch(normal)
    if match is None or (match.group(1) is not None and int(match.group(1)) > 65535):
        raise ValueError(f'invalid host "{host}" (expected host or host:port, no scheme or path)')
    return normal


# --- field types ---------------------------------------------------------------------------


def _duration(value: Any) -> float:
    if not isinstance(value, str | int | float):
        raise ValueError(f'invalid duration "{value}"')
    return parse_duration(value)


def _positive(value: float) -> float:
    # A zero interval would open windows back to back: no pacing at all, and a busy loop.
    if value <= 0:
        raise ValueError("must be greater than 0")
    return value


def _size(value: Any) -> int:
    if not isinstance(value, str | int):
        raise ValueError(f'invalid size "{value}"')
    return parse_size(value)


Duration = Annotated[float, BeforeValidator(_duration)]
"""Non-negative seconds, written ``"1m30s"`` or ``90``."""
PositiveDuration = Annotated[float, BeforeValidator(_duration), AfterValidator(_positive)]
"""Seconds greater than zero."""
Size = Annotated[int, BeforeValidator(_size)]
"""Bytes, written ``"256Mi"`` or ``268435456``."""

_HEADER_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def _identity_source(value: str) -> str:
    if value in ("proxyUser", "clientAddress"):
        return value
    if value.startswith("header:") and _HEADER_TOKEN.fullmatch(value.removeprefix("header:")):
        return value
    raise ValueError(
        f'unknown resource identity "{value}" (expected header:<Name>, proxyUser or clientAddress)'
    )


IdentitySource = Annotated[str, AfterValidator(_identity_source)]
"""One way to tell which resource a request belongs to (SPEC §4.2)."""


def _split_listen(listen: str) -> tuple[str, int]:
    """``host:port`` → ``(host, port)``; ``[::1]:80`` → ``("::1", 80)``; ``:80`` → ``("", 80)``."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ValueError(f'invalid listen address "{listen}" (expected host:port)')
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f'invalid listen address "{listen}"') from None
    elif ":" in host or any(c.isspace() for c in host):
        # A bare IPv6 address is ambiguous with its port; Go requires brackets, so do we.
        raise ValueError(f'invalid listen address "{listen}" (write IPv6 hosts as [::1]:port)')
    return host, int(port)


# --- per-registry settings -----------------------------------------------------------------


@dataclass(frozen=True, config=_MODEL_CONFIG)
class CheckSettings:
    """The check series of a host: manifest reads, one image per window (SPEC P1-P7, P10)."""

    interval: PositiveDuration = 60.0
    """Seconds between two check windows (YAML ``interval``, default ``1m``)."""
    timeout: Duration = 10.0
    """Seconds one upstream check may take; ``0`` is no limit (default ``10s``)."""
    mode: Literal["hold", "prefetch"] = "hold"
    """``hold``: a request waits for its image's turn; ``prefetch``: every turn reads (P7)."""
    max_hold: Duration = 0.0
    """Seconds a request may wait before a 429 with ``Retry-After``; ``0`` is no limit."""
    follow_up: Duration = 2.0
    """Seconds after an answer during which follow-up checks of that image pass (P10)."""


@dataclass(frozen=True, config=_MODEL_CONFIG)
class CopySettings:
    """The copy series of a host: blob and manifest downloads, one image per window (P9)."""

    interval: PositiveDuration = 300.0
    """Seconds between two copy windows (default ``5m``)."""
    timeout: Duration = 0.0
    """Seconds a copy may stay open in all; ``0`` (the default) is no limit."""
    idle: Duration = 5.0
    """Seconds a copy stays open after its last request ends (default ``5s``)."""
    follow_up: Duration = 600.0
    """Seconds after a copy's last request during which its resource's blob reads and
    manifest reads by digest in that repository go without a window (P9, default ``10m``): a
    pull resumed or retried after a pause is not sent to the back of the queue."""


@dataclass(frozen=True, config=_MODEL_CONFIG)
class Credentials:
    """kuikproxy's own credentials for one host (R5): files only, never inline secrets."""

    username: str | None = None
    """The user name; goes with ``passwordFile``."""
    password_file: str | None = None
    """A file holding the password or token (read when used, so it can be rotated)."""
    docker_config_file: str | None = None
    """A Docker ``config.json`` whose ``auths`` entry for the host is used instead."""

    @_model_validator(mode="after")
    def _one_source(self) -> Credentials:
        pair = self.username is not None or self.password_file is not None
        if pair and self.docker_config_file is not None:
            raise ValueError("set either username and passwordFile, or dockerConfigFile, not both")
        if pair and (self.username is None or self.password_file is None):
            raise ValueError("username and passwordFile go together")
        if not pair and self.docker_config_file is None:
            raise ValueError("set username and passwordFile, or dockerConfigFile")
        return self


@dataclass(frozen=True, config=_MODEL_CONFIG)
class TLSSettings:
    """How the upstream's TLS certificate is verified."""

    ca_file: str | None = None
    """A PEM bundle trusted for this host, on top of the system roots."""
    insecure_skip_verify: bool = False
    """Accept any certificate. For tests and labs only."""


def _upstream(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        parts = urlsplit(value.strip())
        port = parts.port  # raises ValueError on a bad port
    except ValueError:
        raise ValueError(f'invalid upstream "{value}"') from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f'invalid upstream "{value}" (expected http:// or https:// and a host)')
    # The OCI API lives at /v2/ of the host; a path prefix, query or embedded credentials
    # would be silently dropped or leaked, so they are refused rather than half-supported.
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f'invalid upstream "{value}" (no path, query or fragment)')
    if parts.username is not None or parts.password is not None:
        raise ValueError(f'invalid upstream "{value}" (use credentials, not user:pass@ in the URL)')
    host = parts.hostname
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    return f"{parts.scheme}://{netloc}"


@dataclass(frozen=True, config=_MODEL_CONFIG)
class RegistrySettings:
    """The effective settings of one registry host (its block with ``default`` merged under)."""

    upstream: Annotated[str | None, AfterValidator(_upstream)] = None
    """The registry's endpoint, ``http(s)://host[:port]``; unset means ``https://<host>``."""
    paced: bool = True
    """``false`` for a destination kuik owns: passed through, never paced (P14)."""
    fleet: Literal["shared", "local"] = "shared"
    """With a ``fleet``: ``shared`` paces this host for the whole fleet (one image per window
    in total), ``local`` for this proxy alone."""
    check: CheckSettings = Field(default_factory=CheckSettings)
    """The check series (manifest reads)."""
    copy: CopySettings = Field(default_factory=CopySettings)
    """The copy series (image downloads)."""
    credentials: Credentials | None = None
    """kuikproxy's own credentials for this host; unset means anonymous or the client's own."""
    tls: TLSSettings = Field(default_factory=TLSSettings)
    """Verification of the upstream's certificate."""
    quota: QuotaSettings = Field(default_factory=QuotaSettings)
    """What the registry rations (SPEC §11); the empty default rations nothing."""

    def upstream_url(self, host: str) -> str:
        """The base URL of ``host``'s registry API, without a trailing slash."""
        if self.upstream is not None:
            return self.upstream
        host = normalize_host(host)
        return DOCKER_HUB_UPSTREAM if host == DOCKER_HUB else f"https://{host}"


# --- process-wide settings -----------------------------------------------------------------


@dataclass(frozen=True, config=_MODEL_CONFIG)
class CacheSettings:
    """The cache of kept answers (R1, R6)."""

    max_age: Duration = 3600.0
    """Seconds a kept answer may be reused (default ``1h``)."""
    max_entries: Annotated[int, Field(ge=0)] = 100_000
    """At most this many kept answers; least recently used are evicted."""
    max_bytes: Size = 256 * 1024**2
    """At most this many bytes of kept bodies (default ``256Mi``)."""


@dataclass(frozen=True, config=_MODEL_CONFIG)
class LimitsSettings:
    """Bounds on what kuikproxy keeps in memory: a request that would pass one is
    refused (503) and counted; what already has state keeps working. The defaults are far above
    what a real deployment holds and keep the worst case to a few hundred MiB (decisions.md)."""

    max_hosts: PositiveInt = 1_000
    """Hosts not in ``registries`` (allowed by a wildcard of ``allowedHosts``) that may have
    state at once; one is forgotten a retention after its last request."""
    max_resources: PositiveInt = 10_000
    """Resources that may have state (a ring or a copy queue) at once, over every host."""
    max_images: PositiveInt = 1_000_000
    """Images in every ring together."""
    max_ring_images: PositiveInt = 100_000
    """Images in one ring (one resource on one host)."""


@dataclass(frozen=True, config=_MODEL_CONFIG)
class StateSettings:
    """Where pacing state survives restarts (SPEC §7.3, P13)."""

    path: Annotated[str, Field(min_length=1)] | None = None
    """A SQLite database file; unset keeps the state in memory only."""


@dataclass(frozen=True, config=_MODEL_CONFIG)
class ForwardProxyCA:
    """The CA kuikproxy mints its interception certificates from (SPEC §13)."""

    cert_file: Annotated[str, Field(min_length=1)] = "kuikproxy-ca.crt"
    """The CA certificate (PEM); generated with ``keyFile`` on first start when both are
    missing. Relative paths are relative to the working directory."""
    key_file: Annotated[str, Field(min_length=1)] = "kuikproxy-ca.key"
    """The CA's private key (PEM, unencrypted), written with mode 0600 when generated."""


@dataclass(frozen=True, config=_MODEL_CONFIG)
class ForwardProxySettings:
    """Forward-proxy mode (SPEC §13): kuikproxy as the ``HTTPS_PROXY`` of clients that cannot
    be given a mirror (kube-image-keeper's controllers)."""

    enabled: bool = False
    """Accept ``CONNECT host:port`` (intercepted with TLS) and absolute-URI requests."""
    ca: ForwardProxyCA = Field(default_factory=ForwardProxyCA)
    """Where the interception CA is."""
    tunnel_hosts: tuple[str, ...] = ()
    """Globs of ``CONNECT`` targets tunnelled blind, never intercepted (e.g. the Kubernetes
    API if a client sends it to the proxy). Only these may be reached without being paced."""

    @field_validator("tunnel_hosts")
    @classmethod
    def _check_tunnel_hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return host_patterns(value)

    def tunnels(self, authority: str) -> bool:
        """Whether ``CONNECT authority`` (``host:port``) is tunnelled blind."""
        host = authority.lower()
        bare = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
        return any(
            fnmatch.fnmatchcase(host, p) or fnmatch.fnmatchcase(bare, p) for p in self.tunnel_hosts
        )


@dataclass(frozen=True, config=_MODEL_CONFIG)
class RedisSettings:
    """Where the fleet meets."""

    url: Annotated[str, Field(min_length=1)]
    """``redis://host:port/db``, or ``rediss://`` for TLS; a password may be in it."""
    password_file: Annotated[str, Field(min_length=1)] | None = None
    """A file holding the password (a mounted Secret), instead of one in the URL."""
    tls_ca_file: Annotated[str, Field(min_length=1)] | None = None
    """The CA that signs the server's certificate (``rediss://``), besides the system's."""


@dataclass(frozen=True, config=_MODEL_CONFIG)
class FleetSettings:
    """Several proxies sharing one registry budget: windows, blocks and their
    origins are the fleet's, kept in Redis."""

    redis: RedisSettings
    """The Redis the fleet shares."""
    name: Annotated[str, Field(min_length=1, max_length=253)] | None = None
    """This proxy's name in the fleet, unique per proxy and stable across its restarts;
    default the machine's host name (a pod's name)."""


@dataclass(frozen=True, config=_MODEL_CONFIG)
class Config:
    """The whole validated configuration. Build it with :func:`kuikproxy.config.load_config`.

    ``registries`` holds *effective* settings: its ``default`` entry is the ``default`` block,
    every other entry is that host's block with ``default`` already merged under it.
    """

    listen: str = "127.0.0.1:7439"
    """``host:port`` to serve on; ``:port`` is every address, ``[::1]:port`` for IPv6."""
    default_registry: str = DOCKER_HUB
    """The host of requests that name none (SPEC §3, step 4)."""
    allowed_hosts: tuple[str, ...] = PUBLIC_REGISTRIES
    """Glob patterns of hosts that may be contacted besides the configured ones (§3.1).

    Setting ``allowedHosts`` *replaces* the public list, so a config can lock kuikproxy down to
    its own registries; write the public ones in the list to keep them.
    """
    host_aliases: Mapping[str, str] = Field(default_factory=dict)
    """``Host`` header → registry host, for clients that use kuikproxy as a named mirror."""
    resource_identity: tuple[IdentitySource, ...] = (
        "header:Kuik-Resource",
        "proxyUser",
        "clientAddress",
    )
    """How a request's resource is found, first match wins (SPEC §4.2)."""
    unused_image_retention: Duration = 86400.0
    """Seconds an image stays in a ring without a request (P8, default ``24h``)."""
    cache: CacheSettings = Field(default_factory=CacheSettings)
    """The cache of kept answers."""
    state: StateSettings = Field(default_factory=StateSettings)
    """Persistence of pacing state."""
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    """Bounds on hosts, resources and ring images kept in memory."""
    registries: Mapping[str, RegistrySettings] = Field(default_factory=dict)
    """Effective settings per normalised host, plus ``default``."""
    flow_control: FlowControl = Field(default_factory=FlowControl)
    """Priority levels and flow schemas in effect (SPEC §10): the built-in baseline when the
    file has no ``flowControl``, with the configured ones on top when it has."""
    forward_proxy: ForwardProxySettings = Field(default_factory=ForwardProxySettings)
    """Forward-proxy mode with TLS interception (SPEC §13); off by default."""
    fleet: FleetSettings | None = None
    """Proxies sharing registries' budgets through Redis; unset: this proxy paces alone."""

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, value: str) -> str:
        _split_listen(value)
        return value

    @field_validator("resource_identity")
    @classmethod
    def _check_resource_identity(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # Checked here rather than with min_length, which pydantic also reports when only an
        # item is wrong; every request needs some way to be told apart.
        if not value:
            raise ValueError("at least one source is needed")
        return value

    @field_validator("default_registry")
    @classmethod
    def _check_default_registry(cls, value: str) -> str:
        return validate_host(value)

    @field_validator("allowed_hosts")
    @classmethod
    def _check_allowed_hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return host_patterns(value)

    @field_validator("host_aliases")
    @classmethod
    def _check_host_aliases(cls, value: Mapping[str, str]) -> dict[str, str]:
        # Host headers are case-insensitive; keys keep their port because the header does.
        return {alias.strip().lower(): validate_host(host) for alias, host in value.items()}

    @field_validator("registries")
    @classmethod
    def _check_registries(
        cls, value: Mapping[str, RegistrySettings]
    ) -> dict[str, RegistrySettings]:
        registries = {
            key if key == DEFAULT_BLOCK else validate_host(key): settings
            for key, settings in value.items()
        }
        # Every lookup falls back to ``default``, so it always exists.
        registries.setdefault(DEFAULT_BLOCK, RegistrySettings())
        return registries

    def listen_address(self) -> tuple[str, int]:
        """``(host, port)`` to bind; host ``""`` means every address."""
        return _split_listen(self.listen)

    def registry(self, host: str) -> RegistrySettings:
        """The effective settings of ``host``: its own merged block, else the default block."""
        host = normalize_host(host)
        if host != DEFAULT_BLOCK and host in self.registries:
            return self.registries[host]
        return self.registries[DEFAULT_BLOCK]

    def configured_hosts(self) -> tuple[str, ...]:
        """The hosts with their own block under ``registries``, sorted."""
        return tuple(sorted(host for host in self.registries if host != DEFAULT_BLOCK))

    def is_allowed(self, host: str) -> bool:
        """Whether kuikproxy may contact ``host`` (SPEC §3.1).

        A host is allowed when it has its own ``registries`` block or matches an
        ``allowedHosts`` glob (case-insensitive; ``*`` also matches dots). Without an
        ``allowedHosts`` key the globs are :data:`PUBLIC_REGISTRIES`; an explicit list replaces
        them rather than extending them, so a locked-down config stays locked down.
        """
        host = normalize_host(host)
        if not host or host == DEFAULT_BLOCK:
            return False
        if host in self.registries:
            return True
        return any(fnmatch.fnmatchcase(host, pattern) for pattern in self.allowed_hosts)
