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


class Waiting:
    """The tickets waiting for each image key, in the order they came.

    Most images have one waiting ticket (a held request costs what it holds): it is kept as
    it is, and a dict is made only when a second ticket waits for the same image (and let go
    when one is left)."""

    __slots__ = ("_by_key",)

    def __init__(self) -> None:
        self._by_key: dict[str, Ticket | dict[Ticket, None]] = {}

    def __bool__(self) -> bool:
        return bool(self._by_key)

    def images(self) -> list[str]:
        """The keys of the images with waiting tickets."""
        return list(self._by_key)

    def add(self, ticket: Ticket) -> None:
        key = ticket.image.key
        found = self._by_key.get(key)
        if found is None:
            self._by_key[key] = ticket
        elif isinstance(found, Ticket):
            self._by_key[key] = {found: None, ticket: None}
        else:
            found[ticket] = None

    def of(self, key: str) -> tuple[Ticket, ...]:
        found = self._by_key.get(key)
        if found is None:
            return ()
        return (found,) if isinstance(found, Ticket) else tuple(found)

    def __contains__(self, ticket: Ticket) -> bool:
        found = self._by_key.get(ticket.image.key)
        return found is ticket or (isinstance(found, dict) and ticket in found)

    def release(self, ticket: Ticket) -> bool:
        """``ticket`` stops waiting; False when it was not waiting."""
        key = ticket.image.key
        found = self._by_key.get(key)
        if found is ticket:
            del self._by_key[key]
            return True
        if not isinstance(found, dict) or ticket not in found:
            return False
        del found[ticket]
        if len(found) == 1:
            self._by_key[key] = next(iter(found))
        return True

    def pop(self, key: str) -> tuple[Ticket, ...]:
        """Every ticket waiting for ``key``, which stop waiting."""
        tickets = self.of(key)
        self._by_key.pop(key, None)
        return tickets

    def count(self) -> int:
        return sum(1 if isinstance(t, Ticket) else len(t) for t in self._by_key.values())


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
