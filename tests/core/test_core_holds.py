"""P7, P8, P11: prefetch, held requests that wait too long or go away, ring membership."""

from __future__ import annotations

import dataclasses

from timeline import Timeline, images

from kuikproxy.core.hoststate import HostPacing
from kuikproxy.core.standing import RETRY_MARGIN
from kuikproxy.core.tickets import Hold, Reuse, Ticket
from kuikproxy.core.windows import Outcome

MIN = 60.0


def held(decision: object) -> Ticket:
    assert isinstance(decision, Hold)
    return decision.ticket


def test_p7_prefetch_reads_the_next_image_at_each_turn_without_a_request() -> None:
    """In prefetch mode every turn reads the ring's next image, in order and wrapping, with no
    request waiting: the Read has no leader and serves no ticket."""
    t = Timeline.start(0.0, check_interval=MIN, prefetch=True)
    keys = ["app/a:1", "app/b:1", "app/c:1"]
    t.ask_all("A", keys, 0.0)
    t.run(3)  # the three requests, answered
    assert not t.held
    t.run(4)
    assert t.read_keys() == [*keys, *keys, "app/a:1"]
    for read in t.reads[3:]:
        assert read.leader is None and read.tickets == ()
    assert t.sched.view(t.next_window).prefetch


def test_p7_prefetch_serves_a_request_from_the_fresh_answer() -> None:
    """A client with a short deadline finds the answer prefetched at the image's turn kept:
    its request is answered at once (R1), spending no window."""
    t = Timeline.start(0.0, check_interval=MIN, prefetch=True)
    t.sched.join("A", ["app/a:1", "app/b:1"], 0.0)
    t.run(2)
    assert [r.leader for r in t.reads] == [None, None]
    assert isinstance(t.ask("A", "app/b:1", 2.5 * MIN), Reuse)
    assert isinstance(t.ask("B", "app/a:1", 2.5 * MIN), Reuse)
    assert not t.held


def test_p7_two_prefetching_resources_on_the_same_images_read_each_once_per_lap() -> None:
    """A prefetch read kept for everyone counts for every ring: two resources prefetching the
    same 10 images read each image once per lap, laps of 10 windows."""
    t = Timeline.start(0.0, check_interval=MIN, prefetch=True)
    keys = images(10)
    t.sched.join("A", keys, 0.0)
    t.sched.join("B", keys, 0.0)
    t.run(32)
    for lap in range(3):
        assert sorted(t.read_keys()[lap * 10 : (lap + 1) * 10]) == keys
    assert t.ring_view("A").cycle_duration == t.ring_view("B").cycle_duration == 10 * MIN


def test_p7_max_hold_retry_after_estimates_the_time_until_the_turn() -> None:
    """A held request's ``Retry-After`` is the time until its image's turn: the next window
    plus one window per due image ahead of it (and never before a block ends)."""
    t = Timeline.start(0.0, check_interval=MIN, max_hold=30.0)
    tickets = [held(d) for d in t.ask_all("A", images(5), 0.0)]
    last = tickets[-1]
    # just after the window that reads it (P11)
    assert t.sched.retry_after(last, 10.0) == 290.0 + RETRY_MARGIN  # the 5th window, t = 300
    assert t.sched.retry_after(tickets[0], 10.0) == 50.0 + RETRY_MARGIN
    t.sched.block(until=1000.0)
    assert t.sched.retry_after(tickets[0], 10.0) == 990.0  # the block's end: it counts down


def test_p7_max_hold_cancelled_ticket_keeps_its_image_in_the_ring() -> None:
    """A request answered 429 after ``maxHold`` is cancelled; its image keeps its place in the
    ring (size and order unchanged), so a retry is read at its turn."""
    t = Timeline.start(0.0, check_interval=MIN, max_hold=30.0)
    tickets = [held(d) for d in t.ask_all("A", ["app/a:1", "app/b:1", "app/c:1"], 0.0)]
    assert t.sched.retry_after(tickets[1], 30.0) > 0
    t.sched.cancel(tickets[1])
    assert t.ring_view("A").images == 3
    assert "app/b:1" in t.sched.ring("A")
    t.window()
    t.ask("A", "app/b:1", t.next_window - 1)  # the client's retry
    t.run(2)
    assert t.read_keys() == ["app/a:1", "app/b:1", "app/c:1"]


def test_p8_image_leaves_the_ring_after_retention_without_a_request() -> None:
    """An image unasked for ``unusedImageRetention`` leaves the ring; one asked since stays;
    a ring left empty disappears from the view."""
    t = Timeline.start(0.0, check_interval=MIN, retention=3600.0)
    t.ask("A", "app/old:1", 0.0)
    t.ask("A", "app/new:1", 1800.0)
    t.run(60)  # up to t = 3600: nothing has been unused for more than an hour
    assert t.ring_view("A").images == 2
    t.run(1)  # t = 3660
    assert t.ring_view("A").images == 1
    assert "app/new:1" in t.sched.ring("A")
    t.run(30)  # t = 5460: app/new:1 unused since 1800
    assert all(r.resource != "A" for r in t.sched.view(t.next_window).rings)


def test_p8_image_asked_twice_counts_once() -> None:
    """A reference asked for twice (or as an origin and as an alternative) is one ring image."""
    t = Timeline.start(0.0, check_interval=MIN)
    t.ask("A", "app/a:1", 0.0)
    t.ask("A", "app/a:1", 1.0)
    t.ask("A", "app/b:1", 2.0)
    assert t.ring_view("A").images == 2
    t.run(3)
    assert t.read_keys() == ["app/a:1", "app/b:1"]
    assert len(t.reads[0].tickets) == 2  # both requests answered by the one read


def test_p8_waiting_image_is_not_expired() -> None:
    """An image with a request still waiting is being asked for: retention does not drop it."""
    t = Timeline.start(0.0, check_interval=MIN, retention=100.0)
    t.sched.block(until=300.0)
    t.ask("A", "app/a:1", 0.0)
    assert [r.outcome for r in t.run(4)] == [Outcome.BLOCKED] * 4
    assert t.ring_view("A").images == 1
    assert t.window().outcome is Outcome.USED


def test_p11_cancel_of_the_only_waiter_means_the_image_is_not_read() -> None:
    """A request whose client goes away stops waiting; with no other waiter its image is not
    read at its turn (hold mode): the window is idle."""
    t = Timeline.start(0.0, check_interval=MIN)
    ticket = held(t.ask("A", "app/a:1", 0.0))
    t.sched.cancel(ticket)
    assert t.sched.view(1.0).check_waiting == 0
    assert t.window().outcome is Outcome.IDLE
    assert t.ring_view("A").images == 1


def test_p11_cancel_of_one_waiter_leaves_the_others_waiting() -> None:
    """With another request (of the same or another resource) still waiting, the image is read
    at its turn for the ones that remain."""
    t = Timeline.start(0.0, check_interval=MIN)
    gone = held(t.ask("A", "app/a:1", 0.0))
    stays = held(t.ask("B", "app/a:1", 0.0))
    t.sched.cancel(gone)
    read = t.window().read
    assert read is not None and read.tickets == (stays,)
    assert read.leader is stays


def test_p11_request_cancelled_while_its_read_is_in_flight_does_not_strand_a_new_one() -> None:
    """A client goes away while its image is being read, then asks again before the read ends
    (the runtime still lists the first ticket as served): the new request waits for the next
    lap and is read then — the stale ticket does not take the new one's place among the ring's
    waiters."""
    t = Timeline.start(0.0, check_interval=MIN)
    first = held(t.ask("A", "app/a:1", 0.0))
    read = t.window(read=False).read
    assert read is not None and read.tickets == (first,)
    t.sched.cancel(first)
    t.held.pop(first.id)
    again = held(t.ask("A", "app/a:1", MIN + 10))
    t.finish(read, MIN + 20)
    assert t.sched.waiting(again.operation) == 1
    nxt = t.window().read
    assert nxt is not None and nxt.tickets == (again,)
    assert not t.held


def test_p12_interval_change_restarts_only_that_series_without_moving_cursors() -> None:
    """A reload that changes ``check.interval`` restarts the check series (first window a full
    new interval after the reload); the copy series keeps its times and no cursor moves."""
    t = Timeline.start(0.0, check_interval=MIN, copy_interval=MIN)
    t.ask_all("A", ["app/a:1", "app/b:1"], 0.0)
    t.window()
    old = t.sched.pacing
    new = HostPacing(**{**{f: getattr(old, f) for f in old.__slots__}, "check_interval": 300.0})
    t.sched.reconfigure(new, 90.0)
    assert t.next_window == 390.0
    assert t.sched.copy_series.next_window() == MIN
    assert t.cursor("A") == "app/a:1"
    t.sched.reconfigure(new, 100.0)  # an unchanged interval keeps its times
    assert t.next_window == 390.0


def test_p7_p12_switching_a_host_to_prefetch_prefetches_rings_without_requests() -> None:
    """A reload that turns a host from hold to prefetch makes every ring due at once: the next
    window reads the next image of a ring nobody is waiting on."""
    t = Timeline.start(0.0, check_interval=MIN)
    t.ask_all("A", ["app/a:1", "app/b:1"], 0.0)
    t.run(2)
    assert t.read_keys() == ["app/a:1", "app/b:1"]
    assert t.window().outcome is Outcome.IDLE  # hold: nothing waits
    t.sched.reconfigure(dataclasses.replace(t.sched.pacing, prefetch=True), 3 * MIN + 1)
    result = t.window()
    assert result.read is not None
    assert result.read.leader is None
    assert result.read.image.key == "app/a:1"
