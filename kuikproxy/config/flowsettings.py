"""Flow control settings (SPEC §10): the ``flowControl`` block, parsed into the core's types.

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

The types are :mod:`kuikproxy.core.flowcontrol`'s, which states what a rule matches
(:mod:`~kuikproxy.core.flowcontrol.schemas`), every rule a block must meet
(:mod:`~kuikproxy.core.flowcontrol.validation`) and the built-in baseline that configured
levels and schemas replace or add to (:mod:`~kuikproxy.core.flowcontrol.baseline`). This module
only reads YAML into them — strictly, so that a count written ``true`` or ``"8"`` and a string
that YAML turned into a boolean or number are refused — and reports the core's problems at
their paths.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated, Any, get_type_hints

from pydantic import AfterValidator, TypeAdapter, ValidationError, model_validator
from pydantic.dataclasses import dataclass
from pydantic_core import InitErrorDetails, to_json

from kuikproxy.config.base import MODEL_CONFIG, Loc, NestedErrors, camel, host_patterns
from kuikproxy.core.flowcontrol import (
    FlowSchema,
    FlowTraits,
    PriorityLevel,
    Problem,
    effective_levels,
    effective_schemas,
    first_match,
    flow_problems,
    level_problems,
)

__all__ = ["FlowControl", "validated_level"]


@dataclass(frozen=True, config=MODEL_CONFIG)
class FlowControl:
    """The effective flow control: the baseline with the configured levels and schemas on top.

    ``priority_levels`` holds the built-in levels (replaced in place by configured ones of the
    same name) followed by the other configured levels in file order; ``flow_schemas`` holds
    every schema, built in or configured, sorted by ``(matching_precedence, name)``, which is
    the order to try them in.
    """

    server_concurrency_limit: int = 64
    """ServerCL: the upstream requests in flight at once, shared out by NCS."""
    priority_levels: tuple[PriorityLevel, ...] = ()
    """The effective levels (after validation)."""
    flow_schemas: tuple[FlowSchema, ...] = ()
    """The effective schemas, in matching order (after validation)."""

    @model_validator(mode="before")
    @classmethod
    def _strict_yaml(cls, value: Any) -> Any:
        return _read_strictly(value) if isinstance(value, Mapping) else value

    @model_validator(mode="after")
    def _effective(self) -> FlowControl:
        schemas, problems = _lowercase_hosts(self.flow_schemas)
        problems += flow_problems(self.server_concurrency_limit, self.priority_levels, schemas)
        if problems:
            raise NestedErrors(problems)
        # Frozen, so the effective lists are set the way dataclasses' own __init__ does.
        object.__setattr__(self, "priority_levels", effective_levels(self.priority_levels))
        object.__setattr__(self, "flow_schemas", effective_schemas(schemas))
        return self

    def level(self, name: str) -> PriorityLevel:
        """The effective level called ``name`` (``KeyError`` if there is none)."""
        for level in self.priority_levels:
            if level.name == name:
                return level
        raise KeyError(name)

    def match(self, request: FlowTraits) -> FlowSchema | None:
        """The first schema, in matching order, that matches the request (``None``: no schema)."""
        return first_match(self.flow_schemas, request)


# --- reading YAML strictly -------------------------------------------------------------------

# One adapter per field of the block, validating the field's YAML as JSON, strictly: JSON's
# strict mode takes lists for tuples, mappings for dataclasses and strings for enums, as a file
# writes them, but refuses a count written true or "8" (Python's strict mode would take only
# tuples and instances, its lax mode would read true as 1).
_FIELDS: dict[str, tuple[str, TypeAdapter[Any]]] = {
    key: (field.name, TypeAdapter(hint, config=MODEL_CONFIG))
    for field in dataclasses.fields(FlowControl)
    for hint in (get_type_hints(FlowControl)[field.name],)
    for key in (field.name, camel(field.name))
}


def _read_strictly(block: Mapping[Any, Any]) -> dict[Any, Any]:
    """The block with each known field validated strictly (unknown keys are left for the
    model to refuse); every error of every field is raised at once, at its path."""
    out: dict[Any, Any] = {}
    errors: list[InitErrorDetails] = []
    for key, value in block.items():
        if key not in _FIELDS:
            out[key] = value
            continue
        name, adapter = _FIELDS[key]
        try:
            out[name] = adapter.validate_json(to_json(value), strict=True)
        except ValidationError as error:
            errors.extend(_yaml_error(key, item) for item in error.errors())
    if errors:
        raise ValidationError.from_exception_data("FlowControl", errors)
    return out


def _yaml_error(key: str, item: Any) -> InitErrorDetails:
    """A field's error at the block's path; a string that YAML read as a boolean or number
    (unquoted yes, no, on, off, 1.5...) says how to write it."""
    loc = (key, *item["loc"])
    value = item["input"]
    if item["type"] == "string_type" and isinstance(value, bool | int | float):
        kind = "a boolean" if isinstance(value, bool) else "a number"
        reason = f"must be a string, not {kind} (quote it in YAML)"
        return {
            "type": "value_error",
            "loc": loc,
            "input": value,
            "ctx": {"error": ValueError(reason)},
        }
    details: InitErrorDetails = {"type": item["type"], "loc": loc, "input": value}
    if "ctx" in item:
        details["ctx"] = item["ctx"]
    return details


def _lowercase_hosts(
    schemas: tuple[FlowSchema, ...],
) -> tuple[tuple[FlowSchema, ...], list[Problem]]:
    """The schemas with their rules' host patterns checked and lowercased as every host pattern
    of the config is (:func:`~kuikproxy.config.base.host_patterns`)."""
    problems: list[Problem] = []
    out = []
    for index, schema in enumerate(schemas):
        rules = []
        for number, rule in enumerate(schema.rules):
            try:
                hosts = None if rule.hosts is None else host_patterns(rule.hosts)
            except ValueError as error:
                where: Loc = ("flowSchemas", index, "rules", number, "hosts")
                problems.append((where, str(error)))
                hosts = rule.hosts
            rules.append(dataclasses.replace(rule, hosts=hosts))
        out.append(dataclasses.replace(schema, rules=tuple(rules)))
    return tuple(out), problems


# --- Python callers ----------------------------------------------------------------------------


def _valid(level: PriorityLevel) -> PriorityLevel:
    problems = level_problems(level)
    if problems:
        raise NestedErrors(problems)
    return level


_LEVEL: TypeAdapter[PriorityLevel] = TypeAdapter(Annotated[PriorityLevel, AfterValidator(_valid)])


def validated_level(**fields: Any) -> PriorityLevel:
    """A :class:`~kuikproxy.core.flowcontrol.PriorityLevel` from Python, read and checked as
    the config reads one (``type="Exempt"`` and the like; ``ValidationError`` naming each
    problem's path)."""
    return _LEVEL.validate_python(fields)
