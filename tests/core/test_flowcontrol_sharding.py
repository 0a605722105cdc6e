"""Shuffle sharding: a flow's hand is ``handSize`` distinct queues, the same every time (and in
every process: SHA-256, not ``hash``), dealt as Kubernetes' dealer deals; the entropy limit."""

from __future__ import annotations

import hashlib
import itertools
import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from kuikproxy.core.flowcontrol import (
    MAX_HASH_BITS,
    deal,
    flow_id,
    hand_for,
    hash_flow,
    required_entropy_bits,
)

# (queues, handSize) pairs within the 60-bit limit
pairs = st.integers(1, 4096).flatmap(
    lambda queues: st.tuples(
        st.just(queues),
        st.integers(1, min(queues, 15)).filter(
            lambda hand: required_entropy_bits(queues, hand) <= MAX_HASH_BITS
        ),
    )
)


@settings(max_examples=500, deadline=None)
@given(flow=st.text(max_size=40), pair=pairs)
def test_hand_is_hand_size_distinct_queues_and_stable(flow: str, pair: tuple[int, int]) -> None:
    """Any flow, any valid (queues, handSize): the hand has handSize distinct indices in
    range(queues), and dealing again gives the same hand in the same order."""
    queues, hand_size = pair
    hand = hand_for(flow, queues, hand_size)
    assert len(hand) == hand_size
    assert len(set(hand)) == hand_size
    assert all(0 <= q < queues for q in hand)
    assert hand_for(flow, queues, hand_size) == hand


def test_flow_hash_is_stable_across_processes() -> None:
    """The hash is the first 8 bytes of SHA-256 of ``schema NUL distinguisher``, little-endian
    (Kubernetes' hashFlowID): pinned, so a restart or another replica deals the same hands."""
    flow = flow_id("checks", "imagemonitor/default/web")
    assert flow == "checks\x00imagemonitor/default/web"
    digest = hashlib.sha256(b"checks\x00imagemonitor/default/web").digest()
    assert hash_flow(flow) == int.from_bytes(digest[:8], "little")
    assert digest[:8].hex() == "2b3b8c9878bc37bb"
    assert hand_for(flow, 64, 8) == [43, 53, 18, 56, 0, 10, 59, 29]


@pytest.mark.parametrize("deck", range(1, 8))
def test_deal_is_a_bijection_onto_ordered_hands(deck: int) -> None:
    """Over hash values 0 … deck!/(deck−hand)! − 1, every ordered hand of distinct cards comes
    out exactly once — so hands are uniform when the hash is."""
    for hand_size in range(1, deck + 1):
        count = math.perm(deck, hand_size)
        hands = {tuple(deal(h, deck, hand_size)) for h in range(count)}
        assert hands == set(itertools.permutations(range(deck), hand_size))


def test_digits_are_successive_divmods_with_decreasing_deck() -> None:
    """Deck 10, hash 7 + 10·(3 + 9·5): digits 7, 3, 5 pick card 7, then the 4th (index 3) of
    the nine left, then the 6th (index 5) of the eight left after that: 7, 3, 6."""
    assert deal(7 + 10 * (3 + 9 * 5), 10, 3) == [7, 3, 6]


@settings(max_examples=200, deadline=None)
@given(queues=st.integers(2, 1 << 20), hand_size=st.integers(1, 64))
def test_entropy_rule(queues: int, hand_size: int) -> None:
    """``ceil(log2(queues) · handSize)``: 64 queues × 8 = 48 bits fits; 128 × 9 = 63 does not."""
    assume(hand_size <= queues)
    assert required_entropy_bits(queues, hand_size) == math.ceil(math.log2(queues) * hand_size)
    assert required_entropy_bits(64, 8) == 48
    assert required_entropy_bits(128, 9) == 63


def test_hands_of_many_flows_spread_over_the_queues() -> None:
    """2000 flows × hands of 8 out of 64: every queue is in some hand and none in more than
    twice its share — the hash does not favour queues."""
    seen = [0] * 64
    for n in range(2000):
        for q in hand_for(flow_id("checks", f"flow-{n}"), 64, 8):
            seen[q] += 1
    share = 2000 * 8 / 64
    assert min(seen) > share / 2
    assert max(seen) < share * 2
