"""A ring of a few images kept as rows (ringtable ``FEW``): the same decisions as by column,
whichever way a ring switches — past ``FEW`` images to columns, back to rows when an expiry
leaves ``FEW // 2`` — and a one-image ring cheaper than the ring of dict entries it replaced."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st
from timeline import Timeline, images

from kuikproxy.core import ringtable
from kuikproxy.core.rings import Ring

KEYS = images(12)
ALWAYS_ROWS = 1000  # more than any ring here holds


@contextmanager
def few(n: int) -> Iterator[None]:
    """Rings of at most ``n`` images kept as rows (1: columns from the second image on)."""
    spots = [(None, k * ringtable.ROW_WIDTH) for k in range(n)]
    with mock.patch.object(ringtable, "FEW", n), mock.patch.object(ringtable, "ROW_SPOTS", spots):
        yield


def rows(ring: Ring) -> bool:
    return ring.in_rows


steps = st.lists(
    st.one_of(
        st.tuples(st.just("ask"), st.sampled_from("ABCD"), st.sampled_from(KEYS)),
        st.tuples(st.just("window"), st.booleans(), st.just("")),
        st.tuples(st.just("idle"), st.integers(1, 40), st.just("")),
        st.tuples(st.just("cancel"), st.integers(0, 5), st.just("")),
    ),
    min_size=40,
    max_size=160,
)


def play(plan: list[tuple[str, object, str]], prefetch: bool, max_age: float) -> tuple[object, ...]:
    """A timeline of asks, windows (their reads kept or not), idle time (sweeps: P8) and
    cancelled requests (P11), with what a state file would be told at each step."""
    t = Timeline.start(0.0, check_interval=1.0, prefetch=prefetch, max_age=max_age, retention=60.0)
    t.sched.track_changes()
    now, log = 0.0, []
    for op, arg, key in plan:
        if op == "ask":
            assert isinstance(arg, str)
            log.append(type(t.ask(arg, key, now)).__name__)
        elif op == "window":
            result = t.window(read=False)
            if result.read is not None:
                t.finish(result.read, result.at, kept=bool(arg))
            now = result.at
        elif op == "idle":
            assert isinstance(arg, int)
            now += arg
            t.sched.sweep(now)
        elif t.held:
            assert isinstance(arg, int)
            t.sched.cancel(list(t.held.values())[arg % len(t.held)])
        log.append(t.sched.changes())
    standing = [t.sched.retry_after(ticket, now) for ticket in t.held.values()]
    view = t.sched.view(now, list("ABCD"))
    return t.read_keys(), t.reused, log, standing, view, t.sched.export()


@settings(max_examples=200, deadline=None)
@given(steps, st.booleans(), st.sampled_from([5.0, 40.0, 3600.0]))
def test_rows_and_columns_decide_alike(
    plan: list[tuple[str, object, str]], prefetch: bool, max_age: float
) -> None:
    """P5, P7, P8, P11, P13: rings switching between rows and columns at 1 or 8 images, or
    never leaving rows, read the same images, give the same kept answers and Retry-Afters,
    show and save the same rings, and tell a state file the same changes."""
    with few(ALWAYS_ROWS):
        always = play(plan, prefetch, max_age)
    for n in (1, 2, ringtable.FEW):
        with few(n):
            assert play(plan, prefetch, max_age) == always


def test_a_ring_turns_to_columns_past_few_and_back_to_rows_after_an_expiry() -> None:
    """Grown one image at a time past ``FEW``, then expired down to ``FEW // 2``: rows,
    columns, rows again, and at every step the ring a ring kept as rows would be."""
    n = ringtable.FEW
    ring, model = Ring(), Ring()

    def both(op: str, *args: object) -> object:
        done = getattr(ring, op)(*args)
        with few(ALWAYS_ROWS):
            assert getattr(model, op)(*args) == done
            assert model.export() == ring.export()
        return done

    keys = images(n + 3)[::-1]  # asked in reverse key order: each goes first in its table
    for at, key in enumerate(keys):
        both("ask", key, float(at))
        assert rows(ring) == (at < n)
    both("walk_in_order")
    assert both("take", 100.0, True) == keys[-1]
    both("answer", keys[-1], 101.0)
    both("wait", keys[2])
    # all but the last n // 2 asked leave, but for the one still waiting: still columns
    both("expire", float(len(keys) - n // 2), 200.0)
    assert len(ring) == n // 2 + 1 and not rows(ring)
    both("unwait", keys[2])
    for key in keys[-(n // 2) :]:
        both("ask", key, 240.0)
    assert both("expire", 220.0, 300.0) == [keys[2]]
    assert len(ring) == n // 2 and rows(ring)
    assert both("previous_read", keys[-1]) == 101.0 and both("answered_in_lap", keys[-1])
    for k in range(3):
        both("take", float(400 + k), True)
    for key in images(n + 1):  # and past FEW again, from rows that were columns once
        both("ask", key, 500.0)
    assert not rows(ring)


def test_a_one_image_ring_costs_less_than_its_dict_entry_ring() -> None:
    """The ring of a resource asking for one image: ~420 B with its key (tracemalloc, Python
    3.11), where its ordered-dict entry, entry object and empty sets and dicts took ~1,500."""
    keys = [f"team/app-{i:07d}:1.0" for i in range(2000)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    rings = []
    for n, key in enumerate(keys):
        ring = Ring()
        ring.ask(key, float(n))
        rings.append(ring)
    per_ring = (tracemalloc.get_traced_memory()[0] - before) / len(keys)
    tracemalloc.stop()
    assert per_ring < 600, per_ring
