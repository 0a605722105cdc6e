"""P4–P6: turns among resources, rings in byte-wise order, laps and their measured duration."""

from __future__ import annotations

import random

from timeline import Timeline, images

from kuikproxy.core.rings import lap_ratio
from kuikproxy.core.tickets import Hold
from kuikproxy.core.windows import Outcome

MIN = 60.0


def leaders(t: Timeline) -> list[str | None]:
    return [r.read.leader.resource if r.read and r.read.leader else None for r in t.results]


def test_p4_turns_round_robin_in_a_stable_order() -> None:
    """Resources with something due take the windows in turn, in their names' order whatever
    the order they arrived in."""
    t = Timeline.start(0.0, check_interval=MIN)
    for resource in ("C", "A", "B"):
        t.ask_all(resource, images(3, prefix=resource.lower()), 0.0)
    t.run(9)
    assert leaders(t) == ["A", "B", "C"] * 3


def test_p4_resource_with_nothing_due_is_skipped() -> None:
    """A resource whose ring has nothing due gives its turn to the next one: no window is lost
    for it. One that gets something due later rejoins at its place in the order."""
    t = Timeline.start(0.0, check_interval=MIN)
    t.ask_all("A", images(4, prefix="a"), 0.0)
    t.ask_all("C", images(4, prefix="c"), 0.0)
    t.ask("B", "b/only:1", 0.0)
    t.run(5)
    assert leaders(t) == ["A", "B", "C", "A", "C"]
    t.ask("B", "b/again:1", t.next_window - 1)
    t.run(3)
    assert leaders(t)[5:] == ["A", "B", "C"]
    assert all(r.outcome is Outcome.USED for r in t.results)


def test_p4_adding_a_resource_shares_the_budget() -> None:
    """The windows belong to the host: with a second resource the host still reads one image
    per window; the first resource gets half of them."""
    alone = Timeline.start(0.0, check_interval=MIN)
    alone.ask_all("A", images(20, prefix="a"), 0.0)
    alone.run(10)
    shared = Timeline.start(0.0, check_interval=MIN)
    shared.ask_all("A", images(20, prefix="a"), 0.0)
    shared.ask_all("B", images(20, prefix="b"), 0.0)
    shared.run(10)
    assert len(alone.reads) == len(shared.reads) == 10
    assert leaders(shared).count("A") == 5 and leaders(shared).count("B") == 5


def test_p5_one_resource_reads_its_images_in_byte_wise_order() -> None:
    """N HEADs arriving in any order are read in byte-wise order of ``repo:tag`` (capitals
    before lowercase, ``/`` before letters), not in arrival order."""
    keys = ["b/x:1", "a/z:1", "a/Z:1", "a:9", "a/y:10", "a/y:9", "ab/c:1", "a-b/c:1"]
    shuffled = keys[:]
    random.Random(7).shuffle(shuffled)
    t = Timeline.start(0.0, check_interval=MIN)
    t.ask_all("A", shuffled, 0.0)
    t.run(len(keys))
    assert t.read_keys() == sorted(keys, key=lambda k: k.encode())


def test_p5_request_answered_in_this_lap_waits_for_the_next_lap() -> None:
    """A request for an image already answered to the resource in the lap in progress waits
    until the ring wraps: the other images come first."""
    t = Timeline.start(0.0, check_interval=MIN)
    t.ask_all("A", ["app/a:1", "app/b:1", "app/c:1"], 0.0)
    t.window()
    again = t.ask("A", "app/a:1", t.next_window - 1)  # asked again right after its answer
    assert isinstance(again, Hold)
    t.run(3)
    assert t.read_keys() == ["app/a:1", "app/b:1", "app/c:1", "app/a:1"]


def test_p5_lap_ends_where_nothing_is_due_before_the_end_but_something_after_wrapping() -> None:
    """Cursor at ``c``, only ``a`` waiting: the turn finds nothing due after the cursor, so the
    lap ends at that window (cycleDuration measured) and the search goes on from the start."""
    t = Timeline.start(0.0, check_interval=MIN)
    t.ask_all("A", ["app/a:1", "app/b:1", "app/c:1", "app/d:1"], 0.0)
    t.run(3)  # a, b, c: cursor at c, d still waiting
    t.ask("A", "app/a:1", t.next_window - 1)
    t.window()  # d: before the end of the ring
    assert t.cursor("A") == "app/d:1"
    assert t.ring_view("A").cycle_duration is None
    t.ask("A", "app/b:1", t.next_window - 1)
    wrap = t.window()
    assert wrap.read is not None and wrap.read.image.key == "app/a:1"
    assert t.cursor("A") == "app/a:1"
    view = t.ring_view("A")
    assert view.cycle_started == wrap.at == 5 * MIN
    assert view.cycle_duration == 4 * MIN  # the first lap started at the first turn, 1m
    assert t.window().read is not None and t.read_keys()[-1] == "app/b:1"


def test_p6_alone_sixty_images_on_one_minute_lap_in_one_hour() -> None:
    """A resource alone on its host that keeps asking for its 60 images laps in
    60 × 1m = 1h, measured; the lap in progress started at the window that wrapped."""
    t = Timeline.start(0.0, reask=True, check_interval=MIN)
    t.ask_all("A", images(60), 0.0)
    t.run(60)
    assert t.ring_view("A").cycle_duration is None  # absent before the first full lap
    assert t.ring_view("A").cycle_started == MIN
    t.run(120)
    view = t.ring_view("A")
    assert view.images == 60
    assert view.cycle_duration == 3600.0
    assert view.cycle_started == 121 * MIN
    assert t.counts()["used"] == 180


def test_p6_sharing_the_host_lengthens_the_lap() -> None:
    """The same 60 images take two hours a lap when another resource with 60 other images
    shares the host's windows."""
    t = Timeline.start(0.0, reask=True, check_interval=MIN)
    t.ask_all("A", images(60, prefix="a"), 0.0)
    t.ask_all("B", images(60, prefix="b"), 0.0)
    t.run(360)
    assert t.ring_view("A").cycle_duration == 7200.0
    assert t.ring_view("B").cycle_duration == 7200.0


def test_p6_two_resources_asking_for_the_same_images_lap_in_n_windows() -> None:
    """Two resources asking again for the same 1000 images as soon as they are answered lap in
    1000 windows, not 2000 — each lap reads every image upstream exactly once — from their
    first lap on (the first lap starts at the resource's first turn)."""
    n = 1000
    t = Timeline.start(0.0, reask=True, check_interval=MIN)
    keys = images(n)
    t.ask_all("A", keys, 0.0)
    t.ask_all("B", keys, 0.0)
    t.run(n + 2)  # A's first turn is window 1, B's is window 2
    for resource in ("A", "B"):
        assert t.ring_view(resource).cycle_duration == n * MIN
    t.run(2 * n)
    for resource in ("A", "B"):
        assert t.ring_view(resource).cycle_duration == n * MIN
    for lap in range(3):
        assert sorted(t.read_keys()[lap * n : (lap + 1) * n]) == keys
    assert t.counts() == {
        "used": 3 * n + 2,
        "idle": 0,
        "busy": 0,
        "blocked": 0,
        "fleet": 0,
        "away": 0,
    }
    assert all(len(read.tickets) == 2 for read in t.reads)  # R2: one read serves both


def test_p5_request_answered_behind_the_cursor_waits_one_lap_and_is_never_starved() -> None:
    """An answer for an image the cursor already passed counts in the next lap; a request
    asked again for it is read in the lap after, even if nothing else is due (no starvation),
    and the lap that held nothing but that early answer is not measured as a lap."""
    t = Timeline.start(check_interval=60.0)
    t.ask("b", "app:b", 0.0)
    t.window()  # 60: b's first turn reads app:b; its cursor is now app:b
    t.ask("a", "app:a", 61.0)
    t.ask("b", "app:a", 61.0)  # b joins a's wait: answered by a's read, behind b's cursor
    t.window()  # 120: a's turn reads app:a, answering b too
    assert t.read_keys() == ["app:b", "app:a"]
    t.ask("b", "app:a", 121.0)  # b asks again: already answered for its next lap
    t.window()  # 180
    t.window()  # 240
    assert t.read_keys()[2:3] == ["app:a"], t.read_keys()
    assert not t.held
    assert t.ring_view("b").cycle_duration == 120.0  # 60 → 180, not a one-window lap


def test_p6_a_lap_that_starts_and_ends_at_one_turn_is_not_measured() -> None:
    """A resource answered everything by another's read before its first turn: its first turn
    starts a lap and wraps at once. That lap measured nothing; cycleDuration is not 0."""
    t = Timeline.start(check_interval=60.0)
    t.ask("web", "app:v1", 0.0)
    t.ask("batch", "app:v1", 0.0)
    t.window()  # 60: one read answers both (R2)
    t.ask("web", "app:v1", 61.0)  # web asks again: due in its next lap
    t.ask("batch", "app:v1", 61.0)
    t.window()  # 120
    t.window()  # 180
    for resource in ("web", "batch"):
        duration = t.ring_view(resource).cycle_duration
        assert duration is None or duration > 0, resource


def test_p6_lap_ratio_is_the_last_lap_against_its_best_case() -> None:
    """cycleDuration / (images × interval): 1 alone, 2 sharing evenly, None before a lap."""
    assert lap_ratio(3600.0, 60, 60.0) == 1.0
    assert lap_ratio(7200.0, 60, 60.0) == 2.0
    assert lap_ratio(None, 60, 60.0) is None
    assert lap_ratio(60.0, 0, 60.0) is None
