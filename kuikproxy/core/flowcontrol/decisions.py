"""What the flow-control machine answers (:class:`Seated`, :class:`Queued`, :class:`Rejected`,
a :class:`Place`) and what it shows of each level (:class:`LevelView`)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from kuikproxy.core.flowcontrol.spec import LevelType, LimitResponseType


class RejectReason(StrEnum):
    QUEUE_FULL = "queue-full"  # the least-loaded queue of the flow's hand is full
    CONCURRENCY_LIMIT = "concurrency-limit"  # a Reject level with no seat free


@dataclass(frozen=True, slots=True)
class Seated:
    """Run now. The request holds a seat until ``FlowMachine.finish`` of its level."""


@dataclass(frozen=True, slots=True)
class Queued:
    """Wait: the ticket comes back from ``FlowMachine.finish`` (or ``cancel``) when a seat
    is its; ``queue`` is the index of the queue it waits in."""

    queue: int


@dataclass(frozen=True, slots=True)
class Rejected:
    """Refuse (429). ``retry_after`` estimates, in seconds, when trying again may succeed."""

    reason: RejectReason
    retry_after: float


Decision = Seated | Queued | Rejected


@dataclass(frozen=True, slots=True)
class Place:
    """A place in a level's queues held by a request that waits for its window, not a seat
    (SPEC §10); given back with ``FlowMachine.unpark``. ``queue`` is -1 on a level
    without queues."""

    level: str
    queue: int


SEATED = Seated()


@dataclass(frozen=True, slots=True)
class Condition:
    """A ``PriorityLevelConfigurationCondition``; ``last_transition_time`` is a core ``now``."""

    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str
    message: str
    last_transition_time: float


@dataclass(frozen=True, slots=True)
class LevelView:
    name: str
    type: LevelType
    limit_response: LimitResponseType | None  # None for Exempt levels
    nominal_cl: int
    lendable_cl: int
    borrowing_cl: int | None  # None: unlimited
    current_cl: int  # for an Exempt level: the seats it keeps from lending, not a limit
    in_queue: int  # waiting for a seat
    parked: int  # holding a place while waiting for their window
    executing: int
    dispatched: int
    rejected: dict[RejectReason, int]
    conditions: tuple[Condition, ...]
