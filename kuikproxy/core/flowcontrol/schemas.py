"""Flow schemas, and matching a request to them (SPEC §10): which level, which flow.

A schema matches a request when *any* of its ``rules`` matches. A rule matches when *every*
matcher it sets matches; a matcher left out matches anything, so ``FlowRule()`` matches every
request. Each matcher is a list (``None`` when left out) that matches when *any* item does,
except ``headers``, where every listed header must match (one rule per header gives "any of
these headers"):

- ``resources``: globs on the request's resource name (SPEC §4.2), case-sensitive;
- ``headers``: the header (name case-insensitive) has one of ``values`` exactly;
- ``user_agents``: globs on the ``User-Agent`` header, case-sensitive (no header is ``""``);
- ``hosts``: globs on the normalised registry host (``docker.io``), case-insensitive (the
  patterns are lowercase, as the config writes them);
- ``operations``: ``check``, ``copy`` or ``unpaced`` as SPEC §4.3 classifies the request.

Globs are :mod:`fnmatch` patterns in which ``*`` also matches ``/`` and ``.``. Schemas are tried
in ``(matching_precedence, name)`` order and the first match wins.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from kuikproxy.core.flowcontrol.sharding import flow_id

FlowOperation = Literal["check", "copy", "unpaced"]
"""What a request does, as SPEC §4.3 classifies it (``unpaced``: the ``/v2/`` ping and requests
to hosts with ``paced: false``). Not :class:`kuikproxy.core.tickets.Operation`, which a paced
request's ticket carries."""

DEFAULT_MATCHING_PRECEDENCE = 1000
"""A schema's ``matchingPrecedence`` when it sets none (Kubernetes' default)."""
MAX_MATCHING_PRECEDENCE = 10_000


@dataclass(frozen=True, slots=True)
class FlowTraits:
    """What the flow schemas see of a request."""

    resource: str
    host: str
    operation: FlowOperation
    user_agent: str = ""
    headers: Mapping[str, str] | None = None  # None: the schemas read no other header


@dataclass(frozen=True, slots=True)
class HeaderMatch:
    """A header (name case-insensitive) whose value is exactly one of ``values``."""

    name: str
    """The header's name, e.g. ``Kuik-Priority``."""
    values: tuple[str, ...]
    """Accepted values, compared exactly; at least one."""

    def matches(self, headers: Mapping[str, str]) -> bool:
        """Whether ``headers`` (any mapping; aiohttp's is case-insensitive) has a listed value."""
        value = headers.get(self.name)
        if value is None:
            wanted = self.name.lower()
            value = next((v for k, v in headers.items() if k.lower() == wanted), None)
        return value is not None and value in self.values


@dataclass(frozen=True, slots=True)
class FlowRule:
    """Matchers that must all match; each one left out (``None``) matches anything."""

    resources: tuple[str, ...] | None = None
    """Globs on the request's resource name (SPEC §4.2), e.g. ``ImageMonitor/*``."""
    headers: tuple[HeaderMatch, ...] | None = None
    """Headers that must *all* be present with one of their values."""
    user_agents: tuple[str, ...] | None = None
    """Globs on the ``User-Agent`` header, e.g. ``containerd/*``."""
    hosts: tuple[str, ...] | None = None
    """Globs on the normalised registry host, lowercase, e.g. ``*.azurecr.io``."""
    operations: tuple[FlowOperation, ...] | None = None
    """``check``, ``copy`` or ``unpaced`` (SPEC §4.3)."""

    def matches(self, request: FlowTraits) -> bool:
        """Whether a request with these traits matches every matcher this rule sets."""
        if self.operations and request.operation not in self.operations:
            return False
        if self.resources and not _any_glob(request.resource, self.resources):
            return False
        if self.hosts and not _any_glob(request.host.lower(), self.hosts):
            return False
        if self.user_agents and not _any_glob(request.user_agent, self.user_agents):
            return False
        headers = request.headers or {}
        return all(header.matches(headers) for header in self.headers or ())


def _any_glob(value: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(value, pattern) for pattern in patterns)


@dataclass(frozen=True, slots=True)
class PriorityLevelReference:
    """The level a schema sends its requests to (``PriorityLevelConfigurationReference``)."""

    name: str


@dataclass(frozen=True, slots=True)
class FlowDistinguisherMethod:
    """How a schema's requests are split into flows for fair queuing."""

    type: Literal["ByResource", "ByHost"]
    """``ByResource``: one flow per resource (SPEC §4.2); ``ByHost``: one per registry host."""


@dataclass(frozen=True, slots=True)
class FlowSchema:
    """Which requests go to which priority level, and how they split into flows."""

    name: str
    priority_level_configuration: PriorityLevelReference
    """The level its requests go to; it must exist."""
    matching_precedence: int = DEFAULT_MATCHING_PRECEDENCE
    """``1..10000``; schemas are tried lowest first (ties by name), the first match wins."""
    distinguisher_method: FlowDistinguisherMethod | None = None
    """How requests split into flows; ``None`` makes the whole schema one flow."""
    rules: tuple[FlowRule, ...] = ()
    """The schema matches a request when any rule does; at least one (``FlowRule()`` matches
    every request)."""

    @property
    def priority_level(self) -> str:
        """The name of the level its requests go to."""
        return self.priority_level_configuration.name

    def matches(self, request: FlowTraits) -> bool:
        """Whether any of the schema's rules matches the request."""
        return any(rule.matches(request) for rule in self.rules)

    def flow(self, resource: str, host: str) -> str:
        """The flow a request of this schema belongs to (its distinguisher's value)."""
        method = self.distinguisher_method
        if method is None:
            return flow_id(self.name, "")
        return flow_id(self.name, resource if method.type == "ByResource" else host)


def first_match(schemas: Iterable[FlowSchema], request: FlowTraits) -> FlowSchema | None:
    """The first of ``schemas`` (in matching order) that matches the request, if any."""
    return next((schema for schema in schemas if schema.matches(request)), None)


def reads_headers(schemas: Iterable[FlowSchema]) -> bool:
    """Whether any schema looks at headers other than User-Agent: then a request's
    classification depends on more than its resource, host, operation and user agent."""
    return any(rule.headers for schema in schemas for rule in schema.rules)


def may_exempt_paced(schemas: Iterable[FlowSchema], exempt_levels: frozenset[str]) -> bool:
    """Whether a check or a copy can be classified into an Exempt level at all: a schema on an
    Exempt level with a rule not only for unpaced requests."""
    return any(
        schema.priority_level in exempt_levels
        and any(not rule.operations or set(rule.operations) - {"unpaced"} for rule in schema.rules)
        for schema in schemas
    )
