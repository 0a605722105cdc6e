"""Flow control settings (SPEC §10): priority levels and flow schemas, as Kubernetes has them.

A priority level is a ``flowcontrol.apiserver.k8s.io/v1`` ``PriorityLevelConfigurationSpec``
with a ``name`` beside its fields (no ``spec:`` wrapper), with Kubernetes' defaults and
validation::

    flowControl:
      serverConcurrencyLimit: 64          # upstream requests in flight at once (ServerCL)
      priorityLevels:
        - name: monitoring
          type: Limited                   # Exempt | Limited
          limited:
            nominalConcurrencyShares: 10  # default 30; 0 makes a "jail"
            lendablePercent: 0            # 0..100, default 0
            borrowingLimitPercent: 50     # >= 0; absent (null) is unlimited
            limitResponse:
              type: Queue                 # Queue | Reject
              queuing: {queues: 64, handSize: 8, queueLengthLimit: 50}   # {} = these defaults
      flowSchemas:
        - name: image-monitors
          matchingPrecedence: 500         # 1..10000, lower is tried first; default 1000
          priorityLevelConfiguration: {name: monitoring}
          distinguisherMethod: {type: ByResource}   # ByResource | ByHost; absent = one flow
          rules:
            - resources: ["ImageMonitor/*"]
              operations: [check]

**Rules.** A schema matches a request when *any* of its ``rules`` matches. A rule matches when
*every* matcher it sets matches; a matcher left out matches anything, so ``{}`` matches every
request. Each matcher is a list that matches when *any* item does, except ``headers``, where
every listed header must match (one rule per header gives "any of these headers"):

- ``resources``: globs on the request's resource name (SPEC §4.2), case-sensitive;
- ``headers``: ``{name, values}``: the header (name case-insensitive) has one of ``values``
  exactly;
- ``userAgents``: globs on the ``User-Agent`` header, case-sensitive (no header is ``""``);
- ``hosts``: globs on the normalised registry host (``docker.io``), case-insensitive;
- ``operations``: ``check``, ``copy`` or ``unpaced`` as SPEC §4.3 classifies the request
  (``unpaced``: the ``/v2/`` ping and requests to hosts with ``paced: false``).

Globs are :mod:`fnmatch` patterns in which ``*`` also matches ``/`` and ``.``. A matcher written
as an empty list is refused (leave it out to match anything), and so is a schema without rules
(Kubernetes allows one that matches nothing; here it is always a mistake).

**The baseline.** :data:`BUILTIN_PRIORITY_LEVELS` and :data:`BUILTIN_FLOW_SCHEMAS` are always in
effect. A configured level or schema with a built-in's name *replaces* that built-in whole
(fields are not merged: a level is one Kubernetes object, and a half-Exempt, half-Limited mix
would be nobody's intent); every other one is added. Built-ins cannot be removed, but a built-in
schema can be replaced by one that sends its requests elsewhere.

**Where Kubernetes is followed and where not.** Defaults, ranges and the ``Exempt``/``Limited``
and ``Queue``/``Reject`` rules are Kubernetes'. Like Kubernetes, ``type: Queue`` without
``queuing`` is an error rather than defaulted (the API reference defaults the fields of
``queuing``, never the block itself); ``queuing: {}`` takes every default. Unlike Kubernetes,
an explicit ``0`` for ``queues``, ``handSize`` or ``queueLengthLimit`` is refused (Kubernetes
reads a zero ``int32`` as "unset" and defaults it), since a written zero is a mistake here.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BeforeValidator, Field, Strict, ValidationInfo, field_validator
from pydantic import model_validator as _model_validator
from pydantic.dataclasses import dataclass

from kuikproxy.config.base import (
    MODEL_CONFIG,
    Loc,
    NestedErrors,
    NonNegativeInt,
    PositiveInt,
    host_patterns,
)
from kuikproxy.core.flowcontrol.sharding import MAX_HASH_BITS, required_entropy_bits

__all__ = [
    "BUILTIN_FLOW_SCHEMAS",
    "BUILTIN_PRIORITY_LEVELS",
    "DEFAULT_MATCHING_PRECEDENCE",
    "MAX_HASH_BITS",
    "MAX_QUEUES",
    "ExemptPriorityLevelConfiguration",
    "FlowControl",
    "FlowDistinguisherMethod",
    "FlowRule",
    "FlowSchema",
    "HeaderMatch",
    "LimitResponse",
    "LimitedPriorityLevelConfiguration",
    "Operation",
    "PriorityLevel",
    "PriorityLevelReference",
    "QueuingConfiguration",
    "required_entropy_bits",
]

MAX_QUEUES = 10_000_000
"""The most queues a level may have (Kubernetes' ``priorityLevelConfigurationQueuingMaxQueues``)."""
DEFAULT_MATCHING_PRECEDENCE = 1000
"""A schema's ``matchingPrecedence`` when it sets none (Kubernetes' default)."""
MAX_MATCHING_PRECEDENCE = 10_000

Operation = Literal["check", "copy", "unpaced"]
"""What a request does, as SPEC §4.3 classifies it."""


def _string(value: Any) -> Any:
    # YAML reads unquoted yes, no, on, off, true, 1.5... as booleans and numbers: say so.
    if isinstance(value, bool):
        raise ValueError("must be a string, not a boolean (quote it in YAML)")
    if isinstance(value, int | float):
        raise ValueError("must be a string, not a number (quote it in YAML)")
    return value


Text = Annotated[str, BeforeValidator(_string)]
"""A string, refusing what YAML turned into a boolean or number."""


def _percent(value: int) -> int:
    if not 0 <= value <= 100:
        raise ValueError("must be between 0 and 100")
    return value


Percent = Annotated[int, Strict(), AfterValidator(_percent)]
"""An integer percentage, ``0..100``."""

# Names show up in /status, metrics labels and logs: Kubernetes object names (DNS-1123
# subdomains), which every Kubernetes built-in level and schema name already is.
_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?")


def _name(value: str) -> str:
    if len(value) > 253 or not _NAME.fullmatch(value):
        raise ValueError(
            f'invalid name "{value}" (lowercase letters, digits, "-" and ".", '
            "starting and ending with a letter or digit)"
        )
    return value


Name = Annotated[Text, AfterValidator(_name)]
"""The name of a priority level or flow schema."""

_HEADER_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def _header_name(value: str) -> str:
    if not _HEADER_TOKEN.fullmatch(value):
        raise ValueError(f'invalid header name "{value}"')
    return value


def _pattern(value: str) -> str:
    if not value:
        raise ValueError("an empty pattern matches nothing")
    return value


Pattern = Annotated[Text, AfterValidator(_pattern)]
"""A glob (``fnmatch``; ``*`` matches any characters, ``/`` and ``.`` included)."""


# --- priority levels -------------------------------------------------------------------------


@dataclass(frozen=True, config=MODEL_CONFIG)
class QueuingConfiguration:
    """How a ``Queue`` level queues (Kubernetes ``QueuingConfiguration``)."""

    queues: PositiveInt = 64
    """Queues of the level; ``1`` turns shuffle sharding (and distinguishers) off."""
    hand_size: PositiveInt = 8
    """Queues dealt to each flow, the shortest of which a request joins; ``<= queues``."""
    queue_length_limit: PositiveInt = 50
    """Requests that may wait in one queue; more are rejected."""

    @field_validator("queues")
    @classmethod
    def _check_queues(cls, value: int) -> int:
        if value > MAX_QUEUES:
            raise ValueError(f"must not be greater than {MAX_QUEUES}")
        return value

    @field_validator("hand_size")
    @classmethod
    def _check_hand_size(cls, value: int, info: ValidationInfo) -> int:
        queues = info.data.get("queues")
        if queues is None:  # invalid, and reported as such
            return value
        if value > queues:
            raise ValueError(f"must not be greater than queues ({queues})")
        bits = required_entropy_bits(queues, value)
        if bits > MAX_HASH_BITS:
            raise ValueError(
                f"a hand of {value} out of {queues} queues needs {bits} bits of entropy "
                f"(ceil(log2(queues) · handSize)), more than {MAX_HASH_BITS}"
            )
        return value


@dataclass(frozen=True, config=MODEL_CONFIG)
class LimitResponse:
    """What a ``Limited`` level does with a request that cannot run now."""

    type: Literal["Queue", "Reject"]
    """``Queue``: wait in the level's queues; ``Reject``: ``429`` at once."""
    queuing: QueuingConfiguration | None = Field(default=None, validate_default=True)
    """The queues; set exactly when ``type`` is ``Queue``."""

    @field_validator("queuing")
    @classmethod
    def _check_queuing(
        cls, value: QueuingConfiguration | None, info: ValidationInfo
    ) -> QueuingConfiguration | None:
        kind = info.data.get("type")
        if kind == "Reject" and value is not None:
            raise ValueError("must not be set when type is Reject")
        if kind == "Queue" and value is None:
            # Kubernetes requires it too; "queuing: {}" is the one-word way to the defaults.
            raise ValueError(
                "must be set when type is Queue ({} takes the defaults: "
                "queues 64, handSize 8, queueLengthLimit 50)"
            )
        return value


@dataclass(frozen=True, config=MODEL_CONFIG)
class ExemptPriorityLevelConfiguration:
    """The settings of an ``Exempt`` level (Kubernetes ``ExemptPriorityLevelConfiguration``)."""

    nominal_concurrency_shares: NonNegativeInt = 0
    """Shares of ServerCL nominally reserved (it never limits an Exempt level's own requests)."""
    lendable_percent: Percent = 0
    """Percent of its NominalCL that other levels may borrow."""


@dataclass(frozen=True, config=MODEL_CONFIG)
class LimitedPriorityLevelConfiguration:
    """The settings of a ``Limited`` level (Kubernetes ``LimitedPriorityLevelConfiguration``)."""

    limit_response: LimitResponse
    """What to do with a request that cannot run now (required)."""
    nominal_concurrency_shares: NonNegativeInt = 30
    """Shares of ServerCL: ``NominalCL = ceil(ServerCL · NCS / Σ NCS)``; ``0`` makes a jail."""
    lendable_percent: Percent = 0
    """Percent of its NominalCL that other levels may borrow."""
    borrowing_limit_percent: NonNegativeInt | None = None
    """Most it may borrow, in percent of its NominalCL (may exceed 100); ``None`` is unlimited."""


@dataclass(frozen=True, config=MODEL_CONFIG)
class PriorityLevel:
    """One priority level: a name and the fields of a ``PriorityLevelConfigurationSpec``.

    After validation exactly one of ``exempt`` and ``limited`` is set, matching ``type``: an
    ``Exempt`` level written without ``exempt`` gets Kubernetes' defaults.
    """

    name: Name
    """The level's name, which flow schemas refer to."""
    type: Literal["Exempt", "Limited"]
    """``Exempt``: never queued, never paced; ``Limited``: gets a share of the seats."""
    exempt: ExemptPriorityLevelConfiguration | None = Field(default=None, validate_default=True)
    """Set when ``type`` is ``Exempt`` (defaulted), refused otherwise."""
    limited: LimitedPriorityLevelConfiguration | None = Field(default=None, validate_default=True)
    """Required when ``type`` is ``Limited``, refused otherwise."""

    @field_validator("exempt")
    @classmethod
    def _check_exempt(
        cls, value: ExemptPriorityLevelConfiguration | None, info: ValidationInfo
    ) -> ExemptPriorityLevelConfiguration | None:
        kind = info.data.get("type")
        if kind == "Limited" and value is not None:
            raise ValueError("must not be set when type is Limited")
        if kind == "Exempt" and value is None:
            return ExemptPriorityLevelConfiguration()
        return value

    @field_validator("limited")
    @classmethod
    def _check_limited(
        cls, value: LimitedPriorityLevelConfiguration | None, info: ValidationInfo
    ) -> LimitedPriorityLevelConfiguration | None:
        kind = info.data.get("type")
        if kind == "Exempt" and value is not None:
            raise ValueError("must not be set when type is Exempt")
        if kind == "Limited" and value is None:
            raise ValueError("must be set when type is Limited")
        return value

    @property
    def nominal_concurrency_shares(self) -> int:
        """The level's NCS, whichever of ``exempt`` and ``limited`` holds it."""
        settings = self.exempt if self.type == "Exempt" else self.limited
        return 0 if settings is None else settings.nominal_concurrency_shares


# --- flow schemas ----------------------------------------------------------------------------


@dataclass(frozen=True, config=MODEL_CONFIG)
class HeaderMatch:
    """A header (name case-insensitive) whose value is exactly one of ``values``."""

    name: Annotated[Text, AfterValidator(_header_name)]
    """The header's name, e.g. ``Kuik-Priority``."""
    values: tuple[Text, ...]
    """Accepted values, compared exactly; at least one."""

    @field_validator("values")
    @classmethod
    def _check_values(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError("at least one value is needed")
        return value

    def matches(self, headers: Mapping[str, str]) -> bool:
        """Whether ``headers`` (any mapping; aiohttp's is case-insensitive) has a listed value."""
        value = headers.get(self.name)
        if value is None:
            wanted = self.name.lower()
            value = next((v for k, v in headers.items() if k.lower() == wanted), None)
        return value is not None and value in self.values


_EMPTY_MATCHER = "must not be empty (leave it out to match anything)"


@dataclass(frozen=True, config=MODEL_CONFIG)
class FlowRule:
    """Matchers that must all match; each one left out (empty) matches anything."""

    resources: tuple[Pattern, ...] = ()
    """Globs on the request's resource name (SPEC §4.2), e.g. ``ImageMonitor/*``."""
    headers: tuple[HeaderMatch, ...] = ()
    """Headers that must *all* be present with one of their values."""
    user_agents: tuple[Pattern, ...] = ()
    """Globs on the ``User-Agent`` header, e.g. ``containerd/*``."""
    hosts: tuple[Pattern, ...] = ()
    """Globs on the normalised registry host, lowercased, e.g. ``*.azurecr.io``."""
    operations: tuple[Operation, ...] = ()
    """``check``, ``copy`` or ``unpaced`` (SPEC §4.3)."""

    @field_validator("resources", "headers", "user_agents", "operations")
    @classmethod
    def _check_not_empty(cls, value: tuple[object, ...]) -> tuple[object, ...]:
        if not value:
            raise ValueError(_EMPTY_MATCHER)
        return value

    @field_validator("hosts")
    @classmethod
    def _check_hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value:
            raise ValueError(_EMPTY_MATCHER)
        return host_patterns(value)

    def matches(
        self,
        *,
        resource: str,
        host: str,
        operation: Operation,
        user_agent: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> bool:
        """Whether a request with these traits matches every matcher this rule sets."""
        if self.operations and operation not in self.operations:
            return False
        if self.resources and not _any_glob(resource, self.resources):
            return False
        if self.hosts and not _any_glob(host.lower(), self.hosts):
            return False
        if self.user_agents and not _any_glob(user_agent, self.user_agents):
            return False
        return all(header.matches(headers or {}) for header in self.headers)


def _any_glob(value: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(value, pattern) for pattern in patterns)


@dataclass(frozen=True, config=MODEL_CONFIG)
class PriorityLevelReference:
    """The level a schema sends its requests to (``PriorityLevelConfigurationReference``)."""

    name: Name


@dataclass(frozen=True, config=MODEL_CONFIG)
class FlowDistinguisherMethod:
    """How a schema's requests are split into flows for fair queuing."""

    type: Literal["ByResource", "ByHost"]
    """``ByResource``: one flow per resource (SPEC §4.2); ``ByHost``: one per registry host."""


@dataclass(frozen=True, config=MODEL_CONFIG)
class FlowSchema:
    """Which requests go to which priority level, and how they split into flows."""

    name: Name
    """The schema's name."""
    priority_level_configuration: PriorityLevelReference
    """The level its requests go to; it must exist (configured or built in)."""
    matching_precedence: Annotated[int, Strict()] = DEFAULT_MATCHING_PRECEDENCE
    """``1..10000``; schemas are tried lowest first (ties by name), the first match wins."""
    distinguisher_method: FlowDistinguisherMethod | None = None
    """How requests split into flows; ``None`` makes the whole schema one flow."""
    rules: tuple[FlowRule, ...] = Field(default=(), validate_default=True)
    """The schema matches a request when any rule does; at least one (``{}`` matches all)."""

    @field_validator("matching_precedence")
    @classmethod
    def _check_precedence(cls, value: int) -> int:
        if not 1 <= value <= MAX_MATCHING_PRECEDENCE:
            raise ValueError(f"must be between 1 and {MAX_MATCHING_PRECEDENCE}")
        return value

    @field_validator("rules")
    @classmethod
    def _check_rules(cls, value: tuple[FlowRule, ...]) -> tuple[FlowRule, ...]:
        if not value:
            raise ValueError("at least one rule is needed ({} matches every request)")
        return value

    @property
    def priority_level(self) -> str:
        """The name of the level its requests go to."""
        return self.priority_level_configuration.name

    def matches(
        self,
        *,
        resource: str,
        host: str,
        operation: Operation,
        user_agent: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> bool:
        """Whether any of the schema's rules matches the request."""
        return any(
            rule.matches(
                resource=resource,
                host=host,
                operation=operation,
                user_agent=user_agent,
                headers=headers,
            )
            for rule in self.rules
        )


# --- the baseline ----------------------------------------------------------------------------


def _limited(
    shares: int, queuing: QueuingConfiguration | None
) -> LimitedPriorityLevelConfiguration:
    response = LimitResponse(type="Queue" if queuing else "Reject", queuing=queuing)
    return LimitedPriorityLevelConfiguration(
        limit_response=response, nominal_concurrency_shares=shares
    )


# A ring of thousands of images parks one waiting request per image at its window: the queues
# must hold them all rather than turn them away (SPEC §10).
_RING_QUEUING = QueuingConfiguration(queues=64, hand_size=8, queue_length_limit=2000)

BUILTIN_PRIORITY_LEVELS: tuple[PriorityLevel, ...] = (
    PriorityLevel(name="exempt", type="Exempt"),
    PriorityLevel(name="checks", type="Limited", limited=_limited(30, _RING_QUEUING)),
    PriorityLevel(name="copies", type="Limited", limited=_limited(30, _RING_QUEUING)),
    PriorityLevel(name="catch-all", type="Limited", limited=_limited(5, None)),
)
"""The levels always in effect (SPEC §10); a configured level of the same name replaces one."""


def _schema(name: str, precedence: int, operation: Operation | None) -> FlowSchema:
    rule = FlowRule() if operation is None else FlowRule(operations=(operation,))
    return FlowSchema(
        name=name,
        priority_level_configuration=PriorityLevelReference(name=name),
        matching_precedence=precedence,
        # An Exempt level never queues, so its flows need no telling apart.
        distinguisher_method=None if name == "exempt" else FlowDistinguisherMethod("ByResource"),
        rules=(rule,),
    )


BUILTIN_FLOW_SCHEMAS: tuple[FlowSchema, ...] = (
    # Requests already unpaced (the ping, hosts with paced: false) are never queued either:
    # without this they would fall to catch-all's few Reject seats.
    _schema("exempt", 1, "unpaced"),
    # Below the default precedence, so a configured schema is tried before these unless it
    # says otherwise.
    _schema("checks", 8000, "check"),
    _schema("copies", 8000, "copy"),
    _schema("catch-all", MAX_MATCHING_PRECEDENCE, None),
)
"""The schemas always in effect (SPEC §10), sorted; a configured one of a name replaces one."""


# --- the whole block -------------------------------------------------------------------------


def _duplicates(names: list[str], key: str) -> list[tuple[Loc, str]]:
    first: dict[str, int] = {}
    problems: list[tuple[Loc, str]] = []
    for index, name in enumerate(names):
        if name in first:
            problems.append(
                ((key, index, "name"), f'duplicate name "{name}" (also {key}[{first[name]}])')
            )
        else:
            first[name] = index
    return problems


@dataclass(frozen=True, config=MODEL_CONFIG)
class FlowControl:
    """The effective flow control: the baseline with the configured levels and schemas on top.

    ``priority_levels`` holds the built-in levels (replaced in place by configured ones of the
    same name) followed by the other configured levels in file order; ``flow_schemas`` holds
    every schema, built in or configured, sorted by ``(matching_precedence, name)``, which is
    the order to try them in.
    """

    server_concurrency_limit: PositiveInt = 64
    """ServerCL: the upstream requests in flight at once, shared out by NCS."""
    priority_levels: tuple[PriorityLevel, ...] = ()
    """The effective levels (after validation)."""
    flow_schemas: tuple[FlowSchema, ...] = ()
    """The effective schemas, in matching order (after validation)."""

    @_model_validator(mode="after")
    def _effective(self) -> FlowControl:
        levels, schemas = self.priority_levels, self.flow_schemas
        problems = _duplicates([level.name for level in levels], "priorityLevels")
        problems += _duplicates([schema.name for schema in schemas], "flowSchemas")
        effective_levels = _overlay(BUILTIN_PRIORITY_LEVELS, levels)
        known = {level.name for level in effective_levels}
        for index, schema in enumerate(schemas):
            if schema.priority_level not in known:
                where: Loc = ("flowSchemas", index, "priorityLevelConfiguration", "name")
                problems.append((where, f'priority level "{schema.priority_level}" does not exist'))
        if not problems and not any(level.nominal_concurrency_shares for level in effective_levels):
            problems.append(
                (
                    ("priorityLevels",),
                    "the nominalConcurrencyShares of all levels add up to 0 "
                    "(at least one must be positive to share out serverConcurrencyLimit)",
                )
            )
        if problems:
            raise NestedErrors(problems)
        effective_schemas = sorted(
            _overlay(BUILTIN_FLOW_SCHEMAS, schemas),
            key=lambda schema: (schema.matching_precedence, schema.name),
        )
        # Frozen, so the effective lists are set the way dataclasses' own __init__ does.
        object.__setattr__(self, "priority_levels", effective_levels)
        object.__setattr__(self, "flow_schemas", tuple(effective_schemas))
        return self

    def level(self, name: str) -> PriorityLevel:
        """The effective level called ``name`` (``KeyError`` if there is none)."""
        for level in self.priority_levels:
            if level.name == name:
                return level
        raise KeyError(name)

    def match(
        self,
        *,
        resource: str,
        host: str,
        operation: Operation,
        user_agent: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> FlowSchema | None:
        """The first schema, in matching order, that matches the request (``None``: no schema)."""
        for schema in self.flow_schemas:
            if schema.matches(
                resource=resource,
                host=host,
                operation=operation,
                user_agent=user_agent,
                headers=headers,
            ):
                return schema
        return None


_Named = TypeVar("_Named", PriorityLevel, FlowSchema)


def _overlay(builtin: tuple[_Named, ...], configured: tuple[_Named, ...]) -> tuple[_Named, ...]:
    """``builtin`` with same-named ``configured`` items in their place, then the other ones."""
    by_name = {item.name: item for item in configured}
    replaced = tuple(by_name.pop(item.name, item) for item in builtin)
    return replaced + tuple(by_name.values())
