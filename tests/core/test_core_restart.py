"""P13: a ring's state as plain values, brought back after a restart, and the changes a store
writes. A restart is played as a new scheduler whose series start at the restart (P1), with the
old scheduler's rings restored into it; both clocks are the same timeline's."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from timeline import HOST, Timeline, images

from kuikproxy.core.rings import Ring
from kuikproxy.core.ringstate import EntryState, RingChanges, RingHeader, RingState
from kuikproxy.core.scheduler import HostScheduler
from kuikproxy.core.tickets import Hold
from kuikproxy.core.tracked import TrackedRing

MIN = 60.0


def restart(t: Timeline, at: float, *, track: bool = False) -> Timeline:
    """The process dies and a new one starts at ``at`` with ``t``'s rings restored."""
    saved = t.sched.export()
    new = Timeline(HostScheduler(HOST, t.sched.pacing, at), t.reask)
    if track:
        new.sched.track_changes()
    for resource, state in saved:
        new.sched.restore(resource, state)
    return new


def test_p13_export_and_restore_round_trip() -> None:
    """A ring exported, restored into a new scheduler and exported again is the same ring:
    header, and every image with its last ask, last answer and lap, in last-asked order."""
    t = Timeline.start(0.0, check_interval=MIN)
    t.ask_all("A", ["app/c:1", "app/a:1", "app/b:1"], 0.0)
    t.ask("B", "lib/x:1", 10.0)
    t.run(3)
    t.ask("A", "app/a:1", t.next_window - 1)  # answered: waits for the next lap
    saved = dict(t.sched.export())
    assert saved["A"].header == RingHeader("app/b:1", 0, MIN, None)
    assert [e.image for e in saved["A"].entries] == ["app/c:1", "app/b:1", "app/a:1"]
    assert saved["A"].entries[-1] == EntryState("app/a:1", t.next_window - 1, MIN, 0)
    again = restart(t, 500.0)
    assert dict(again.sched.export()) == saved
    view = again.ring_view("A")
    assert (view.images, view.cursor, view.cycle_started) == (3, "app/b:1", MIN)


def test_p13_a_restored_ring_resumes_after_its_cursor() -> None:
    """Killed after two of five images: the new process, its first window a full interval
    after it started (P1), reads the third, fourth and fifth, then wraps to the first."""
    keys = images(5)
    t = Timeline.start(0.0, reask=True, check_interval=MIN)
    t.ask_all("A", keys, 0.0)
    t.run(2)
    assert t.read_keys() == keys[:2]
    again = restart(t, 150.0)
    again.reask = True
    again.ask_all("A", keys, 150.0)  # the clients ask again, all of them
    assert again.next_window == 150.0 + MIN
    again.run(4)
    assert again.read_keys() == [*keys[2:], keys[0]]


def test_p13_an_image_done_in_the_lap_in_progress_is_not_due_again_in_it() -> None:
    """An image read before the restart, asked for again after it, waits for the next lap:
    the restart does not make it due twice in one lap."""
    t = Timeline.start(0.0, check_interval=MIN)
    t.ask_all("A", ["app/a:1", "app/b:1", "app/c:1"], 0.0)
    t.window()
    again = restart(t, 100.0)
    assert isinstance(again.ask("A", "app/a:1", 100.0), Hold)
    again.ask_all("A", ["app/b:1", "app/c:1"], 100.0)
    again.run(3)
    assert again.read_keys() == ["app/b:1", "app/c:1", "app/a:1"]


def test_p13_the_lap_in_progress_counts_the_downtime() -> None:
    """Lap started at the first turn (1m); down from 2m30 to 16m40; three more windows and
    the wrap: the lap took from 1m to the wrap, the gap included."""
    keys = images(5)
    t = Timeline.start(0.0, reask=True, check_interval=MIN)
    t.ask_all("A", keys, 0.0)
    t.run(2)
    again = restart(t, 1000.0)
    again.reask = True
    again.ask_all("A", keys, 1000.0)
    again.run(3)
    assert again.ring_view("A").cycle_duration is None
    wrap = again.window()
    assert wrap.at == 1000.0 + 4 * MIN
    view = again.ring_view("A")
    assert view.cycle_duration == wrap.at - MIN
    assert view.cycle_started == wrap.at


def test_p13_an_answer_behind_the_cursor_still_counts_for_the_next_lap() -> None:
    """An image answered behind the cursor (by another resource's read) is done for the next
    lap; restored, it still is: that lap skips it."""
    t = Timeline.start(0.0, check_interval=MIN)
    t.ask_all("A", ["app/a:1", "app/b:1", "app/c:1"], 0.0)
    t.run(2)  # A: a, b; cursor at b
    t.ask("B", "app/a:1", t.next_window - 1)
    t.ask("A", "app/a:1", t.next_window - 1)  # waits beside B's request: answered by B's read
    t.run(2)  # A's turn: c; B's turn: a, answering A's request too (R2), behind A's cursor
    assert t.read_keys() == ["app/a:1", "app/b:1", "app/c:1", "app/a:1"]
    again = restart(t, 1000.0)
    again.ask_all("A", ["app/a:1", "app/b:1", "app/c:1"], 1000.0)
    again.run(3)
    assert again.read_keys() == ["app/b:1", "app/c:1", "app/a:1"]


def test_p13_a_restored_prefetch_ring_is_due_without_a_request() -> None:
    """Prefetch rings read without requests (P7): restored, the next turn reads the image
    after the cursor, nobody asking."""
    t = Timeline.start(0.0, check_interval=MIN, prefetch=True)
    t.ask_all("A", images(4), 0.0)
    t.run(2)
    again = restart(t, 1000.0)
    again.run(2)
    assert again.read_keys() == images(4)[2:]


def test_p13_an_empty_saved_ring_is_not_restored() -> None:
    sched = HostScheduler(HOST, Timeline.start().sched.pacing, 0.0)
    sched.restore("A", RingState(RingHeader(None, 0, None, None), ()))
    assert sched.export() == []


# -- changes, for a store that writes only them ------------------------------------------------


def test_p13_rings_are_plain_unless_tracked() -> None:
    """Without a store, rings are plain :class:`Ring` s (the kept-answer path pays nothing)
    and there are never changes; tracked, they are :class:`TrackedRing` s."""
    t = Timeline.start(0.0, check_interval=MIN)
    t.ask("A", "app/a:1", 0.0)
    assert type(t.sched.ring("A")) is Ring
    assert t.sched.changes() == []
    tracked = Timeline.start(0.0, check_interval=MIN)
    tracked.sched.track_changes()
    tracked.ask("A", "app/a:1", 0.0)
    assert type(tracked.sched.ring("A")) is TrackedRing


def test_p13_changes_are_what_changed_since_the_last_call() -> None:
    """A new ring comes whole and replaces what a store held; then only the images touched
    (asked, answered, taken) and the header; nothing when nothing changed."""
    t = Timeline.start(0.0, check_interval=MIN)
    t.sched.track_changes()
    t.ask_all("A", ["app/a:1", "app/b:1"], 0.0)
    [(resource, first)] = t.sched.changes()
    assert resource == "A" and first.replace
    assert [e.image for e in first.entries] == ["app/a:1", "app/b:1"]
    assert first.header == RingHeader(None, 0, None, None)
    assert t.sched.changes() == []
    t.window()
    [(_, turn)] = t.sched.changes()
    assert not turn.replace
    assert turn.header == RingHeader("app/a:1", 0, MIN, None)
    assert turn.entries == (EntryState("app/a:1", 0.0, MIN, 0),)
    t.ask("A", "app/b:1", 70.0)
    [(_, ask)] = t.sched.changes()
    assert ask.entries == (EntryState("app/b:1", 70.0, None, -1),)


def test_p13_expired_images_and_rings_are_changes() -> None:
    """Images that leave a ring (P8) are dropped; a ring whose last image left is gone."""
    t = Timeline.start(0.0, check_interval=MIN, retention=100.0)
    t.sched.track_changes()
    t.ask("A", "app/a:1", 0.0)
    t.ask("A", "app/b:1", 50.0)
    t.sched.changes()
    t.window()  # 60: nothing expires yet
    t.window()  # 120: a (asked at 0) leaves
    [(_, first)] = t.sched.changes()
    assert first.dropped == ("app/a:1",) and first.header is not None
    t.window()  # 180: b leaves, and the ring with it
    [(_, last)] = t.sched.changes()
    assert last == RingChanges(header=None, entries=(), dropped=(), replace=False)
    assert t.sched.export() == []


def test_p13_a_waiting_image_kept_past_retention_is_a_change() -> None:
    """An image still waited for is asked for again when it would expire (P8): its new time
    is written too."""
    t = Timeline.start(0.0, check_interval=MIN, retention=30.0)
    t.sched.track_changes()
    t.ask("Z", "app/a:1", 0.0)
    t.ask("A", "app/b:1", 0.0)  # the first turn (P4): Z keeps waiting through the window
    t.sched.changes()
    assert t.window().read is not None and t.reads[-1].image.key == "app/b:1"
    changes = dict(t.sched.changes())["Z"]
    assert changes.entries == (EntryState("app/a:1", MIN, None, -1),)


def test_p13_prefetch_images_spared_by_a_read_for_everyone_are_changes() -> None:
    """Two prefetching resources on the same images: each read counts for both rings (P7,
    R1), and the image the other ring's walk skips for it is written as done in its lap."""
    t = Timeline.start(0.0, check_interval=MIN, prefetch=True)
    t.sched.track_changes()
    keys = images(3)
    t.sched.join("A", keys, 0.0)
    t.sched.join("B", keys, 0.0)
    t.sched.changes()
    t.run(2)  # A reads img0; B's walk skips img0 (read for everyone) and reads img1
    assert t.read_keys() == keys[:2]
    changes = dict(t.sched.changes())
    assert {e.image: e.lap for e in changes["B"].entries} == {keys[0]: 0, keys[1]: 0}


# -- a store model that applies changes always holds what the rings hold ------------------------


Store = dict[str, tuple[RingHeader, dict[str, EntryState]]]


def apply(store: Store, changes: list[tuple[str, RingChanges]]) -> None:
    """What a store does with changes (as ``kuikproxy.state`` does in SQL)."""
    for resource, change in changes:
        kept = {} if change.replace or change.header is None else store[resource][1]
        if change.header is None:
            store.pop(resource, None)
            continue
        entries = {**kept, **{e.image: e for e in change.entries}}
        for image in change.dropped:
            entries.pop(image, None)
        store[resource] = (change.header, entries)


def held(sched: HostScheduler) -> Store:
    return {
        resource: (ring.header(), {e.image: e for e in ring.export().entries})
        for resource, ring in sched.rings.items()
    }


RESOURCES = ["r0", "r1"]
KEYS = ["app/a:1", "app/b:1", "app/c:1", "lib/x:1"]
steps = st.lists(
    st.one_of(
        st.tuples(st.just("ask"), st.sampled_from(RESOURCES), st.sampled_from(KEYS)),
        # an image joins without a request waiting (as in bulk): prefetch reads it anyway
        st.tuples(st.just("join"), st.sampled_from(RESOURCES), st.sampled_from(KEYS)),
        st.tuples(st.just("window"), st.booleans()),
        st.tuples(st.just("flush")),
        st.tuples(st.just("idle"), st.integers(1, 4)),  # minutes without requests
    ),
    max_size=50,
)


@pytest.mark.parametrize("prefetch", [False, True], ids=["hold", "prefetch"])
@settings(max_examples=500, deadline=None)
@given(stream=steps)
def test_p13_a_store_applying_changes_holds_the_rings(
    prefetch: bool, stream: list[tuple[object, ...]]
) -> None:
    """Whatever happens — asks, turns, answers by others' reads, retention, rings leaving and
    coming back — a store that applies each batch of changes holds exactly the rings' state,
    and a ring restored from it is the same ring."""
    t = Timeline.start(0.0, check_interval=MIN, prefetch=prefetch, retention=150.0)
    t.sched.track_changes()
    store: Store = {}
    now = 0.0
    for step in stream:
        if step[0] == "ask":
            assert isinstance(step[1], str) and isinstance(step[2], str)
            t.ask(step[1], step[2], now)
        elif step[0] == "join":
            assert isinstance(step[1], str) and isinstance(step[2], str)
            t.sched.join(step[1], [step[2]], now)
        elif step[0] == "window":
            result = t.window(read=False)
            now = result.at
            if result.read is not None:
                t.finish(result.read, now + 1.0, kept=bool(step[1]))
        elif step[0] == "idle":
            assert isinstance(step[1], int)
            for _ in range(step[1]):
                now = t.window().at
        else:
            apply(store, t.sched.changes())
            assert store == held(t.sched)
    apply(store, t.sched.changes())
    assert store == held(t.sched)
    again = HostScheduler(HOST, t.sched.pacing, now)
    for resource, (header, entries) in store.items():
        again.restore(resource, RingState(header, tuple(entries.values())))
    assert held(again) == held(t.sched)


def test_p13_export_takes_pending_changes_as_written() -> None:
    """A whole export (a store rewritten after a failed write) counts as writing every
    pending change: the next changes start from it, never replacing it with a part."""
    t = Timeline.start(0.0, check_interval=MIN)
    t.sched.track_changes()
    t.ask_all("A", ["app/a:1", "app/b:1"], 0.0)
    saved = t.sched.export()
    assert t.sched.changes() == []
    t.ask("A", "app/a:1", 10.0)
    [(_, change)] = t.sched.changes()
    assert not change.replace
    store: Store = {"A": (saved[0][1].header, {e.image: e for e in saved[0][1].entries})}
    apply(store, [("A", change)])
    assert store == held(t.sched)


def test_p13_whole_changes_replace() -> None:
    state = RingState(RingHeader("a", 2, 1.0, 5.0), (EntryState("a", 0.0, 1.0, 2),))
    whole = RingChanges.whole(state)
    assert whole.replace and whole.entries == state.entries and whole.header == state.header
    assert dataclasses.replace(whole, replace=False) != whole
