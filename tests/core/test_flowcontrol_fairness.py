"""Fairness under a flood: fair queuing between queues, shuffle sharding against a heavy flow,
bounded parking and bounded memory (SPEC §10: "a flood is refused at the door")."""

from __future__ import annotations

import math
from collections import Counter, deque

from flowcontrol_levels import limited

from kuikproxy.core.flowcontrol import (
    FlowMachine,
    Queued,
    Rejected,
    RejectReason,
    Seated,
    flow_id,
    hand_for,
)

QUEUES, HAND, QLL = 64, 8, 50
FLOOD = flow_id("checks", "flood")


class Ticket:
    def __init__(self, flow: str, n: int, at: int) -> None:
        self.flow, self.n, self.at = flow, n, at
        self.mark = -1  # how many requests had been dispatched when this one arrived
        self.ran = -1.0  # when it was dispatched


def distinct_flow(prefix: str, avoid: str, queues: int = QUEUES, hand: int = HAND) -> str:
    """A flow whose hand has at least one queue outside ``avoid``'s hand (the usual case:
    two hands of 8 out of 64 share all eight queues with probability 1 / C(64, 8))."""
    taken = set(hand_for(avoid, queues, hand))
    for n in range(1000):
        flow = flow_id("checks", f"{prefix}-{n}")
        if set(hand_for(flow, queues, hand)) - taken:
            return flow
    raise AssertionError("no distinct hand")


class Run:
    """One level of ``concurrency`` seats; each step one running request (the oldest) ends."""

    def __init__(self, concurrency: int) -> None:
        self.control: FlowMachine[Ticket] = FlowMachine(
            [limited("checks", queues=QUEUES, hand_size=HAND, queue_length_limit=QLL)],
            concurrency,
            0.0,
        )
        self.running: deque[Ticket] = deque()
        self.dispatched: list[Ticket] = []
        self.rejected: Counter[str] = Counter()
        self.parked: Counter[str] = Counter()  # waiting requests per flow
        self.max_parked: Counter[str] = Counter()
        self.max_stored = 0

    def arrive(self, ticket: Ticket, now: float) -> None:
        ticket.mark = len(self.dispatched)
        decision = self.control.arrive("checks", ticket.flow, ticket, now)
        if isinstance(decision, Seated):
            ticket.ran = now
            self.running.append(ticket)
            self.dispatched.append(ticket)
        elif isinstance(decision, Rejected):
            assert decision.reason is RejectReason.QUEUE_FULL
            assert decision.retry_after > 0
            self.rejected[ticket.flow] += 1
        else:
            assert isinstance(decision, Queued)
            self.parked[ticket.flow] += 1
            self.max_parked[ticket.flow] = max(
                self.max_parked[ticket.flow], self.parked[ticket.flow]
            )
        self.max_stored = max(self.max_stored, self.control.stored())

    def step(self, now: float) -> None:
        self.running.popleft()
        released = self.control.finish("checks", now)
        for ticket in released:
            ticket.ran = now
            self.parked[ticket.flow] -= 1
        self.running.extend(released)
        self.dispatched.extend(released)


def test_a_quiet_flow_is_served_within_its_share_during_a_flood() -> None:
    """A flow sends 10,000 requests (10 per step) to a level of 4 seats while a second sends
    10, one every 100 steps; one request ends per step. The quiet flow finds a queue of its own
    and fair queuing gives it the next turn of the round: at most handSize (8) flood requests
    are dispatched before each of its requests, which wait at most 9 steps. The flood parks
    at most handSize × queueLengthLimit = 400 and is refused the rest at the door; what the
    level holds never exceeds queues × queueLengthLimit entries (plus its turn heap)."""
    mouse = distinct_flow("mouse", FLOOD)
    run = Run(concurrency=4)
    sent = 0
    for step in range(1000):
        for _ in range(10):
            run.arrive(Ticket(FLOOD, sent, step), float(step))
            sent += 1
        if step % 100 == 50:
            run.arrive(Ticket(mouse, step, step), float(step))
        run.step(step + 0.5)
    assert sent == 10_000
    mice = [(i, t) for i, t in enumerate(run.dispatched) if t.flow == mouse]
    assert len(mice) == 10 and run.rejected[mouse] == 0
    # flood requests dispatched after each quiet request arrived and before it ran
    ahead = [sum(1 for u in run.dispatched[t.mark : i] if u.flow == FLOOD) for i, t in mice]
    waits = [t.ran - t.at for _, t in mice]
    print(f"\nflood dispatched ahead of each quiet request: {ahead}")
    print(f"quiet request waits (steps): {waits}; distribution {sorted(Counter(waits).items())}")
    flood_dispatched = sum(1 for t in run.dispatched if t.flow == FLOOD)
    print(
        f"flood: {flood_dispatched} dispatched, {run.rejected[FLOOD]} rejected, "
        f"{run.max_parked[FLOOD]} parked at most; stored at most {run.max_stored}"
    )
    assert max(ahead) <= HAND
    assert max(waits) <= HAND + 1
    assert run.max_parked[FLOOD] == HAND * QLL
    assert run.rejected[FLOOD] >= 10_000 - flood_dispatched - HAND * QLL
    assert run.max_stored <= 2 * QUEUES * QLL + 3 * QUEUES
    assert run.max_stored <= 2 * HAND * QLL + 3 * QUEUES  # the flood's share, in fact


def test_a_burst_of_a_quiet_flow_spreads_over_its_hand() -> None:
    """The quiet flow sends its 10 at once in the middle of the flood: they spread over the
    queues of its hand the flood does not hold, each of which gets a turn per round, so all 10
    run before 8 · ceil(10 / its queues) flood requests have."""
    mouse = distinct_flow("burst", FLOOD)
    own = len(set(hand_for(mouse, QUEUES, HAND)) - set(hand_for(FLOOD, QUEUES, HAND)))
    run = Run(concurrency=4)
    n = 0
    for step in range(200):
        for _ in range(10):
            run.arrive(Ticket(FLOOD, n, step), float(step))
            n += 1
        if step == 100:
            for i in range(10):
                run.arrive(Ticket(mouse, i, step), float(step))
        run.step(step + 0.5)
    mark = next(t.mark for t in run.dispatched if t.flow == mouse)
    after = run.dispatched[mark:]
    last = max(i for i, t in enumerate(after) if t.flow == mouse)
    flood_ahead = sum(1 for t in after[:last] if t.flow == FLOOD)
    print(f"\nquiet flow holds {own} queues; flood dispatched before its last: {flood_ahead}")
    assert sum(1 for t in after if t.flow == mouse) == 10
    assert flood_ahead <= HAND * math.ceil(10 / own)


def test_idle_queues_accumulate_no_credit() -> None:
    """One seat, two flows with a queue each. A has been served 50 times alone when B comes
    with 5: B joins at the current virtual time, so the two alternate (B first, its start
    being the smaller) instead of B taking five turns in a row for the time it was idle."""
    queues, hand = 64, 1
    a = flow_id("s", "a")
    b = next(
        f
        for n in range(100)
        if hand_for(f := flow_id("s", f"b{n}"), queues, hand) != hand_for(a, queues, hand)
    )
    control: FlowMachine[Ticket] = FlowMachine(
        [limited("l", queues=queues, hand_size=hand, queue_length_limit=200)], 1, 0.0
    )
    for i in range(100):
        control.arrive("l", a, Ticket(a, i, 0), 0.0)
    order: list[str] = []
    for step in range(50):
        order += [t.flow for t in control.finish("l", float(step))]
    assert order == [a] * 50
    for i in range(5):
        assert isinstance(control.arrive("l", b, Ticket(b, i, 50), 50.0), Queued)
    order = []
    for step in range(10):
        order += [t.flow for t in control.finish("l", 51.0 + step)]
    assert order == [b, a] * 5
