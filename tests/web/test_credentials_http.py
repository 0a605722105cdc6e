"""R5 on every path an answer travels: nobody is given what was read with another's credentials.

The registry here (tests/upstream_app.py, with Basic auth) has one private repository.
``alice`` may read it, ``bob`` is a valid user who may not (403), an anonymous client is
challenged (401), and kuikproxy's own credentials (``carol``, when the host has them) may read
it too. Every answer sets a cookie naming whom it was for. For each path — requests waiting
together for one read (R2), a kept answer (R1), the ``/v2/`` ping, a follow-up (P10), a copy's
manifest and blobs, a fleet's shared answers — and for every ordered pair of identities, each
client must get exactly the verdict the registry gives its own credentials, and never another
client's cookie.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from kuikproxy.fleet.memory import FleetState, MemoryFleet
from tests.upstream_app import Auth, Registry, blob_of, digest_of, manifest_of

pytestmark = pytest.mark.looptime

HOST = "registry.test"
REPO = "private/app"
USERS = {"alice": "a-pass", "bob": "b-pass", "carol": "c-pass"}
READERS = {"alice", "carol"}  # who may read the private repository
MANIFEST = manifest_of(REPO, "v1")
MANIFEST_DIGEST = digest_of(MANIFEST)
BLOB = b"private layer bytes" * 100
BLOB_DIGEST = blob_of(BLOB)
IDENTITIES = ("alice", "bob", "anon")

Client = TestClient[Any, Any]


def authorization(identity: str) -> dict[str, str]:
    if identity == "anon":
        return {}
    token = base64.b64encode(f"{identity}:{USERS[identity]}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def private_registry() -> Registry:
    """Basic auth; answers per identity, each with a cookie naming it."""
    return Registry(auth=Auth(USERS, readers=READERS, cookies=True))


Start = Callable[..., Awaitable[tuple[Client, Registry]]]


def host_block(port: int, tmp_path: Path, *, own: bool) -> str:
    block = (
        f"  {HOST}:\n"
        f"    upstream: http://127.0.0.1:{port}\n"
        "    check: {interval: 200ms}\n"
        "    copy: {interval: 200ms, idle: 0s}\n"
    )
    if own:  # kuikproxy's own credentials: carol's
        (tmp_path / "password").write_text(USERS["carol"])
        block += f"    credentials: {{username: carol, passwordFile: {tmp_path}/password}}\n"
    return block


@pytest.fixture
def start(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    aiohttp_client: Callable[..., Awaitable[Client]],
    tmp_path: Path,
) -> Start:
    async def run(*, own: bool = False) -> tuple[Client, Registry]:
        fake = private_registry()
        server = await aiohttp_server(fake.app())
        config = parse_config("registries:\n" + host_block(server.port, tmp_path, own=own))
        client = await aiohttp_client(
            build_app(config), server_kwargs={"handler_cancellation": True}
        )
        return client, fake

    return run


def expected(identity: str, *, own: bool, ping: bool = False) -> set[int]:
    """What this identity may be answered: the status the registry gives its own request
    (kuikproxy signs an anonymous one with carol's credentials when it holds them) — and,
    when kuikproxy holds credentials that open the image, a 200 read with them, which R5
    shares with every client of kuikproxy (any client could have had it anonymously)."""
    if identity == "anon":
        return {200} if own else {401}
    own_verdict = 200 if ping or identity in READERS else 403
    return {own_verdict, 200} if own else {own_verdict}


@dataclass(frozen=True)
class Path_:
    """A read as a client sends it: method, the route after the repository, extra headers."""

    name: str
    method: str
    route: str
    headers: tuple[tuple[str, str], ...] = ()

    def send(self, client: Client, identity: str, resource: str) -> Any:
        headers = {"Kuik-Resource": resource, **authorization(identity), **dict(self.headers)}
        return client.request(self.method, f"/v2/{REPO}/{self.route}?ns={HOST}", headers=headers)


READS = [
    Path_("check-head-tag", "HEAD", "manifests/v1"),
    Path_("check-get-tag", "GET", "manifests/v1", (("Kuik-Operation", "check"),)),
    Path_("check-head-digest", "HEAD", f"manifests/{MANIFEST_DIGEST}"),
    Path_("copy-get-tag", "GET", "manifests/v1"),
    Path_("copy-get-digest", "GET", f"manifests/{MANIFEST_DIGEST}"),
    Path_("copy-blob", "GET", f"blobs/{BLOB_DIGEST}"),
    Path_("copy-blob-head", "HEAD", f"blobs/{BLOB_DIGEST}"),
]
PAIRS = list(itertools.permutations(IDENTITIES, 2))


async def outcome(response: Any) -> tuple[int, bytes, list[str]]:
    async with response as answer:
        return answer.status, await answer.read(), answer.headers.getall("Set-Cookie", [])


def assert_own(
    identity: str, got: tuple[int, bytes, list[str]], statuses: set[int], path: Path_
) -> None:
    code, body, cookies = got
    assert code in statuses, f"{identity} got {code} on {path.name}"
    if code != 200 and path.method == "GET":
        assert MANIFEST not in body and BLOB not in body
    owner = "carol" if identity == "anon" else identity
    for cookie in cookies:  # only ever the cookie of a read made for this very client
        assert cookie.startswith((f"session={owner}-", "session=anon-")), (identity, cookie)


@pytest.mark.parametrize("own", [False, True], ids=["anonymous", "own-credentials"])
@pytest.mark.parametrize(("first", "second"), PAIRS)
@pytest.mark.parametrize("path", READS, ids=lambda p: p.name)
async def test_r2_r5_requests_waiting_together_get_only_what_their_credentials_open(
    start: Start, path: Path_, first: str, second: str, own: bool
) -> None:
    """Two resources ask for the private image before the same window, with different
    credentials: the window's read answers its own client, and the other gets the verdict of
    its own credentials (its own read, on its own turn), never the first one's answer."""
    client, _ = await start(own=own)
    lead = asyncio.ensure_future(outcome(path.send(client, first, "r1")))
    await asyncio.sleep(0.01)
    other = asyncio.ensure_future(outcome(path.send(client, second, "r2")))
    got_first, got_second = await asyncio.gather(lead, other)
    assert_own(first, got_first, expected(first, own=own), path)
    assert_own(second, got_second, expected(second, own=own), path)


@pytest.mark.parametrize(("first", "second"), [*PAIRS, ("alice", "alice"), ("anon", "anon")])
@pytest.mark.parametrize("path", READS[:5], ids=lambda p: p.name)
async def test_r1_r5_a_kept_answer_serves_only_the_credentials_it_was_read_with(
    start: Start, path: Path_, first: str, second: str
) -> None:
    """One resource's read is kept; another resource then asks with other credentials: it
    is not answered from the kept answer (it waits for its own read); with the same ones it
    is, without a second read."""
    client, fake = await start()
    assert_own(
        first, await outcome(path.send(client, first, "r1")), expected(first, own=False), path
    )
    reads = len(fake.seen)
    got = await outcome(path.send(client, second, "r2"))
    assert_own(second, got, expected(second, own=False), path)
    if first == second and path.name.startswith("check"):
        assert len(fake.seen) == reads  # R1: the kept answer served it (copies always read)


@pytest.mark.parametrize("own", [False, True], ids=["anonymous", "own-credentials"])
@pytest.mark.parametrize("order", list(itertools.permutations(IDENTITIES)))
async def test_r5_the_ping_is_kept_per_identity(
    start: Start, order: tuple[str, ...], own: bool
) -> None:
    """``/v2/`` pings by three identities, in every order, twice: each gets its own
    credentials' answer (an anonymous 401 never stops a client signing in, a signed-in 200 is
    never given to an anonymous client), and only its own cookie."""
    client, _ = await start(own=own)
    ping = Path_("ping", "GET", "")
    for identity in (*order, *order):
        headers = {**authorization(identity)}
        got = await outcome(client.get(f"/v2/?ns={HOST}", headers=headers))
        assert_own(identity, got, expected(identity, own=own, ping=True), ping)


@pytest.mark.parametrize(("first", "second"), PAIRS)
async def test_p10_a_follow_up_with_other_credentials_gets_its_own_answer(
    start: Start, first: str, second: str
) -> None:
    """kuik tries each pull secret in turn: within ``check.followUp`` the same resource's
    check with other credentials goes upstream itself and gets its own verdict."""
    client, _ = await start()
    path = READS[0]
    assert_own(
        first, await outcome(path.send(client, first, "r1")), expected(first, own=False), path
    )
    got = await outcome(path.send(client, second, "r1"))
    assert_own(second, got, expected(second, own=False), path)


@pytest.mark.parametrize("path", [READS[0], READS[1]], ids=lambda p: p.name)
async def test_r5_a_fleet_answer_read_with_one_proxys_credentials_is_not_served_by_another(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    aiohttp_client: Callable[..., Awaitable[Client]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    path: Path_,
) -> None:
    """Two proxies share kept answers through the fleet. The first holds credentials for
    the host (carol's) and reads the private image for an anonymous client; the second holds
    none: its anonymous client must get the registry's 401, not the first proxy's 200. An
    answer read with alice's own Authorization still serves alice on either proxy."""
    loop = asyncio.get_running_loop()
    monkeypatch.setattr(time, "time", lambda: 1.8e9 + loop.time())
    fake = private_registry()
    server = await aiohttp_server(fake.app())
    state = FleetState(clock=loop.time)
    clients = []
    for n, own in enumerate((True, False)):
        config = parse_config(
            f"fleet: {{redis: {{url: 'redis://127.0.0.1:1'}}, name: p{n}}}\nregistries:\n"
            + host_block(server.port, tmp_path, own=own)
        )
        app = build_app(config, fleet=MemoryFleet(state, f"p{n}"))
        clients.append(await aiohttp_client(app, server_kwargs={"handler_cancellation": True}))
    signed, unsigned = clients
    assert (await outcome(path.send(signed, "anon", "r1")))[0] == 200
    assert_own("anon", await outcome(path.send(unsigned, "anon", "r2")), {401}, path)
    other_tag = replace(path, route="manifests/v2")  # no answer of carol's to stand in
    assert (await outcome(other_tag.send(signed, "alice", "r3")))[0] == 200
    reads = len(fake.seen)
    assert (await outcome(other_tag.send(unsigned, "alice", "r4")))[0] == 200
    assert len(fake.seen) == reads  # alice's answer is alice's on every proxy of the fleet


@pytest.mark.parametrize("identity", IDENTITIES)
@pytest.mark.parametrize("path", READS[:5], ids=lambda p: p.name)
async def test_per_client_headers_reach_only_the_client_whose_request_was_read(
    start: Start, path: Path_, identity: str
) -> None:
    """Two resources with the same credentials wait together and share one read (R2): both
    are answered, but the registry's ``Set-Cookie`` (and any header not kept by R1) goes only
    to the client whose request was sent."""
    client, fake = await start()
    lead = asyncio.ensure_future(outcome(path.send(client, identity, "r1")))
    await asyncio.sleep(0.01)
    other = asyncio.ensure_future(outcome(path.send(client, identity, "r2")))
    got = await asyncio.gather(lead, other)
    assert len(fake.seen) == 1  # one read for both
    assert [len(cookies) for _, _, cookies in got] == [1, 0]
    assert got[0][0] == got[1][0] and got[0][1] == got[1][1]
