"""The validated configuration (SPEC §7): frozen pydantic dataclasses.

Pydantic *dataclasses* rather than ``BaseModel``: a registry has a ``copy`` block, and a field
named ``copy`` would shadow ``BaseModel.copy`` (a warning at import, a type error under mypy).
Dataclasses keep the attribute names of the SPEC and are frozen and compared by value.

Every model refuses unknown keys and is written in YAML with the camelCase names of SPEC §7
(``maxHold``); in Python the snake_case attribute names work as keyword arguments too. Durations
are ``float`` seconds, accepted as Go-style strings or numbers (:mod:`kuikproxy.durations`).
Here is the whole :class:`Config`; a registry host's settings live in
:mod:`kuikproxy.config.registry`, the process-wide ones (cache, limits, state, forward proxy,
fleet) in :mod:`kuikproxy.config.process`, the field types in :mod:`kuikproxy.config.fields`.
Flow control (§10) lives in :mod:`kuikproxy.config.flowsettings`, registry quotas (§11) in
:mod:`kuikproxy.config.quotas`.

Objects built here directly (tests, code) are validated field by field, but the cross-host rules
(the ``default`` block merged under each host, host keys normalised, ``defaultRegistry`` allowed)
live in :mod:`kuikproxy.config.loading`, which is how a config file becomes a :class:`Config`.
"""

from __future__ import annotations

import fnmatch
import ipaddress
from collections.abc import Mapping

from pydantic import Field, field_validator
from pydantic.dataclasses import dataclass

from kuikproxy.config.base import MODEL_CONFIG, host_patterns
from kuikproxy.config.fields import Duration, IdentitySource, validate_host
from kuikproxy.config.flowsettings import FlowControl
from kuikproxy.config.podmemory import pod_memory
from kuikproxy.config.process import (
    CacheSettings,
    FleetSettings,
    ForwardProxySettings,
    LimitsSettings,
    StateSettings,
)
from kuikproxy.config.registry import RegistrySettings
from kuikproxy.core.images import DOCKER_HUB, normalize_host
from kuikproxy.core.memorybudget import Bound, MemoryBudget, split

__all__ = ["DEFAULT_BLOCK", "PUBLIC_REGISTRIES", "Config"]

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


# --- the whole configuration ---------------------------------------------------------------


@dataclass(frozen=True, config=MODEL_CONFIG)
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

    def budget(self) -> MemoryBudget:
        """``limits.memory`` split into the bounds a client can fill
        (:mod:`kuikproxy.core.memorybudget`): those written in the config as written, the
        others sized from what they leave."""
        limits, cache = self.limits, self.cache
        settings = {
            Bound.IMAGES: limits.max_images,
            Bound.RESOURCES: limits.max_resources,
            Bound.HOSTS: limits.max_hosts,
            Bound.HELD: limits.max_held,
            Bound.KEPT_BYTES: cache.max_bytes,
            Bound.KEPT_ENTRIES: cache.max_entries,
            Bound.REFUSALS: cache.max_refusals,
            Bound.CATALOG: cache.blobs.max_entries,
        }
        written = {bound: value for bound, value in settings.items() if value is not None}
        unused = frozenset() if cache.blobs.path else frozenset({Bound.CATALOG})
        return split(self.memory()[0], written, unused)

    def memory(self) -> tuple[int, str]:
        """The memory budget in bytes, and where it came from: ``limits.memory``, the pod's
        cgroup, or the chart's default."""
        if self.limits.memory is not None:
            return self.limits.memory, "limits.memory"
        return pod_memory()

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
