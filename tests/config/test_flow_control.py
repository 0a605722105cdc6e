"""``flowControl`` (SPEC §10): Kubernetes-style priority levels and flow schemas, the baseline."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from kuikproxy.config import (
    BUILTIN_FLOW_SCHEMAS,
    BUILTIN_PRIORITY_LEVELS,
    ExemptPriorityLevelConfiguration,
    FlowControl,
    FlowDistinguisherMethod,
    FlowRule,
    FlowSchema,
    HeaderMatch,
    LimitedPriorityLevelConfiguration,
    LimitResponse,
    PriorityLevel,
    PriorityLevelReference,
    QueuingConfiguration,
    describe,
    load_config,
    parse_config,
)
from kuikproxy.core.flowcontrol import FlowTraits
from kuikproxy.errors import ConfigError

LEVEL = "flowControl:\n  priorityLevels:\n    - "
SCHEMA = "flowControl:\n  flowSchemas:\n    - "
QUEUE = "limitResponse: {type: Queue, queuing: {}}"


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "test.yaml")
    return caught.value.errors


def limited_level(name: str, limited: str) -> str:
    return f"{LEVEL}{{name: {name}, type: Limited, limited: {{{limited}}}}}\n"


def queuing_level(queuing: str) -> str:
    return limited_level("q", f"limitResponse: {{type: Queue, queuing: {{{queuing}}}}}")


def schema(body: str) -> str:
    return f"{SCHEMA}{{name: s, priorityLevelConfiguration: {{name: checks}}, {body}}}\n"


# --- the baseline ----------------------------------------------------------------------------


def test_baseline_when_flow_control_is_absent() -> None:
    """Without flowControl: ServerCL 64 and the built-in levels and schemas of SPEC §10."""
    flow = load_config(None).flow_control
    assert flow.server_concurrency_limit == 64
    assert [(level.name, level.type) for level in flow.priority_levels] == [
        ("exempt", "Exempt"),
        ("checks", "Limited"),
        ("copies", "Limited"),
        ("catch-all", "Limited"),
    ]
    assert flow.level("exempt").exempt == ExemptPriorityLevelConfiguration(
        nominal_concurrency_shares=0, lendable_percent=0
    )
    ring_queues = QueuingConfiguration(queues=64, hand_size=8, queue_length_limit=2000)
    for name in ("checks", "copies"):
        assert flow.level(name).limited == LimitedPriorityLevelConfiguration(
            limit_response=LimitResponse(type="Queue", queuing=ring_queues),
            nominal_concurrency_shares=30,
            lendable_percent=0,
            borrowing_limit_percent=None,
        )
    assert flow.level("catch-all").limited == LimitedPriorityLevelConfiguration(
        limit_response=LimitResponse(type="Reject"), nominal_concurrency_shares=5
    )
    assert flow.priority_levels == BUILTIN_PRIORITY_LEVELS
    assert flow.flow_schemas == BUILTIN_FLOW_SCHEMAS


def test_baseline_schemas() -> None:
    """unpaced → exempt, check → checks, copy → copies, anything else → catch-all, ByResource."""
    schemas = load_config(None).flow_control.flow_schemas
    assert [
        (
            s.name,
            s.matching_precedence,
            s.priority_level,
            s.distinguisher_method.type if s.distinguisher_method else None,
            s.rules,
        )
        for s in schemas
    ] == [
        ("exempt", 1, "exempt", None, (FlowRule(operations=("unpaced",)),)),
        ("checks", 8000, "checks", "ByResource", (FlowRule(operations=("check",)),)),
        ("copies", 8000, "copies", "ByResource", (FlowRule(operations=("copy",)),)),
        ("catch-all", 10000, "catch-all", "ByResource", (FlowRule(),)),
    ]


@pytest.mark.parametrize(
    ("operation", "level"), [("check", "checks"), ("copy", "copies"), ("unpaced", "exempt")]
)
def test_baseline_classifies_by_operation(operation: str, level: str) -> None:
    """The baseline sends each operation to its own level."""
    flow = load_config(None).flow_control
    match = flow.match(FlowTraits("Pod/default/web", "docker.io", operation))  # type: ignore[arg-type]
    assert match is not None
    assert match.priority_level == level


def test_empty_flow_control_is_the_baseline() -> None:
    """``flowControl: {}`` is the same as no flowControl at all."""
    assert parse_config("flowControl: {}") == load_config(None)
    assert parse_config("flowControl:\n  serverConcurrencyLimit: 8\n").flow_control == (
        FlowControl(server_concurrency_limit=8)
    )


def test_same_name_replaces_the_builtin_whole() -> None:
    """A configured level named like a built-in replaces it in place; new ones come after."""
    flow = parse_config(
        LEVEL + "{name: checks, type: Limited, limited: {limitResponse: {type: Reject}}}\n"
        "    - {name: vip, type: Exempt}\n"
        "    - {name: copies, type: Exempt, exempt: {lendablePercent: 10}}\n"
    ).flow_control
    assert [level.name for level in flow.priority_levels] == [
        "exempt",
        "checks",
        "copies",
        "catch-all",
        "vip",
    ]
    # Nothing of the built-in survives: NCS and queuing are this level's own defaults.
    assert flow.level("checks").limited == LimitedPriorityLevelConfiguration(
        limit_response=LimitResponse(type="Reject"), nominal_concurrency_shares=30
    )
    assert flow.level("copies").type == "Exempt"
    assert flow.level("copies").limited is None
    assert flow.level("copies").exempt == ExemptPriorityLevelConfiguration(lendable_percent=10)


def test_schemas_sorted_by_precedence_then_name() -> None:
    """Effective schemas are in matching order: precedence, then name; same names replace."""
    flow = parse_config(
        SCHEMA + "{name: zz, priorityLevelConfiguration: {name: copies}, rules: [{}]}\n"
        "    - {name: aa, priorityLevelConfiguration: {name: copies}, rules: [{}]}\n"
        "    - {name: checks, matchingPrecedence: 2, priorityLevelConfiguration: {name: copies},"
        " rules: [{operations: [check]}]}\n"
    ).flow_control
    assert [(s.name, s.matching_precedence) for s in flow.flow_schemas] == [
        ("exempt", 1),
        ("checks", 2),
        ("aa", 1000),
        ("zz", 1000),
        ("copies", 8000),
        ("catch-all", 10000),
    ]
    assert flow.match(FlowTraits("r", "h", "check")) == flow.flow_schemas[1]
    assert flow.flow_schemas[1].priority_level == "copies"


# --- defaults --------------------------------------------------------------------------------


def test_level_defaults() -> None:
    """Kubernetes' defaults: exempt 0/0; limited NCS 30, lendable 0, borrowing unlimited."""
    flow = parse_config(
        LEVEL + "{name: free, type: Exempt}\n"
        f"    - {{name: lim, type: Limited, limited: {{{QUEUE}}}}}\n"
    ).flow_control
    assert flow.level("free").exempt == ExemptPriorityLevelConfiguration(0, 0)
    assert flow.level("free").limited is None
    limited = flow.level("lim").limited
    assert limited is not None
    assert flow.level("lim").exempt is None
    assert (
        limited.nominal_concurrency_shares,
        limited.lendable_percent,
        limited.borrowing_limit_percent,
    ) == (30, 0, None)
    assert limited.limit_response.queuing == QueuingConfiguration(
        queues=64, hand_size=8, queue_length_limit=50
    )


def test_full_level_and_schema() -> None:
    """Every field as written, camelCase in YAML, snake_case in Python."""
    flow = parse_config(
        """
flowControl:
  serverConcurrencyLimit: 100
  priorityLevels:
    - name: jail
      type: Limited
      limited:
        nominalConcurrencyShares: 0
        lendablePercent: 100
        borrowingLimitPercent: 250
        limitResponse: {type: Queue, queuing: {queues: 1, handSize: 1, queueLengthLimit: 5}}
  flowSchemas:
    - name: bad-bots
      matchingPrecedence: 10000
      priorityLevelConfiguration: {name: jail}
      distinguisherMethod: {type: ByHost}
      rules:
        - resources: ["Job/*"]
          headers: [{name: X-Bot, values: ["yes", "1"]}]
          userAgents: ["curl/*"]
          hosts: ["*.Example"]
          operations: [check, copy]
"""
    ).flow_control
    assert flow.server_concurrency_limit == 100
    assert flow.level("jail") == PriorityLevel(
        name="jail",
        type="Limited",
        limited=LimitedPriorityLevelConfiguration(
            limit_response=LimitResponse(
                type="Queue",
                queuing=QueuingConfiguration(queues=1, hand_size=1, queue_length_limit=5),
            ),
            nominal_concurrency_shares=0,
            lendable_percent=100,
            borrowing_limit_percent=250,
        ),
    )
    [bots] = [s for s in flow.flow_schemas if s.name == "bad-bots"]
    assert bots == FlowSchema(
        name="bad-bots",
        matching_precedence=10000,
        priority_level_configuration=PriorityLevelReference(name="jail"),
        distinguisher_method=FlowDistinguisherMethod(type="ByHost"),
        rules=(
            FlowRule(
                resources=("Job/*",),
                headers=(HeaderMatch(name="X-Bot", values=("yes", "1")),),
                user_agents=("curl/*",),
                hosts=("*.example",),  # lowercased, like allowedHosts
                operations=("check", "copy"),
            ),
        ),
    )
    # Same name, same precedence as catch-all: ties go by name.
    assert [s.name for s in flow.flow_schemas][-2:] == ["bad-bots", "catch-all"]


def test_schema_defaults() -> None:
    """matchingPrecedence 1000 (Kubernetes' default), no distinguisher: one flow."""
    [mine] = [
        s for s in parse_config(schema("rules: [{}]")).flow_control.flow_schemas if s.name == "s"
    ]
    assert mine.matching_precedence == 1000
    assert mine.distinguisher_method is None


def test_snake_case_keys_accepted() -> None:
    """Like every block, flowControl takes the attribute names as well."""
    flow = parse_config(
        "flowControl:\n  server_concurrency_limit: 3\n  priority_levels:\n"
        "    - {name: x, type: Limited, limited: {limit_response: {type: Reject}}}\n"
    ).flow_control
    assert flow.server_concurrency_limit == 3
    assert flow.level("x").type == "Limited"


# --- validation: every rule, with its path and message ---------------------------------------


@pytest.mark.parametrize(
    ("text", "error"),
    [
        # Exempt with limited, Limited without it, Limited with exempt.
        (
            LEVEL + "{name: a, type: Exempt}\n"
            f"    - {{name: b, type: Exempt, limited: {{{QUEUE}}}}}\n",
            "flowControl.priorityLevels[1].limited: must not be set when type is Exempt",
        ),
        (
            LEVEL + "{name: a, type: Limited}\n",
            "flowControl.priorityLevels[0].limited: must be set when type is Limited",
        ),
        (
            LEVEL + f"{{name: a, type: Limited, exempt: {{}}, limited: {{{QUEUE}}}}}\n",
            "flowControl.priorityLevels[0].exempt: must not be set when type is Limited",
        ),
        # Reject with queuing, Queue without it.
        (
            limited_level("a", "limitResponse: {type: Reject, queuing: {}}"),
            "flowControl.priorityLevels[0].limited.limitResponse.queuing: "
            "must not be set when type is Reject",
        ),
        (
            limited_level("a", "limitResponse: {type: Queue}"),
            "flowControl.priorityLevels[0].limited.limitResponse.queuing: "
            "must be set when type is Queue "
            "({} takes the defaults: queues 64, handSize 8, queueLengthLimit 50)",
        ),
        # handSize > queues, and the 60 bits of entropy.
        (
            queuing_level("queues: 4, handSize: 5"),
            "flowControl.priorityLevels[0].limited.limitResponse.queuing.handSize: "
            "must not be greater than queues (4)",
        ),
        (
            queuing_level("handSize: 65"),
            "flowControl.priorityLevels[0].limited.limitResponse.queuing.handSize: "
            "must not be greater than queues (64)",
        ),
        (
            queuing_level("queues: 128, handSize: 9"),
            "flowControl.priorityLevels[0].limited.limitResponse.queuing.handSize: "
            "a hand of 9 out of 128 queues needs 63 bits of entropy "
            "(ceil(log2(queues) · handSize)), more than 60",
        ),
        (
            queuing_level("queues: 1000, handSize: 7"),
            "flowControl.priorityLevels[0].limited.limitResponse.queuing.handSize: "
            "a hand of 7 out of 1000 queues needs 70 bits of entropy "
            "(ceil(log2(queues) · handSize)), more than 60",
        ),
        (
            queuing_level("queues: 10000001"),
            "flowControl.priorityLevels[0].limited.limitResponse.queuing.queues: "
            "must not be greater than 10000000",
        ),
        # lendablePercent outside 0..100.
        (
            limited_level("a", f"lendablePercent: 101, {QUEUE}"),
            "flowControl.priorityLevels[0].limited.lendablePercent: must be between 0 and 100",
        ),
        (
            limited_level("a", f"lendablePercent: -1, {QUEUE}"),
            "flowControl.priorityLevels[0].limited.lendablePercent: must be between 0 and 100",
        ),
        (
            LEVEL + "{name: a, type: Exempt, exempt: {lendablePercent: 150}}\n",
            "flowControl.priorityLevels[0].exempt.lendablePercent: must be between 0 and 100",
        ),
        # Negative numbers.
        (
            limited_level("a", f"nominalConcurrencyShares: -1, {QUEUE}"),
            "flowControl.priorityLevels[0].limited.nominalConcurrencyShares: must not be negative",
        ),
        (
            LEVEL + "{name: a, type: Exempt, exempt: {nominalConcurrencyShares: -3}}\n",
            "flowControl.priorityLevels[0].exempt.nominalConcurrencyShares: must not be negative",
        ),
        (
            limited_level("a", f"borrowingLimitPercent: -5, {QUEUE}"),
            "flowControl.priorityLevels[0].limited.borrowingLimitPercent: must not be negative",
        ),
        (
            queuing_level("queues: -1"),
            "flowControl.priorityLevels[0].limited.limitResponse.queuing.queues: "
            "must be greater than 0",
        ),
        (
            queuing_level("handSize: -2"),
            "flowControl.priorityLevels[0].limited.limitResponse.queuing.handSize: "
            "must be greater than 0",
        ),
        (
            queuing_level("queueLengthLimit: -50"),
            "flowControl.priorityLevels[0].limited.limitResponse.queuing.queueLengthLimit: "
            "must be greater than 0",
        ),
        # Zero counts are refused rather than read as "unset" as Kubernetes does.
        (
            queuing_level("queueLengthLimit: 0"),
            "flowControl.priorityLevels[0].limited.limitResponse.queuing.queueLengthLimit: "
            "must be greater than 0",
        ),
        (
            "flowControl: {serverConcurrencyLimit: 0}",
            "flowControl.serverConcurrencyLimit: must be greater than 0",
        ),
        (
            "flowControl: {serverConcurrencyLimit: -4}",
            "flowControl.serverConcurrencyLimit: must be greater than 0",
        ),
        # Duplicate names, and a schema naming a level that does not exist.
        (
            LEVEL + "{name: a, type: Exempt}\n    - {name: b, type: Exempt}\n"
            "    - {name: a, type: Exempt}\n",
            'flowControl.priorityLevels[2].name: duplicate name "a" (also priorityLevels[0])',
        ),
        (
            SCHEMA + "{name: s, priorityLevelConfiguration: {name: checks}, rules: [{}]}\n"
            "    - {name: s, priorityLevelConfiguration: {name: copies}, rules: [{}]}\n",
            'flowControl.flowSchemas[1].name: duplicate name "s" (also flowSchemas[0])',
        ),
        (
            SCHEMA + "{name: s, priorityLevelConfiguration: {name: checks}, rules: [{}]}\n"
            "    - {name: t, priorityLevelConfiguration: {name: gold}, rules: [{}]}\n",
            "flowControl.flowSchemas[1].priorityLevelConfiguration.name: "
            'priority level "gold" does not exist',
        ),
        # Kubernetes' matchingPrecedence range.
        (
            schema("matchingPrecedence: 0, rules: [{}]"),
            "flowControl.flowSchemas[0].matchingPrecedence: must be between 1 and 10000",
        ),
        (
            schema("matchingPrecedence: 10001, rules: [{}]"),
            "flowControl.flowSchemas[0].matchingPrecedence: must be between 1 and 10000",
        ),
        # Types and required fields.
        (
            LEVEL + "{name: a, type: Burstable}\n",
            "flowControl.priorityLevels[0].type: Input should be 'Exempt' or 'Limited'",
        ),
        (LEVEL + "{name: a}\n", "flowControl.priorityLevels[0].type: required"),
        (LEVEL + "{type: Exempt}\n", "flowControl.priorityLevels[0].name: required"),
        (
            limited_level("a", ""),
            "flowControl.priorityLevels[0].limited.limitResponse: required",
        ),
        (
            limited_level("a", "limitResponse: {type: Wait}"),
            "flowControl.priorityLevels[0].limited.limitResponse.type: "
            "Input should be 'Queue' or 'Reject'",
        ),
        (
            limited_level("a", f"nominalConcurrencyShares: true, {QUEUE}"),
            "flowControl.priorityLevels[0].limited.nominalConcurrencyShares: "
            "Input should be a valid integer",
        ),
        (
            queuing_level("queues: '64'"),
            "flowControl.priorityLevels[0].limited.limitResponse.queuing.queues: "
            "Input should be a valid integer",
        ),
        (
            LEVEL + "{name: Gold_Level, type: Exempt}\n",
            'flowControl.priorityLevels[0].name: invalid name "Gold_Level" '
            '(lowercase letters, digits, "-" and ".", starting and ending with a letter or digit)',
        ),
        (
            SCHEMA + "{name: s, rules: [{}]}\n",
            "flowControl.flowSchemas[0].priorityLevelConfiguration: required",
        ),
        (
            schema("distinguisherMethod: {type: ByUser}, rules: [{}]"),
            "flowControl.flowSchemas[0].distinguisherMethod.type: "
            "Input should be 'ByResource' or 'ByHost'",
        ),
        (
            "flowControl: {priorityLevels: {name: a}}",
            "flowControl.priorityLevels: must be a list, not a mapping",
        ),
        ("flowControl: []", "flowControl: must be a mapping, not a list"),
        (
            LEVEL + f"{{name: a, type: Limited, limited: {{{QUEUE}, weight: 3}}}}\n",
            "flowControl.priorityLevels[0].limited.weight: unknown key",
        ),
        # Rules.
        (
            schema("distinguisherMethod: {type: ByHost}"),
            "flowControl.flowSchemas[0].rules: at least one rule is needed "
            "({} matches every request)",
        ),
        (
            schema("rules: []"),
            "flowControl.flowSchemas[0].rules: at least one rule is needed "
            "({} matches every request)",
        ),
        (
            schema("rules: [{resources: []}]"),
            "flowControl.flowSchemas[0].rules[0].resources: "
            "must not be empty (leave it out to match anything)",
        ),
        (
            schema("rules: [{operations: []}]"),
            "flowControl.flowSchemas[0].rules[0].operations: "
            "must not be empty (leave it out to match anything)",
        ),
        (
            schema("rules: [{operations: [check, write]}]"),
            "flowControl.flowSchemas[0].rules[0].operations[1]: "
            "Input should be 'check', 'copy' or 'unpaced'",
        ),
        (
            schema("rules: [{userAgents: ['']}]"),
            "flowControl.flowSchemas[0].rules[0].userAgents[0]: an empty pattern matches nothing",
        ),
        (
            schema("rules: [{hosts: ['reg.example/library']}]"),
            'flowControl.flowSchemas[0].rules[0].hosts: invalid host pattern "reg.example/library"',
        ),
        (
            schema("rules: [{headers: [{name: X-Team, values: []}]}]"),
            "flowControl.flowSchemas[0].rules[0].headers[0].values: at least one value is needed",
        ),
        (
            schema("rules: [{headers: [{name: 'X Team', values: [a]}]}]"),
            'flowControl.flowSchemas[0].rules[0].headers[0].name: invalid header name "X Team"',
        ),
        (
            schema("rules: [{headers: [{name: X-Bot, values: [yes]}]}]"),
            "flowControl.flowSchemas[0].rules[0].headers[0].values[0]: "
            "must be a string, not a boolean (quote it in YAML)",
        ),
        (
            schema("rules: [{resources: [7]}]"),
            "flowControl.flowSchemas[0].rules[0].resources[0]: "
            "must be a string, not a number (quote it in YAML)",
        ),
        (
            schema("rules: [{resource: ['Pod/*']}]"),
            "flowControl.flowSchemas[0].rules[0].resource: unknown key",
        ),
    ],
)
def test_validation_error(text: str, error: str) -> None:
    """Each rule of SPEC §10 (and Kubernetes') is one error with its full path."""
    assert errors_of(text) == [error]


def test_shares_must_not_all_be_zero() -> None:
    """NominalCL divides by the sum of NCS: at least one level must have a share."""
    levels = "".join(
        f"    - {{name: {name}, type: Exempt}}\n" for name in ("checks", "copies", "catch-all")
    )
    assert errors_of("flowControl:\n  priorityLevels:\n" + levels) == [
        "flowControl.priorityLevels: the nominalConcurrencyShares of all levels add up to 0 "
        "(at least one must be positive to share out serverConcurrencyLimit)"
    ]


def test_every_flow_control_error_is_reported() -> None:
    """Several errors across levels are all reported, each with its own path."""
    errors = errors_of(
        LEVEL + "{name: a, type: Exempt, limited: {limitResponse: {type: Reject}}}\n"
        "    - {name: b, type: Limited, limited: {lendablePercent: 200, "
        "limitResponse: {type: Queue, queuing: {queues: 2, handSize: 3}}}}\n"
    )
    assert errors == [
        "flowControl.priorityLevels[0].limited: must not be set when type is Exempt",
        "flowControl.priorityLevels[1].limited.limitResponse.queuing.handSize: "
        "must not be greater than queues (2)",
        "flowControl.priorityLevels[1].limited.lendablePercent: must be between 0 and 100",
    ]
    # Duplicates and missing levels are found together.
    assert errors_of(
        LEVEL + "{name: a, type: Exempt}\n    - {name: a, type: Exempt}\n"
        "  flowSchemas:\n    - {name: s, priorityLevelConfiguration: {name: b}, rules: [{}]}\n"
    ) == [
        'flowControl.priorityLevels[1].name: duplicate name "a" (also priorityLevels[0])',
        'flowControl.flowSchemas[0].priorityLevelConfiguration.name: priority level "b" '
        "does not exist",
    ]


@pytest.mark.parametrize(("queues", "hand_size"), [(1, 1), (64, 8), (1024, 6), (2**20, 3)])
def test_entropy_limit_is_inclusive(queues: int, hand_size: int) -> None:
    """Exactly 60 bits (or fewer) is fine: 1024 queues and a hand of 6 is allowed."""
    text = queuing_level(f"queues: {queues}, handSize: {hand_size}")
    queuing = parse_config(text).flow_control.level("q").limited
    assert queuing is not None
    assert queuing.limit_response.queuing == QueuingConfiguration(queues, hand_size, 50)


def test_schema_may_name_a_builtin_or_configured_level() -> None:
    """References resolve against the effective levels: built in and configured."""
    flow = parse_config(
        LEVEL + "{name: vip, type: Exempt}\n  flowSchemas:\n"
        "    - {name: a, priorityLevelConfiguration: {name: vip}, rules: [{}]}\n"
        "    - {name: b, priorityLevelConfiguration: {name: catch-all}, rules: [{}]}\n"
    ).flow_control
    assert {s.name: s.priority_level for s in flow.flow_schemas}["a"] == "vip"


# --- matching --------------------------------------------------------------------------------


def test_rule_matchers() -> None:
    """A rule needs every matcher it sets; a list matches on any item, headers on all."""
    rule = FlowRule(
        resources=("ImageMonitor/*", "Job/batch/*"),
        hosts=("*.azurecr.io", "docker.io"),
        operations=("check",),
        user_agents=("kuik/*",),
        headers=(
            HeaderMatch(name="Kuik-Priority", values=("low", "lowest")),
            HeaderMatch(name="X-Team", values=("a",)),
        ),
    )
    good = {
        "resource": "ImageMonitor/default/web",
        "host": "Reg.AzureCR.io",
        "operation": "check",
        "user_agent": "kuik/3.0",
        "headers": {"kuik-priority": "lowest", "X-Team": "a"},
    }
    assert rule.matches(FlowTraits(**good))  # type: ignore[arg-type]
    for key, value in [
        ("resource", "Pod/default/web"),
        ("host", "ghcr.io"),
        ("operation", "copy"),
        ("user_agent", "containerd/1.7"),
        ("headers", {"Kuik-Priority": "high", "X-Team": "a"}),
        ("headers", {"Kuik-Priority": "low"}),  # every header must match
        ("headers", {"Kuik-Priority": "LOW", "X-Team": "a"}),  # values are exact
    ]:
        assert not rule.matches(FlowTraits(**{**good, key: value})), key  # type: ignore[arg-type]
    assert FlowRule().matches(FlowTraits("", "x", "unpaced"))


def test_first_matching_schema_wins() -> None:
    """A configured schema with the default precedence comes before the built-in checks."""
    flow = parse_config(
        LEVEL + "{name: monitoring, type: Limited, limited: {"
        f"nominalConcurrencyShares: 5, {QUEUE}}}}}\n"
        "  flowSchemas:\n"
        "    - {name: monitors, priorityLevelConfiguration: {name: monitoring}, "
        "rules: [{resources: ['ImageMonitor/*'], operations: [check]}, "
        "{headers: [{name: Kuik-Priority, values: [low]}]}]}\n"
    ).flow_control

    def level(resource: str, operation: str, **headers: str) -> str | None:
        match = flow.match(
            FlowTraits(
                resource=resource,
                host="docker.io",
                operation=operation,  # type: ignore[arg-type]
                headers={k.replace("_", "-"): v for k, v in headers.items()},
            )
        )
        return None if match is None else match.priority_level

    assert level("ImageMonitor/default/web", "check") == "monitoring"
    assert level("ImageMonitor/default/web", "copy") == "copies"
    assert level("Pod/default/web", "check") == "checks"
    assert level("Pod/default/web", "copy", Kuik_Priority="low") == "monitoring"
    assert level("Pod/default/web", "unpaced") == "exempt"


# --- Python callers --------------------------------------------------------------------------


def test_built_in_python_is_effective_and_frozen() -> None:
    """FlowControl built in Python is validated and merged with the baseline the same way."""
    vip = PriorityLevel(name="vip", type="Exempt")
    flow = FlowControl(priority_levels=(vip,))
    assert flow.priority_levels == (*BUILTIN_PRIORITY_LEVELS, vip)
    assert vip.exempt == ExemptPriorityLevelConfiguration()
    # Validating the effective object again changes nothing.
    assert FlowControl(flow.server_concurrency_limit, flow.priority_levels, flow.flow_schemas) == (
        flow
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        flow.server_concurrency_limit = 1  # type: ignore[misc]
    with pytest.raises(KeyError):
        flow.level("gold")


def test_python_errors_name_their_paths() -> None:
    """A ValidationError from Python code names the nested paths too."""
    with pytest.raises(ValidationError) as caught:
        FlowControl(
            flow_schemas=(
                FlowSchema(
                    name="s",
                    priority_level_configuration=PriorityLevelReference(name="gold"),
                    rules=(FlowRule(),),
                ),
            )
        )
    assert (
        'flowSchemas[0].priorityLevelConfiguration.name: priority level "gold" does not exist'
        in str(caught.value)
    )
    with pytest.raises(ValidationError, match="must be set when type is Limited"):
        PriorityLevel(name="x", type="Limited")


# --- check-config ----------------------------------------------------------------------------


def test_describe_shows_the_effective_flow_control() -> None:
    """check-config prints ServerCL, every level's settings and the schemas in matching order."""
    text = describe(
        parse_config(
            "flowControl:\n  serverConcurrencyLimit: 16\n  priorityLevels:\n"
            "    - {name: catch-all, type: Limited, limited: {nominalConcurrencyShares: 2, "
            "borrowingLimitPercent: 50, limitResponse: {type: Reject}}}\n"
            "  flowSchemas:\n"
            "    - {name: bots, matchingPrecedence: 10, priorityLevelConfiguration: "
            "{name: catch-all}, distinguisherMethod: {type: ByHost}, rules: "
            "[{userAgents: ['curl/*'], hosts: ['*.example']}, "
            "{headers: [{name: X-Bot, values: ['1', 'yes']}]}]}\n"
        )
    )
    assert "\nflowControl: serverConcurrencyLimit 16\n  priorityLevels:\n" in text
    assert "    exempt (built-in): Exempt, nominalConcurrencyShares 0, lendablePercent 0\n" in text
    assert (
        "    checks (built-in): Limited, nominalConcurrencyShares 30, lendablePercent 0, "
        "borrowingLimitPercent unlimited, Queue (queues 64, handSize 8, queueLengthLimit 2000)\n"
    ) in text
    assert (
        "    catch-all (replaces the built-in): Limited, nominalConcurrencyShares 2, "
        "lendablePercent 0, borrowingLimitPercent 50, Reject\n"
    ) in text
    schemas = text.split("  flowSchemas (tried in this order, the first match wins):\n")[1]
    assert schemas.startswith(
        "    exempt (built-in): precedence 1 → exempt, distinguisher none\n"
        "      when operation unpaced\n"
        "    bots: precedence 10 → catch-all, distinguisher ByHost\n"
        "      when host *.example and user agent curl/*\n"
        "      when header X-Bot: 1 or yes\n"
        "    checks (built-in): precedence 8000 → checks, distinguisher ByResource\n"
        "      when operation check\n"
    )
    assert (
        schemas.endswith(
            "    catch-all (built-in): precedence 10000 → catch-all, distinguisher ByResource\n"
            "      when every request\n"
            "\n"
            "default (every other host)\n"
        )
        is False
    )
    assert (
        "    catch-all (built-in): precedence 10000 → catch-all, distinguisher ByResource\n"
        "      when every request\n\n"
    ) in schemas
