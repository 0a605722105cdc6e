"""Hold limits, prefetch, follow-ups and header fidelity over HTTP (P7, P10, R1, R3)."""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import HOST, ProxyFactory, head
from tests.upstream_app import MANIFEST_TYPE, Registry, digest_of, manifest_of

pytestmark = pytest.mark.looptime


async def test_p7_request_held_past_max_hold_gets_429_with_retry_after(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """With check.maxHold 300ms and one image per 200ms window, the third image cannot be
    answered in time: it gets 429 TOOMANYREQUESTS with a Retry-After, and keeps its place."""
    client = await proxy("check: {interval: 200ms, maxHold: 300ms}")
    responses = await asyncio.gather(*(head(client, f"v{i}") for i in range(3)))
    assert [r.status for r in responses] == [200, 429, 429]
    refused = responses[2]
    assert int(refused.headers["Retry-After"]) >= 1
    body = await client.get(f"/v2/app/manifests/v2?ns={HOST}", headers={"Kuik-Resource": "x"})
    assert body.status in (200, 429)
    status = await (await client.get("/status")).json()
    ring = status["resources"]["web"]["checks"]["registries"][0]
    assert ring["images"] == 3


async def test_p7_prefetch_reads_the_ring_without_requests_and_clients_find_fresh_answers(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """In prefetch mode every turn reads the ring's next image whether or not a request waits;
    a client asking later is answered at once from that read (R1)."""
    fake, _ = registry
    client = await proxy("check: {interval: 200ms, mode: prefetch}")
    loop = asyncio.get_running_loop()
    first = await head(client, "v1")
    assert first.status == 200
    await asyncio.sleep(0.45)  # two more windows: both prefetch v1 again, with nobody waiting
    reads = fake.reads()
    assert len(reads) >= 3
    assert reads[-1].headers["accept"]  # kuikproxy's own read asks for every manifest type
    before = loop.time()
    again = await head(client, "v1")
    assert again.status == 200
    assert loop.time() - before < 0.01


async def test_p10_follow_up_by_digest_passes_without_a_window(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """After a check's answer, the same resource's check of the digest it was answered goes
    through at once (check.followUp), not at the next window."""
    fake, _ = registry
    client = await proxy("check: {interval: 200ms, followUp: 2s}")
    loop = asyncio.get_running_loop()
    answer = await head(client, "v1")
    digest = answer.headers["Docker-Content-Digest"]
    before = loop.time()
    follow = await client.get(
        f"/v2/app/manifests/{digest}?ns={HOST}",
        headers={"Kuik-Resource": "web", "Kuik-Operation": "check"},
    )
    assert follow.status == 200
    assert loop.time() - before < 0.01
    assert [r.path.rsplit("/", 1)[1] for r in fake.reads()] == ["v1", digest]


async def test_r1_r3_head_answers_keep_length_and_digest_live_and_kept(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """HEAD answers keep the registry's Content-Length and Docker-Content-Digest, whether they
    come from the window's read or from the kept answer."""
    client = await proxy()
    body = manifest_of("app", "v1")
    live = await head(client, "v1", "a")
    kept = await head(client, "v1", "b")
    for response in (live, kept):
        assert response.status == 200
        assert response.headers["Content-Length"] == str(len(body))
        assert response.headers["Docker-Content-Digest"] == digest_of(body)
        assert response.headers["Content-Type"] == MANIFEST_TYPE
        assert response.headers["OCI-Namespace"] == HOST


async def test_r3_head_answer_never_serves_a_get(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """A kept HEAD answer serves HEADs only: a check GET of the same image waits for its own
    window and is answered with the body."""
    fake, _ = registry
    client = await proxy()
    await head(client, "v1", "a")
    response = await client.get(
        f"/v2/app/manifests/v1?ns={HOST}", headers={"Kuik-Resource": "b", "Kuik-Operation": "check"}
    )
    assert await response.read() == manifest_of("app", "v1")
    assert [r.method for r in fake.reads()] == ["HEAD", "GET"]


async def test_r2_head_waiting_beside_a_get_is_answered_from_the_get(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """A HEAD and a check GET waiting for the same image are answered by one upstream GET."""
    fake, _ = registry
    client = await proxy()
    got, headed = await asyncio.gather(
        client.get(
            f"/v2/app/manifests/v1?ns={HOST}",
            headers={"Kuik-Resource": "a", "Kuik-Operation": "check"},
        ),
        head(client, "v1", "b"),
    )
    assert got.status == headed.status == 200
    assert await got.read() == manifest_of("app", "v1")
    assert headed.headers["Content-Length"] == str(len(manifest_of("app", "v1")))
    assert [r.method for r in fake.reads()] == ["GET"]


async def test_repeated_accept_headers_reach_the_registry_as_sent(
    proxy: ProxyFactory, registry: tuple[Registry, object]
) -> None:
    """Content negotiation depends on every Accept header: they are forwarded, not collapsed."""
    fake, _ = registry
    client = await proxy()
    accepts = ["application/vnd.oci.image.index.v1+json", MANIFEST_TYPE]
    response = await client.head(
        f"/v2/app/manifests/v1?ns={HOST}",
        headers=[("Kuik-Resource", "a"), ("Accept", accepts[0]), ("Accept", accepts[1])],
    )
    assert response.status == 200
    assert fake.reads()[0].headers["accept"] == accepts
    assert "kuik-resource" not in fake.reads()[0].headers
