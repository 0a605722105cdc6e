"""Which reads are ``Exempt`` (SPEC §10, P14): matched by a flow schema on an Exempt level.

Matching every read against every flow schema would cost the hot path of kept answers; the
built-in ``exempt`` schema matches unpaced requests only, so the matching is done only when the
config has an Exempt schema that a paced read could match.
"""

from __future__ import annotations

from aiohttp import web

from kuikproxy.config import Config, FlowSchema
from kuikproxy.runtime.messages import RegistryRequest


class ExemptReads:
    def __init__(self, config: Config) -> None:
        flow = config.flow_control
        self._flow = flow
        self._needed = any(
            flow.level(schema.priority_level).type == "Exempt"
            and any(
                not rule.operations or set(rule.operations) - {"unpaced"} for rule in schema.rules
            )
            for schema in flow.flow_schemas
        )

    def applies(self, request: web.Request, read: RegistryRequest) -> bool:
        """Whether the first flow schema this read matches puts it on an Exempt level."""
        if not self._needed:
            return False
        schema = self._flow.match(
            resource=read.resource,
            host=read.host,
            operation=read.operation.value,
            user_agent=request.headers.get("User-Agent", ""),
            headers=request.headers,
        )
        return schema is not None and self._flow.level(schema.priority_level).type == "Exempt"


def _may_match_paced(schema: FlowSchema) -> bool:
    """Whether a check or a copy could match the schema (a rule not limited to ``unpaced``)."""
    return any(not rule.operations or set(rule.operations) - {"unpaced"} for rule in schema.rules)
