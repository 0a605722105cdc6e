"""Copies over HTTP (P9): acceptance 4 of the pacing issue, on virtual time."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import HOST, ProxyFactory
from tests.upstream_app import Registry, blob_digest, digest_of, manifest_of

pytestmark = pytest.mark.looptime

INTERVAL = 0.2
BLOB = blob_digest("b")
OTHER_BLOB = blob_digest("c")


def get(client, path: str, resource: str):  # type: ignore[no-untyped-def]
    return client.get(f"/v2/app/{path}?ns={HOST}", headers={"Kuik-Resource": resource})


async def test_p9_open_copy_lets_children_through_and_stays_busy_until_idle(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """A manifest GET by tag opens a copy at a copy window; the same resource's manifest by
    digest and blobs go through at once, and the copy series stays busy until ``copy.idle``
    after the last of them ended, when the next window takes the next queued copy."""
    fake, _ = registry
    client = await proxy("copy: {interval: 200ms, idle: 500ms}")
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def pull() -> float:
        index = await get(client, "manifests/v1", "node-a")
        assert index.status == 200
        digest = digest_of(manifest_of("app", "v1"))
        children = await asyncio.gather(
            get(client, f"manifests/{digest}", "node-a"),
            get(client, f"blobs/{BLOB}", "node-a"),
            get(client, f"blobs/{OTHER_BLOB}", "node-a"),
        )
        for child in children:
            assert child.status == 200
            await child.read()
        return loop.time()

    async def other() -> float:
        await asyncio.sleep(0.25)
        response = await get(client, "manifests/v2", "node-b")
        assert response.status == 200
        return loop.time()

    pulled, other_done = await asyncio.gather(pull(), other())
    seen = [(s.path.rsplit("/", 1)[1][:10], round(s.at - start, 2)) for s in fake.seen]
    v1_children = [at for name, at in seen if name != "v2"]
    assert all(abs(at - INTERVAL) < 0.1 for at in v1_children), seen
    # the copy stays open until idle (0.5 s) after its last request: windows at 0.4, 0.6 are busy
    v2_at = next(at for name, at in seen if name == "v2")
    assert v2_at >= pulled - start + 0.5 - 1e-6
    assert round(v2_at / INTERVAL, 6).is_integer()
    status = await (await client.get("/status")).json()
    assert status["registries"][HOST]["copy"]["windows"]["busy"] >= 2
    assert other_done >= start + v2_at


async def test_p9_failed_copy_does_not_hold_back_the_copies_queued_behind_it(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """A copy whose upstream read fails is answered with the error; the next window takes the
    next queued copy, and the retry queues at the back."""
    fake, _ = registry
    fake.fail["/v2/app/manifests/bad"] = 500
    client = await proxy("copy: {interval: 200ms, idle: 0s}")
    start = asyncio.get_running_loop().time()

    async def bad() -> list[int]:
        first = await get(client, "manifests/bad", "node-a")
        retry = await get(client, "manifests/bad", "node-a")
        return [first.status, retry.status]

    async def good() -> int:
        await asyncio.sleep(0.01)
        return (await get(client, "manifests/good", "node-b")).status

    bad_statuses, good_status = await asyncio.gather(bad(), good())
    assert bad_statuses == [500, 500]
    assert good_status == 200
    order = [(s.path.rsplit("/", 1)[1], round(s.at - start, 3)) for s in fake.reads()]
    assert order == [("bad", 0.2), ("good", 0.4), ("bad", 0.6)]


async def test_p9_blob_outside_an_open_copy_opens_its_own(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """A blob GET of a resource with no open copy waits for a copy window of its own."""
    fake, _ = registry
    client = await proxy("copy: {interval: 200ms}")
    start = asyncio.get_running_loop().time()
    response = await get(client, f"blobs/{BLOB}", "node-a")
    assert response.status == 200
    assert len(await response.read()) > 0
    assert [round(s.at - start, 3) for s in fake.reads("blobs")] == [0.2]


async def test_p9_p11_copy_whose_client_left_mid_read_still_closes(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """A client that leaves while its copy's manifest is being read does not keep the copy
    open: it closes after the read, and the next queued copy gets the next window."""
    fake, _ = registry
    fake.delay = 1.0
    client = await proxy("copy: {interval: 200ms, idle: 0s}")
    start = asyncio.get_running_loop().time()
    leaving = asyncio.ensure_future(get(client, "manifests/v1", "node-a"))
    await asyncio.sleep(0.25)
    staying = asyncio.ensure_future(get(client, "manifests/v2", "node-b"))
    await asyncio.sleep(0.05)
    leaving.cancel()
    response = await staying
    assert response.status == 200
    order = [(s.path.rsplit("/", 1)[1], round(s.at - start, 3)) for s in fake.reads()]
    assert order == [("v1", 0.2), ("v2", 1.4)]


@pytest.mark.parametrize(
    ("method", "headers"),
    [("GET", {}), ("HEAD", {}), ("GET", {"Range": "bytes=100-"}), ("GET", {"Range": "bytes=0-9"})],
    ids=["get", "head", "range-resume", "range-head"],
)
async def test_p9_a_pull_resumed_after_its_copy_closed_goes_without_a_window(
    proxy: ProxyFactory, registry: tuple[Registry, object], method: str, headers: dict[str, str]
) -> None:
    """A copy closes (``copy.idle`` 0s) while its client pauses; within ``copy.followUp`` the
    same resource's blob reads in that repository — a GET, a HEAD, a ``Range`` resume — and its
    manifest by digest go at once, not at the next copy window, and do not make the series
    busy. Another resource's blob read still waits for a window."""
    client = await proxy("copy: {interval: 10s, idle: 0s, followUp: 10m}")
    loop = asyncio.get_running_loop()
    assert (await get(client, "manifests/v1", "node-a")).status == 200  # the copy, at 10 s
    assert (await get(client, f"blobs/{BLOB}", "node-a")).status == 200
    await asyncio.sleep(60)  # the copy closed long ago; windows at 20 s, 30 s, ... were idle
    resumed = loop.time()
    request_headers = {"Kuik-Resource": "node-a", **headers}
    async with client.request(
        method, f"/v2/app/blobs/{BLOB}?ns={HOST}", headers=request_headers
    ) as response:
        assert response.status in (200, 206)
        await response.read()
    digest = digest_of(manifest_of("app", "v1"))
    assert (await get(client, f"manifests/{digest}", "node-a")).status == 200
    assert loop.time() - resumed < 1.0
    other = asyncio.ensure_future(get(client, f"blobs/{BLOB}", "node-b"))
    await asyncio.sleep(1.0)
    assert not other.done()  # another resource: its own copy window
    assert (await other).status == 200
    status = await (await client.get("/status")).json()
    assert status["registries"][HOST]["copy"]["windows"]["busy"] == 0
