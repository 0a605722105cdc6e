"""P11 standing asks, riders of a read in flight, and P9 copy follow-ups, on plain timelines."""

from __future__ import annotations

from timeline import Timeline, images, img

from kuikproxy.core.standing import RETRY_MARGIN
from kuikproxy.core.tickets import Hold, Pass, Reuse, Ticket
from kuikproxy.core.windows import Outcome

MIN = 60.0


def held(decision: object) -> Ticket:
    assert isinstance(decision, Hold)
    return decision.ticket


def test_p11_a_client_that_left_leaves_its_image_asked_until_a_window_reads_it() -> None:
    """The client of A's check goes away before the window: the image stays due (a standing
    ask), the window reads it, and A's retry is answered from that read (R1): the read was made
    for A, so it is newer than A's previous read, and the retry is A's read in this lap."""
    t = Timeline.start(0.0, check_interval=MIN)
    ticket = held(t.ask("A", "app:v1", 5.0))
    assert t.sched.stand(ticket, 15.0)
    assert t.sched.standing(ticket)
    result = t.window()
    assert result.outcome is Outcome.USED and t.read_keys() == ["app:v1"]
    assert not t.sched.standing(ticket)
    assert t.ring_view("A").images == 1
    assert isinstance(t.ask("A", "app:v1", 61.0), Reuse)  # the retry
    assert t.sched.ring("A").previous_read("app:v1") == 61.0


def test_p11_a_standing_ask_lapses_one_interval_after_its_lost_turn() -> None:
    """A standing ask whose turn is lost (the series busy with a read that never ends) ends
    one interval after the turn it was estimated at; the window that ends it says so
    (``lapsed``), and it is never read."""
    t = Timeline.start(0.0, check_interval=MIN)
    held(t.ask("A", "app:v0", 1.0))
    ticket = held(t.ask("A", "app:v1", 2.0))
    assert t.sched.stand(ticket, 3.0)  # its turn: the second window (t = 120)
    stuck = t.window(read=False)  # t = 60 reads v0, and never ends
    assert stuck.read is not None
    results = [t.window(read=False) for _ in range(3)]  # 120, 180, 240: busy
    assert [r.outcome for r in results] == [Outcome.BUSY] * 3
    assert [ticket in r.lapsed for r in results] == [False, False, True]  # 3 + 117 + 60 < 240
    assert not t.sched.standing(ticket)
    assert t.read_keys() == ["app:v0"]


def test_p11_at_most_one_standing_ask_per_resource_and_image() -> None:
    """A second client of the same resource leaving for the same image adds nothing: one
    standing ask, lasting until the later end; one read."""
    t = Timeline.start(0.0, check_interval=MIN)
    first = held(t.ask("A", "app:v1", 1.0))
    second = held(t.ask("A", "app:v1", 2.0))
    assert t.sched.stand(first, 3.0)
    assert not t.sched.stand(second, 4.0)
    assert t.sched.standing(first) and not t.sched.standing(second)
    t.run(3)
    assert t.read_keys() == ["app:v1"]


def test_p11_a_check_of_the_image_in_flight_rides_its_read() -> None:
    """A check that arrives while its image is being read (a client back on a ``Retry-After``
    pointing just after the window) is offered that read's answer: it is a rider of it."""
    t = Timeline.start(0.0, check_interval=MIN)
    held(t.ask("A", "app:v1", 1.0))
    result = t.window(read=False)
    assert result.read is not None
    rider = held(t.ask("B", "app:v1", 60.5))
    other = held(t.ask("B", "app:v2", 60.5))
    assert t.sched.riders(result.read) == (rider,)
    assert other not in t.sched.riders(result.read)
    t.finish(result.read, 61.0)
    assert t.sched.riders(result.read) == ()


def test_p7_retry_after_points_just_after_the_window_that_reads_the_image() -> None:
    """``Retry-After`` is the time until the window that reads the image, plus a margin: a
    client that obeys it arrives after that window, never just before."""
    t = Timeline.start(0.0, check_interval=MIN, max_hold=30.0)
    tickets = [held(d) for d in t.ask_all("A", images(3), 0.0)]
    assert t.sched.retry_after(tickets[2], 30.0) == 3 * MIN - 30.0 + RETRY_MARGIN


def test_p9_a_closed_copys_content_stays_reachable_for_copy_follow_up() -> None:
    """After the copy of app:v1 closes, its resource's blob and digest reads in that repository
    pass without a window (and outside any copy) for ``copy.followUp``; another resource's, or
    another repository's, wait for a window; after the follow-up they all do."""
    t = Timeline.start(0.0, check_interval=MIN, copy_interval=MIN, copy_idle=5.0,
                       copy_follow_up=600.0)  # fmt: skip
    s = t.sched
    s.copy("M", img("app:v1"), 0.0, opens=True)
    opened = s.copy_window(MIN)
    assert opened.read is not None
    s.copy_request_done(62.0)
    blob = img("app@sha256:" + "b" * 64)
    assert s.view(70.0).copy_open is None
    assert s.copy("M", blob, 70.0, opens=False) == Pass()
    assert s.copy("M", blob, 62.0 + 5.0 + 599.0, opens=False) == Pass()
    assert isinstance(s.copy("N", blob, 70.0, opens=False), Hold)
    assert isinstance(s.copy("M", img("other@sha256:" + "b" * 64), 70.0, opens=False), Hold)
    assert isinstance(s.copy("M", blob, 62.0 + 5.0 + 600.0, opens=False), Hold)
    assert isinstance(s.copy("M", img("app:v2"), 70.0, opens=True), Hold)  # a tag: its own
