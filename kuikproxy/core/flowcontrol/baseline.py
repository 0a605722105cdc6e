"""The built-in levels and schemas (SPEC §10), and the effective set a configuration makes.

:data:`BUILTIN_PRIORITY_LEVELS` and :data:`BUILTIN_FLOW_SCHEMAS` are always in effect. A
configured level or schema with a built-in's name *replaces* that built-in whole (fields are not
merged: a level is one Kubernetes object, and a half-Exempt, half-Limited mix would be nobody's
intent); every other one is added. Built-ins cannot be removed, but a built-in schema can be
replaced by one that sends its requests elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from kuikproxy.core.flowcontrol.schemas import (
    MAX_MATCHING_PRECEDENCE,
    FlowDistinguisherMethod,
    FlowOperation,
    FlowRule,
    FlowSchema,
    PriorityLevelReference,
)
from kuikproxy.core.flowcontrol.spec import (
    LevelType,
    LimitedPriorityLevelConfiguration,
    LimitResponse,
    LimitResponseType,
    PriorityLevel,
    QueuingConfiguration,
)


def _limited(name: str, shares: int, queuing: QueuingConfiguration | None) -> PriorityLevel:
    kind = LimitResponseType.REJECT if queuing is None else LimitResponseType.QUEUE
    settings = LimitedPriorityLevelConfiguration(
        limit_response=LimitResponse(kind, queuing), nominal_concurrency_shares=shares
    )
    return PriorityLevel(name, LevelType.LIMITED, limited=settings)


# A ring of thousands of images parks one waiting request per image at its window: the queues
# must hold them all rather than turn them away (SPEC §10).
_RING_QUEUING = QueuingConfiguration(queues=64, hand_size=8, queue_length_limit=2000)

BUILTIN_PRIORITY_LEVELS: tuple[PriorityLevel, ...] = (
    PriorityLevel("exempt", LevelType.EXEMPT),
    _limited("checks", 30, _RING_QUEUING),
    _limited("copies", 30, _RING_QUEUING),
    _limited("catch-all", 5, None),
)
"""The levels always in effect; a configured level of the same name replaces one."""


def _schema(name: str, precedence: int, operation: FlowOperation | None) -> FlowSchema:
    rule = FlowRule() if operation is None else FlowRule(operations=(operation,))
    return FlowSchema(
        name=name,
        priority_level_configuration=PriorityLevelReference(name),
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
"""The schemas always in effect, sorted; a configured one of a name replaces one."""

_Named = TypeVar("_Named", PriorityLevel, FlowSchema)


def overlay(builtin: Sequence[_Named], configured: Sequence[_Named]) -> tuple[_Named, ...]:
    """``builtin`` with same-named ``configured`` items in their place, then the other ones."""
    by_name = {item.name: item for item in configured}
    replaced = tuple(by_name.pop(item.name, item) for item in builtin)
    return replaced + tuple(by_name.values())


def effective_levels(configured: Sequence[PriorityLevel]) -> tuple[PriorityLevel, ...]:
    """The built-in levels, replaced in place by configured ones, then the other configured."""
    return overlay(BUILTIN_PRIORITY_LEVELS, configured)


def effective_schemas(configured: Sequence[FlowSchema]) -> tuple[FlowSchema, ...]:
    """Every schema, built in or configured, in matching order: ``(matching_precedence,
    name)``."""
    schemas = overlay(BUILTIN_FLOW_SCHEMAS, configured)
    return tuple(sorted(schemas, key=lambda schema: (schema.matching_precedence, schema.name)))
