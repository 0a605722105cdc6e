"""The process-wide settings of the config (SPEC §7): what is not per registry host.

The cache of kept answers, the limits on what is kept in memory, where pacing state survives
restarts, forward-proxy mode (§13) and the fleet a proxy paces with.
"""

from __future__ import annotations

import fnmatch
import importlib.util
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic.dataclasses import dataclass

from kuikproxy.config.base import MODEL_CONFIG, Loc, NestedErrors, PositiveInt, host_patterns
from kuikproxy.config.fields import Duration, Size

__all__ = [
    "BlobStoreSettings",
    "CacheSettings",
    "FleetSettings",
    "ForwardProxyCA",
    "ForwardProxySettings",
    "LimitsSettings",
    "RedisMode",
    "RedisSettings",
    "StateSettings",
]

# --- process-wide settings -----------------------------------------------------------------


@dataclass(frozen=True, config=MODEL_CONFIG)
class BlobStoreSettings:
    """The pull-through store (SPEC §15): blobs and manifests by digest, on disk, read from the
    registry once whoever asks, and served from the disk from then on."""

    path: str | None = None
    """A directory of its own; unset (the default) keeps no store: blobs stream through."""
    max_bytes: Size = 10 * 1024**3
    """At most this many bytes on disk, blobs being written included (default ``10Gi``);
    the least recently used go first."""
    max_entries: PositiveInt | None = None
    """At most this many grants and tags in the store's catalog, kept in memory (two grants
    to a tag), oldest out first. Unset: sized from the memory budget (``limits.memory``)."""


@dataclass(frozen=True, config=MODEL_CONFIG)
class CacheSettings:
    """The cache of kept answers (R1, R6)."""

    max_age: Duration = 3600.0
    """Seconds a kept answer may be reused (default ``1h``)."""
    max_entries: Annotated[int, Field(ge=0)] | None = None
    """At most this many kept answers; least recently used are evicted. Unset: sized from the
    memory budget (``limits.memory``)."""
    max_bytes: Size | None = None
    """At most this many bytes of kept bodies. Unset: sized from the memory budget."""
    max_refusals: Annotated[int, Field(ge=0)] | None = None
    """At most this many kept refusals (401, 403, 404) among them, oldest out first: names that
    do not exist are the cheapest thing a client can make. Unset: sized from the budget."""
    blobs: BlobStoreSettings = Field(default_factory=BlobStoreSettings)
    """The pull-through store of blobs and manifests on disk; off unless ``path`` is set."""


@dataclass(frozen=True, config=MODEL_CONFIG)
class LimitsSettings:
    """Bounds on what kuikproxy keeps in memory: a request that would pass one is
    refused (503) and counted; what already has state keeps working. Each bound left unset is
    sized from ``memory``, so that all of them full at once fit in it (decisions.md)."""

    memory: Size | None = None
    """The memory budget: unset, the pod's (the cgroup's ``memory.max``), else ``512Mi``."""
    max_hosts: PositiveInt | None = None
    """Hosts not in ``registries`` (allowed by a wildcard of ``allowedHosts``) that may have
    state at once; one is forgotten a retention after its last request."""
    max_resources: PositiveInt | None = None
    """Resources that may have state (a ring or a copy queue) at once, over every host."""
    max_images: PositiveInt | None = None
    """Images in every ring together."""
    max_held: PositiveInt | None = None
    """Requests held for their windows at once, over every host."""
    max_ring_images: PositiveInt = 100_000
    """Images in one ring (one resource on one host)."""


@dataclass(frozen=True, config=MODEL_CONFIG)
class StateSettings:
    """Where pacing state survives restarts (SPEC §7.3, P13)."""

    path: Annotated[str, Field(min_length=1)] | None = None
    """A SQLite database file; unset keeps the state in memory only."""


@dataclass(frozen=True, config=MODEL_CONFIG)
class ForwardProxyCA:
    """The CA kuikproxy mints its interception certificates from (SPEC §13)."""

    cert_file: Annotated[str, Field(min_length=1)] = "kuikproxy-ca.crt"
    """The CA certificate (PEM); generated with ``keyFile`` on first start when both are
    missing. Relative paths are relative to the working directory."""
    key_file: Annotated[str, Field(min_length=1)] = "kuikproxy-ca.key"
    """The CA's private key (PEM, unencrypted), written with mode 0600 when generated."""


@dataclass(frozen=True, config=MODEL_CONFIG)
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


RedisMode = Literal["single", "sentinel", "cluster"]
"""The kind of Redis a fleet runs on (``/status.fleet.store.mode``)."""


def _address(text: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``) → (host, port); ``ValueError`` says what is wrong."""
    host, colon, port = text.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f'"{text}" is not host:port')
    return host, int(port)


@dataclass(frozen=True, config=MODEL_CONFIG)
class RedisSettings:
    """Where the fleet meets: one Redis server or a replicated primary (``url``), a Redis
    Cluster (``url`` of one of its nodes, ``cluster: true``), or the master Redis Sentinel
    names (``sentinels`` and ``masterName``, no ``url``), followed across a failover."""

    url: Annotated[str, Field(min_length=1)] | None = None
    """``redis://host:port/db``, or ``rediss://`` for TLS; a password may be in it. With
    ``cluster``, any node of the cluster (the others are learnt from it)."""
    cluster: bool = False
    """``url`` is a node of a Redis Cluster."""
    sentinels: tuple[str, ...] = ()
    """``host:port`` of the Sentinels watching the master, instead of ``url``."""
    master_name: Annotated[str, Field(min_length=1)] | None = None
    """The master's name in the Sentinels' config (``sentinel monitor <name> ...``)."""
    username: Annotated[str, Field(min_length=1)] | None = None
    """An ACL user (Redis 6+), signed in with ``passwordFile``; unset: ``default``."""
    password_file: Annotated[str, Field(min_length=1)] | None = None
    """A file holding the password (a mounted Secret), instead of one in the URL."""
    sentinel_password_file: Annotated[str, Field(min_length=1)] | None = None
    """A file holding the Sentinels' own password (their ``requirepass``), if they have one."""
    tls: bool = False
    """With ``sentinels``: TLS to the master and to the Sentinels (a ``url`` says it by
    ``rediss://``)."""
    tls_ca_file: Annotated[str, Field(min_length=1)] | None = None
    """The CA that signs the server's certificate (``rediss://``, or ``tls``), besides the
    system's."""
    confirmed_by: Annotated[int, Field(ge=0, le=16)] = 0
    """Replicas that must hold a claim before its window is used (Redis ``WAIT``): with 1 or
    more, a master a failover left behind, still taking writes, gives no window that the new
    one gives too; with fewer replicas up than that, no window is used. Not on a Cluster."""

    @field_validator("sentinels")
    @classmethod
    def _check_sentinels(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        problems: list[tuple[Loc, str]] = []
        for at, text in enumerate(value):
            try:
                _address(text)
            except ValueError as error:
                problems.append(((at,), str(error)))
        if problems:
            raise NestedErrors(problems)
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> RedisSettings:
        problems = self._problems()
        if problems:
            raise NestedErrors([((key,), reason) for key, reason in problems])
        return self

    def _problems(self) -> list[tuple[str, str]]:
        if self.sentinels:
            problems = [
                (key, f"not with sentinels: {why}")
                for key, why, given in (
                    ("url", "the master is the one the Sentinels name", self.url),
                    ("cluster", "Sentinel does not watch a Redis Cluster", self.cluster),
                )
                if given
            ]
            if self.master_name is None:
                problems.append(("masterName", "required with sentinels"))
            if self.tls_ca_file is not None and not self.tls:
                problems.append(("tlsCaFile", "needs tls: true"))
            return problems
        if self.url is None:
            return [("url", "required: a Redis URL, or sentinels and masterName")]
        if self.cluster and self.confirmed_by:
            return [("confirmedBy", "not on a Redis Cluster (each slot has its own master)")]
        problems = [
            (key, "only with sentinels")
            for key, given in (
                ("masterName", self.master_name),
                ("sentinelPasswordFile", self.sentinel_password_file),
            )
            if given is not None
        ]
        if self.tls:
            problems.append(("tls", "only with sentinels: a URL turns TLS on by rediss://"))
        scheme = self.url.partition("://")[0].lower()
        if self.cluster and scheme not in ("redis", "rediss"):
            problems.append(("url", "a Redis Cluster is reached by redis:// or rediss://"))
        if self.tls_ca_file is not None and scheme != "rediss":
            problems.append(("tlsCaFile", "needs a rediss:// url"))
        return problems

    @property
    def mode(self) -> RedisMode:
        return "sentinel" if self.sentinels else "cluster" if self.cluster else "single"

    def sentinel_addresses(self) -> tuple[tuple[str, int], ...]:
        return tuple(_address(text) for text in self.sentinels)

    def describe(self) -> str:
        """The Redis, for ``check-config``: never a password (a URL's is masked)."""
        if self.sentinels:
            where = f"sentinel, master {self.master_name} of {', '.join(self.sentinels)}"
        else:
            assert self.url is not None
            where = f"{self.mode}, {_without_password(self.url)}"
        parts = [where]
        if self.username is not None:
            parts.append(f"username {self.username}")
        for key, path in (
            ("passwordFile", self.password_file),
            ("sentinelPasswordFile", self.sentinel_password_file),
            ("tlsCaFile", self.tls_ca_file),
        ):
            if path is not None:
                parts.append(f"{key} {path}")
        if self.tls:
            parts.append("tls")
        if self.confirmed_by:
            parts.append(f"a claim counts once {self.confirmed_by} replica(s) hold it")
        return ", ".join(parts)


def _without_password(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    userinfo, at, location = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    return f"{scheme}{sep}{userinfo.partition(':')[0]}:***@{location}"


@dataclass(frozen=True, config=MODEL_CONFIG)
class FleetSettings:
    """Several proxies sharing one registry budget: windows, blocks and their
    origins are the fleet's, kept in Redis."""

    redis: RedisSettings
    """The Redis the fleet shares."""
    name: Annotated[str, Field(min_length=1, max_length=253)] | None = None
    """This proxy's name in the fleet, unique per proxy and stable across its restarts;
    default the machine's host name (a pod's name)."""
    when_cut_off: Literal["wait", "ownTurns"] = "wait"
    """What this proxy does while it cannot reach the Redis the others may still reach:
    ``wait``, use no shared window until it can (exact: the registry never sees two reads in
    a window; this proxy's clients wait), or ``ownTurns``, go on alone on its last turns
    (its clients are served; once the others take those turns over, after two intervals, a
    window may be read twice until the partition heals)."""

    def missing(self) -> str | None:
        """Why this proxy cannot join the fleet as installed (redis-py is an extra), if so."""
        if importlib.util.find_spec("redis") is None:
            return "fleet: redis-py is not installed: pip install 'kuikproxy[fleet]'"
        return None

    def describe(self) -> str:
        """The fleet, for ``check-config``."""
        name = self.name or "the host name"
        cut_off = (
            "waits for it"
            if self.when_cut_off == "wait"
            else "goes on alone on its own turns (a window may be read twice meanwhile)"
        )
        # the lease the store gives a proxy's turns (core.fleetturns): two of the host's
        # intervals past its last claim
        return (
            f"fleet: name {name}, redis {self.redis.describe()}; cut off, it {cut_off}; "
            "a proxy's turns are its own two intervals past its last claim"
        )
