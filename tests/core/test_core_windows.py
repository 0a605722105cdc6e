"""P1–P3: the windows of a series — fixed instants, one image each, lost rather than saved."""

from __future__ import annotations

import pytest
from timeline import HOST, Timeline, img

from kuikproxy.core.hoststate import HostPacing
from kuikproxy.core.scheduler import HostScheduler
from kuikproxy.core.windows import Outcome, Series

H1332 = 13 * 3600 + 32 * 60  # 13:32, the document's example
MIN = 60.0


def test_p1_first_window_is_a_full_interval_after_start() -> None:
    """A series started at 13:32 with interval 5m opens at 13:37, 13:42, 13:47 — never before."""
    sched = HostScheduler(HOST, HostPacing(check_interval=5 * MIN, copy_interval=5 * MIN), H1332)
    assert sched.check_series.next_window() == H1332 + 5 * MIN
    assert sched.copy_series.next_window() == H1332 + 5 * MIN
    with pytest.raises(ValueError):
        sched.check_window(H1332 + 5 * MIN - 1)
    with pytest.raises(ValueError):
        sched.copy_window(H1332)
    opened = [sched.check_window(sched.check_series.next_window()).at for _ in range(3)]
    assert opened == [13 * 3600 + 37 * 60, 13 * 3600 + 42 * 60, 13 * 3600 + 47 * 60]


def test_p1_restart_loop_faster_than_the_interval_sends_nothing() -> None:
    """A proxy restarting every 4m59s on a 5m interval never reaches a window: each start is a
    new origin, and its first window is a full interval after it, past the next restart."""
    interval, every = 5 * MIN, 5 * MIN - 1
    fired = 0
    now = float(H1332)
    for _ in range(500):
        sched = HostScheduler(
            HOST, HostPacing(check_interval=interval, copy_interval=interval), now
        )
        sched.check("monitor", img("library/nginx:1.27"), now, auth=None, kept_at=None)
        sched.copy("mirror", img("library/nginx:1.27"), now, opens=True)
        restart = now + every
        assert sched.check_series.next_window() > restart
        assert sched.copy_series.next_window() > restart
        for window in (sched.check_window, sched.copy_window):
            with pytest.raises(ValueError):
                window(restart)  # nothing is due before the process restarts
        view = sched.view(restart)
        fired += sum(view.check.windows.values()) + sum(view.copy.windows.values())
        now = restart
    assert fired == 0


def test_p2_time_an_image_takes_never_moves_later_windows() -> None:
    """A read that lasts 2.5 intervals leaves the next windows at t0 + k·interval exactly: they
    are lost while it is in flight, and the first one after it ends is used on time."""
    t = Timeline.start(0.0, check_interval=MIN)
    t.ask_all("A", ["app/a:1", "app/b:1", "app/c:1"], 0.0)
    slow = t.window(read=False).read
    assert slow is not None
    assert [t.window().outcome for _ in range(2)] == [Outcome.BUSY, Outcome.BUSY]
    t.finish(slow, 3.5 * MIN)
    later = t.run(3)
    assert [r.outcome for r in later] == [Outcome.USED, Outcome.USED, Outcome.IDLE]
    assert [r.at for r in t.results] == [k * MIN for k in range(1, 7)]
    assert [r.read.at for r in later if r.read] == [4 * MIN, 5 * MIN]


def test_p3_window_with_nothing_due_is_idle() -> None:
    """A window that finds nothing due is lost and counted ``idle``; it is not saved: the next
    request still waits for the next window, one image per window."""
    t = Timeline.start(0.0, check_interval=MIN)
    assert [r.outcome for r in t.run(3)] == [Outcome.IDLE] * 3
    t.ask_all("A", ["app/a:1", "app/b:1"], 3.5 * MIN)
    assert [r.outcome for r in t.run(3)] == [Outcome.USED, Outcome.USED, Outcome.IDLE]
    assert t.counts() == {"used": 2, "idle": 4, "busy": 0, "blocked": 0, "fleet": 0, "away": 0}


def test_p3_window_lost_when_previous_check_in_flight_counts_busy() -> None:
    """While the previous check's upstream request is in flight, windows are lost as ``busy``,
    even with images due; the view says the series is busy."""
    t = Timeline.start(0.0, check_interval=MIN)
    t.ask_all("A", ["app/a:1", "app/b:1"], 0.0)
    first = t.window(read=False).read
    assert first is not None
    assert t.sched.view(1.5 * MIN).check.busy
    assert t.window().outcome is Outcome.BUSY
    assert t.window().outcome is Outcome.BUSY
    t.finish(first, 3.1 * MIN)
    assert not t.sched.view(3.2 * MIN).check.busy
    assert t.window().outcome is Outcome.USED
    assert t.counts() == {"used": 2, "idle": 0, "busy": 2, "blocked": 0, "fleet": 0, "away": 0}


def test_p3_window_lost_when_host_blocked_counts_blocked() -> None:
    """While the registry blocks the host (§11) both series lose their windows as ``blocked``;
    a block is never shortened; the first window after it is used."""
    t = Timeline.start(0.0, check_interval=MIN, copy_interval=MIN)
    t.ask("A", "app/a:1", 0.0)
    t.sched.copy("A", img("app/a:1"), 0.0, opens=True)
    t.sched.block(until=2.5 * MIN)
    t.sched.block(until=1.5 * MIN)  # shorter: ignored
    assert t.sched.view(2 * MIN).blocked_until == 2.5 * MIN
    assert [r.outcome for r in t.run(2)] == [Outcome.BLOCKED, Outcome.BLOCKED]
    assert t.sched.copy_window(MIN).outcome is Outcome.BLOCKED
    assert t.window().outcome is Outcome.USED
    assert t.sched.view(3 * MIN).blocked_until is None
    assert t.counts() == {"used": 1, "idle": 0, "busy": 0, "blocked": 2, "fleet": 0, "away": 0}
    assert t.sched.view(3 * MIN).copy.windows["blocked"] == 1


def test_p3_late_wake_up_counts_skipped_windows_busy_and_never_fires_two() -> None:
    """A runtime that wakes 3.5 intervals late fires one window (the latest due), counts the
    two it slept through ``busy``, and cannot fire another at the same instant."""
    series = Series(origin=100.0, interval=MIN)
    assert series.fire(100.0 + 3.5 * MIN) == 100.0 + 3 * MIN
    assert series.outcomes[Outcome.BUSY] == 2
    with pytest.raises(ValueError):
        series.fire(100.0 + 3.5 * MIN)
    assert series.next_window() == 100.0 + 4 * MIN

    t = Timeline.start(0.0, check_interval=MIN)
    t.ask_all("A", ["app/a:1", "app/b:1"], 0.0)
    late = t.sched.check_window(3.5 * MIN)
    assert late.outcome is Outcome.USED and late.at == 3 * MIN
    with pytest.raises(ValueError):
        t.sched.check_window(3.5 * MIN)
    assert t.counts() == {"used": 1, "idle": 0, "busy": 2, "blocked": 0, "fleet": 0, "away": 0}


def test_p1_host_first_seen_later_keeps_the_proxys_window_times() -> None:
    """A host first asked for at 13:40 on a proxy serving since 13:32 (interval 5m) gets its
    windows on the proxy's times: 13:42 next; the one it had at 13:37 is counted idle."""
    pacing = HostPacing(check_interval=5 * MIN, copy_interval=5 * MIN)
    sched = HostScheduler(HOST, pacing, H1332 + 8 * MIN, origin=H1332)
    assert sched.check_series.next_window() == H1332 + 10 * MIN
    assert sched.copy_series.next_window() == H1332 + 10 * MIN
    assert sched.view(H1332 + 8 * MIN).check.windows == {
        "used": 0,
        "idle": 1,
        "busy": 0,
        "blocked": 0,
        "fleet": 0,
        "away": 0,
    }


def test_p3_windows_a_sleeping_series_let_pass_count_blocked_before_a_blocks_end() -> None:
    """A series nobody fired (nothing was due) counts the windows it let pass when it wakes:
    those before the block's end were lost to the block (P3c), the others idle (P3a)."""
    series = Series(origin=0.0, interval=10.0)
    series.pass_idle(65.0, blocked_until=35.0)  # windows at 10..60: 10, 20, 30 blocked
    assert series.outcomes[Outcome.BLOCKED] == 3
    assert series.outcomes[Outcome.IDLE] == 3
    series.pass_idle(100.0, blocked_until=35.0)  # 70..100: after the block
    assert series.outcomes[Outcome.BLOCKED] == 3 and series.outcomes[Outcome.IDLE] == 7
    series.pass_idle(130.0, blocked_until=130.0)  # 110, 120 before it; 130 is its end
    assert series.outcomes[Outcome.BLOCKED] == 5 and series.outcomes[Outcome.IDLE] == 8
