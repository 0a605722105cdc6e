"""Rings stored by column (ringtable) and the prefetch walk's runs of reads for everyone
(sharedreads): the same decisions as one image at a time, at a fraction of the cost."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st
from timeline import Timeline, images

from kuikproxy.core import ringtable
from kuikproxy.core.rings import Ring
from kuikproxy.core.sharedreads import SharedReads

KEYS = images(12)

steps = st.lists(
    st.one_of(
        st.tuples(st.just("ask"), st.sampled_from("ABCD"), st.sampled_from(KEYS)),
        st.tuples(st.just("window"), st.booleans(), st.just("")),
        st.tuples(st.just("idle"), st.integers(1, 30), st.just("")),
    ),
    max_size=120,
)


@contextmanager
def one_at_a_time() -> Iterator[None]:
    """The walk without runs: every image read for everyone looked up on its own."""
    with mock.patch.object(SharedReads, "since", lambda self, after, now: ([], 0)):
        yield


def play(plan: list[tuple[str, object, str]], max_age: float) -> tuple[object, ...]:
    t = Timeline.start(0.0, check_interval=1.0, prefetch=True, max_age=max_age, retention=90.0)
    t.sched.track_changes()
    now = 0.0
    changes = []
    for op, arg, key in plan:
        if op == "ask":
            assert isinstance(arg, str)
            t.ask(arg, key, now)
        elif op == "window":
            result = t.window(read=False)
            if result.read is not None:
                t.finish(result.read, result.at, kept=bool(arg))
            now = result.at
        else:
            assert isinstance(arg, int)
            now += arg
            t.sched.sweep(now)
        changes.append(t.sched.changes())
    return (t.read_keys(), t.reused, changes, t.sched.export())


@settings(max_examples=300, deadline=None)
@given(steps, st.sampled_from([5.0, 40.0, 3600.0]))
def test_prefetch_runs_decide_as_one_image_at_a_time(
    plan: list[tuple[str, object, str]], max_age: float
) -> None:
    """P5, P7, R1: resources sharing images, reads kept or not, maxAge short or long, images
    expiring (P8): the walk that skips runs of reads for everyone reads the same images, gives
    the same kept answers, records the same changes and saves the same rings."""
    fast = play(plan, max_age)
    with one_at_a_time():
        slow = play(plan, max_age)
    assert fast == slow


def test_shared_prefetch_turn_steps_over_the_others_reads_in_runs() -> None:
    """1 resource in 50 sharing 200 images: after the first lap of turns, a turn looks up only
    the image it takes, not the ~49 the others read since its last turn."""
    t = Timeline.start(0.0, check_interval=1.0, prefetch=True)
    keys = images(200)
    for r in range(50):
        t.sched.join(f"r{r:02d}", keys, 0.0)
    t.run(50)
    with mock.patch.object(SharedReads, "get", autospec=True, side_effect=SharedReads.get) as get:
        t.run(100)
    assert t.read_keys() == keys[:150]
    assert get.call_count <= 100 * 2


def test_retention_keeps_last_asked_order_across_ties_and_renumbering() -> None:
    """P8: images asked at one time leave in the order they were asked; the order survives
    the counter's renumbering."""
    with mock.patch.object(ringtable, "_SEQ_LIMIT", 5):
        ring = Ring()
        for key in ("c", "a", "d", "b"):
            ring.ask(key, 0.0)
        ring.ask("a", 1.0)
        ring.ask("e", 1.0)
        ring.ask("c", 2.0)
        assert ring.oldest_ask() == 0.0
        assert [e.image for e in ring.export().entries] == ["d", "b", "a", "e", "c"]
        ring.wait("b")
        assert ring.expire(1.5, 3.0) == ["d", "a", "e"]
        assert [e.image for e in ring.export().entries] == ["c", "b"]
        assert ring.oldest_ask() == 2.0
        assert (len(ring), "a" in ring, "b" in ring) == (2, False, True)


def test_chunks_split_and_empty_in_order() -> None:
    """Thousands of images asked one by one, half of them expired: the order holds."""
    ring = Ring()
    keys = images(1000)
    for n, key in enumerate(reversed(keys)):
        ring.ask(key, float(n % 2))
    assert len(ring.export().entries) == 1000
    gone = ring.expire(1.0, 5.0)
    assert gone == keys[1::2][::-1]  # in last-asked order
    ring.walk_in_order()
    assert [ring.take(float(10 + n), True) for n in range(3)] == keys[0:6:2]


def test_a_run_of_reads_ends_where_cache_max_age_ends() -> None:
    """R1, P7: a read for everyone spares an image only within ``cache.maxAge`` (2 s here): C's
    turn comes as the read of its first image lapses, and A's second turn as the read of its
    next one does, so both read them again."""
    plans = []
    for runs in (True, False):
        t = Timeline.start(0.0, check_interval=1.0, prefetch=True, max_age=2.0)
        for r in "ABC":
            t.sched.join(r, KEYS, 0.0)
        if runs:
            t.run(5)
        else:
            with one_at_a_time():
                t.run(5)
        plans.append(t.read_keys())
    assert plans[0] == plans[1] == [KEYS[0], KEYS[1], KEYS[0], KEYS[1], KEYS[2]]


def test_a_run_after_a_wrap_stops_at_the_old_cursor() -> None:
    """P5, P7: at a wrap, images past the old cursor were walked past at this very turn, so a
    read for everyone before it spares them no more, even when the reads, in the order they
    came, line up with them."""
    for runs in (True, False):
        ring, shared = Ring(), SharedReads()
        ring.walk_in_order()
        for key in "abcd":
            ring.ask(key, 0.0)
        assert [ring.take(1.0, True, shared), ring.take(2.0, True, shared)] == ["a", "b"]
        for at, key in ((3.0, "d"), (4.0, "b"), (5.0, "c")):
            shared.put(key, at, 100.0 + at)
        ring.answer("a", 6.0)  # behind the cursor: done in the next lap
        if runs:
            assert ring.take(7.0, True, shared) == "c"
        else:
            with one_at_a_time():
                assert ring.take(7.0, True, shared) == "c"
        assert ring.lap == 1


def test_reads_made_while_a_host_held_decide_as_logged_ones_once_it_prefetches() -> None:
    """R1, P7: a host that holds keeps no ordered log of its reads for everyone (no walk needs
    it); after a reload turns it to prefetch, its walks decide exactly as if those reads had
    been logged: found one image at a time, within ``cache.maxAge``."""

    def scenario() -> tuple[list[str], int]:
        t = Timeline.start(0.0, check_interval=1.0, max_age=3600.0)
        keys = images(20)
        t.sched.join("B", keys, 0.0)  # tracks every image, waits for none
        t.ask_all("A", keys[:10], 0.0)
        t.run(10)
        logged = len(t.sched.shared_reads.since(-1.0, 10.0)[0])
        t.sched.reconfigure(dataclasses.replace(t.sched.pacing, prefetch=True), 11.0)
        t.run(40)
        return t.read_keys(), logged

    put = SharedReads.put
    with mock.patch.object(
        SharedReads, "put", lambda self, key, at, until, logged: put(self, key, at, until)
    ):
        always, logged = scenario()
    assert logged == 10
    assert scenario() == (always, 0)
