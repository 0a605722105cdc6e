"""Shuffle sharding: a flow's hash dealt into a hand of distinct queue indices.

As Kubernetes' ``shufflesharding`` package: the hash is read as a mixed-radix number whose
digits, taken with successive ``divmod`` by ``deck, deck − 1, …``, pick each card among the cards
not dealt yet — so a hand never repeats a queue, and each possible hand is dealt by as many hash
values as any other. The hash must carry enough bits for that: ``ceil(log2(deck) · hand) ≤ 60``.
"""

from __future__ import annotations

import hashlib
import math

MAX_HASH_BITS = 60


def required_entropy_bits(deck_size: int, hand_size: int) -> int:
    """``ceil(log2(deck_size) · hand_size)``: the hash bits a uniform deal needs."""
    return math.ceil(math.log2(deck_size) * hand_size)


def flow_id(schema: str, distinguisher: str) -> str:
    """The flow of a request: its flow schema's name and distinguisher, NUL-separated (the
    bytes Kubernetes' ``hashFlowID`` hashes)."""
    return f"{schema}\x00{distinguisher}"


def hash_flow(flow: str) -> int:
    """A stable 64-bit hash of a flow: the first 8 bytes of its SHA-256, little-endian."""
    return int.from_bytes(hashlib.sha256(flow.encode()).digest()[:8], "little")


def deal(hash_value: int, deck_size: int, hand_size: int) -> list[int]:
    """``hand_size`` distinct cards out of ``range(deck_size)`` for ``hash_value``.

    Digit ``i`` (``hash mod (deck − i)``, then ``hash //= deck − i``) is a card among the
    ``deck − i`` not dealt before it; it is shifted past the earlier digits the way Kubernetes'
    ``Dealer.Deal`` does. Over ``hash_value in range(deck!/(deck−hand)!)`` every ordered hand
    comes out exactly once.
    """
    if not 0 < hand_size <= deck_size:
        raise ValueError(f"hand size {hand_size} must be in 1..{deck_size}")
    digits: list[int] = []
    for i in range(hand_size):
        hash_value, digit = divmod(hash_value, deck_size - i)
        digits.append(digit)
    hand: list[int] = []
    for i, digit in enumerate(digits):
        card = digit
        for j in range(i, 0, -1):
            if card >= digits[j - 1]:
                card += 1
        hand.append(card)
    return hand


def hand_for(flow: str, queues: int, hand_size: int) -> list[int]:
    """The queues a flow may join, in hand order."""
    return deal(hash_flow(flow), queues, hand_size)
