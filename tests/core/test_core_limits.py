"""Bounded state — limits refuse what would pass them, series with nothing due sleep,
sweeps drop what retention lets go of, and an idle host may be forgotten. Explicit ``now``."""

from __future__ import annotations

from timeline import img

from kuikproxy.core.hoststate import HostPacing
from kuikproxy.core.housekeeping import SWEEP_GRACE
from kuikproxy.core.limits import Census, Limit, Limits, Refuse, admits_host
from kuikproxy.core.scheduler import HostScheduler
from kuikproxy.core.tickets import Hold, Operation, Reuse
from kuikproxy.core.windows import Outcome

MIN = 60.0
HOUR = 3600.0


def scheduler(census: Census, host: str = "docker.io", *, prefetch: bool = False) -> HostScheduler:
    pacing = HostPacing(MIN, MIN, prefetch=prefetch, retention=HOUR)
    return HostScheduler(host, pacing, 0.0, census=census)


def kept(s: HostScheduler, resource: str, key: str, now: float) -> object:
    """A check answered from a kept answer read at ``now`` (R1), if it is admitted."""
    return s.check(resource, img(key), now, auth=None, kept_at=now)


def test_max_resources_refuses_a_new_resource_and_no_other() -> None:
    """At ``maxResources``, a request of a resource with no state is refused on any host and
    leaves nothing behind; resources with state go on asking there and elsewhere; a copy of a
    new resource is refused too."""
    census = Census(Limits(max_resources=2))
    hub, ghcr = scheduler(census), scheduler(census, "ghcr.io")
    assert isinstance(kept(hub, "A", "app/a:1", 1.0), Reuse)
    assert isinstance(kept(hub, "B", "app/a:1", 1.0), Reuse)
    assert kept(hub, "C", "app/a:1", 2.0) == Refuse(Limit.RESOURCES)
    assert kept(ghcr, "C", "app/a:1", 2.0) == Refuse(Limit.RESOURCES)
    assert hub.copy("C", img("app/a:1"), 2.0, opens=True) == Refuse(Limit.RESOURCES)
    assert "C" not in census and all(r.resource != "C" for r in hub.view(2.0).rings)
    assert isinstance(kept(hub, "A", "app/b:1", 3.0), Reuse)  # a new image, an old resource
    assert isinstance(kept(ghcr, "B", "app/a:1", 3.0), Reuse)  # an old resource, a new host
    assert isinstance(hub.copy("A", img("app/c:1"), 3.0, opens=True), Hold)
    assert len(census) == 2 and census.hosts("B") == ["docker.io", "ghcr.io"]


def test_max_ring_images_refuses_a_new_image_of_a_full_ring_only() -> None:
    """A ring at ``maxRingImages`` takes no new image; its images are still asked, and another
    resource's ring still grows."""
    census = Census(Limits(max_ring_images=2))
    s = scheduler(census)
    kept(s, "A", "app/a:1", 1.0)
    kept(s, "A", "app/b:1", 1.0)
    assert kept(s, "A", "app/c:1", 2.0) == Refuse(Limit.RING_IMAGES)
    assert isinstance(s.check("A", img("app/a:1"), 2.0, auth=None, kept_at=None), Hold)
    assert isinstance(kept(s, "B", "app/c:1", 2.0), Reuse)
    assert census.images == 3


def test_max_images_counts_every_ring_of_every_host() -> None:
    """``maxImages`` bounds the images of all rings together, across hosts; images that leave
    by retention (P8) make room again."""
    census = Census(Limits(max_images=3))
    hub, ghcr = scheduler(census), scheduler(census, "ghcr.io")
    kept(hub, "A", "app/a:1", 0.0)
    kept(hub, "B", "app/a:1", 0.0)
    kept(ghcr, "A", "app/a:1", 1000.0)
    assert kept(ghcr, "A", "app/b:1", 1000.0) == Refuse(Limit.IMAGES)
    hub.sweep(HOUR + 1.0)  # A's and B's images on docker.io are unasked for an hour
    assert census.images == 1 and len(census) == 1
    assert isinstance(kept(ghcr, "A", "app/b:1", HOUR + 1.0), Reuse)


def test_admits_host_below_the_limit_only() -> None:
    """``maxHosts``: one more host not in ``registries`` while fewer than the limit have state."""
    limits = Limits(max_hosts=2)
    assert admits_host(1, limits)
    assert not admits_host(2, limits)


def test_a_series_with_nothing_due_sleeps_and_wakes_on_its_grid() -> None:
    """P1, P3: nothing due, no window to fire (``next_due`` is None); the windows slept
    through are idle, counted when viewed; a held request wakes the series at its next window
    on the same grid, never earlier than a full interval after the origin."""
    s = scheduler(Census())
    assert s.next_due(Operation.CHECK, 0.0) is None
    assert s.next_due(Operation.COPY, 0.0) is None
    assert s.view(5 * MIN + 1.0).check.windows[Outcome.IDLE] == 5
    assert isinstance(s.check("A", img("app/a:1"), 7 * MIN + 30.0, auth=None, kept_at=None), Hold)
    assert s.next_due(Operation.CHECK, 7 * MIN + 30.0) == 8 * MIN
    assert s.next_due(Operation.COPY, 7 * MIN + 30.0) is None  # nothing due there
    result = s.check_window(8 * MIN)
    assert result.outcome is Outcome.USED
    assert s.view(8 * MIN).check.windows[Outcome.IDLE] == 7
    assert s.next_due(Operation.CHECK, 8 * MIN) == 9 * MIN  # its read is in flight: busy next


def test_a_prefetch_ring_is_due_without_a_request() -> None:
    """P7: a prefetch ring made by a kept answer has something due: its series wakes."""
    s = scheduler(Census(), prefetch=True)
    assert s.next_due(Operation.CHECK, 0.0) is None
    kept(s, "A", "app/a:1", 10.0)
    assert s.next_due(Operation.CHECK, 10.0) == MIN


def test_sweep_drops_ring_images_after_their_retention_without_a_window() -> None:
    """P8 with no window: the next sweep is just after the oldest ask's retention, and a sweep
    then drops what was not asked since, rings and census entries with them."""
    census = Census()
    s = scheduler(census)
    kept(s, "A", "app/a:1", 10.0)
    kept(s, "A", "app/b:1", 100.0)
    assert s.next_sweep(10.0, forgettable=False) == 10.0 + HOUR + SWEEP_GRACE
    s.sweep(10.0 + HOUR)  # exactly its retention: not *after* it yet
    assert census.images == 2
    s.sweep(10.0 + HOUR + SWEEP_GRACE)
    assert census.images == 1
    assert s.next_sweep(10.0 + HOUR + SWEEP_GRACE, forgettable=False) == (
        100.0 + HOUR + SWEEP_GRACE
    )
    s.sweep(100.0 + HOUR + SWEEP_GRACE)
    assert census.images == 0 and "A" not in census
    assert s.next_sweep(100.0 + HOUR + SWEEP_GRACE, forgettable=False) is None


def test_a_host_is_idle_a_retention_after_its_last_request_with_nothing_held() -> None:
    """A host not in ``registries`` may be forgotten once it had no request for the retention,
    holds nothing and has no ring left; a waiting request keeps it (its image stays asked,
    P8), a block keeps it until it ends (a block is never forgotten)."""
    census = Census()
    s = scheduler(census)
    ticket = s.check("A", img("app/a:1"), 0.0, auth=None, kept_at=None)
    assert isinstance(ticket, Hold)
    assert s.next_sweep(0.0, forgettable=True) == HOUR + SWEEP_GRACE
    s.sweep(HOUR + 1.0)
    assert not s.idle(HOUR + 1.0)  # its request still waits: asked for now, as far as P8 goes
    s.cancel(ticket.ticket)
    s.block(until=3 * HOUR)
    s.sweep(2 * HOUR + 2.0)  # the image leaves a retention after that sweep
    assert census.images == 0
    assert not s.idle(2 * HOUR + 2.0)
    assert s.next_sweep(2 * HOUR + 2.0, forgettable=True) == 3 * HOUR + SWEEP_GRACE
    assert s.idle(3 * HOUR + SWEEP_GRACE)
    s.forget()
    assert len(census) == 0 and census.images == 0


def test_a_host_still_in_use_past_its_retention_is_looked_at_a_retention_later() -> None:
    """A sweep never comes again at once: a host kept by a request that waits for longer than
    the retention is looked at a retention later."""
    s = scheduler(Census())
    s.check("A", img("app/a:1"), 0.0, auth=None, kept_at=None)
    s.sweep(HOUR + 5.0)
    assert not s.idle(HOUR + 5.0)
    assert s.next_sweep(HOUR + 5.0, forgettable=True) == 2 * HOUR + 5.0


def test_census_pages_resources_in_name_order() -> None:
    """``/status`` lists resources a page at a time: ``limit`` after ``after``, and whether
    more follow."""
    census = Census()
    for name in ("c", "a", "d", "b"):
        census.enter(name, "docker.io")
    assert census.page(None, 2) == (["a", "b"], True)
    assert census.page("b", 2) == (["c", "d"], False)
    census.leave("c", "docker.io")
    assert census.page("b", 5) == (["d"], False)
