"""Every rule a flow-control block must meet (SPEC §10), each stated once, here.

Defaults, ranges and the ``Exempt``/``Limited`` and ``Queue``/``Reject`` rules are Kubernetes'.
Unlike Kubernetes, an explicit ``0`` for ``queues``, ``handSize`` or ``queueLengthLimit`` is
refused (Kubernetes reads a zero ``int32`` as "unset" and defaults it), since a written zero is
a mistake here; so are an empty matcher list (leave it out to match anything) and a schema
without rules (Kubernetes allows one that matches nothing; here it is always a mistake).

Each function returns problems rather than raising, so a whole file is reported at once. A
problem is a path below the object checked — the YAML's camelCase keys and list indexes, e.g.
``("priorityLevels", 2, "limited", "lendablePercent")`` — and a reason.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from kuikproxy.core.flowcontrol.baseline import effective_levels
from kuikproxy.core.flowcontrol.schemas import (
    MAX_MATCHING_PRECEDENCE,
    FlowRule,
    FlowSchema,
    HeaderMatch,
)
from kuikproxy.core.flowcontrol.sharding import MAX_HASH_BITS, required_entropy_bits
from kuikproxy.core.flowcontrol.spec import (
    ExemptPriorityLevelConfiguration,
    LevelType,
    LimitedPriorityLevelConfiguration,
    LimitResponse,
    LimitResponseType,
    PriorityLevel,
    QueuingConfiguration,
)

Loc = tuple[str | int, ...]
Problem = tuple[Loc, str]

MAX_QUEUES = 10_000_000
"""The most queues a level may have (Kubernetes' ``priorityLevelConfigurationQueuingMaxQueues``)."""

# Names show up in /status, metrics labels and logs: Kubernetes object names (DNS-1123
# subdomains), which every Kubernetes built-in level and schema name already is.
_NAME = re.compile(r"[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?")
_HEADER_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_EMPTY_MATCHER = "must not be empty (leave it out to match anything)"


def _at(where: Loc, problems: list[Problem]) -> list[Problem]:
    return [((*where, *loc), reason) for loc, reason in problems]


def _positive(key: str, value: int) -> list[Problem]:
    return [] if value > 0 else [((key,), "must be greater than 0")]


def _non_negative(key: str, value: int | None) -> list[Problem]:
    return [] if value is None or value >= 0 else [((key,), "must not be negative")]


def _percent(key: str, value: int) -> list[Problem]:
    return [] if 0 <= value <= 100 else [((key,), "must be between 0 and 100")]


def name_problems(name: str) -> list[Problem]:
    if len(name) > 253 or not _NAME.fullmatch(name):
        return [
            (
                ("name",),
                f'invalid name "{name}" (lowercase letters, digits, "-" and ".", '
                "starting and ending with a letter or digit)",
            )
        ]
    return []


# --- priority levels -------------------------------------------------------------------------


def queuing_problems(queuing: QueuingConfiguration) -> list[Problem]:
    queues, hand = queuing.queues, queuing.hand_size
    out = _positive("queues", queues)
    if queues > MAX_QUEUES:
        out.append((("queues",), f"must not be greater than {MAX_QUEUES}"))
    out += _positive("handSize", hand)
    if out:  # the hand is judged against valid queues only
        pass
    elif hand > queues:
        out.append((("handSize",), f"must not be greater than queues ({queues})"))
    elif (bits := required_entropy_bits(queues, hand)) > MAX_HASH_BITS:
        out.append(
            (
                ("handSize",),
                f"a hand of {hand} out of {queues} queues needs {bits} bits of entropy "
                f"(ceil(log2(queues) · handSize)), more than {MAX_HASH_BITS}",
            )
        )
    return out + _positive("queueLengthLimit", queuing.queue_length_limit)


def limit_response_problems(response: LimitResponse) -> list[Problem]:
    if response.type == LimitResponseType.REJECT:
        if response.queuing is not None:
            return [(("queuing",), "must not be set when type is Reject")]
        return []
    if response.queuing is None:
        # Kubernetes requires it too; "queuing: {}" is the one-word way to the defaults.
        return [
            (
                ("queuing",),
                "must be set when type is Queue ({} takes the defaults: "
                "queues 64, handSize 8, queueLengthLimit 50)",
            )
        ]
    return _at(("queuing",), queuing_problems(response.queuing))


def limited_problems(limited: LimitedPriorityLevelConfiguration) -> list[Problem]:
    return (
        _at(("limitResponse",), limit_response_problems(limited.limit_response))
        + _non_negative("nominalConcurrencyShares", limited.nominal_concurrency_shares)
        + _percent("lendablePercent", limited.lendable_percent)
        + _non_negative("borrowingLimitPercent", limited.borrowing_limit_percent)
    )


def exempt_problems(exempt: ExemptPriorityLevelConfiguration) -> list[Problem]:
    return _non_negative("nominalConcurrencyShares", exempt.nominal_concurrency_shares) + _percent(
        "lendablePercent", exempt.lendable_percent
    )


def level_problems(level: PriorityLevel) -> list[Problem]:
    """Every reason to refuse this level: type and settings agree, and the settings' rules."""
    out = name_problems(level.name)
    if level.type == LevelType.EXEMPT:
        if level.limited is not None:
            out.append((("limited",), "must not be set when type is Exempt"))
        if level.exempt is not None:
            out += _at(("exempt",), exempt_problems(level.exempt))
        return out
    if level.exempt is not None:
        out.append((("exempt",), "must not be set when type is Limited"))
    if level.limited is None:
        out.append((("limited",), "must be set when type is Limited"))
    else:
        out += _at(("limited",), limited_problems(level.limited))
    return out


# --- flow schemas ----------------------------------------------------------------------------


def header_problems(header: HeaderMatch) -> list[Problem]:
    out: list[Problem] = []
    if not _HEADER_TOKEN.fullmatch(header.name):
        out.append((("name",), f'invalid header name "{header.name}"'))
    if not header.values:
        out.append((("values",), "at least one value is needed"))
    return out


def rule_problems(rule: FlowRule) -> list[Problem]:
    """A matcher left out is ``None``; one written empty is a mistake. Host patterns are the
    config's to check and lowercase, as every host pattern of a file is."""
    out: list[Problem] = []
    matchers: tuple[tuple[str, tuple[object, ...] | None], ...] = (
        ("resources", rule.resources),
        ("headers", rule.headers),
        ("userAgents", rule.user_agents),
        ("hosts", rule.hosts),
        ("operations", rule.operations),
    )
    for key, values in matchers:
        if values is not None and not values:
            out.append(((key,), _EMPTY_MATCHER))
    for key, patterns in (("resources", rule.resources), ("userAgents", rule.user_agents)):
        out += [
            ((key, i), "an empty pattern matches nothing")
            for i, p in enumerate(patterns or ())
            if not p
        ]
    for index, header in enumerate(rule.headers or ()):
        out += _at(("headers", index), header_problems(header))
    return out


def schema_problems(schema: FlowSchema) -> list[Problem]:
    out = name_problems(schema.name)
    out += _at(("priorityLevelConfiguration",), name_problems(schema.priority_level))
    if not 1 <= schema.matching_precedence <= MAX_MATCHING_PRECEDENCE:
        out.append((("matchingPrecedence",), f"must be between 1 and {MAX_MATCHING_PRECEDENCE}"))
    if not schema.rules:
        out.append((("rules",), "at least one rule is needed ({} matches every request)"))
    for index, rule in enumerate(schema.rules):
        out += _at(("rules", index), rule_problems(rule))
    return out


# --- the whole block -------------------------------------------------------------------------


def _duplicates(names: Sequence[str], key: str) -> list[Problem]:
    first: dict[str, int] = {}
    out: list[Problem] = []
    for index, name in enumerate(names):
        if name in first:
            out.append(
                ((key, index, "name"), f'duplicate name "{name}" (also {key}[{first[name]}])')
            )
        else:
            first[name] = index
    return out


def flow_problems(
    server_concurrency_limit: int, levels: Sequence[PriorityLevel], schemas: Sequence[FlowSchema]
) -> list[Problem]:
    """Every problem of a ``flowControl`` block as written: its levels and schemas, names used
    twice, schemas naming a level that is neither configured nor built in, and effective
    levels whose nominalConcurrencyShares add up to 0 (nothing to share ServerCL out by)."""
    out = _positive("serverConcurrencyLimit", server_concurrency_limit)
    for index, level in enumerate(levels):
        out += _at(("priorityLevels", index), level_problems(level))
    for index, schema in enumerate(schemas):
        out += _at(("flowSchemas", index), schema_problems(schema))
    out += _duplicates([level.name for level in levels], "priorityLevels")
    out += _duplicates([schema.name for schema in schemas], "flowSchemas")
    effective = effective_levels(levels)
    known = {level.name for level in effective}
    for index, schema in enumerate(schemas):
        if schema.priority_level not in known:
            where: Loc = ("flowSchemas", index, "priorityLevelConfiguration", "name")
            out.append((where, f'priority level "{schema.priority_level}" does not exist'))
    if not out and not any(level.shares for level in effective):
        out.append(
            (
                ("priorityLevels",),
                "the nominalConcurrencyShares of all levels add up to 0 "
                "(at least one must be positive to share out serverConcurrencyLimit)",
            )
        )
    return out
