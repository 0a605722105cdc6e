"""The memory budget's split: every bound a client can fill, full at once, fits in it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kuikproxy.core.memorybudget import BASE, COSTS, HEADROOM, SHARES, Bound, split

MIB = 1024**2
written_bounds = st.dictionaries(
    st.sampled_from([b for b in Bound if b is not Bound.RELAYS]), st.integers(1, 10**6)
)


def test_shares_add_up_to_the_whole() -> None:
    assert abs(sum(SHARES.values()) - 1) < 1e-9
    assert set(SHARES) == set(COSTS) == set(Bound)


def test_the_chart_limit_split() -> None:
    """512 MiB: 64 MiB for the process, a fifth as headroom, the rest shared; the bounds a
    client fills cheapest (refusals) get the least."""
    budget = split(512 * MIB, {})
    assert (budget.base, budget.headroom, budget.over) == (BASE, int(512 * MIB * HEADROOM), 0)
    assert sum(s.bytes for s in budget.shares) <= budget.fillable
    refusals = next(s for s in budget.shares if s.bound is Bound.REFUSALS)
    assert refusals.bytes == min(s.bytes for s in budget.shares)
    assert budget.value(Bound.IMAGES) == int(budget.fillable * 0.20) // 256


@given(st.integers(BASE * 2, 64 * 1024 * MIB), written_bounds)
def test_whatever_is_written_the_sized_bounds_fit_in_what_it_leaves(
    memory: int, written: dict[Bound, int]
) -> None:
    budget = split(memory, written)
    taken = sum(v * COSTS[b] for b, v in written.items())
    for share in budget.shares:
        assert share.set == (share.bound in written)
        if share.set:
            assert share.value == written[share.bound]
    if taken <= budget.fillable:
        # each sized bound rounds down, but is never below one item
        slack = sum(COSTS[s.bound] for s in budget.shares if not s.set)
        assert sum(s.bytes for s in budget.shares) <= budget.fillable + slack
    else:
        assert budget.over == sum(s.bytes for s in budget.shares) - budget.fillable > 0


def test_a_bound_not_used_takes_nothing() -> None:
    """Without a store its catalog takes nothing, and the others share its part."""
    with_store, without = split(512 * MIB, {}), split(512 * MIB, {}, frozenset({Bound.CATALOG}))
    assert without.value(Bound.CATALOG) == 0
    assert without.value(Bound.IMAGES) > with_store.value(Bound.IMAGES)
