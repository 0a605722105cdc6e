"""Whom one read is sent for and whom its answer serves (R2, R3, R5, P11, §11): the pure
decisions of :mod:`kuikproxy.core.serving`, over plain tickets and requests."""

from __future__ import annotations

from dataclasses import dataclass

from kuikproxy.core.images import Image
from kuikproxy.core.serving import group, newest_fresh, outlasted, sender, served_by
from kuikproxy.core.tickets import Operation, Read, Ticket

IMAGE = Image("r.example", "app", "v1")


@dataclass(frozen=True)
class Asked:
    method: str


@dataclass(frozen=True)
class Kept:
    read_at: float
    name: str


def ticket(
    resource: str, auth: str | None = None, *, check: bool = True, since: float = 0.0
) -> Ticket:
    operation = Operation.CHECK if check else Operation.COPY
    return Ticket(resource, IMAGE, operation, auth, since)


def read(leader: Ticket | None, *others: Ticket) -> Read:
    tickets = (leader, *others) if leader is not None else others
    return Read(Operation.CHECK, IMAGE, leader, tickets, 10.0)


def test_the_group_is_the_pending_tickets_with_the_leaders_credentials() -> None:
    """R5: only requests with the leader's credentials may stand in for it."""
    a, b, c, d = ticket("a"), ticket("b", "alice"), ticket("c"), ticket("d")
    gone = {d}
    assert group(read(a, b, c, d), {a, b, c, d} - gone) == [a, c]


def test_a_prefetch_read_groups_the_anonymous_tickets() -> None:
    a, b = ticket("a"), ticket("b", "bob")
    assert group(read(None, a, b), {a, b}) == [a]


def test_the_leaders_request_is_sent_turned_into_a_get_when_a_get_waits_beside_it() -> None:
    """R2, R3: a GET's answer serves a HEAD, not the other way round."""
    a, b = ticket("a"), ticket("b")
    r = read(a, b)
    assert sender(r, {a: Asked("HEAD"), b: Asked("HEAD")}) == (a, False)
    assert sender(r, {a: Asked("HEAD"), b: Asked("GET")}) == (a, True)
    assert sender(r, {a: Asked("GET"), b: Asked("HEAD")}) == (a, False)


def test_a_leader_that_left_is_stood_in_for_by_the_first_of_its_group() -> None:
    """P11: the read goes for those still there; nobody left, nothing is read."""
    a, b, c = ticket("a"), ticket("b"), ticket("c")
    assert sender(read(a, b, c), {b: Asked("HEAD"), c: Asked("HEAD")}) == (b, False)
    assert sender(read(a, b), {}) is None


def test_the_sent_request_is_served_whatever_the_answer_others_only_if_it_serves_them() -> None:
    a, b, c = ticket("a"), ticket("b"), ticket("c")
    assert served_by([a, b, c], a, lambda t: t is c) == [a, c]
    assert served_by([a, b, c], None, lambda t: False) == []


def test_a_block_outlasts_a_check_only_beyond_its_max_hold() -> None:
    """§11: a check whose maxHold ends before the block is refused at once."""
    held = ticket("a", since=100.0)
    assert outlasted(held, 30.0, 131.0)
    assert not outlasted(held, 30.0, 130.0)
    assert not outlasted(held, 0.0, 10_000.0)  # no maxHold: held through any block
    assert not outlasted(held, 30.0, None)
    assert not outlasted(ticket("c", check=False, since=100.0), 30.0, 1_000.0)  # copies wait


def test_the_fleets_answer_is_the_newest_fresh_one_that_serves() -> None:
    """R1 across a fleet: older than maxAge, or not serving the request, is not an answer."""
    found = [Kept(5.0, "old"), Kept(20.0, "new"), Kept(30.0, "other's"), Kept(15.0, "mid")]
    chosen = newest_fresh(found, 10.0, lambda k: k.name != "other's")
    assert chosen == Kept(20.0, "new")
    assert newest_fresh(found, 40.0, lambda k: True) is None
