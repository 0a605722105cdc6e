"""Flow control through the proxy (SPEC §10): one flow floods 10,000
requests, a second sends 10 on the same Limited level.

Two places where a flood is held back, one test each:

* **places** — on a paced host every request waits for its window, holding a place in its
  flow's queues: the flood parks at most ``handSize × queueLengthLimit`` and the rest is refused
  at the door (429 + ``Retry-After``), while the quiet flow's images come in its turns (P4);
* **seats** — where requests go upstream at once (a host kuik owns, ``paced: false``), the
  level's seats are shared by fair queuing: the quiet flow gets its turn each round however long
  the flood's queues are, and the flood beyond its queues is refused.

Both print the wait distribution of each flow (``pytest -s`` shows it).
"""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kuikproxy.web.keys import PACER
from tests.conftest import ProxyFactory, head
from tests.upstream_app import Registry
from tests.web.many import Proxy, proxy

pytestmark = pytest.mark.looptime

FLOOD, QUIET = 10_000, 10
HAND, QUEUE_LENGTH = 8, 50  # a flow parks or queues at most 8 × 50 = 400
LEVEL = f"""\
      limited:
        nominalConcurrencyShares: 10
        limitResponse:
          type: Queue
          queuing: {{queues: 64, handSize: {HAND}, queueLengthLimit: {QUEUE_LENGTH}}}
"""


@dataclass
class Outcome:
    status: int
    waited: float
    retry_after: int | None
    body: dict[str, Any]


async def send(
    client: Proxy, count: int, resource: str, path: Callable[[int], str]
) -> list[Outcome]:
    loop = asyncio.get_running_loop()

    async def one(i: int) -> Outcome:
        sent = loop.time()
        async with client.get(path(i), resource) as response:
            body = await response.json() if response.status != 200 else {}
            await response.read()
            retry_after = response.headers.get("Retry-After")
            return Outcome(
                response.status,
                loop.time() - sent,
                None if retry_after is None else int(retry_after),
                body,
            )

    return list(await asyncio.gather(*(one(i) for i in range(count))))


def waits(name: str, outcomes: list[Outcome]) -> list[float]:
    served = sorted(o.waited for o in outcomes if o.status == 200)
    refused = sum(1 for o in outcomes if o.status == 429)
    if served:
        q = statistics.quantiles(served, n=10, method="inclusive") if len(served) > 1 else served
        print(
            f"\n{name}: {len(served)} served, {refused} refused; wait (s) min {served[0]:.2f} "
            f"p10 {q[0]:.2f} p50 {statistics.median(served):.2f} p90 {q[-1]:.2f} "
            f"max {served[-1]:.2f}"
        )
    return served


def assert_refusals(outcomes: list[Outcome], level: str) -> None:
    """Every refusal is kuikproxy's own: 429 TOOMANYREQUESTS naming the level, with a
    Retry-After of at least a second."""
    for o in outcomes:
        if o.status != 200:
            assert o.status == 429
            assert o.retry_after is not None and o.retry_after >= 1
            (error,) = o.body["errors"]
            assert error["code"] == "TOOMANYREQUESTS"
            assert error["detail"]["priorityLevel"] == level


async def test_a_flood_parks_at_most_its_hand_and_the_quiet_flow_keeps_its_turns(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
) -> None:
    """10,000 checks of distinct images from one resource, 10 from another, on a host read one
    image per 200 ms: the flood holds at most 400 places and the rest is refused at once; the
    quiet resource's images are read in its turns, alternating with the flood's (P4)."""
    config = (
        "flowControl:\n  priorityLevels:\n    - name: checks\n      type: Limited\n"
        + LEVEL
        + "registries:\n  reg.test:\n    upstream: http://127.0.0.1:PORT\n"
        "    check: {interval: 200ms}\n"
    )
    async with proxy(aiohttp_server, config) as client:
        await flood_paced(client)


async def flood_paced(client: Proxy) -> None:
    pacer = client.app[PACER]
    most_held = 0

    async def sample() -> None:
        nonlocal most_held
        while True:
            most_held = max(most_held, pacer.held())
            await asyncio.sleep(0.05)

    sampler = asyncio.ensure_future(sample())
    flood = asyncio.ensure_future(
        send(client, FLOOD, "flood", lambda i: f"/v2/app/manifests/f{i:05}?ns=reg.test")
    )
    await asyncio.sleep(0.1)  # the flood has filled its hand
    quiet = await send(client, QUIET, "quiet", lambda i: f"/v2/app/manifests/q{i}?ns=reg.test")
    flooded = await flood
    sampler.cancel()

    quiet_waits = waits("quiet", quiet)
    flood_waits = waits("flood", flooded)
    assert [o.status for o in quiet] == [200] * QUIET
    # turns: the quiet images are read every other window, the first one at the next window
    assert max(quiet_waits) <= 0.2 * (2 * QUIET + 1)
    served = len(flood_waits)
    assert HAND * QUEUE_LENGTH <= served < FLOOD // 10
    assert_refusals(flooded, "checks")
    assert most_held <= HAND * QUEUE_LENGTH + QUIET  # bounded, never the whole flood
    status = await (await client.get("/status")).json()
    (checks,) = [p for p in status["flowControl"]["priorityLevels"] if p["name"] == "checks"]
    assert checks["rejectedByReason"]["queue-full"] == FLOOD - served
    assert (checks["inQueue"], checks["parked"], checks["executing"]) == (0, 0, 0)
    # one read per image, none for a refused one
    assert len(client.registry.reads()) == served + QUIET


async def test_the_quiet_flow_gets_its_seats_while_the_flood_queues(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
) -> None:
    """A host kuik owns (unpaced), each answer taking 1 s, a level of 10 seats: the flood fills
    its seats and its 400 places, the rest is refused; the quiet flow, arriving after, is
    dispatched within about two rounds of fair queuing — it does not wait behind the flood."""
    config = (
        "flowControl:\n  serverConcurrencyLimit: 75\n  priorityLevels:\n"
        "    - name: bulk\n      type: Limited\n" + LEVEL + "  flowSchemas:\n"
        # precedence 1 like the built-in exempt schema for unpaced requests: ties go by name
        "    - name: bulk\n      matchingPrecedence: 1\n"
        "      priorityLevelConfiguration: {name: bulk}\n"
        "      distinguisherMethod: {type: ByResource}\n"
        "      rules: [{hosts: [bulk.test]}]\n"
        "registries:\n  bulk.test:\n    upstream: http://127.0.0.1:PORT\n    paced: false\n"
    )
    async with proxy(aiohttp_server, config) as client:
        client.registry.delay = 1.0
        await flood_unpaced(client)


async def flood_unpaced(client: Proxy) -> None:
    flood = asyncio.ensure_future(
        send(client, FLOOD, "flood", lambda i: f"/v2/app/manifests/f{i:05}?ns=bulk.test")
    )
    await asyncio.sleep(0.1)
    status = await (await client.get("/status")).json()
    (bulk,) = [p for p in status["flowControl"]["priorityLevels"] if p["name"] == "bulk"]
    assert (bulk["currentCL"], bulk["executing"], bulk["inQueue"]) == (10, 10, HAND * QUEUE_LENGTH)
    assert {c["type"]: c["reason"] for c in bulk["conditions"]}["Saturated"] == "RequestsQueued"
    quiet = await send(client, QUIET, "quiet", lambda i: f"/v2/app/manifests/q{i}?ns=bulk.test")
    flooded = await flood

    quiet_waits = waits("quiet", quiet)
    flood_waits = waits("flood", flooded)
    assert [o.status for o in quiet] == [200] * QUIET
    # Each queue holding requests gets one turn per round: the flood's eight, and the few of
    # its hand the quiet flow's ten spread over (the least loaded, so not the flood's) — a
    # round of 8 + k turns takes (8 + k) / 10 s, and the quiet flow needs ceil(10 / k) rounds.
    # With this hand that is under 4 s, where the flood's last queued request waits 42 s.
    assert max(quiet_waits) <= 4.0
    assert max(flood_waits) >= (HAND * QUEUE_LENGTH) / 10  # the flood waits its own turns
    assert len(flood_waits) == 10 + HAND * QUEUE_LENGTH
    assert_refusals(flooded, "bulk")
    assert len(client.registry.reads()) == len(flood_waits) + QUIET


# -- clients that leave give back what they held ------------------------------------------------

ONE_QUEUE = "queuing: {queues: 1, handSize: 1, queueLengthLimit: 2}"


def level(name: str, queuing: str, shares: int = 10) -> str:
    return (
        f"    - name: {name}\n      type: Limited\n      limited:\n"
        f"        nominalConcurrencyShares: {shares}\n"
        f"        limitResponse: {{type: Queue, {queuing}}}\n"
    )


async def levels(client: TestClient[Any, Any]) -> dict[str, dict[str, Any]]:
    status = await (await client.get("/status")).json()
    return {p["name"]: p for p in status["flowControl"]["priorityLevels"]}


async def test_a_parked_client_that_leaves_gives_its_place_back(proxy: ProxyFactory) -> None:
    """A flow may park 2 (one queue of 2): the third check is refused at once, with a
    Retry-After of at least the time to the next window; when a parked client leaves, its place
    is free for the next request, and what is left is read as usual."""
    client = await proxy(top="flowControl:\n  priorityLevels:\n" + level("checks", ONE_QUEUE))
    first = asyncio.ensure_future(head(client, "a"))
    second = asyncio.ensure_future(head(client, "b"))
    await asyncio.sleep(0.05)
    refused = await head(client, "c")
    assert refused.status == 429 and int(refused.headers["Retry-After"]) >= 1
    assert (await levels(client))["checks"]["parked"] == 2
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert (await levels(client))["checks"]["parked"] == 1
    assert (await head(client, "d")).status == 200  # parked in the freed place, read in turn
    assert (await first).status == 200
    checks = (await levels(client))["checks"]
    assert (checks["parked"], checks["inQueue"], checks["executing"]) == (0, 0, 0)
    assert checks["rejectedByReason"] == {"queue-full": 1, "concurrency-limit": 0}
    assert client.server.app[PACER].tasks == set()


async def test_a_client_that_leaves_while_queued_for_a_seat_is_not_sent(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """One seat (ServerCL 1), each answer taking 1 s: of three requests the second waits for
    the seat and its client leaves; the third takes the seat after the first, the second is
    never sent, and the level ends with nothing executing or queued."""
    fake, _ = registry
    fake.delay = 1.0
    client = await proxy(
        "paced: false",
        top="flowControl:\n  serverConcurrencyLimit: 1\n  priorityLevels:\n"
        + level("bulk", "queuing: {queues: 4, handSize: 2, queueLengthLimit: 5}", shares=1)
        + "  flowSchemas:\n    - name: bulk\n      matchingPrecedence: 1\n"
        "      priorityLevelConfiguration: {name: bulk}\n      rules: [{}]\n",
    )
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    first = asyncio.ensure_future(head(client, "a"))
    await asyncio.sleep(0.1)
    second = asyncio.ensure_future(head(client, "b"))
    third = asyncio.ensure_future(head(client, "c"))
    await asyncio.sleep(0.1)
    assert (await levels(client))["bulk"]["inQueue"] == 2
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    assert [(await r).status for r in (first, third)] == [200, 200]
    assert [(s.path.rsplit("/", 1)[1], round(s.at - t0, 1)) for s in fake.reads()] == [
        ("a", 0.0),
        ("c", 1.0),
    ]
    bulk = (await levels(client))["bulk"]
    assert (bulk["inQueue"], bulk["executing"], bulk["dispatched"]) == (0, 0, 2)
