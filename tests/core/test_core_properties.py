"""Properties of the check scheduler over random arrival streams of several resources."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from timeline import Timeline

from kuikproxy.core.tickets import Operation, Read
from kuikproxy.core.windows import Outcome

INTERVAL = 60.0
RESOURCES = ["r0", "r1", "r2"]
KEYS = ["app/a:1", "app/b:1", "app/c:1", "app/d:1", "lib/x:1"]

events = st.lists(
    st.one_of(
        st.tuples(
            st.just("ask"),
            st.sampled_from(RESOURCES),
            st.sampled_from(KEYS),
            st.sampled_from([None, None, "secret"]),
        ),
        st.tuples(st.just("cancel"), st.integers(0, 99)),
        # a window, and how long its read (if any) takes, in intervals
        st.tuples(st.just("window"), st.sampled_from([0.0, 0.3, 1.5, 2.5])),
    ),
    max_size=60,
)


@pytest.mark.parametrize("prefetch", [False, True], ids=["hold", "prefetch"])
@settings(max_examples=150, deadline=None)
@given(stream=events)
def test_scheduler_properties_for_random_arrival_streams(
    prefetch: bool, stream: list[tuple[object, ...]]
) -> None:
    """(a) at most one Read per window and never two in flight: a window that finds the
    previous read in flight is busy; (b) in hold mode no Read is made for an image nobody waits
    for: its leader is a waiting request of the turn's resource, every ticket waits for that
    image; (c) once requests stop arriving, every held ticket is served within a bounded number
    of windows."""
    t = Timeline.start(0.0, check_interval=INTERVAL, prefetch=prefetch)
    pending: list[tuple[float, Read]] = []
    now = 0.0

    def settle(until: float) -> None:
        pending.sort(key=lambda p: p[0])
        while pending and pending[0][0] <= until:
            done, read = pending.pop(0)
            t.finish(read, done)

    def window(duration: float) -> None:
        nonlocal now
        now = t.next_window
        settle(now)
        in_flight = bool(pending)
        result = t.window(read=False)
        if in_flight:
            assert result.outcome is Outcome.BUSY
        read = result.read
        assert (read is not None) == (result.outcome is Outcome.USED)
        if read is None:
            return
        if not prefetch:
            assert read.leader is not None and read.leader in read.tickets
        for ticket in read.tickets:
            assert ticket.id in t.held
            assert ticket.image.key == read.image.key
        if duration == 0.0:
            t.finish(read, now)
        else:
            pending.append((now + duration * INTERVAL, read))

    for event in stream:
        if event[0] == "window":
            assert isinstance(event[1], float)
            window(event[1])
            continue
        now = min(now + INTERVAL / 7, t.next_window - 0.001)
        settle(now)
        if event[0] == "ask":
            _, resource, key, auth = event
            assert isinstance(resource, str) and isinstance(key, str)
            assert auth is None or isinstance(auth, str)
            t.ask(resource, key, now, auth=auth)
        elif t.held:
            assert isinstance(event[1], int)
            ticket = list(t.held.values())[event[1] % len(t.held)]
            t.sched.cancel(ticket)
            del t.held[ticket.id]

    # requests stop: every held ticket is served, within a bound
    bound = 4 * (len(t.held) + len(RESOURCES)) + 10
    for _ in range(bound):
        if not t.held and not pending:
            break
        window(0.0)
    assert not t.held, f"still held after {bound} windows: {list(t.held.values())}"
    assert t.sched.waiting(Operation.CHECK) == 0
