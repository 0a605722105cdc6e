"""Priority levels as ``flowcontrol.apiserver.k8s.io/v1`` spells them (SPEC §10).

The dataclasses mirror ``PriorityLevelConfigurationSpec`` field by field (snake_case for
camelCase), with the API's defaults, plus the level's ``name``. The config parses a file
straight into them; :mod:`.validation` states every rule they must meet. Nothing here raises on
construction, so every problem of a file can be reported at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class LevelType(StrEnum):
    EXEMPT = "Exempt"
    LIMITED = "Limited"


class LimitResponseType(StrEnum):
    QUEUE = "Queue"
    REJECT = "Reject"


@dataclass(frozen=True, slots=True)
class QueuingConfiguration:
    """How a ``Queue`` level queues (Kubernetes ``QueuingConfiguration``)."""

    queues: int = 64
    """Queues of the level; ``1`` turns shuffle sharding (and distinguishers) off."""
    hand_size: int = 8
    """Queues dealt to each flow, the shortest of which a request joins; ``<= queues``."""
    queue_length_limit: int = 50
    """Requests that may wait in one queue; more are rejected."""


@dataclass(frozen=True, slots=True)
class LimitResponse:
    """What a ``Limited`` level does with a request that cannot run now."""

    type: LimitResponseType
    """``Queue``: wait in the level's queues; ``Reject``: ``429`` at once."""
    queuing: QueuingConfiguration | None = None
    """The queues; set exactly when ``type`` is ``Queue`` (Kubernetes requires the block and
    defaults its fields: ``queuing: {}`` takes every default)."""


@dataclass(frozen=True, slots=True)
class LimitedPriorityLevelConfiguration:
    """The settings of a ``Limited`` level."""

    limit_response: LimitResponse
    """What to do with a request that cannot run now (required)."""
    nominal_concurrency_shares: int = 30
    """Shares of ServerCL: ``NominalCL = ceil(ServerCL · NCS / Σ NCS)``; ``0`` makes a jail."""
    lendable_percent: int = 0
    """Percent of its NominalCL that other levels may borrow."""
    borrowing_limit_percent: int | None = None
    """Most it may borrow, in percent of its NominalCL (may exceed 100); ``None`` is unlimited."""


@dataclass(frozen=True, slots=True)
class ExemptPriorityLevelConfiguration:
    """The settings of an ``Exempt`` level."""

    nominal_concurrency_shares: int = 0
    """Shares of ServerCL nominally reserved (it never limits an Exempt level's own requests)."""
    lendable_percent: int = 0
    """Percent of its NominalCL that other levels may borrow."""


@dataclass(frozen=True, slots=True)
class PriorityLevel:
    """One priority level: ``metadata.name`` and ``spec``.

    An ``Exempt`` level written without ``exempt`` gets the API's defaults on construction, so
    a valid level has exactly one of ``exempt`` and ``limited``, matching ``type``.
    """

    name: str
    """The level's name, which flow schemas refer to."""
    type: LevelType
    """``Exempt``: never queued, never paced; ``Limited``: gets a share of the seats."""
    exempt: ExemptPriorityLevelConfiguration | None = None
    limited: LimitedPriorityLevelConfiguration | None = None

    def __post_init__(self) -> None:
        if self.type == LevelType.EXEMPT and self.exempt is None:
            # Frozen: set the way the dataclass's own __init__ does.
            object.__setattr__(self, "exempt", ExemptPriorityLevelConfiguration())

    @property
    def settings(self) -> ExemptPriorityLevelConfiguration | LimitedPriorityLevelConfiguration:
        """``exempt`` or ``limited``, whichever the level's type reads (a valid level has it)."""
        settings = self.limited if self.type == LevelType.LIMITED else self.exempt
        assert settings is not None, f"invalid priority level {self.name!r}"
        return settings

    @property
    def shares(self) -> int:
        """The level's nominalConcurrencyShares."""
        return self.settings.nominal_concurrency_shares

    @property
    def lendable_percent(self) -> int:
        return self.settings.lendable_percent

    @property
    def queuing(self) -> QueuingConfiguration | None:
        """The queues of a Limited ``Queue`` level; None for Exempt and ``Reject`` levels."""
        if self.limited is None or self.limited.limit_response.type != LimitResponseType.QUEUE:
            return None
        return self.limited.limit_response.queuing
