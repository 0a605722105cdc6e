"""What a host's scheduler holds and decides (:mod:`kuikproxy.core.scheduler`): the operation
of a request, the :class:`Ticket` it waits on, the decision its arrival gets (:data:`Admission`)
and what a window does (:class:`WindowResult`, with the :class:`Read` it starts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from itertools import count

from kuikproxy.core.images import Image
from kuikproxy.core.limits import Refuse
from kuikproxy.core.windows import Outcome


class Operation(StrEnum):
    CHECK = "check"
    COPY = "copy"


_ticket_ids = count(1)


@dataclass(eq=False, slots=True)
class Ticket:
    """A request held by the scheduler until a window (or the end of its wait) releases it."""

    resource: str
    image: Image
    operation: Operation
    auth: str | None  # a key of the client's own Authorization (R5, P10), None when it has none
    since: float
    id: int = field(default_factory=lambda: next(_ticket_ids))


# -- decisions ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reuse:
    """Answer the request from the kept answer the runtime offered (R1)."""


@dataclass(frozen=True, slots=True)
class Pass:
    """Let the request go upstream now without a window (a follow-up, P10 and P9; a member of
    the open copy, P9). For a member of the open copy (``in_copy``), call
    :meth:`HostScheduler.copy_request_done` when it ends."""

    in_copy: bool = False


@dataclass(frozen=True, slots=True)
class Hold:
    ticket: Ticket


Admission = Reuse | Pass | Hold | Refuse


@dataclass(frozen=True, slots=True)
class Read:
    """Read ``image`` upstream now, for every ticket in ``tickets`` it can serve (R2).

    ``leader`` is the ticket whose turn it is (None for a prefetch read, P7). For a copy, the
    copy is open and every ticket in ``tickets`` is one of its requests in flight.
    """

    operation: Operation
    image: Image
    leader: Ticket | None
    tickets: tuple[Ticket, ...]
    at: float


@dataclass(frozen=True, slots=True)
class WindowResult:
    at: float
    outcome: Outcome
    read: Read | None = None
    lapsed: tuple[Ticket, ...] = ()  # standing asks that ended unread at this window (P11)
