"""FlowMachine under random event streams: invariants that hold after every event."""

from __future__ import annotations

from flowcontrol_levels import exempt, limited
from hypothesis import given, settings
from hypothesis import strategies as st

from kuikproxy.core.flowcontrol import FlowMachine, Queued, Rejected, Seated, seats

LEVELS = [
    exempt("exempt", shares=2, lendable=50),
    limited("a", 30, lendable=50, queues=8, hand_size=3, queue_length_limit=4),
    limited("b", 10, lendable=50, borrowing=200, queues=4, hand_size=2, queue_length_limit=3),
    limited("r", 5, lendable=100, reject=True),
    limited("jail", 0, borrowing=None, queues=2, hand_size=1, queue_length_limit=2),
]
NAMES = [level.name for level in LEVELS]
SERVER_CL = 10

events = st.lists(
    st.one_of(
        st.tuples(st.just("arrive"), st.sampled_from(NAMES), st.integers(0, 5)),
        st.tuples(st.just("finish"), st.sampled_from(NAMES), st.just(0)),
        st.tuples(st.just("cancel"), st.just(""), st.integers(0, 1000)),
    ),
    max_size=150,
)


@settings(max_examples=200, deadline=None)
@given(stream=events)
def test_invariants_hold_after_every_event(stream: list[tuple[str, str, int]]) -> None:
    """After every event: limits within their bounds and summing to no more than the seats;
    a level with requests waiting has every seat of its limit taken (nothing waits beside a
    free seat); exactly the tickets the machine queued and has not released or seen cancelled
    are waiting; and when everything running finishes and the jail's clients leave, every
    ticket has run and nothing is held."""
    control: FlowMachine[int] = FlowMachine(LEVELS, SERVER_CL, 0.0)
    table = seats(LEVELS, SERVER_CL)
    total = min(
        max(SERVER_CL, sum(s.floor for s in table.values())),
        sum(s.ceiling(SERVER_CL) for s in table.values()),
    )
    running = dict.fromkeys(NAMES, 0)
    waiting: dict[int, str] = {}
    ran: set[int] = set()
    now = 0.0

    def released(tickets: list[int]) -> None:
        for t in tickets:
            running[waiting.pop(t)] += 1
            ran.add(t)

    for n, (kind, level, arg) in enumerate(stream):
        now += 1.0
        if kind == "arrive":
            decision = control.arrive(level, f"flow-{arg}", n, now)
            if isinstance(decision, Seated):
                running[level] += 1
                ran.add(n)
            elif isinstance(decision, Queued):
                waiting[n] = level
            else:
                assert isinstance(decision, Rejected) and level != "exempt"
        elif kind == "finish" and running[level]:
            running[level] -= 1
            released(control.finish(level, now))
        elif kind == "cancel" and waiting:
            ticket = sorted(waiting)[arg % len(waiting)]
            del waiting[ticket]
            released(control.cancel(ticket, now))
        limits = {name: control.limit(name) for name in NAMES}
        assert sum(limits.values()) <= total
        for name in NAMES:
            assert table[name].floor <= limits[name] <= table[name].ceiling(SERVER_CL)
            assert control.executing(name) == running[name]
            assert control.waiting(name) == sum(1 for v in waiting.values() if v == name)
            if control.waiting(name):
                assert running[name] >= limits[name]
    # drain: the clients of the jail leave, everything running finishes
    for ticket in [t for t, level in waiting.items() if level == "jail"]:
        del waiting[ticket]
        released(control.cancel(ticket, now))
    while any(running.values()):
        level = next(name for name in NAMES if running[name])
        running[level] -= 1
        released(control.finish(level, now))
    assert waiting == {}
    assert control.stored() == 0
