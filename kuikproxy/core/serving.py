"""Whom one upstream read is sent for and whom its answer serves (R2, R5, P7, §11).

Pure decisions over the tickets of a :class:`~kuikproxy.core.tickets.Read`: the runtime
knows which tickets still have a client (or a standing ask, P11) and what each asked for, and
asks these functions what to send and whom to answer. Requests are seen only through the
questions asked of them, so the rules hold whatever the runtime's request type is.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from typing import Protocol, TypeVar

from kuikproxy.core.tickets import Operation, Read, Ticket


class Sent(Protocol):
    """What the choice of the request to send needs to know of a request."""

    @property
    def method(self) -> str: ...


R = TypeVar("R", bound=Sent)


def group(read: Read, pending: Container[Ticket]) -> list[Ticket]:
    """The tickets of ``read`` still ``pending`` (a client waits, or its ask stands, P11) that
    could stand in for its leader: those with the leader's credentials (R5). ``pending`` is a
    value the runtime made, not a question back to it: the core calls nothing above it."""
    auth = read.leader.auth if read.leader is not None else None
    return [t for t in read.tickets if t.auth == auth and t in pending]


def sender(read: Read, requests: Mapping[Ticket, R]) -> tuple[Ticket, bool] | None:
    """Whose request a read sends, and whether as a GET: the leader's (or, if its client just
    left, the first of its group's), turned into a GET when any GET of its group waits beside
    it, so that one answer serves both (R2, R3). ``requests`` are the group's, in read order;
    None when everyone it was for has left (P11: nothing is read)."""
    if not requests:
        return None
    first = read.leader if read.leader in requests else next(iter(requests))
    assert first is not None
    wants_get = requests[first].method == "HEAD" and any(
        r.method == "GET" for r in requests.values()
    )
    return first, wants_get


def served_by(
    candidates: Iterable[Ticket], sent: Ticket | None, serves: Callable[[Ticket], bool]
) -> list[Ticket]:
    """R2: the tickets an answer serves among ``candidates`` (still pending): the one whose
    request was sent, whatever the registry gave it (it negotiated with that request), and every
    other the answer ``serves`` (R3, R5)."""
    return [t for t in candidates if t is sent or serves(t)]


def outlasted(ticket: Ticket, max_hold: float, blocked_until: float | None) -> bool:
    """§11: whether a block outlasts a check's ``check.maxHold`` — it would be held in vain, and
    is refused at once instead."""
    return (
        ticket.operation is Operation.CHECK
        and max_hold > 0
        and blocked_until is not None
        and blocked_until > ticket.since + max_hold
    )


class Kept(Protocol):
    @property
    def read_at(self) -> float: ...


K = TypeVar("K", bound=Kept)


def newest_fresh(found: Sequence[K], oldest: float, serves: Callable[[K], bool]) -> K | None:
    """R1 across a fleet: of the answers other proxies read, the newest read no earlier than
    ``oldest`` (``cache.maxAge`` ago) that ``serves`` the request."""
    fresh = [a for a in found if a.read_at >= oldest and serves(a)]
    return max(fresh, key=lambda answer: answer.read_at, default=None)
