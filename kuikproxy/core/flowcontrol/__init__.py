"""Flow control: Kubernetes API Priority and Fairness, restated for registry reads (SPEC §10).

How it works
============

Every request is classified by flow schemas (:mod:`.schemas`) into a *priority level* and a
*flow* — the schema's name and a distinguisher, such as the resource the request is made for.
The levels share ``serverConcurrencyLimit`` *seats*: upstream requests in flight at once.

**Levels** (:mod:`.spec`, their rules :mod:`.validation`, the built-in ones
:mod:`.baseline`) are ``PriorityLevelConfigurationSpec`` field by field; the config parses a
file straight into them.

**Seats** (:mod:`.seats`). Each level's ``nominalConcurrencyShares`` gives it
``NominalCL = ceil(ServerCL · NCS / Σ NCS)`` seats, of which ``LendableCL`` (``lendablePercent``)
may be lent, and it may borrow up to ``BorrowingCL`` (``borrowingLimitPercent``, nil unlimited).
Its *current limit* moves between ``NominalCL − LendableCL`` and ``NominalCL + BorrowingCL``
with demand — the seats each level wants now, executing plus queued — by Kubernetes' fair
allocation: levels that want little keep their floor and lend the rest, levels that want more
share what is lent in proportion to their demand, the total held at ServerCL
(:class:`.seats.Allocator` states the rule and where it departs from Kubernetes).

**Queues** (:mod:`.sharding`, :mod:`.queueset`). A request that finds no free seat waits in one
of its level's ``queues``: its flow is hashed (SHA-256, stable across restarts and processes) and
dealt a hand of ``handSize`` distinct queues, and it joins the one with the least waiting, unless
that one already holds ``queueLengthLimit`` requests — then it is refused. A flow can therefore
park at most ``handSize × queueLengthLimit`` requests and a level at most
``queues × queueLengthLimit``: a flood is refused at the door instead of growing memory, and a
quiet flow almost always has a queue of its own. When a seat frees, fair queuing (virtual time,
one unit per request) picks which queue's head goes: every busy queue gets a turn per round, so
a flow holding eight queues gets eight turns, never the whole level.

**Levels' types.** ``Exempt`` requests never queue nor wait and take no seat from anyone (P14);
their NCS only reserves seats they may lend. ``Limited`` levels with ``limitResponse: Reject``
never queue: no free seat, no entry.

**The machine** (:mod:`.machine`). :class:`FlowMachine` is pure, like the pacing scheduler: the
runtime feeds it ``arrive`` (a request came: :class:`Seated`, :class:`Queued` or
:class:`Rejected` with a retry estimate), ``finish`` (a request that held a seat ended: the
tickets that may run now) and ``cancel`` (a waiting client left), each with ``now``; ``park`` and
``unpark`` for requests that wait for their window rather than a seat (they hold a place in
their flow's queues, bounding what a flow parks, but want no seat); and it reads
``snapshot`` for ``/status``: per level its seat numbers, current limit, queued, executing,
rejected, and ``conditions`` as ``PriorityLevelConfigurationStatus`` has them:

* ``ConcurrencyShared`` — ``True``/``Borrowing`` while more requests execute than NominalCL
  (seats lent by other levels are in use), else ``True``/``Lending`` while the current limit is
  below NominalCL (some of its seats are allotted to others); ``False``/``NotShared`` otherwise;
* ``Saturated`` — ``True`` with reason ``RequestsQueued`` while requests wait, ``AllSeatsBusy``
  while every seat is taken; ``False``/``SeatsAvailable`` otherwise, ``False``/``Exempt`` for
  Exempt levels.

``lastTransitionTime`` is the ``now`` of the event at which a condition's status changed;
reason and message follow the state without moving it.

Limits are recomputed at every change of demand (instantly, from demand: no clock), which costs
one small solve over the levels — nothing when no level's target moved. A limit may fall at any
event but rises, where requests wait, only at ``finish`` and ``cancel``, which dispatch them; so
``arrive`` answers for its own ticket only and never releases another.
"""

from kuikproxy.core.flowcontrol.baseline import (
    BUILTIN_FLOW_SCHEMAS,
    BUILTIN_PRIORITY_LEVELS,
    effective_levels,
    effective_schemas,
)
from kuikproxy.core.flowcontrol.decisions import (
    Condition,
    Decision,
    LevelView,
    Place,
    Queued,
    Rejected,
    RejectReason,
    Seated,
)
from kuikproxy.core.flowcontrol.machine import FlowMachine
from kuikproxy.core.flowcontrol.queueset import QueueSet
from kuikproxy.core.flowcontrol.schemas import (
    DEFAULT_MATCHING_PRECEDENCE,
    MAX_MATCHING_PRECEDENCE,
    FlowDistinguisherMethod,
    FlowOperation,
    FlowRule,
    FlowSchema,
    FlowTraits,
    HeaderMatch,
    PriorityLevelReference,
    first_match,
    may_exempt_paced,
    reads_headers,
)
from kuikproxy.core.flowcontrol.seats import (
    Allocator,
    Seats,
    current_limits,
    fair_allocation,
    round_allocation,
    seats,
)
from kuikproxy.core.flowcontrol.sharding import (
    MAX_HASH_BITS,
    deal,
    flow_id,
    hand_for,
    hash_flow,
    required_entropy_bits,
)
from kuikproxy.core.flowcontrol.spec import (
    ExemptPriorityLevelConfiguration,
    LevelType,
    LimitedPriorityLevelConfiguration,
    LimitResponse,
    LimitResponseType,
    PriorityLevel,
    QueuingConfiguration,
)
from kuikproxy.core.flowcontrol.validation import (
    MAX_QUEUES,
    Loc,
    Problem,
    flow_problems,
    level_problems,
    schema_problems,
)

__all__ = [
    "BUILTIN_FLOW_SCHEMAS",
    "BUILTIN_PRIORITY_LEVELS",
    "DEFAULT_MATCHING_PRECEDENCE",
    "MAX_HASH_BITS",
    "MAX_MATCHING_PRECEDENCE",
    "MAX_QUEUES",
    "Allocator",
    "Condition",
    "Decision",
    "ExemptPriorityLevelConfiguration",
    "FlowDistinguisherMethod",
    "FlowMachine",
    "FlowOperation",
    "FlowRule",
    "FlowSchema",
    "FlowTraits",
    "HeaderMatch",
    "LevelType",
    "LevelView",
    "LimitResponse",
    "LimitResponseType",
    "LimitedPriorityLevelConfiguration",
    "Loc",
    "Place",
    "PriorityLevel",
    "PriorityLevelReference",
    "Problem",
    "QueueSet",
    "Queued",
    "QueuingConfiguration",
    "RejectReason",
    "Rejected",
    "Seated",
    "Seats",
    "current_limits",
    "deal",
    "effective_levels",
    "effective_schemas",
    "fair_allocation",
    "first_match",
    "flow_id",
    "flow_problems",
    "hand_for",
    "hash_flow",
    "level_problems",
    "may_exempt_paced",
    "reads_headers",
    "required_entropy_bits",
    "round_allocation",
    "schema_problems",
    "seats",
]
