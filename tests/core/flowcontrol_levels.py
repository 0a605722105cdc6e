"""Priority levels for the flow-control tests, built the way a config would spell them."""

from __future__ import annotations

from kuikproxy.core.flowcontrol import (
    ExemptPriorityLevelConfiguration,
    LevelType,
    LimitedPriorityLevelConfiguration,
    LimitResponse,
    LimitResponseType,
    PriorityLevel,
    QueuingConfiguration,
)


def limited(
    name: str,
    shares: int = 30,
    *,
    lendable: int = 0,
    borrowing: int | None = None,
    queues: int = 64,
    hand_size: int = 8,
    queue_length_limit: int = 50,
    reject: bool = False,
) -> PriorityLevel:
    response = (
        LimitResponse(LimitResponseType.REJECT, None)
        if reject
        else LimitResponse(
            LimitResponseType.QUEUE,
            QueuingConfiguration(queues, hand_size, queue_length_limit),
        )
    )
    return PriorityLevel(
        name,
        LevelType.LIMITED,
        limited=LimitedPriorityLevelConfiguration(response, shares, lendable, borrowing),
    )


def exempt(name: str = "exempt", shares: int = 0, lendable: int = 0) -> PriorityLevel:
    return PriorityLevel(
        name, LevelType.EXEMPT, exempt=ExemptPriorityLevelConfiguration(shares, lendable)
    )


def worked_example() -> list[PriorityLevel]:
    """The issue's example for ServerCL 100: NCS 30 / 10 / 0, lendablePercent 50 %,
    borrowingLimitPercent nil and 200 %, a jail, and the default Exempt level."""
    return [
        exempt(),
        limited("workload", 30, lendable=50, borrowing=None),
        limited("batch", 10, lendable=50, borrowing=200),
        limited("jail", 0, borrowing=0),
    ]
