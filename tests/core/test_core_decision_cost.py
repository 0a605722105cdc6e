"""Decision cost: a turn on a ring of 100,000 images is a successor query, not a scan."""

from __future__ import annotations

import time
from bisect import bisect_left, bisect_right
from collections.abc import Iterator
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st
from timeline import Timeline, images

from kuikproxy.core import sortedset
from kuikproxy.core.rings import Ring
from kuikproxy.core.sortedset import SortedSet

N = 100_000
DECISIONS = 2000

keys = st.text(alphabet="ab/:Z-é\U0001f600", max_size=4)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("add"), keys),
        st.tuples(st.just("discard"), keys),
        st.tuples(st.just("update"), st.lists(keys, max_size=12)),
        st.tuples(st.just("after"), st.none() | keys),
        st.tuples(st.just("rank"), keys),
    ),
    max_size=80,
)


@settings(max_examples=300, deadline=None)
@given(operations)
def test_decision_cost_sorted_set_behaves_like_a_sorted_list(ops: list[tuple[str, object]]) -> None:
    """SortedSet against a sorted-list model, with tiny chunks so that splits, merges and bulk
    rebuilds all happen: membership, order (byte-wise = code-point), first, after, rank."""
    with mock.patch.object(sortedset, "_CHUNK", 3):
        s = SortedSet()
        model: list[str] = []
        for op, arg in ops:
            if op == "add":
                assert isinstance(arg, str)
                s.add(arg)
                if arg not in model:
                    model.insert(bisect_left(model, arg), arg)
            elif op == "discard":
                assert isinstance(arg, str)
                s.discard(arg)
                if arg in model:
                    model.remove(arg)
            elif op == "update":
                assert isinstance(arg, list)
                s.update(arg)
                model = sorted(set(model) | set(arg))
            elif op == "after":
                assert arg is None or isinstance(arg, str)
                i = 0 if arg is None else bisect_right(model, arg)
                assert s.after(arg) == (model[i] if i < len(model) else None)
            else:
                assert isinstance(arg, str)
                assert s.rank(arg) == bisect_left(model, arg)
            assert list(s) == model
            assert len(s) == len(model)
            assert s.first() == (model[0] if model else None)
            assert all(k in s for k in model)
        assert sorted(model, key=lambda k: k.encode()) == model  # code-point order is byte order


def no_scan(self: SortedSet) -> Iterator[str]:
    raise AssertionError("a decision iterated over a whole sorted set")


def test_decision_cost_hold_ring_of_100k_images_takes_without_scanning() -> None:
    """A hold-mode ring of 100,000 waiting images answers 2000 turns (wrapping its lap) without
    iterating any set, well under a second in all."""
    ring = Ring()
    all_keys = images(N)
    ring.join(all_keys, 0.0)
    for key in all_keys:
        ring.wait(key)
    ring.take(0.0, False)
    ring.cursor = all_keys[N - DECISIONS // 2]  # the lap wraps halfway through
    with mock.patch.object(SortedSet, "__iter__", no_scan):
        start = time.perf_counter()
        taken = []
        for i in range(DECISIONS):
            took = ring.take(float(i), False)
            assert took is not None
            ring.unwait(took)
            ring.answer(took, float(i))
            taken.append(took)
        elapsed = time.perf_counter() - start
    assert taken[: DECISIONS // 2 - 1] == all_keys[N - DECISIONS // 2 + 1 :]
    assert ring.cycle_duration is not None
    assert elapsed < 1.0, elapsed


def test_decision_cost_prefetch_scheduler_with_100k_images_per_ring() -> None:
    """Two prefetching resources with the same 100,000 images each: 2000 check windows (turn,
    read, answer) cost well under a second; no set is iterated."""
    t = Timeline.start(0.0, check_interval=1.0, prefetch=True)
    all_keys = images(N)
    t.sched.join("A", all_keys, 0.0)
    t.sched.join("B", all_keys, 0.0)
    with mock.patch.object(SortedSet, "__iter__", no_scan):
        start = time.perf_counter()
        t.run(DECISIONS)
        elapsed = time.perf_counter() - start
    assert t.read_keys() == all_keys[:DECISIONS]
    assert elapsed < 1.0, elapsed
