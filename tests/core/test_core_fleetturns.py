"""A proxy's own turns in a fleet (core.fleetturns): cut off from the store, no window
(``fleet.whenCutOff: wait``) or alone on the turn it last learnt while the fleet was settled
(``ownTurns``), and, while the fleet forms again, a window only if the store gave it and it is
its own turn."""

from __future__ import annotations

from kuikproxy.core.fleetturns import Claim, Turns, careful_for

INTERVAL = 0.2


def test_settled_the_store_decides_and_its_turn_is_learnt() -> None:
    turns = Turns(place=7, of=1)
    assert turns.claimed(Claim(True, 1, 3), 4, INTERVAL, now=1.0)
    assert not turns.claimed(Claim(False, 1, 3), 5, INTERVAL, now=1.2)
    assert (turns.place, turns.of) == (1, 3)


def test_alone_only_its_own_turns() -> None:
    turns = Turns(place=1, of=3)
    assert [k for k in range(9) if turns.alone(k, wait=False)] == [1, 4, 7]


def test_cut_off_and_waiting_no_window() -> None:
    turns = Turns(place=1, of=3)
    assert [k for k in range(9) if turns.alone(k, wait=True)] == []
    assert turns.away  # back, it is careful as after any time alone


def test_one_cut_off_waiting_never_shares_a_window_with_those_still_reaching_the_store() -> None:
    """Three proxies settled; proxy 2 is cut off while the others still claim: two intervals
    on, the store's turns are among the two (it stopped leaving proxy 2 its own), and proxy 2,
    waiting, uses none; back, it is careful, and no window is used twice throughout."""
    proxies = [Turns(place=p, of=3) for p in range(3)]
    used: dict[int, int] = {}
    for window in range(10, 40):
        now = window * INTERVAL
        of = 3 if window < 12 or window >= 30 else 2  # the store's due proxies
        for place in (0, 1):
            claim = Claim(window % of == place, place, of)
            if proxies[place].claimed(claim, window, INTERVAL, now):
                used[window] = used.get(window, 0) + 1
        cut = 10 <= window < 30
        if cut and proxies[2].alone(window, wait=True):
            used[window] = used.get(window, 0) + 1
        if not cut and proxies[2].claimed(Claim(window % 3 == 2, 2, 3), window, INTERVAL, now):
            used[window] = used.get(window, 0) + 1
    assert set(used.values()) == {1}


def test_back_from_alone_a_window_must_also_be_its_own_turn_for_a_while() -> None:
    turns = Turns(place=1, of=3)
    turns.alone(10, wait=False)
    back = 2.0
    # the store gives it window 12 (its turns there are among fewer proxies so far): not its
    # own turn, and others may still be alone on theirs, so it is left unused
    assert not turns.claimed(Claim(True, 0, 1), 12, INTERVAL, now=back)
    assert turns.claimed(Claim(True, 0, 1), 13, INTERVAL, now=back + INTERVAL)
    assert not turns.claimed(Claim(False, 0, 2), 16, INTERVAL, now=back + 4 * INTERVAL)
    assert (turns.place, turns.of) == (1, 3)  # nothing learnt while the fleet forms
    # once every proxy alone has had time to try the store, the store's turns again
    later = back + careful_for(INTERVAL)
    assert turns.claimed(Claim(True, 0, 2), 20, INTERVAL, now=later)
    assert (turns.place, turns.of) == (0, 2)


def test_a_store_that_lost_its_turns_makes_every_claimer_careful() -> None:
    turns = Turns(place=0, of=2)  # was never alone: it had no work while the store was away
    assert not turns.claimed(Claim(True, 0, 1, forming=True), 5, INTERVAL, now=3.0)
    assert turns.claimed(Claim(True, 0, 1, forming=True), 6, INTERVAL, now=3.2)
    # every claim that says so extends the while: from the last one
    assert turns.claimed(Claim(True, 0, 1), 7, INTERVAL, now=3.2 + careful_for(INTERVAL))


def test_off_the_fleets_grid_nothing_is_learnt() -> None:
    turns = Turns(place=1, of=2)
    assert not turns.claimed(Claim(False, 0, 0), 3, INTERVAL, now=1.0)
    assert (turns.place, turns.of) == (1, 2)


def test_two_proxies_alone_and_one_back_never_share_a_window() -> None:
    """Three proxies that learnt their turns settled; the store restarts empty and comes back
    to one of them first: over the windows until the others are back, each window is used by
    at most one."""
    proxies = [Turns(place=p, of=3) for p in range(3)]
    for window in range(10, 13):
        assert sum(t.alone(window, wait=False) for t in proxies) == 1
    used: dict[int, int] = {}
    for window in range(13, 30):
        now = window * INTERVAL
        # proxy 0 is back (the store, empty, gives it every window); 1 and 2 are still alone
        if proxies[0].claimed(Claim(True, 0, 1, forming=True), window, INTERVAL, now):
            used[window] = used.get(window, 0) + 1
        for alone in proxies[1:]:
            if alone.alone(window, wait=False):
                used[window] = used.get(window, 0) + 1
    assert set(used.values()) == {1}
