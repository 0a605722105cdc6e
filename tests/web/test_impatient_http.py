"""Impatient clients are served in mode ``hold`` (P7, P11).

kube-image-keeper gives up a check after about 10 s and tries again later; the check interval
is often longer. Without standing asks such a client never gets an answer: each time it leaves,
its image is not read, and each retry starts over. Here a kuik-like client (HEAD, 10 s
deadline, retrying) against a 30 s interval is answered within two intervals, with and without
``check.maxHold``, and the registry sees one read per image; a client that obeys the
``Retry-After`` of a ``maxHold`` refusal is answered on its first return.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import ProxyFactory, head
from tests.upstream_app import Registry

pytestmark = pytest.mark.looptime

INTERVAL = 30.0
DEADLINE = 10.0  # kuik's check gives up after this long
PAUSES = [1.0, 20.0]  # how much later kuik tries again: with 20 s it is away at every window
GIVE_UP = 20 * INTERVAL  # a test that fails, fails rather than hangs


async def kuik_check(
    client: object, ref: str, pause: float, resource: str = "ImageMonitor/default/web"
) -> float:
    """Check ``ref`` as kuik does until it is answered 200; when that was (loop time). A 429 is
    retried after the pause, its ``Retry-After`` ignored (kuik requeues on its own clock)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while loop.time() - started < GIVE_UP:
        try:
            async with asyncio.timeout(DEADLINE):
                response = await head(client, ref, resource)
        except TimeoutError:
            pass
        else:
            if response.status == 200:
                return loop.time()
            assert response.status == 429
        await asyncio.sleep(pause)
    raise AssertionError(f"{ref} was never answered in {GIVE_UP:g}s")


@pytest.mark.parametrize("pause", PAUSES)
@pytest.mark.parametrize("max_hold", ["0s", "5s"])
async def test_p11_a_check_that_gives_up_after_10s_is_answered_within_two_intervals(
    proxy: ProxyFactory, registry: tuple[Registry, object], max_hold: str, pause: float
) -> None:
    """One image, a 30 s interval, a client that gives up after 10 s: answered 200 by the
    second window at the latest (the first one reads it for the standing ask), one read."""
    fake, _ = registry
    client = await proxy(f"check: {{interval: 30s, maxHold: {max_hold}}}")
    await asyncio.sleep(1)  # off the grid: with a 20 s pause it is away at every window
    started = asyncio.get_running_loop().time()
    answered = await kuik_check(client, "v1", pause)
    assert answered - started <= 2 * INTERVAL
    assert len(fake.reads()) == 1


@pytest.mark.parametrize("pause", PAUSES)
@pytest.mark.parametrize("max_hold", ["0s", "5s"])
async def test_p11_impatient_checks_of_many_images_are_each_read_once(
    proxy: ProxyFactory, registry: tuple[Registry, object], max_hold: str, pause: float
) -> None:
    """Three images of one resource, each checked by an impatient client: one window reads
    each (one read per image), and every check is answered within one interval of its read."""
    fake, _ = registry
    client = await proxy(f"check: {{interval: 30s, maxHold: {max_hold}}}")
    await asyncio.sleep(1)
    started = asyncio.get_running_loop().time()
    answered = await asyncio.gather(*(kuik_check(client, ref, pause) for ref in ("a", "b", "c")))
    assert sorted(path for _, path in ((s.method, s.path) for s in fake.reads())) == [
        "/v2/app/manifests/a",
        "/v2/app/manifests/b",
        "/v2/app/manifests/c",
    ]
    assert max(answered) - started <= 4 * INTERVAL


async def test_p11_a_client_that_obeys_retry_after_is_answered_on_its_first_return(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """With ``check.maxHold``, the refusal's ``Retry-After`` points just after the window that
    reads the image (rounded up to whole seconds): a client that comes back then is answered
    at once — from the read in flight or the kept answer — never refused again."""
    fake, _ = registry
    client = await proxy("check: {interval: 30s, maxHold: 5s}")
    loop = asyncio.get_running_loop()
    for ref in ("a", "b", "c"):  # b and c wait behind a: their turns are later windows
        response = await head(client, ref)
        assert response.status == 429
        retry_after = int(response.headers["Retry-After"])
        await asyncio.sleep(retry_after)
        back = loop.time()
        assert (await head(client, ref)).status == 200
        assert loop.time() - back < 1.0
    assert len(fake.reads()) == 3
