"""kuikproxy signs in to registries for clients, and keeps clients' credentials apart (R4, R5).

The registry here wants tokens from its realm; ``public/*`` opens to an anonymous token,
``private/*`` only to alice's.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from tests.upstream_app import Auth, Registry, blob_of

pytestmark = pytest.mark.looptime

HOST = "registry.test"
USERS = {"alice": "s3cret"}
ALICE = "Basic " + base64.b64encode(b"alice:s3cret").decode()

Start = Callable[..., Awaitable[tuple[TestClient[Any, Any], Registry]]]


@pytest.fixture
def storage() -> Registry:
    """Where the registry sends blobs: another origin."""
    return Registry()


@pytest.fixture
def start(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    aiohttp_client: Callable[..., Awaitable[TestClient[Any, Any]]],
    tmp_path: Path,
    storage: Registry,
) -> Start:
    """A token registry (and blob storage on another origin, ``storage``) with kuikproxy
    before it;
    ``credentials`` is kuikproxy's own: ``"file"`` (user + password file), ``"docker"`` (a
    Docker config.json) or None; ``quota`` is the host's ``quota`` block, as YAML."""

    async def run(
        credentials: str | None = None, scheme: str = "bearer", quota: str | None = None
    ) -> tuple[TestClient[Any, Any], Registry]:
        store = await aiohttp_server(storage.app())
        fake = Registry(
            auth=Auth(USERS, bearer=scheme == "bearer"),
            blobs_at=f"http://127.0.0.1:{store.port}/storage",
        )
        server = await aiohttp_server(fake.app())
        block = f"upstream: http://127.0.0.1:{server.port}\n    check: {{interval: 10ms}}\n"
        block += "    copy: {interval: 10ms, idle: 0s}\n"
        if credentials == "file":
            (tmp_path / "password").write_text("s3cret\n")
            block += f"    credentials: {{username: alice, passwordFile: {tmp_path}/password}}\n"
        elif credentials == "docker":
            auth = base64.b64encode(b"alice:s3cret").decode()
            config = {"auths": {HOST: {"auth": auth}}}
            (tmp_path / "config.json").write_text(json.dumps(config))
            block += f"    credentials: {{dockerConfigFile: {tmp_path}/config.json}}\n"
        if quota is not None:
            block += f"    quota: {quota}\n"
        # the storage a blob redirects to is on loopback: followed only as a configured endpoint
        storage_host = f"  storage.test:\n    upstream: http://127.0.0.1:{store.port}\n"
        app = build_app(parse_config(f"registries:\n  {HOST}:\n    {block}{storage_host}"))
        client = await aiohttp_client(app, server_kwargs={"handler_cancellation": True})
        return client, fake

    return run


def manifest(client: TestClient[Any, Any], repo: str, ref: str = "v1", **headers: str) -> Any:
    return client.head(f"/v2/{repo}/manifests/{ref}?ns={HOST}", headers=headers)


@pytest.mark.parametrize("credentials", ["file", "docker"])
async def test_own_credentials_let_clients_without_credentials_read_private_images(
    start: Start, credentials: str
) -> None:
    """With its own credentials for the host (a password file or a Docker config.json),
    kuikproxy answers the registry's challenge with a token for alice, and a client that brings
    no credentials reads a private image."""
    client, fake = await start(credentials)
    response = await manifest(client, "private/app", **{"Kuik-Resource": "a"})
    assert response.status == 200
    assert fake.token_requests == [("repository:private/app:pull", "alice")]


async def test_tokens_are_kept_per_scope_so_the_registry_sees_no_second_challenge(
    start: Start,
) -> None:
    """Once a scope's token is known, later reads carry it from the start: one 401 per scope,
    not one per read (a 401 counts against a registry's rate limit too)."""
    client, fake = await start("file")
    for ref in ("v1", "v2", "v3"):
        assert (await manifest(client, "private/app", ref)).status == 200
    unsigned = [s for s in fake.seen if s.authorization is None]
    assert len(unsigned) == 1
    assert len(fake.token_requests) == 1


async def test_without_credentials_kuikproxy_signs_in_anonymously_for_public_images(
    start: Start,
) -> None:
    """Without credentials of its own, kuikproxy fetches an anonymous token: public images are
    read once for every client (the answer is shared, R5)."""
    client, fake = await start()
    first = await manifest(client, "public/app", **{"Kuik-Resource": "a"})
    second = await manifest(client, "public/app", **{"Kuik-Resource": "b"})
    assert first.status == second.status == 200
    assert fake.token_requests == [("repository:public/app:pull", None)]
    assert len([s for s in fake.seen if "/manifests/" in s.path]) == 2  # the 401, then the read


@pytest.mark.parametrize(("credentials", "repo"), [(None, "public"), ("file", "private")])
async def test_s11_each_token_request_waits_for_the_hosts_oauth_bucket(
    start: Start, credentials: str | None, repo: str
) -> None:
    """With an OAuth bucket of burst 1 refilled 6 times a minute, kuikproxy's second token
    request (for another repository's scope, anonymous or with its own credentials) waits the
    10 s until the bucket has a token again; the read it signs in for is answered then."""
    oauth = "{category: OAuth, scope: registry, ratePerMinute: 6, burst: 1}"
    client, fake = await start(credentials, quota=f"{{buckets: [{oauth}]}}")
    loop = asyncio.get_running_loop()
    assert (await manifest(client, f"{repo}/app")).status == 200
    before = loop.time()
    assert (await manifest(client, f"{repo}/other")).status == 200
    assert [scope for scope, _ in fake.token_requests] == [
        f"repository:{repo}/app:pull",
        f"repository:{repo}/other:pull",
    ]
    first, second = fake.token_times
    assert second - first == pytest.approx(10)
    assert loop.time() - before == pytest.approx(10, abs=0.1)  # its window, then the wait


async def test_r4_a_kept_challenge_answers_the_next_anonymous_client_without_a_window(
    start: Start,
) -> None:
    """A private image read anonymously is a 401 with its challenge — an answer (R4): a second
    anonymous client gets the kept challenge at once, and the registry is not asked again."""
    client, fake = await start()
    first = await manifest(client, "private/app", **{"Kuik-Resource": "a"})
    assert first.status == 401
    assert "realm=" in first.headers["WWW-Authenticate"]
    asked = len(fake.seen)
    loop = asyncio.get_running_loop()
    before = loop.time()
    second = await manifest(client, "private/app", **{"Kuik-Resource": "b"})
    assert second.status == 401
    assert second.headers["WWW-Authenticate"] == first.headers["WWW-Authenticate"]
    assert loop.time() - before < 0.005
    assert len(fake.seen) == asked


async def test_r5_a_clients_own_authorization_passes_through_and_is_never_shared(
    start: Start,
) -> None:
    """A client's own Authorization goes to the registry untouched; the answer it obtained is
    reused for the identical Authorization only — a client without it, or with another, is
    not given it."""
    client, fake = await start(scheme="basic")
    mine = await manifest(client, "private/app", **{"Authorization": ALICE, "Kuik-Resource": "a"})
    assert mine.status == 200
    assert fake.seen[-1].authorization == ALICE
    again = await manifest(client, "private/app", **{"Authorization": ALICE, "Kuik-Resource": "b"})
    assert again.status == 200
    assert len(fake.seen) == 1  # served from the kept answer, same Authorization
    anonymous = await manifest(client, "private/app", **{"Kuik-Resource": "c"})
    assert anonymous.status == 401
    other = "Basic " + base64.b64encode(b"mallory:guess").decode()
    stranger = await manifest(client, "private/app", **{"Authorization": other})
    assert stranger.status == 401


async def test_basic_challenge_answered_with_own_credentials(start: Start) -> None:
    """A registry that challenges with Basic gets kuikproxy's credentials, and from then on
    every read carries them."""
    client, fake = await start("file", scheme="basic")
    assert (await manifest(client, "private/app", "v1")).status == 200
    assert (await manifest(client, "private/app", "v2")).status == 200
    assert [s.authorization is None for s in fake.seen] == [True, False, False]


async def test_ping_answers_for_kuikproxy_where_it_holds_credentials(start: Start) -> None:
    """``/v2/`` relays the registry's challenge where kuikproxy has no credentials (clients must
    sign in themselves), and answers 200 where it signs in for them."""
    client, _ = await start()
    response = await client.get(f"/v2/?ns={HOST}")
    assert response.status == 401
    assert "realm=" in response.headers["WWW-Authenticate"]
    client, _ = await start("file")
    assert (await client.get(f"/v2/?ns={HOST}")).status == 200


async def test_blob_redirect_is_followed_without_authorization_to_another_origin(
    start: Start, storage: Registry
) -> None:
    """A registry that redirects a blob to storage on another origin: kuikproxy follows the
    redirect itself and never sends the registry's Authorization there."""
    client, fake = await start("file")
    digest = blob_of(b"layer-bytes")  # what the storage serves: kuikproxy checks it
    response = await client.get(f"/v2/private/app/blobs/{digest}?ns={HOST}")
    assert response.status == 200
    assert await response.read() == b"layer-bytes"
    assert [(s.path, s.authorization) for s in storage.seen] == [
        (f"/storage/v2/private/app/blobs/{digest}", None)
    ]
    assert any(s.authorization is not None for s in fake.seen if "/blobs/" in s.path)


async def test_logs_say_each_upstream_request_and_never_a_credential(
    start: Start, caplog: pytest.LogCaptureFixture
) -> None:
    """At debug, one line per upstream request (method, host, path, status) and per window;
    no password, Authorization value or token ever reaches a log line."""
    caplog.set_level("DEBUG", logger="kuikproxy")
    client, fake = await start("file")
    assert (await manifest(client, "private/app", "v1")).status == 200
    token = next(iter(fake.tokens))  # alice's, as a client of her own would bring it
    bearer = f"Bearer {token}"
    assert (await manifest(client, "private/app", "v2", Authorization=bearer)).status == 200
    text = "\n".join(record.getMessage() for record in caplog.records)
    assert "/v2/private/app/manifests/v1 -> 200" in text
    assert "check window" in text
    secrets = ["s3cret", ALICE, ALICE.split()[1], *fake.tokens]
    assert not [secret for secret in secrets if secret in text]
