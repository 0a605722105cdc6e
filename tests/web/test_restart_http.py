"""P13 through HTTP, on virtual time: a proxy with ``state.path``, stopped, and a second proxy on
the same file that resumes where the first one was.

The file holds wall-clock times. Under looptime the loop's clock runs far ahead of the real
one, so here the pacer's wall clock is the loop's plus a fixed epoch: a downtime slept on the
virtual clock is a downtime in the file too, and the assertions are exact.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from kuikproxy.core.ringstate import EntryState, RingChanges, RingHeader, RingState
from kuikproxy.errors import StateError
from kuikproxy.runtime import pacer as pacer_module
from kuikproxy.state import Batch, Saved, StateStore
from kuikproxy.web.keys import PACER
from tests.conftest import HOST, ProxyFactory, head
from tests.upstream_app import Registry

pytestmark = pytest.mark.looptime

INTERVAL = 0.2
EPOCH = 1_800_000_000.0
REFS = ["v1", "v2", "v3", "v4", "v5"]


@pytest.fixture
async def wall_follows_the_loop(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[None]:
    loop = asyncio.get_running_loop()
    monkeypatch.setattr(pacer_module, "time", SimpleNamespace(time=lambda: EPOCH + loop.time()))
    yield


def state(tmp_path: Path) -> str:
    return f"state: {{path: {tmp_path / 'state.db'}}}"


def refs_read(fake: Registry, since: float = 0.0) -> list[str]:
    return [s.path.rsplit("/", 1)[1] for s in fake.reads() if s.at >= since]


def ring_of(client: TestClient[Any, Any], resource: str = "web") -> Any:
    scheduler = client.server.app[PACER].hosts[HOST]
    now = client.server.app[PACER].loop.time()
    return next(r for r in scheduler.view(now).rings if r.resource == resource)


async def stop_with_held(client: TestClient[Any, Any], held: list[asyncio.Future[Any]]) -> None:
    """The first proxy goes away with requests still held: their clients give up first."""
    for request in held:
        request.cancel()
    await asyncio.gather(*held, return_exceptions=True)
    await client.close()


@pytest.mark.usefixtures("wall_follows_the_loop")
async def test_p13_a_second_proxy_on_the_same_file_resumes_after_the_cursor(
    proxy: ProxyFactory, registry: tuple[Registry, object], tmp_path: Path
) -> None:
    """Two of five images read, then the proxy stops; one second later a new one starts on the
    same file. Its first read is a full interval after it started (P1), of the third image;
    the two read before the restart wait for the next lap, and the lap that wraps counts the
    downtime in its duration."""
    fake, _ = registry
    loop = asyncio.get_running_loop()
    first = await proxy(top=state(tmp_path))
    held = [asyncio.ensure_future(head(first, ref)) for ref in REFS]
    await asyncio.sleep(2.5 * INTERVAL)
    assert refs_read(fake) == ["v1", "v2"]
    lap_start = ring_of(first).cycle_started
    await stop_with_held(first, held)

    await asyncio.sleep(1.0)
    second = await proxy(top=state(tmp_path))
    restarted = loop.time()
    ring = ring_of(second)
    assert (ring.images, ring.cursor) == (5, "app:v2")
    assert ring.cycle_started == pytest.approx(lap_start, abs=1e-6)
    responses = await asyncio.gather(*(head(second, ref) for ref in REFS))
    assert [r.status for r in responses] == [200] * 5
    assert refs_read(fake, restarted) == ["v3", "v4", "v5", "v1", "v2"]
    first_read = fake.reads()[2].at
    assert first_read - restarted == pytest.approx(INTERVAL, abs=0.01)
    ring = ring_of(second)
    wrap = restarted + 4 * INTERVAL  # v1: the lap wraps
    assert ring.cycle_started == pytest.approx(wrap, abs=1e-6)
    assert ring.cycle_duration == pytest.approx(wrap - lap_start, abs=1e-6)
    assert ring.cycle_duration > 1.0 + 5 * INTERVAL  # the downtime is in it
    await second.close()


@pytest.mark.usefixtures("wall_follows_the_loop")
async def test_p13_the_turn_is_on_disk_before_its_read_is_sent(
    proxy: ProxyFactory,
    registry: tuple[Registry, object],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every read reaches the registry after a write that moved the cursor to its image has
    finished: a process killed as the read goes out would not read it again."""
    fake, _ = registry
    events: list[tuple[str, str | None]] = []
    lock = threading.Lock()
    write = StateStore.write

    def recording(self: StateStore, batch: Batch, offset: float = 0.0) -> None:
        write(self, batch, offset)
        with lock:
            events.extend(("written", c.header.cursor) for _, _, c in batch.rings if c.header)

    monkeypatch.setattr(StateStore, "write", recording)
    record = fake.record

    def seen(request: web.Request) -> None:
        record(request)
        with lock:
            events.append(("read", "app:" + request.path.rsplit("/", 1)[1]))

    monkeypatch.setattr(fake, "record", seen)
    client = await proxy(top=state(tmp_path))
    responses = await asyncio.gather(*(head(client, ref) for ref in REFS))
    assert [r.status for r in responses] == [200] * 5
    reads = [i for i, (kind, _) in enumerate(events) if kind == "read"]
    assert len(reads) == 5
    for i in reads:
        assert ("written", events[i][1]) in events[:i], events
    await client.close()


@pytest.fixture
def throttling(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
) -> Callable[[], Awaitable[tuple[TestServer, Registry]]]:
    """A registry whose first answer is ``429`` with ``Retry-After: 120``, then 200s (it
    records the loop times it was asked at)."""

    async def start() -> tuple[TestServer, Registry]:
        fake = Registry(script=[(429, {"Retry-After": "120"})])
        return await aiohttp_server(fake.app()), fake

    return start


@pytest.mark.usefixtures("wall_follows_the_loop")
async def test_p13_s11_a_block_survives_a_restart(
    throttling: Callable[[], Awaitable[tuple[TestServer, Registry]]],
    aiohttp_client: Callable[..., Awaitable[TestClient[Any, Any]]],
    tmp_path: Path,
) -> None:
    """A 429 with ``Retry-After: 120`` blocks the host; a proxy started on the same file ten
    seconds later shows the same block, loses its windows to it, sends nothing until it ends,
    and reads at the first window after it."""
    server, fake = await throttling()
    text = (
        f"{state(tmp_path)}\n"
        f"registries:\n  {HOST}:\n    upstream: http://127.0.0.1:{server.port}\n"
        "    check: {interval: 200ms}\n"
    )
    loop = asyncio.get_running_loop()
    first = await aiohttp_client(build_app(parse_config(text)))
    held = [asyncio.ensure_future(head(first, "v1"))]
    await asyncio.sleep(2 * INTERVAL)
    assert len(fake.seen) == 1
    until = fake.seen[0].at + 120.0
    before = (await (await first.get("/status")).json())["registries"][HOST]["blockedUntil"]
    await stop_with_held(first, held)

    await asyncio.sleep(10.0)
    second = await aiohttp_client(build_app(parse_config(text)))
    restarted = loop.time()
    status = await (await second.get("/status")).json()
    assert status["registries"][HOST]["blockedUntil"] == before
    assert client_blocked_until(second) == pytest.approx(until, abs=0.01)
    response = await head(second, "v1")
    assert response.status == 200
    assert len(fake.seen) == 2
    after = fake.seen[1].at
    assert until <= after < until + INTERVAL + 0.01
    windows = (await (await second.get("/status")).json())["registries"][HOST]["check"]["windows"]
    assert windows["blocked"] == int((until - restarted) / INTERVAL)
    await second.close()


def client_blocked_until(client: TestClient[Any, Any]) -> float | None:
    return client.server.app[PACER].hosts[HOST].blocked_until


async def test_p13_an_unusable_state_file_stops_the_start(tmp_path: Path) -> None:
    """A state file that is not a database: the proxy does not start (and the file is left as
    it was, for whoever looks at it)."""
    path = tmp_path / "state.db"
    await asyncio.to_thread(path.write_bytes, b"not a database" * 500)
    runner = web.AppRunner(build_app(parse_config(state(tmp_path))))
    with pytest.raises(StateError, match="not a database"):
        await runner.setup()
    assert await asyncio.to_thread(path.read_bytes) == b"not a database" * 500


async def test_p13_without_state_path_nothing_is_written(
    proxy: ProxyFactory, tmp_path: Path
) -> None:
    client = await proxy()
    assert client.server.app[PACER].durable is None
    responses = await asyncio.gather(*(head(client, ref) for ref in REFS[:2]))
    assert [r.status for r in responses] == [200, 200]
    assert type(client.server.app[PACER].hosts[HOST].ring("web")).__name__ == "Ring"


def prepare(path: str, batch: Batch) -> None:
    store = StateStore(path)
    store.write(batch)
    store.close()


@pytest.mark.usefixtures("wall_follows_the_loop")
async def test_p13_only_what_still_applies_is_restored(proxy: ProxyFactory, tmp_path: Path) -> None:
    """Rings of a host no longer allowed stay out (and stay in the file), and so does a block
    that ended while the proxy was down."""
    now = EPOCH + asyncio.get_running_loop().time()
    ring = RingState(
        RingHeader("app:v1", 0, now - 5.0, None), (EntryState("app:v1", now - 5.0, now - 5.0, 0),)
    )
    batch = Batch(
        (
            (HOST, "web", RingChanges.whole(ring)),
            ("elsewhere.test", "web", RingChanges.whole(ring)),
        ),
        blocks=((HOST, now - 1.0),),
    )
    await asyncio.to_thread(prepare, str(tmp_path / "state.db"), batch)
    client = await proxy(top=state(tmp_path))
    assert list(client.server.app[PACER].hosts) == [HOST]
    assert ring_of(client).cursor == "app:v1"
    status = await (await client.get("/status")).json()
    assert status["registries"][HOST]["blockedUntil"] is None
    await client.close()
    saved = await asyncio.to_thread(load, str(tmp_path / "state.db"))
    assert set(saved.rings) == {HOST, "elsewhere.test"}


def load(path: str) -> Saved:
    store = StateStore(path)
    try:
        return store.load()
    finally:
        store.close()
