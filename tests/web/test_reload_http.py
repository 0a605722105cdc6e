"""Config reload in place (SPEC §7.2, P12) through the application, on virtual time.

The file is re-read by ``Reloader.reload()`` — what the file watch and SIGHUP call — so each
test says exactly when a reload happens. The watch and the signal themselves are tested at the
end, on the real clock (they wait for the kernel, not for a window).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kuikproxy.app import build_app
from kuikproxy.config import load_config
from kuikproxy.web.keys import PACER, RELOADER
from tests.config.test_config_loading import NO_DOCUMENT, nothing_in
from tests.conftest import HOST, head
from tests.upstream_app import Registry
from tests.web.many import proxy

Client = TestClient[Any, Any]


def write(
    path: Path, port: int, check: str = "200ms", copy: str = "300ms", extra: str = ""
) -> None:
    path.write_text(
        f"registries:\n  {HOST}:\n    upstream: http://127.0.0.1:{port}\n"
        f"    check: {{interval: {check}}}\n    copy: {{interval: {copy}}}\n{extra}"
    )


@pytest.fixture
def start(
    tmp_path: Path,
    registry: tuple[Registry, TestServer],
    aiohttp_client: Callable[..., Awaitable[Client]],
) -> Callable[..., Awaitable[tuple[Client, Path]]]:
    _, server = registry

    async def run(**settings: str) -> tuple[Client, Path]:
        path = tmp_path / "kuikproxy.yaml"
        write(path, server.port, **settings)
        app = build_app(load_config(path), config_path=str(path))
        client = await aiohttp_client(app, server_kwargs={"handler_cancellation": True})
        return client, path

    return run


async def status(client: Client) -> dict[str, Any]:
    return await (await client.get("/status")).json()  # type: ignore[no-any-return]


@pytest.mark.looptime
async def test_p12_a_changed_check_interval_restarts_the_check_series_only(
    start: Any, registry: tuple[Registry, TestServer]
) -> None:
    """Reloaded at 0.5 s with check 200ms → 1s: the next check window is at 1.5 s (a full new
    interval after the reload), not 0.6 s; the copy series keeps its 300 ms grid."""
    fake, server = registry
    client, path = await start()
    loop = asyncio.get_running_loop()
    t0 = client.server.app[PACER].started
    await asyncio.sleep(0.5 - (loop.time() - t0))
    write(path, server.port, check="1s")
    assert client.server.app[RELOADER].reload()
    sent = loop.time()
    assert (await head(client, "a")).status == 200
    assert round(loop.time() - t0, 3) == 1.5
    assert [round(s.at - t0, 3) for s in fake.reads()] == [1.5]
    document = await status(client)
    assert document["config"]["generation"] == 2 and document["config"]["lastError"] is None
    series = document["registries"][HOST]
    assert (series["check"]["interval"], series["copy"]["interval"]) == ("1s", "300ms")
    # a copy opened now waits for the copy series' next window on its unchanged grid
    opened = await client.get(f"/v2/app/manifests/c?ns={HOST}", headers={"Kuik-Resource": "w"})
    assert opened.status == 200
    assert round(fake.reads()[-1].at - t0, 3) == 1.8
    assert sent > 0


@pytest.mark.looptime
async def test_an_invalid_file_keeps_the_running_config_and_shows_why(
    start: Any, registry: tuple[Registry, TestServer]
) -> None:
    """A broken file is refused: the old config keeps running, /status shows each error with
    its path, the error is counted; the fixed file is loaded without a restart."""
    _, server = registry
    client, path = await start()
    path.write_text(f"registries:\n  {HOST}:\n    check: {{interval: fast}}\n")
    assert not client.server.app[RELOADER].reload()
    document = await status(client)
    assert document["config"]["generation"] == 1
    assert f"registries.{HOST}.check.interval" in document["config"]["lastError"]
    assert document["registries"][HOST]["check"]["interval"] == "200ms"
    assert (await head(client, "a")).status == 200  # still served, on the old config
    metrics = await (await client.get("/metrics")).text()
    assert 'kuik_proxy_config_reloads_total{result="error"} 1.0' in metrics
    write(path, server.port, check="400ms")
    assert client.server.app[RELOADER].reload()
    document = await status(client)
    assert document["config"]["generation"] == 2 and document["config"]["lastError"] is None
    assert document["registries"][HOST]["check"]["interval"] == "400ms"
    metrics = await (await client.get("/metrics")).text()
    assert 'kuik_proxy_config_reloads_total{result="success"} 1.0' in metrics


@pytest.mark.looptime
@pytest.mark.parametrize("text", NO_DOCUMENT.values(), ids=NO_DOCUMENT.keys())
async def test_a_file_emptied_is_refused_like_an_invalid_one(
    start: Any, registry: tuple[Registry, TestServer], text: str
) -> None:
    """A file truncated or emptied (nothing, blanks, comments, null, a bare ``---``) is not
    the embedded default, which would refuse every host the file configures: the reload is
    refused, /status says why, the error is counted, and the configured host is still
    served on its own intervals."""
    fake, _ = registry
    client, path = await start()
    path.write_text(text)
    assert not client.server.app[RELOADER].reload()
    document = await status(client)
    assert document["config"]["generation"] == 1
    assert document["config"]["lastError"] == nothing_in(path)
    assert document["registries"][HOST]["check"]["interval"] == "200ms"
    assert (await head(client, "a")).status == 200
    assert [s.path for s in fake.reads()] == ["/v2/app/manifests/a"]
    metrics = await (await client.get("/metrics")).text()
    assert 'kuik_proxy_config_reloads_total{result="error"} 1.0' in metrics


@pytest.mark.looptime
async def test_a_file_that_reads_the_same_changes_nothing(start: Any) -> None:
    client, path = await start()
    path.write_text(path.read_text() + "# a comment\n")
    assert client.server.app[RELOADER].reload()
    assert (await status(client))["config"]["generation"] == 1


@pytest.mark.looptime
async def test_a_host_no_longer_allowed_refuses_its_held_requests(
    start: Any, registry: tuple[Registry, TestServer]
) -> None:
    """Held requests of a host the new file no longer allows get 403 DENIED at once; its
    image is never read."""
    fake, _ = registry
    client, path = await start(check="10s")
    held = asyncio.ensure_future(head(client, "a"))
    await asyncio.sleep(0.1)
    path.write_text("allowedHosts: []\ndefaultRegistry: other.test\nregistries: {other.test: {}}\n")
    assert client.server.app[RELOADER].reload()
    response = await held
    assert response.status == 403
    assert fake.reads() == []


@pytest.mark.looptime
async def test_a_reload_in_the_middle_of_1000_waiting_requests_loses_none_and_doubles_no_read(
    tmp_path: Path, aiohttp_server: Callable[..., Awaitable[TestServer]]
) -> None:
    """20 resources each check the same 50 images: 1,000 requests held at once. Halfway
    through, the check interval changes: every request is answered 200, each image is read
    once for all (R2), nothing is left held."""
    config = f"registries:\n  {HOST}:\n    upstream: http://127.0.0.1:PORT\n"
    path = tmp_path / "kuikproxy.yaml"
    async with proxy(aiohttp_server, config + "    check: {interval: 100ms}\n", path) as client:
        refs = [f"v{i:02}" for i in range(50)]
        requests = [
            asyncio.ensure_future(client.get(f"/v2/app/manifests/{ref}?ns={HOST}", f"r{who:02}"))
            for who in range(20)
            for ref in refs
        ]
        pacer = client.app[PACER]
        await asyncio.sleep(0.15)
        assert pacer.held() == 1000 - 20  # the first window's image went to its 20 at once
        await asyncio.sleep(2.4)
        assert 0 < len(client.registry.reads()) < 50
        rewrite(path, config + "    check: {interval: 150ms}\n")
        assert client.app[RELOADER].reload()
        statuses = []
        for request in requests:
            async with await request as response:
                statuses.append(response.status)
        assert statuses == [200] * 1000
        paths = [s.path for s in client.registry.reads()]
        assert sorted(paths) == sorted(f"/v2/app/manifests/{ref}" for ref in refs)
        assert pacer.held() == 0


def rewrite(path: Path, text: str) -> None:
    path.write_text(text.replace("PORT", path.read_text().split("127.0.0.1:")[1].split()[0]))


# -- the watch and the signal, on the real clock ------------------------------------------------


async def generation_reaches(client: Client, wanted: int, within: float = 5.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        if client.server.app[RELOADER].loaded.generation >= wanted:
            return True
        await asyncio.sleep(0.02)
    return False


async def test_an_edited_file_is_reloaded_by_the_watch(
    start: Any, registry: tuple[Registry, TestServer]
) -> None:
    """Written in place, then replaced by a rename (as editors and ConfigMaps do)."""
    _, server = registry
    client, path = await start()
    write(path, server.port, check="1s")
    assert await generation_reaches(client, 2)
    replacement = path.with_suffix(".new")
    write(replacement, server.port, check="2s")
    os.replace(replacement, path)
    assert await generation_reaches(client, 3)
    assert (await status(client))["registries"][HOST]["check"]["interval"] == "2s"


async def test_sighup_reloads(start: Any, registry: tuple[Registry, TestServer]) -> None:
    _, server = registry
    client, path = await start()
    watch = client.server.app[RELOADER]
    write(path, server.port, check="3s")
    os.kill(os.getpid(), signal.SIGHUP)
    assert await generation_reaches(client, 2)
    assert watch.current.config.registry(HOST).check.interval == 3.0


@pytest.mark.looptime
async def test_a_host_added_by_a_reload_starts_its_series_then(
    start: Any, registry: tuple[Registry, TestServer]
) -> None:
    """A host first configured by a reload at 0.7 s has its first window a full interval
    later (0.7 + 0.5), never one of the windows it would have had since the start."""
    fake, server = registry
    client, path = await start()
    loop = asyncio.get_running_loop()
    t0 = client.server.app[PACER].started
    await asyncio.sleep(0.7 - (loop.time() - t0))
    extra = (
        f"  new.test:\n    upstream: http://127.0.0.1:{server.port}\n"
        "    check: {interval: 500ms}\n"
    )
    write(path, server.port, extra=extra)
    assert client.server.app[RELOADER].reload()
    response = await client.head("/v2/app/manifests/n?ns=new.test", headers={"Kuik-Resource": "w"})
    assert response.status == 200
    assert [round(s.at - t0, 3) for s in fake.reads()] == [1.2]
