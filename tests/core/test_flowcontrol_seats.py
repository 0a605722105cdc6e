"""SPEC §10 seat arithmetic: NominalCL, LendableCL, BorrowingCL, and current limits that move
with demand (Kubernetes' fair allocation, as :class:`Allocator` states it)."""

from __future__ import annotations

from flowcontrol_levels import exempt, limited, worked_example
from hypothesis import given, settings
from hypothesis import strategies as st

from kuikproxy.core.flowcontrol import (
    LevelType,
    LimitedPriorityLevelConfiguration,
    LimitResponse,
    LimitResponseType,
    PriorityLevel,
    QueuingConfiguration,
    Seats,
    current_limits,
    fair_allocation,
    flow_problems,
    level_problems,
    seats,
)

SERVER_CL = 100


def test_worked_example_nominal_lendable_borrowing() -> None:
    """ServerCL 100, NCS 30/10/0 (Σ 40): NominalCL ceil(75) = 75, ceil(25) = 25, 0 (the jail);
    LendableCL round(37.5) = 38 and round(12.5) = 13 — halves away from zero, as Go's
    math.Round, not Python's banker's round; BorrowingCL nil (unlimited) and round(25 · 2) = 50."""
    table = seats(worked_example(), SERVER_CL)
    assert table == {
        "exempt": Seats(nominal=0, lendable=0, borrowing=0),
        "workload": Seats(nominal=75, lendable=38, borrowing=None),
        "batch": Seats(nominal=25, lendable=13, borrowing=50),
        "jail": Seats(nominal=0, lendable=0, borrowing=0),
    }
    assert (table["workload"].floor, table["workload"].ceiling(SERVER_CL)) == (37, 175)
    assert (table["batch"].floor, table["batch"].ceiling(SERVER_CL)) == (12, 75)


def test_nominal_cl_rounds_up_and_exempt_shares_count() -> None:
    """NCS 1/1/1 of ServerCL 100 is ceil(33.3) = 34 each; an Exempt level's NCS is part of
    Σ NCS (it reserves seats it may lend)."""
    levels = [limited("a", 1), limited("b", 1), exempt("e", shares=1, lendable=100)]
    table = seats(levels, SERVER_CL)
    assert [table[n].nominal for n in ("a", "b", "e")] == [34, 34, 34]
    assert table["e"].lendable == 34


def limits(**demand: int) -> dict[str, int]:
    return current_limits(worked_example(), SERVER_CL, demand)


def test_idle_levels_share_seats_in_proportion_to_their_floors() -> None:
    """Nobody wants anything: targets are the floors 37 and 12, so fairProp = 100/49 and the
    limits are 75.51 → 76 and 24.49 → 24 (largest remainders); the jail stays at 0."""
    assert limits() == {"exempt": 0, "workload": 76, "batch": 24, "jail": 0}


def test_a_busy_level_borrows_what_an_idle_one_lends() -> None:
    """workload wants 150, batch nothing: batch falls to its floor 12 and workload gets
    100 − 12 = 88 = NominalCL 75 + 13 borrowed (all of batch's LendableCL)."""
    assert limits(workload=150) == {"exempt": 0, "workload": 88, "batch": 12, "jail": 0}


def test_two_busy_levels_share_in_proportion_to_demand() -> None:
    """workload 150 and batch 100: fairProp = 100/250 = 0.4, neither bound binds: 60 and 40 —
    batch borrows 15 of workload's 38 lendable seats (its BorrowingCL is 50)."""
    assert limits(workload=150, batch=100) == {"exempt": 0, "workload": 60, "batch": 40, "jail": 0}


def test_a_level_is_never_pushed_below_its_floor() -> None:
    """batch wants 100, workload 40: 100·40/140 = 28.6 would be below workload's floor 37, so
    workload keeps 37 and batch takes the other 63 (borrowing 38 ≤ 50)."""
    assert limits(workload=40, batch=100) == {"exempt": 0, "workload": 37, "batch": 63, "jail": 0}


def test_borrowing_limit_caps_a_level_and_the_lender_keeps_the_rest() -> None:
    """With workload lending 100 % (floor 0), batch wanting 1000 stops at its ceiling
    25 + 50 = 75; the 25 seats it may not borrow stay with workload."""
    levels = [limited("workload", 30, lendable=100), limited("batch", 10, borrowing=200)]
    assert current_limits(levels, SERVER_CL, {"batch": 1000}) == {"workload": 25, "batch": 75}


def test_jail_holds_nothing_unless_it_may_borrow() -> None:
    """NCS 0 makes NominalCL 0. With borrowingLimitPercent set the jail's limit is 0 whatever
    its demand; left nil (unlimited, as Kubernetes) it borrows: targets 37, 12, 5 → fairProp
    100/54 → 68.5, 22.2, 9.3 → 69, 22, 9."""
    assert limits(jail=50)["jail"] == 0
    levels = [*worked_example()[:3], limited("jail", 0, borrowing=None)]
    assert current_limits(levels, SERVER_CL, {"jail": 5}) == {
        "exempt": 0,
        "workload": 69,
        "batch": 22,
        "jail": 9,
    }


def test_an_exempt_level_lends_only_what_it_does_not_use() -> None:
    """An Exempt level with NCS 20 (NominalCL 40 of 100 beside workload's 60) and lendable
    100 % lends all 40 while idle, keeps what it uses, and never borrows."""
    levels = [exempt("e", shares=20, lendable=100), limited("workload", 30)]
    assert current_limits(levels, SERVER_CL, {"workload": 500}) == {"e": 0, "workload": 100}
    assert current_limits(levels, SERVER_CL, {"workload": 500, "e": 15}) == {
        "e": 15,
        "workload": 85,
    }
    assert current_limits(levels, SERVER_CL, {"workload": 500, "e": 90}) == {
        "e": 40,
        "workload": 60,
    }


def test_floors_above_server_cl_are_kept() -> None:
    """The built-in levels (30, 30, 5 of ServerCL 64; nothing lendable) have NominalCL 30, 30,
    5 = 65: the ceil makes the floors exceed ServerCL by one seat, the only way the total can."""
    levels = [limited("checks"), limited("copies"), limited("catch-all", 5, reject=True)]
    assert current_limits(levels, 64, {}) == {"checks": 30, "copies": 30, "catch-all": 5}


def test_fair_allocation_solves_kubernetes_example() -> None:
    """computeConcurrencyAllocation: the allocations sum to the requirement, and are
    fairProp · target unless a bound binds."""
    allocs, prop = fair_allocation(100, [(37, 175), (12, 75)], [150.0, 12.0])
    assert abs(sum(allocs) - 100) < 1e-9
    assert allocs[1] == 12
    assert abs(allocs[0] - 88) < 1e-9
    assert abs(prop - 88 / 150) < 1e-9


level_specs = st.lists(
    st.tuples(
        st.integers(0, 50),  # NCS
        st.integers(0, 100),  # lendablePercent
        st.one_of(st.none(), st.integers(0, 300)),  # borrowingLimitPercent
        st.integers(0, 300),  # demand
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(specs=level_specs, server_cl=st.integers(1, 200))
def test_limits_stay_within_bounds_and_sum_to_server_cl(
    specs: list[tuple[int, int, int | None, int]], server_cl: int
) -> None:
    """For any levels and demand: each limit is within [NominalCL − LendableCL, NominalCL +
    BorrowingCL]; the limits sum to ServerCL, unless the floors alone exceed it (then to the
    floors) or the ceilings cannot reach it (then to the ceilings); and a level that wants
    no more than its floor gets at least its floor."""
    levels = [
        limited(f"l{i}", ncs, lendable=lend, borrowing=borrow)
        for i, (ncs, lend, borrow, _) in enumerate(specs)
    ]
    demand = {f"l{i}": spec[3] for i, spec in enumerate(specs)}
    table = seats(levels, server_cl)
    out = current_limits(levels, server_cl, demand)
    floors = sum(s.floor for s in table.values())
    ceilings = sum(s.ceiling(server_cl) for s in table.values())
    assert sum(out.values()) == min(max(server_cl, floors), ceilings)
    for name, limit in out.items():
        assert table[name].floor <= limit <= table[name].ceiling(server_cl)


def test_validation_refuses_what_kubernetes_refuses() -> None:
    """SPEC §10's list: Exempt with limited, Limited without it, Reject with queuing, Queue
    without it, handSize > queues, more than 60 bits of entropy, lendablePercent outside
    0..100, negative numbers — each reported at its path, none raised."""
    plc, lim = PriorityLevel, LimitedPriorityLevelConfiguration
    reject = LimitResponse(LimitResponseType.REJECT)
    assert level_problems(plc("e", LevelType.EXEMPT, limited=lim(reject))) == [
        (("limited",), "must not be set when type is Exempt")
    ]
    assert level_problems(plc("l", LevelType.LIMITED)) == [
        (("limited",), "must be set when type is Limited")
    ]
    reject_with_queuing = lim(LimitResponse(LimitResponseType.REJECT, QueuingConfiguration()))
    assert level_problems(plc("r", LevelType.LIMITED, limited=reject_with_queuing)) == [
        (("limited", "limitResponse", "queuing"), "must not be set when type is Reject")
    ]
    queue_without = lim(LimitResponse(LimitResponseType.QUEUE, None))
    [(where, reason)] = level_problems(plc("q", LevelType.LIMITED, limited=queue_without))
    assert where == ("limited", "limitResponse", "queuing")
    assert reason.startswith("must be set when type is Queue")
    queuing = ("limited", "limitResponse", "queuing")
    assert level_problems(limited("h", queues=4, hand_size=5)) == [
        ((*queuing, "handSize"), "must not be greater than queues (4)")
    ]
    assert level_problems(limited("bits", queues=128, hand_size=9)) == [
        (
            (*queuing, "handSize"),
            "a hand of 9 out of 128 queues needs 63 bits of entropy "
            "(ceil(log2(queues) · handSize)), more than 60",
        )
    ]
    assert level_problems(limited("ok", queues=1024, hand_size=6)) == []  # exactly 60 bits
    assert level_problems(limited("p", lendable=101, borrowing=-1, queue_length_limit=0)) == [
        ((*queuing, "queueLengthLimit"), "must be greater than 0"),
        (("limited", "lendablePercent"), "must be between 0 and 100"),
        (("limited", "borrowingLimitPercent"), "must not be negative"),
    ]
    negative = LimitResponse(LimitResponseType.QUEUE, QueuingConfiguration(queues=-1))
    assert ((*queuing, "queues"), "must be greater than 0") in level_problems(
        plc("n", LevelType.LIMITED, limited=lim(negative))
    )
    assert flow_problems(0, [limited("a"), limited("a")], []) == [
        (("serverConcurrencyLimit",), "must be greater than 0"),
        (("priorityLevels", 1, "name"), 'duplicate name "a" (also priorityLevels[0])'),
    ]
