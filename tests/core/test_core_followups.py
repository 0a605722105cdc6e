"""P10: the follow-ups of a check go through without a window, for ``check.followUp``."""

from __future__ import annotations

from timeline import Timeline, digest_of

from kuikproxy.core.tickets import Hold, Pass, Read
from kuikproxy.core.windows import Outcome

MIN = 60.0
TAG = "library/nginx:1.27"
BY_DIGEST = f"library/nginx@{digest_of(TAG)}"


def answered(follow_up: float = 2.0) -> tuple[Timeline, Read, float]:
    """Resource A's check of TAG (with pull secret "s1") read at 1m, answered at 1m + 3s."""
    t = Timeline.start(0.0, check_interval=MIN, follow_up=follow_up)
    t.ask("A", TAG, 0.0, auth="s1")
    read = t.window(read=False).read
    assert read is not None
    done = MIN + 3.0
    t.finish(read, done)
    return t, read, done


def test_p10_check_of_the_answered_digest_passes_within_follow_up_only() -> None:
    """After a check answered digest D, the same resource's check of repo@D passes without a
    window (whatever its Authorization) for ``followUp`` after the answer, and not after."""
    t, _, done = answered()
    assert isinstance(t.ask("A", BY_DIGEST, done + 1.9, auth="s1"), Pass)
    assert isinstance(t.ask("A", BY_DIGEST, done + 1.9, auth=None), Pass)
    assert isinstance(t.ask("A", BY_DIGEST, done + 2.0, auth="s1"), Hold)


def test_p10_same_reference_with_another_authorization_passes() -> None:
    """kuik tries each pull secret in turn: the same reference with a different Authorization
    within ``followUp`` is a follow-up, as is one without any."""
    t, _, done = answered()
    assert isinstance(t.ask("A", TAG, done + 1.0, auth="s2"), Pass)
    assert isinstance(t.ask("A", TAG, done + 1.0, auth=None), Pass)
    assert isinstance(t.ask("A", TAG, done + 2.5, auth="s2"), Hold)


def test_p10_same_reference_with_the_same_authorization_is_held() -> None:
    """A repeat of the same reference with the same Authorization is not a follow-up: it waits
    for the next lap (P5)."""
    t, _, done = answered()
    assert isinstance(t.ask("A", TAG, done + 0.5, auth="s1"), Hold)


def test_p10_another_resource_gets_no_follow_up() -> None:
    """Follow-ups belong to the resource that was answered: another one's check of the digest or
    of the reference waits for its own turn (or a kept answer)."""
    t, _, done = answered()
    assert isinstance(t.ask("B", BY_DIGEST, done + 0.5, auth="s1"), Hold)
    assert isinstance(t.ask("B", TAG, done + 0.5, auth="s2"), Hold)


def test_p10_waiting_request_with_another_authorization_is_released_as_follow_up() -> None:
    """Requests of the answered resource for the same reference with another Authorization that
    were already waiting go through when the answer comes, without a window of their own."""
    t = Timeline.start(0.0, check_interval=MIN)
    t.ask("A", TAG, 0.0, auth="s1")
    other = t.ask("A", TAG, 1.0, auth="s2")
    assert isinstance(other, Hold)
    result = t.sched.check_window(MIN)
    assert result.read is not None
    served = [ticket for ticket in result.read.tickets if ticket.auth == "s1"]
    released = t.sched.check_read_done(
        result.read, MIN + 1, served=served, digest=digest_of(TAG), kept=False
    )
    assert released == [other.ticket]
    assert t.sched.waiting(result.read.operation) == 0
    assert t.sched.check_window(2 * MIN).outcome is Outcome.IDLE


def test_p10_follow_up_does_not_make_the_series_busy() -> None:
    """A follow-up in flight is not the series' read: the next window is used for the next due
    image, not lost as busy."""
    t, _, done = answered()
    t.ask("B", "library/redis:7", done)
    assert isinstance(t.ask("A", BY_DIGEST, done + 1.0), Pass)  # still in flight at 2m
    assert not t.sched.view(2 * MIN).check.busy
    assert t.window().outcome is Outcome.USED


def test_p10_follow_up_answer_starts_no_new_follow_up_period() -> None:
    """Only a window's read grants follow-ups: passing through does not extend the period."""
    t, _, done = answered()
    assert isinstance(t.ask("A", TAG, done + 1.5, auth="s2"), Pass)
    assert isinstance(t.ask("A", TAG, done + 2.5, auth="s3"), Hold)
