"""runtime/sweeps.py: every host's lapses on one timer, on virtual time."""

from __future__ import annotations

import asyncio

import pytest

from kuikproxy.runtime.sweeps import BATCH, Sweeps

pytestmark = pytest.mark.looptime


async def test_one_timer_sweeps_each_host_at_its_time_until_it_has_nothing_left() -> None:
    """Each host is swept at the time it is due, again when its sweep says so, and no more
    once it says None; one loop timer serves them all; a host dropped is not swept; a host
    due earlier than it was scheduled is swept then."""
    loop = asyncio.get_running_loop()
    swept: list[tuple[str, float]] = []
    again = {"a": 30.0}

    def sweep(host: str, now: float) -> float | None:
        swept.append((host, now))
        return again.pop(host, None)

    sweeps = Sweeps(loop, sweep)
    start = loop.time()
    sweeps.schedule("a", start + 10.0)
    sweeps.schedule("b", start + 20.0)
    sweeps.schedule("c", start + 25.0)
    sweeps.schedule("b", start + 5.0)  # earlier: it is swept then, once
    sweeps.schedule("a", start + 15.0)  # later than it is due: changes nothing
    sweeps.drop("c")
    timers = [h for h in loop._scheduled if not h.cancelled()]  # type: ignore[attr-defined]
    assert len(timers) == 1
    await asyncio.sleep(40.0)
    assert [(host, round(now - start)) for host, now in swept] == [("b", 5), ("a", 10), ("a", 30)]
    assert len(sweeps) == 0 and "a" not in sweeps
    sweeps.close()


async def test_hosts_due_together_are_swept_a_batch_per_turn_of_the_loop() -> None:
    """Hosts due at one time are swept at most :data:`BATCH` per callback, so that forgetting
    many at once never holds the loop for long; the rest follow at the next turns."""
    loop = asyncio.get_running_loop()
    batches: list[list[str]] = []
    sealed = True

    def seal() -> None:  # runs once the callback that swept a batch has returned
        nonlocal sealed
        sealed = True

    def sweep(host: str, now: float) -> None:
        nonlocal sealed
        if sealed:
            batches.append([])
            sealed = False
            loop.call_soon(seal)
        batches[-1].append(host)

    sweeps = Sweeps(loop, sweep)
    for i in range(2 * BATCH + 10):
        sweeps.schedule(f"h{i}", loop.time() + 1.0)
    await asyncio.sleep(2.0)
    assert [len(batch) for batch in batches] == [BATCH, BATCH, 10]
    sweeps.close()
