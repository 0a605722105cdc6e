"""``HostScheduler.reuse``: the kept answers the edge gives before it makes a request of them
(``web/fastpath.py``) are exactly :meth:`check`'s ``Reuse`` decisions, and a ``reuse`` that
says no changes nothing — so the request that then goes the long way is decided as if the
fast path had never looked (R1, P10, limits)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from timeline import HOST, Timeline, img

from kuikproxy.core.hoststate import HostPacing
from kuikproxy.core.limits import Census, Limits
from kuikproxy.core.reuse import shared_with
from kuikproxy.core.scheduler import HostScheduler
from kuikproxy.core.tickets import Admission, Pass, Reuse

INTERVAL = 60.0
RESOURCES = ["r0", "r1", "r2", "r3"]
KEYS = ["app/a:1", "app/b:1", "app/c:1", "lib/x:1"]

events = st.lists(
    st.one_of(
        st.tuples(
            st.just("ask"),
            st.sampled_from(RESOURCES),
            st.sampled_from(KEYS),
            st.sampled_from([None, None, "secret"]),
            st.sampled_from([0.1, 1.0, 7.0, 40.0]),  # intervals since the last event
        ),
        st.tuples(st.just("window")),
        st.tuples(st.just("cancel"), st.integers(0, 99)),
    ),
    max_size=60,
)


def timeline(limits: Limits, prefetch: bool) -> Timeline:
    pacing = HostPacing(
        check_interval=INTERVAL, copy_interval=INTERVAL, prefetch=prefetch,
        max_age=10 * INTERVAL, follow_up=3 * INTERVAL,
    )  # fmt: skip
    return Timeline(HostScheduler(HOST, pacing, 0.0, census=Census(limits)))


def state(t: Timeline, now: float) -> tuple[Any, ...]:
    """What a decision may change: rings (every image's times and laps), waiting tickets,
    follow-up grants, the census, the last request, the views."""
    s = t.sched
    rings = {r: ring.export() for r, ring in sorted(s.rings.items())}
    tickets = s.check_tickets
    waiting = {
        k: sorted((x.resource, x.auth or "") for x in tickets.of(k)) for k in tickets.images()
    }
    grants = sorted((k, s.follow_ups.get(k, now)) for k in s.follow_ups.held())
    return (rings, waiting, grants, s.census.images, len(s.census), s.last_request,
            s.view(now))  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    stream=events,
    prefetch=st.booleans(),
    limits=st.sampled_from([Limits(), Limits(max_resources=2), Limits(max_ring_images=2)]),
)
def test_reuse_is_checks_reuse_and_changes_nothing_otherwise(
    stream: list[tuple[Any, ...]], prefetch: bool, limits: Limits
) -> None:
    fast, plain = timeline(limits, prefetch), timeline(limits, prefetch)
    now, reused = 0.0, 0
    for event in stream:
        if event[0] == "window":
            now = fast.next_window
            for t in (fast, plain):
                t.window()
            continue
        if event[0] == "cancel":  # each cancels its oldest ticket: the same request's
            for t in (fast, plain):
                if t.held:
                    t.sched.cancel(t.held.pop(min(t.held)))
            continue
        _, resource, key, auth, gap = event
        now = min(now + gap * INTERVAL, fast.next_window - 0.001)
        kept_at = None
        if key in fast.kept:
            at, kept_auth = fast.kept[key]
            kept_at = at if shared_with(kept_auth, None, 200, auth, None) else None
        before = state(fast, now)
        decision: Admission
        if kept_at is not None and fast.sched.reuse(resource, img(key), now, kept_at):
            decision, reused = Reuse(), reused + 1
        else:
            assert state(fast, now) == before  # said no: nothing changed
            decision = fast.ask(resource, key, now, auth=auth)
        expected = plain.ask(resource, key, now, auth=auth)
        assert type(decision) is type(expected)
        assert state(fast, now) == state(plain, now)


def test_reuse_answers_a_resource_new_to_the_image_and_not_its_next_ask() -> None:
    """The steady shape: a resource's first ask of an image another read is reused; its next
    ask, with no newer read, is not (it waits for the image's turn, ``check`` decides it)."""
    t = Timeline.start(0.0, check_interval=INTERVAL)
    t.ask("A", "app/a:1", 0.0)
    t.window()
    kept_at = t.kept["app/a:1"][0]
    assert t.sched.reuse("B", img("app/a:1"), 70.0, kept_at)
    assert t.sched.ring("B").previous_read("app/a:1") == 70.0
    assert not t.sched.reuse("B", img("app/a:1"), 80.0, kept_at)
    assert t.sched.ring("B").previous_read("app/a:1") == 70.0


def test_reuse_leaves_a_follow_up_grant_to_check() -> None:
    """A resource answered moments ago asks again with other credentials while a newer kept
    answer exists: ``check`` lets it through as a follow-up (P10), so ``reuse`` says no."""
    t = Timeline.start(0.0, check_interval=INTERVAL, follow_up=3 * INTERVAL)
    t.ask("A", "app/a:1", 0.0)
    t.window()  # A answered at 60 s: a follow-up grant until 240 s
    t.sched.check("B", img("app/a:1"), 61.0, auth=None, kept_at=None)  # held: a newer read
    t.window()
    kept_at = t.kept["app/a:1"][0]
    assert kept_at == 2 * INTERVAL
    assert not t.sched.reuse("A", img("app/a:1"), 130.0, kept_at)
    decision = t.sched.check("A", img("app/a:1"), 130.0, auth="other", kept_at=kept_at)
    assert isinstance(decision, Pass)
