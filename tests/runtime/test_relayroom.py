"""The relays' room (kuikproxy.runtime.relayroom): what a relay is given, who waits, who is
refused, and that room given back is never lost — on the loop's virtual clock (looptime)."""

from __future__ import annotations

import asyncio

import pytest

from kuikproxy.errors import Unavailable
from kuikproxy.runtime.relayroom import ON_THE_LOOP, THREADED, WAIT, RelayRoom

pytestmark = pytest.mark.looptime

MIB = 1024 * 1024


def room(limit: int) -> RelayRoom:
    return RelayRoom(asyncio.get_running_loop(), limit)


async def take(relays: RelayRoom, resource: str) -> int:
    return await relays.take(resource, want=THREADED, at_least=ON_THE_LOOP)


async def test_a_thread_ring_while_half_the_room_is_free_then_the_loops_relay() -> None:
    relays = room(8 * THREADED)
    given = [await take(relays, f"node-{n}") for n in range(6)]
    assert given[:4] == [THREADED] * 4  # up to half the room
    assert given[4:] == [ON_THE_LOOP] * 2
    assert relays.used == 4 * THREADED + 2 * ON_THE_LOOP


async def test_one_resource_holds_at_most_a_quarter_and_waits_for_its_own_relays() -> None:
    relays = room(40 * MIB)
    held = []
    while relays.used + ON_THE_LOOP <= 10 * MIB:
        held.append(await take(relays, "slow"))
    waiting = asyncio.ensure_future(take(relays, "slow"))
    await asyncio.sleep(1)
    assert not waiting.done()  # the resource has its quarter
    # another resource is not held up by it (the loop's relay: others wait for room)
    assert await take(relays, "fast") == ON_THE_LOOP
    relays.give("slow", held.pop())
    assert await waiting == ON_THE_LOOP  # its own relay ended: its turn


async def test_a_relay_without_room_is_refused_after_waiting_and_counted_as_relays() -> None:
    relays = room(ON_THE_LOOP)
    await take(relays, "a")
    started = asyncio.get_running_loop().time()
    with pytest.raises(Unavailable) as refused:
        await take(relays, "b")
    assert asyncio.get_running_loop().time() - started == pytest.approx(WAIT)
    assert refused.value.refusal == "relays"
    assert refused.value.retry_after == WAIT
    assert relays.used == ON_THE_LOOP  # the refused one holds nothing


async def test_waiting_relays_are_served_in_order_and_one_that_leaves_takes_nothing() -> None:
    relays = room(ON_THE_LOOP)
    await take(relays, "a")
    first = asyncio.ensure_future(take(relays, "b"))
    second = asyncio.ensure_future(take(relays, "c"))
    leaving = asyncio.ensure_future(take(relays, "d"))
    await asyncio.sleep(1)
    leaving.cancel()
    assert relays.take_window("e", MIB) == 0  # nothing is taken past those who wait
    relays.give("a", ON_THE_LOOP)
    assert await first == ON_THE_LOOP
    assert not second.done()
    relays.give("b", ON_THE_LOOP)
    assert await second == ON_THE_LOOP
    relays.give("c", ON_THE_LOOP)
    with pytest.raises(asyncio.CancelledError):
        await leaving
    assert relays.used == 0


async def test_a_larger_budget_on_reload_lets_waiting_relays_in() -> None:
    relays = room(ON_THE_LOOP)
    await take(relays, "a")
    waiting = asyncio.ensure_future(take(relays, "b"))
    await asyncio.sleep(1)
    relays.resize(4 * ON_THE_LOOP)
    assert await waiting == ON_THE_LOOP


async def test_a_fan_out_window_takes_what_is_free_and_a_small_blob_keeps_what_it_needs() -> None:
    relays = room(40 * MIB)
    held = await take(relays, "a")
    assert relays.fit("a", held, 300 * 1024) == 300 * 1024  # its blob is small
    assert relays.used == 300 * 1024
    # within the quarter of the resource whose read it is
    assert relays.take_window("a", 16 * MIB) == 10 * MIB - 300 * 1024
    assert relays.take_window("b", 4 * MIB) == 4 * MIB
    relays.give("a", 10 * MIB)
    relays.give("b", 4 * MIB)
    assert relays.used == 0
