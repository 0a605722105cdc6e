"""FlowMachine as a state machine: admission, queues, rejection, Exempt and Reject levels,
cancellation, limits that follow demand, and the conditions /status shows."""

from __future__ import annotations

from flowcontrol_levels import exempt, limited, worked_example

from kuikproxy.core.flowcontrol import (
    FlowMachine,
    LevelView,
    Place,
    PriorityLevel,
    Queued,
    Rejected,
    RejectReason,
    Seated,
    flow_id,
    hand_for,
)


class T:
    """An opaque ticket, as the runtime's are."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


def fc(levels: list[PriorityLevel], server_cl: int) -> FlowMachine[T]:
    return FlowMachine(levels, server_cl, 0.0)


def view(control: FlowMachine[T], name: str) -> LevelView:
    return next(v for v in control.snapshot() if v.name == name)


def test_least_loaded_queue_of_the_hand_ties_to_hand_order() -> None:
    """One seat, 8 queues, hands of 4: a flow's waiting requests go to its hand's queues in
    hand order while they are empty, then to the shortest, ties to the first in hand order."""
    control = fc([limited("l", queues=8, hand_size=4)], 1)
    flow = flow_id("s", "a")
    hand = hand_for(flow, 8, 4)
    assert control.arrive("l", flow, T("run"), 0.0) == Seated()
    placed = [control.arrive("l", flow, T(f"w{i}"), 0.0) for i in range(6)]
    assert placed == [Queued(q) for q in [*hand, hand[0], hand[1]]]
    # another flow sharing queues avoids the longer ones
    other = next(
        f for n in range(100) if set(hand_for(f := flow_id("s", f"o{n}"), 8, 4)) & set(hand)
    )
    decision = control.arrive("l", other, T("o"), 0.0)
    assert isinstance(decision, Queued)
    lengths = {q: (2 if q in hand[:2] else 1 if q in hand else 0) for q in range(8)}
    assert lengths[decision.queue] == min(lengths[q] for q in hand_for(other, 8, 4))


def test_queue_length_limit_rejects_at_the_door() -> None:
    """Hand of 2, queueLengthLimit 3, one seat: a flow parks at most 2 × 3 requests; the next
    is Rejected(queue-full) with a retry estimate, and nothing of it is kept."""
    control = fc([limited("l", queues=4, hand_size=2, queue_length_limit=3)], 1)
    flow = flow_id("s", "flood")
    assert control.arrive("l", flow, T("run"), 0.0) == Seated()
    for i in range(6):
        assert isinstance(control.arrive("l", flow, T(f"w{i}"), 0.0), Queued)
    refused = control.arrive("l", flow, T("x"), 0.0)
    assert refused == Rejected(RejectReason.QUEUE_FULL, 2.0)  # no pace known: 1 s × 2 queues
    assert control.waiting("l") == 6
    assert view(control, "l").rejected == {
        RejectReason.QUEUE_FULL: 1,
        RejectReason.CONCURRENCY_LIMIT: 0,
    }
    assert control.stored() <= 2 * 6 + 4


def test_retry_estimate_follows_the_pace_of_finishes() -> None:
    """Once finishes have been seen while the level was busy, the estimate is the mean time
    between them times the queues that take turns before the flow's gets room."""
    control = fc([limited("l", queues=4, hand_size=1, queue_length_limit=1)], 1)
    flow = flow_id("s", "a")
    control.arrive("l", flow, T("run"), 0.0)
    for i, now in enumerate([0.5, 1.0, 1.5, 2.0]):
        control.arrive("l", flow, T(f"w{i}"), now - 0.1)
        assert control.finish("l", now) != []
    assert control.arrive("l", flow, T("w"), 2.0) == Queued(hand_for(flow, 4, 1)[0])
    assert control.arrive("l", flow, T("x"), 2.0) == Rejected(RejectReason.QUEUE_FULL, 0.5)


def test_reject_level_never_queues() -> None:
    """A Reject level admits while a seat is free and refuses (concurrency-limit) otherwise;
    a finish frees a seat but releases nobody: nothing waits."""
    control = fc([limited("catch-all", 5, reject=True)], 2)
    flow = flow_id("catch-all", "x")
    assert [control.arrive("catch-all", flow, T(str(i)), 0.0) for i in range(3)] == [
        Seated(),
        Seated(),
        Rejected(RejectReason.CONCURRENCY_LIMIT, 1.0),
    ]
    assert control.waiting("catch-all") == 0
    assert control.finish("catch-all", 1.0) == []
    assert control.arrive("catch-all", flow, T("again"), 1.0) == Seated()


def test_exempt_level_is_always_admitted_and_limits_nobody() -> None:
    """P14: Exempt requests never queue nor wait, however many run, and take no seat from a
    Limited level (NCS 0: NominalCL 0, nothing reserved)."""
    control = fc([exempt(), limited("checks", reject=True)], 2)
    for i in range(1000):
        assert control.arrive("exempt", "e", T(f"e{i}"), 0.0) == Seated()
    assert control.arrive("checks", "c", T("c1"), 0.0) == Seated()
    assert control.arrive("checks", "c", T("c2"), 0.0) == Seated()
    assert view(control, "exempt").executing == 1000
    assert view(control, "exempt").in_queue == 0
    assert control.finish("exempt", 1.0) == []
    saturated = next(c for c in view(control, "exempt").conditions if c.type == "Saturated")
    assert (saturated.status, saturated.reason) == ("False", "Exempt")


def test_cancel_removes_a_waiting_ticket_and_ignores_others() -> None:
    """A waiting client that leaves is never dispatched; cancelling a ticket that is not
    waiting (running, rejected, unknown) changes nothing."""
    control = fc([limited("l", queues=4, hand_size=2)], 1)
    running, a, b = T("running"), T("a"), T("b")
    control.arrive("l", "f", running, 0.0)
    control.arrive("l", "f", a, 0.0)
    control.arrive("l", "f", b, 0.0)
    assert control.cancel(a, 1.0) == []
    assert control.cancel(a, 1.0) == []
    assert control.cancel(running, 1.0) == []
    assert control.waiting("l") == 1
    assert control.finish("l", 2.0) == [b]
    assert control.finish("l", 3.0) == []
    assert control.stored() == 0


def test_borrowing_and_lending_follow_demand() -> None:
    """The worked example through the machine (ServerCL 100):

    * 100 workload requests: limits 88 / 12 (batch lends its 13): 88 run, 12 queue;
    * 30 batch requests: 12 run at batch's floor; as batch's demand grows workload's limit
      falls (100·100/130 = 76.9 → 77) — batch's rise waits for the next finish, since an
      arrival never releases others;
    * a workload finish: limits 77 / 23, the 11 batch requests now allowed run at once;
    * workload drains: batch alone wants 30 of its ceiling 75 and runs them all.
    """
    control = fc(worked_example(), 100)
    work = [T(f"w{i}") for i in range(100)]
    decisions = [
        control.arrive("workload", flow_id("wl", str(i)), t, 0.0) for i, t in enumerate(work)
    ]
    assert decisions.count(Seated()) == 88
    assert (control.limit("workload"), control.limit("batch")) == (88, 12)
    batch = [T(f"b{i}") for i in range(30)]
    decisions = [control.arrive("batch", flow_id("b", str(i)), t, 1.0) for i, t in enumerate(batch)]
    assert decisions.count(Seated()) == 12
    assert (control.limit("workload"), control.limit("batch")) == (77, 12)
    released = control.finish("workload", 2.0)
    assert (control.limit("workload"), control.limit("batch")) == (77, 23)
    assert released == [t for t in batch if t in released] and len(released) == 11
    assert control.executing("batch") == 23
    while control.executing("workload"):
        control.finish("workload", 3.0)
    assert control.waiting("workload") == 0
    assert control.executing("batch") == 30
    assert control.waiting("batch") == 0
    total = control.limit("workload") + control.limit("batch") + control.limit("jail")
    assert total == 100


def test_cancel_of_a_flood_hands_its_seats_back() -> None:
    """Queued demand counts: workload's 412 queued requests push batch to its floor 12; when
    their clients leave, the cancels hand seats back — the 88 running workload requests and
    batch's 20 share 100 as 81.5 / 18.5 → 81 / 19 — and release 7 of batch's waiting requests."""
    control = fc(worked_example(), 100)
    flood = [T(f"w{i}") for i in range(500)]
    for i, t in enumerate(flood):
        control.arrive("workload", flow_id("wl", str(i % 50)), t, 0.0)
    for i in range(20):
        control.arrive("batch", flow_id("b", str(i)), T(f"b{i}"), 0.0)
    assert control.limit("batch") == 12
    assert control.executing("batch") == 12
    released: list[T] = []
    for t in flood:
        released += control.cancel(t, 1.0)
    assert len(released) == 7
    assert (control.limit("workload"), control.limit("batch")) == (81, 19)
    assert control.executing("batch") == 19


def test_conditions_report_sharing_and_saturation_with_transition_times() -> None:
    """ConcurrencyShared is Borrowing while a level runs more than NominalCL and Lending while
    its limit is below it; Saturated is RequestsQueued while requests wait. The transition
    time moves only when a status changes."""
    control = fc(worked_example(), 100)

    def condition(level: str, kind: str) -> tuple[str, str, float]:
        c = next(c for c in view(control, level).conditions if c.type == kind)
        return c.status, c.reason, c.last_transition_time

    assert condition("workload", "ConcurrencyShared") == ("False", "NotShared", 0.0)
    assert condition("batch", "ConcurrencyShared") == ("True", "Lending", 0.0)  # 24 < 25
    assert condition("workload", "Saturated") == ("False", "SeatsAvailable", 0.0)
    tickets = [T(str(i)) for i in range(90)]
    for i, t in enumerate(tickets):
        control.arrive("workload", flow_id("wl", str(i)), t, 5.0)
    assert condition("workload", "ConcurrencyShared") == ("True", "Borrowing", 5.0)
    assert condition("workload", "Saturated") == ("True", "RequestsQueued", 5.0)
    assert condition("batch", "ConcurrencyShared") == ("True", "Lending", 0.0)
    control.finish("workload", 7.0)  # a queued one takes the seat: still saturated
    assert condition("workload", "Saturated") == ("True", "RequestsQueued", 5.0)
    control.finish("workload", 8.0)
    assert condition("workload", "Saturated") == ("True", "AllSeatsBusy", 5.0)
    control.finish("workload", 9.0)
    assert condition("workload", "Saturated") == ("False", "SeatsAvailable", 9.0)
    v = view(control, "workload")
    assert (v.nominal_cl, v.lendable_cl, v.borrowing_cl, v.current_cl) == (75, 38, None, 88)
    assert (v.in_queue, v.executing, v.dispatched, sum(v.rejected.values())) == (0, 87, 90, 0)


def test_a_jail_holds_requests_until_they_leave() -> None:
    """NCS 0 and no borrowing: limit 0, so its requests queue (bounded) and never run; their
    clients' cancels take them out."""
    control = fc(worked_example(), 100)
    t = T("j")
    assert isinstance(control.arrive("jail", "x", t, 0.0), Queued)
    control.arrive("workload", "w", T("w"), 1.0)
    assert control.finish("workload", 1.5) == []
    assert control.cancel(t, 2.0) == []
    assert control.waiting("jail") == 0


# -- places: requests that wait for their window (SPEC §10) ------------------------------------


def test_parked_requests_hold_places_and_a_full_hand_refuses_the_next() -> None:
    """Hand of 2, queueLengthLimit 3: a flow parks at most 2 × 3 requests waiting for their
    windows, in its hand's queues, least loaded first; the seventh is refused at the door."""
    control = fc([limited("l", queues=4, hand_size=2, queue_length_limit=3)], 1)
    flow = flow_id("s", "flood")
    hand = hand_for(flow, 4, 2)
    places = [control.park("l", flow) for _ in range(6)]
    assert places == [Place("l", q) for q in [*hand, *hand, *hand]]
    refused = control.park("l", flow)
    assert isinstance(refused, Rejected) and refused.reason is RejectReason.QUEUE_FULL
    v = view(control, "l")
    assert (v.parked, v.in_queue, v.executing, v.rejected[RejectReason.QUEUE_FULL]) == (6, 0, 0, 1)
    control.unpark(places[0])
    assert control.park("l", flow) == Place("l", hand[0])


def test_parking_wants_no_seat_and_moves_no_limit() -> None:
    """Parked requests are not demand: a parked flow's level keeps lending its seats, and a
    request arriving for a seat is admitted while thousands are parked beside it."""
    control = fc(
        [
            limited("a", shares=50, lendable=50, queue_length_limit=2000),
            limited("b", shares=50),
        ],
        10,
    )
    idle = (control.limit("a"), control.limit("b"))
    for i in range(500):
        assert isinstance(control.park("a", flow_id("s", f"r{i % 7}")), Place)
    assert (control.limit("a"), control.limit("b")) == idle == (3, 7)  # a lends as if idle
    assert control.arrive("a", flow_id("s", "r0"), T("go"), 0.0) == Seated()
    assert (view(control, "a").parked, control.executing("a")) == (500, 1)


def test_parked_places_count_against_a_flows_seat_queue() -> None:
    """A place is a place: a flow whose hand is full of parked requests cannot also queue for a
    seat there — what one flow holds in kuikproxy stays within its hand."""
    control = fc([limited("l", queues=4, hand_size=2, queue_length_limit=2)], 1)
    flow = flow_id("s", "f")
    assert control.arrive("l", flow_id("s", "other"), T("run"), 0.0) == Seated()
    for _ in range(4):
        assert isinstance(control.park("l", flow), Place)
    refused = control.arrive("l", flow, T("x"), 0.0)
    assert isinstance(refused, Rejected) and refused.reason is RejectReason.QUEUE_FULL


def test_a_reject_level_parks_as_many_as_it_has_seats() -> None:
    """A Reject level has no queues: as many requests may wait for their windows as it has
    seats now; an Exempt level never refuses a place."""
    control = fc([limited("r", shares=1, reject=True), exempt("e")], 3)
    assert [control.park("r", "f") for _ in range(3)] == [Place("r", -1)] * 3
    refused = control.park("r", "f")
    assert isinstance(refused, Rejected) and refused.reason is RejectReason.CONCURRENCY_LIMIT
    assert all(control.park("e", "f") == Place("e", -1) for _ in range(100))
    control.unpark(Place("r", -1))
    assert control.park("r", "f") == Place("r", -1)
