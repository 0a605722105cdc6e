"""P9: copies drain per-resource queues in arrival order; an open copy owns the copy series."""

from __future__ import annotations

from typing import Any

from timeline import HOST, img

from kuikproxy.core.hoststate import HostPacing
from kuikproxy.core.scheduler import HostScheduler
from kuikproxy.core.tickets import Hold, Pass, Read, WindowResult
from kuikproxy.core.windows import Outcome

MIN = 60.0
DIGEST = "sha256:" + "ab" * 32
BLOB = "sha256:" + "cd" * 32


def scheduler(**pacing: Any) -> HostScheduler:
    pacing.setdefault("check_interval", MIN)
    pacing.setdefault("copy_interval", MIN)
    return HostScheduler(HOST, HostPacing(**pacing), 0.0)


def window(sched: HostScheduler) -> WindowResult:
    return sched.copy_window(sched.copy_series.next_window())


def opened(sched: HostScheduler) -> Read:
    read = window(sched).read
    assert read is not None
    return read


def finish(sched: HostScheduler, read: Read, now: float) -> None:
    """Every request the copy's window released ends at ``now`` (answered, or failed)."""
    for _ in read.tickets:
        sched.copy_request_done(now)


def test_p9_copies_queue_in_arrival_order() -> None:
    """A resource's copies are taken in the order they were asked for, not byte-wise."""
    sched = scheduler()
    for key in ("zeta/app:1", "alpha/app:1", "mid/app:1"):
        sched.copy("M", img(key), 0.0, opens=True)
    assert sched.view(0.0).copy_queues == {"M": 3}
    taken = []
    for _ in range(3):
        read = opened(sched)
        taken.append(read.image.key)
        finish(sched, read, read.at + 1)
    assert taken == ["zeta/app:1", "alpha/app:1", "mid/app:1"]
    assert window(sched).outcome is Outcome.IDLE


def test_p9_resources_take_turns_on_copy_windows() -> None:
    """Mirrors sharing a host take its copy windows in turn; one whose queue is empty is
    skipped; an image queued by two of them is copied once for both (R2)."""
    sched = scheduler()
    for key in ("a/one:1", "a/two:1", "a/three:1"):
        sched.copy("A", img(key), 0.0, opens=True)
    for key in ("b/one:1", "shared/x:1"):
        sched.copy("B", img(key), 0.0, opens=True)
    sched.copy("C", img("shared/x:1"), 0.0, opens=True)
    order = []
    for _ in range(5):
        read = opened(sched)
        assert read.leader is not None
        order.append((read.leader.resource, read.image.key, len(read.tickets)))
        finish(sched, read, read.at + 1)
    assert order == [
        ("A", "a/one:1", 1),
        ("B", "b/one:1", 1),
        ("C", "shared/x:1", 2),  # B's request for it rides along: B's queue is now empty
        ("A", "a/two:1", 1),
        ("A", "a/three:1", 1),  # B and C have nothing queued: skipped
    ]
    assert window(sched).outcome is Outcome.IDLE


def test_p9_open_copy_keeps_the_series_busy_until_idle_after_its_last_request() -> None:
    """A copy opened by its window stays open while any of its requests is in flight and
    ``copy.idle`` after the last one ends: windows meanwhile are lost as busy; the next window
    after that takes the next queued copy."""
    sched = scheduler(copy_idle=90.0)
    sched.copy("M", img("library/nginx:1.27"), 0.0, opens=True)
    sched.copy("M", img("library/redis:7"), 0.0, opens=True)
    read = opened(sched)  # 1m
    assert sched.view(MIN).copy_open == "library/nginx:1.27"
    assert sched.view(MIN).copy.busy
    member = sched.copy("M", img(f"library/nginx@{BLOB}"), 70.0, opens=False)
    assert isinstance(member, Pass)
    assert window(sched).outcome is Outcome.BUSY  # 2m: manifest and blob in flight
    finish(sched, read, 150.0)
    assert window(sched).outcome is Outcome.BUSY  # 3m: the blob is still in flight
    sched.copy_request_done(190.0)  # the blob ends: open until 190 + 90 = 280
    assert sched.view(279.0).copy_open == "library/nginx:1.27"
    assert window(sched).outcome is Outcome.BUSY  # 4m = 240
    assert sched.view(280.0).copy_open is None
    assert not sched.view(280.0).copy.busy
    nxt = window(sched)  # 5m = 300
    assert nxt.outcome is Outcome.USED
    assert nxt.read is not None and nxt.read.image.key == "library/redis:7"
    assert sched.view(300.0).copy.windows == {
        "used": 2,
        "idle": 0,
        "busy": 3,
        "blocked": 0,
        "fleet": 0,
        "away": 0,
    }


def test_p9_member_digest_and_blob_requests_pass_while_the_copy_is_open() -> None:
    """While M's copy of library/nginx is open, M's manifest GETs by digest and blob requests in
    library/nginx pass without a window; another resource's, another repository's, and a
    manifest GET by tag (which always opens a copy of its own) do not."""
    sched = scheduler()
    sched.copy("M", img("library/nginx:1.27"), 0.0, opens=True)
    read = opened(sched)
    assert sched.copy("M", img(f"library/nginx@{DIGEST}"), 61.0, opens=False) == Pass(True)
    assert sched.copy("M", img(f"library/nginx@{BLOB}"), 61.0, opens=False) == Pass(True)
    assert isinstance(sched.copy("N", img(f"library/nginx@{BLOB}"), 61.0, opens=False), Hold)
    assert isinstance(sched.copy("M", img(f"library/redis@{BLOB}"), 61.0, opens=False), Hold)
    assert isinstance(sched.copy("M", img("library/nginx:1.28"), 61.0, opens=True), Hold)
    assert isinstance(sched.copy("M", img("library/nginx:1.27"), 61.0, opens=True), Hold)
    assert sched.view(61.0).copy_queued == 4
    finish(sched, read, 62.0)
    sched.copy_request_done(63.0)
    sched.copy_request_done(63.0)
    assert sched.view(67.9).copy_open is not None  # copy.idle 5s after the last request
    assert sched.view(68.0).copy_open is None
    # closed, its content stays reachable to M for copy.followUp (P9), outside the copy
    assert sched.copy("M", img(f"library/nginx@{BLOB}"), 68.0, opens=False) == Pass()
    assert isinstance(sched.copy("N", img(f"library/nginx@{BLOB}"), 68.0, opens=False), Hold)
    assert isinstance(sched.copy("M", img(f"library/nginx@{BLOB}"), 668.0, opens=False), Hold)


def test_p9_copy_timeout_closes_the_copy() -> None:
    """With ``copy.timeout`` a copy closes at opened + timeout even with requests in flight:
    its members no longer pass and the next window takes the next copy."""
    sched = scheduler(copy_timeout=100.0, copy_follow_up=0.0)
    sched.copy("M", img("library/nginx:1.27"), 0.0, opens=True)
    sched.copy("M", img("library/redis:7"), 0.0, opens=True)
    opened(sched)  # 1m, never finishes
    assert isinstance(sched.copy("M", img(f"library/nginx@{BLOB}"), 159.0, opens=False), Pass)
    assert window(sched).outcome is Outcome.BUSY  # 2m < 1m + 100s
    assert sched.view(160.0).copy_open is None
    assert isinstance(sched.copy("M", img(f"library/nginx@{BLOB}"), 160.0, opens=False), Hold)
    nxt = window(sched)
    assert nxt.outcome is Outcome.USED
    assert nxt.read is not None and nxt.read.image.key == "library/redis:7"


def test_p9_no_timeout_by_default() -> None:
    """``copy.timeout`` 0 (the default) lets a copy take as long as it needs: windows go busy."""
    sched = scheduler()
    sched.copy("M", img("library/nginx:1.27"), 0.0, opens=True)
    sched.copy("M", img("library/redis:7"), 0.0, opens=True)
    opened(sched)
    assert [window(sched).outcome for _ in range(50)] == [Outcome.BUSY] * 50


def test_p9_failed_copy_does_not_hold_back_the_next_queued_copy() -> None:
    """A copy whose upstream read fails is answered with the error (its requests end); the
    client's retry queues again at the back, behind the images queued after it."""
    sched = scheduler()
    for key in ("app/x:1", "app/y:1", "app/z:1"):
        sched.copy("M", img(key), 0.0, opens=True)
    failed = opened(sched)
    assert failed.image.key == "app/x:1"
    finish(sched, failed, 61.0)  # the error is the answer
    retry = sched.copy("M", img("app/x:1"), 62.0, opens=True)
    assert isinstance(retry, Hold)
    taken = []
    for _ in range(3):
        read = opened(sched)
        taken.append(read.image.key)
        finish(sched, read, read.at + 1)
    assert taken == ["app/y:1", "app/z:1", "app/x:1"]


def test_p9_cancelled_copy_request_leaves_the_queue() -> None:
    """A queued copy whose only request goes away (P11) is not taken by a window."""
    sched = scheduler()
    gone = sched.copy("M", img("app/x:1"), 0.0, opens=True)
    sched.copy("M", img("app/y:1"), 0.0, opens=True)
    assert isinstance(gone, Hold)
    sched.cancel(gone.ticket)
    assert sched.view(0.0).copy_queued == 1
    assert opened(sched).image.key == "app/y:1"
