"""R2 extended: a read in flight is shared, on every path.

Whatever upstream read is under way — a copy's follow-up (P9), a check's (P10), a tag list's
or referrers', a standing ask's window read (P11), a stale answer's refresh (§15) — serves
every request that arrives meanwhile for the same representation, as far as R3 and R5 let
it: the request that would have made a second read follows the first instead. Each test
holds one read open at the registry (:class:`Gate`), sends the others while it is held, and
counts what the *registry* received — the one count a registry's quota sees.

Identities: the registry wants Basic sign-in, and every user may read ``private/app``; an
anonymous client is answered 401 there. A read with alice's own ``Authorization`` serves only
alice — except content by digest, which it also serves to bob once bob proved access to the
repository (a manifest of it answered 200 to him lately), but neither to eve, who may read it
and never proved it, nor to the anonymous client. The registry names in a ``Set-Cookie`` whom
each answer was for: no client is ever given a cookie of another's read.
"""

from __future__ import annotations

import asyncio
import base64
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from kuikproxy.app import build_app
from kuikproxy.config import parse_config
from tests.upstream_app import (
    BLOB_SIZE,
    INDEX_TYPE,
    MANIFEST_TYPE,
    Auth,
    Registry,
    Seen,
    blob_of,
    digest_of,
    manifest_of,
)

pytestmark = pytest.mark.looptime

Client = TestClient[Any, Any]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Match = Callable[[web.Request], bool]
Send = Callable[[], "asyncio.Future[Got]"]  # a request, sent when called

HOST = "registry.test"
REPO = "private/app"
USERS = {"alice": "a-pass", "bob": "b-pass", "eve": "e-pass"}
ALICE, BOB, EVE, ANON = "alice", "bob", "eve", "anon"
TAG = "manifests/v1"
MANIFEST = manifest_of(REPO, "v1")
MANIFEST_DIGEST = digest_of(MANIFEST)
BY_DIGEST = f"manifests/{MANIFEST_DIGEST}"
BLOB_BODY = (b"in flight " * BLOB_SIZE)[:BLOB_SIZE]
BLOB = f"blobs/{blob_of(BLOB_BODY)}"
MISSING_TAG = "gone"  # a tag the registry does not have
MISSING_DIGEST = "sha256:" + "d" * 64  # nor this manifest
NARROW, WIDE = MANIFEST_TYPE, f"{MANIFEST_TYPE}, {INDEX_TYPE}"  # two Accept sets
# the pace of most tests: windows 200 ms apart, follow-ups granted for longer than a test
PACE = "copy: {interval: 200ms, idle: 0s}\ncheck: {interval: 200ms, followUp: 1m}"


def authorization(identity: str) -> dict[str, str]:
    """The client's own ``Authorization`` for ``identity`` (none for the anonymous one)."""
    if identity == ANON:
        return {}
    token = base64.b64encode(f"{identity}:{USERS[identity]}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


WHO = {authorization(name)["Authorization"]: name for name in USERS}


def who(authorization: str | None) -> str:
    return WHO.get(authorization or "", ANON)


def route_is(method: str, route: str) -> Match:
    """Matches ``method`` of ``/v2/private/app/<route>`` (its query included) at the registry."""
    path = f"/v2/{REPO}/{route}"
    return lambda request: request.method == method and request.path_qs == path


class Gate:
    """Holds the registry's answers to the requests it matches until :meth:`release`: the
    read it holds is *in flight* for as long as the test wants, with no timing involved.

    A middleware in front of the fake registry's own (its sign-in included), so a refusal is
    held as well as an answer; :attr:`held` is whose each held request was, as it came."""

    def __init__(self) -> None:
        self._match: Match | None = None
        self._open = asyncio.Event()
        self._arrived = asyncio.Event()
        self.held: list[str] = []

    def close(self, match: Match) -> None:
        """Hold every request ``match`` accepts from now on."""
        self._match, self._open, self.held = match, asyncio.Event(), []

    async def reached(self, count: int) -> None:
        """Until ``count`` requests are held: the registry has received them."""
        async with asyncio.timeout(30):
            while len(self.held) < count:
                self._arrived.clear()
                await self._arrived.wait()

    def release(self) -> None:
        """Let the held requests be answered, and hold no more."""
        self._match = None
        self._open.set()

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        match, released = self._match, self._open
        if match is not None and match(request):
            self.held.append(who(request.headers.get("Authorization")))
            self._arrived.set()
            await released.wait()
        return await handler(request)


@dataclass(frozen=True)
class Got:
    """A client's whole answer, and whom it was sent for."""

    identity: str
    status: int
    body: bytes
    headers: dict[str, str]
    cookies: tuple[str, ...]  # the registry names whom each answer was for in one

    @property
    def its_own(self) -> bool:
        """Whether it carries no per-client header of another client's read (R5)."""
        return all(cookie.startswith(f"session={self.identity}-") for cookie in self.cookies)


@dataclass
class Setup:
    client: Client
    fake: Registry
    gate: Gate

    def send(
        self,
        method: str,
        route: str,
        identity: str,
        resource: str | None = None,
        accept: str = NARROW,
    ) -> asyncio.Future[Got]:
        """``method`` of ``/v2/private/app/<route>`` as ``identity``, for ``resource`` (None:
        no ``Kuik-Resource``, a node's pull, its client's address names it), sent now."""
        headers = {"Accept": accept, **authorization(identity)}
        if resource is not None:
            headers["Kuik-Resource"] = resource

        async def whole() -> Got:
            url = f"/v2/{REPO}/{route}?ns={HOST}"
            async with self.client.request(method, url, headers=headers) as response:
                body = await response.read()
                cookies = tuple(response.headers.getall("Set-Cookie", ()))
                return Got(identity, response.status, body, dict(response.headers), cookies)

        return asyncio.ensure_future(whole())

    def reads(self, method: str, route: str) -> dict[str, int]:
        """The requests the registry received for ``route``, by identity."""
        return dict(Counter(who(seen.authorization) for seen in self.seen(method, route)))

    def seen(self, method: str, route: str) -> list[Seen]:
        """The requests the registry received for ``route``."""
        path = f"/v2/{REPO}/{route}"
        return [s for s in self.fake.seen if s.method == method and s.path_qs == path]

    async def status(self) -> dict[str, Any]:
        document: dict[str, Any] = await (await self.client.get("/status")).json()
        return document

    async def shared(self) -> dict[str, int]:
        """``/status``'s count of requests served by another's registry read, by kind."""
        shared: dict[str, int] = (await self.status())["reads"]["shared"]
        return shared

    async def hold(
        self, match: Match, first: Send, meanwhile: Sequence[Send], alongside: Sequence[Send] = ()
    ) -> tuple[Got, list[Got], list[Got]]:
        """``first``'s registry read is held in flight while :meth:`held` sends the others.
        The answers of ``first``, of ``meanwhile`` and of ``alongside``, each carrying only
        its own client's per-client headers (R5)."""
        self.gate.close(match)
        lead = first()
        await self.gate.reached(1)
        followers, own = await self.held(meanwhile, alongside)
        first_answer = await lead
        assert first_answer.its_own, first_answer
        return first_answer, followers, own

    async def held(
        self, meanwhile: Sequence[Send], alongside: Sequence[Send] = ()
    ) -> tuple[list[Got], list[Got]]:
        """While the gate holds one read in flight, the requests of ``meanwhile`` are sent
        (they may follow it), then those of ``alongside``, one by one, each once the one
        before reached the registry: R5 sends them there themselves (an anonymous read may
        serve anyone until its refusal lands, so one sent after it would follow it first).
        The read is released once the last reached the registry. Their answers, each
        carrying no per-client header (``Set-Cookie``) of another client's read (R5)."""
        following = [send() for send in meanwhile]
        await quiescent()
        owning = []
        for n, send in enumerate(alongside, start=2):
            owning.append(send())
            await self.gate.reached(n)
        await quiescent()
        self.gate.release()
        followers, own = await asyncio.gather(*following), await asyncio.gather(*owning)
        assert all(got.its_own for got in (*followers, *own)), (followers, own)
        return list(followers), list(own)


async def quiescent() -> None:
    """Until kuikproxy has taken every request sent so far as far as it goes: looptime moves
    its virtual clock on only once the loop has had nothing to do for a while, so this
    virtual pause ends once each request is at the registry or waiting on a read in flight.
    It orders requests; nothing measures it."""
    await asyncio.sleep(0.05)


Start = Callable[..., Awaitable[Setup]]


@pytest.fixture
def start(
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    aiohttp_client: Callable[..., Awaitable[Client]],
) -> Start:
    """The Basic sign-in registry behind a :class:`Gate` (``registry`` are more of its
    fields), and kuikproxy before it, started in the test (so on its virtual clock);
    ``block`` is YAML for the host's block, ``top`` for the top level."""

    async def run(block: str = PACE, top: str = "", **registry: Any) -> Setup:
        fake = Registry(auth=Auth(dict(USERS), cookies=True), **registry)
        gate = Gate()
        upstream = fake.app()
        upstream.middlewares.insert(0, gate.middleware)
        server = await aiohttp_server(upstream)
        text = (
            f"{top}\nregistries:\n  {HOST}:\n    upstream: http://127.0.0.1:{server.port}\n"
            + "".join(f"    {line}\n" for line in block.splitlines())
        )
        app = build_app(parse_config(text))
        client = await aiohttp_client(app, server_kwargs={"handler_cancellation": True})
        return Setup(client, fake, gate)

    return run


def answered(got: Got, body: bytes | None = None) -> bool:
    """A 200 for the manifest (or ``body``, when given)."""
    if got.status != 200:
        return False
    if body is not None:
        return got.body == body
    return got.headers.get("Docker-Content-Digest") == MANIFEST_DIGEST


# -- (a) copy follow-ups (P9) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("route", "body", "kind"),
    [(BY_DIGEST, MANIFEST, "manifest-digest"), (BLOB, BLOB_BODY, "blob")],
    ids=["manifest-by-digest", "blob"],
)
async def test_p9_copy_follow_ups_follow_a_read_in_flight(
    start: Start, route: str, body: bytes, kind: str
) -> None:
    """Alice's, bob's and an anonymous node pull the tag, each at its copy window: alice and
    bob are answered 200, which proves their access to the repository, the anonymous node
    401. Their copies closed, what they read next by digest goes without a window (P9).
    Alice's read of it is held in flight: her second one, and bob's (content by digest, and
    he proved access), follow it. The anonymous node's reads on its own (its 401), and so
    does eve's, who may read the repository but never proved it (her own copy's window)."""
    setup = await start()
    for identity, status in ((ALICE, 200), (BOB, 200), (ANON, 401)):
        assert (await setup.send("GET", TAG, identity, identity)).status == status
    lead, followers, own = await setup.hold(
        route_is("GET", route),
        lambda: setup.send("GET", route, ALICE, ALICE),
        [
            lambda: setup.send("GET", route, ALICE, ALICE),
            lambda: setup.send("GET", route, BOB, BOB),
        ],
        [lambda: setup.send("GET", route, EVE, EVE), lambda: setup.send("GET", route, ANON, ANON)],
    )
    assert all(answered(got, body) for got in (lead, *followers))
    assert [got.status for got in own] == [200, 401]
    assert own[0].body == body
    assert setup.reads("GET", route) == {ALICE: 1, ANON: 1, EVE: 1}
    assert (await setup.shared())[kind] == 2


# -- (b) check follow-ups (P10) -------------------------------------------------------------


async def test_p10_check_follow_ups_follow_a_read_in_flight(start: Start) -> None:
    """A monitor's check of the tag with alice's secret is answered at its window; within
    ``check.followUp`` its checks with other secrets, and of the digest answered, go without a
    window (P10). Bob's follow-up of the tag is held in flight: bob's second one follows it;
    the anonymous one reads on its own (a read with a client's own ``Authorization`` serves
    a tag only to the identical one, R5). Then alice's follow-up by digest is held: her second
    one and bob's (he proved access) follow it; eve's (she never did) and the anonymous one
    read on their own."""
    setup = await start()
    monitor = "ImageMonitor/default/web"

    def check(route: str, identity: str) -> Send:
        return lambda: setup.send("HEAD", route, identity, monitor)

    assert answered(await check(TAG, ALICE)())
    lead, followers, own = await setup.hold(
        route_is("HEAD", TAG), check(TAG, BOB), [check(TAG, BOB)], [check(TAG, ANON)]
    )
    assert all(answered(got) for got in (lead, *followers))
    assert [got.status for got in own] == [401]
    assert setup.reads("HEAD", TAG) == {ALICE: 1, BOB: 1, ANON: 1}

    lead, followers, own = await setup.hold(
        route_is("HEAD", BY_DIGEST),
        check(BY_DIGEST, ALICE),
        [check(BY_DIGEST, ALICE), check(BY_DIGEST, BOB)],
        [check(BY_DIGEST, EVE), check(BY_DIGEST, ANON)],
    )
    assert all(answered(got) for got in (lead, *followers))
    assert [got.status for got in own] == [200, 401]
    assert setup.reads("HEAD", BY_DIGEST) == {ALICE: 1, EVE: 1, ANON: 1}
    shared = await setup.shared()
    assert (shared["manifest-tag"], shared["manifest-digest"]) == (1, 2)


# -- (c) tag lists and referrers, as check follow-ups ---------------------------------------


@pytest.mark.parametrize(
    ("route", "accept", "kind"),
    [
        ("tags/list", "application/json", "tags"),
        (f"referrers/{MANIFEST_DIGEST}", INDEX_TYPE, "referrers"),
    ],
    ids=["tags", "referrers"],
)
async def test_p10_list_follow_ups_follow_a_read_in_flight(
    start: Start, route: str, accept: str, kind: str
) -> None:
    """A tag list and a referrers list are checks (§4.1): after a monitor's read of one with
    alice's secret, its reads of it with other secrets are follow-ups (P10). Bob's is held in
    flight: bob's second one follows it; the anonymous one reads on its own (a list read with
    a client's own ``Authorization`` serves only the identical one, R5) and gets its 401."""
    setup = await start(tags={REPO: ["v1", "v2"]})
    monitor = "ImageMonitor/default/lists"

    def read(identity: str) -> Send:
        return lambda: setup.send("GET", route, identity, monitor, accept=accept)

    first = await read(ALICE)()
    assert first.status == 200
    lead, followers, own = await setup.hold(
        route_is("GET", route), read(BOB), [read(BOB)], [read(ANON)]
    )
    assert [(got.status, got.body) for got in (lead, *followers)] == [(200, first.body)] * 2
    assert [got.status for got in own] == [401]
    assert setup.reads("GET", route) == {ALICE: 1, BOB: 1, ANON: 1}
    assert (await setup.shared())[kind] == 1


# -- (d) a standing ask and the requests that come while it is read (P11) -------------------


async def cancelled(client: Client) -> float:
    """How many requests ``/metrics`` counts as ended by their client leaving."""
    text = await (await client.get("/metrics")).text()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "kuik_proxy_requests_total" and sample.labels.get("code") == "cancelled"
    )


async def test_p11_riders_follow_a_standing_asks_read_in_flight(start: Start) -> None:
    """Alice's check waits for its window and its client leaves: the ask stands (P11), and
    the window reads the image for it with alice's secret. While that read is held in flight,
    the asker's retry rides it, and another monitor's checks with alice's secret — follow-ups
    there, as it checked the tag with bob's before (P10) — follow it: the registry is asked
    once for alice. That monitor's anonymous follow-up reads on its own (its 401), and its
    check with bob's secret is not answered by alice's read (R5): it reads on its own turn."""
    setup = await start("check: {interval: 10s, timeout: 1m, followUp: 1m}")
    asker, other = "ImageMonitor/default/asker", "ImageMonitor/default/other"
    assert answered(await setup.send("HEAD", TAG, BOB, other))  # its window: 10 s
    setup.gate.close(route_is("HEAD", TAG))
    leaving = setup.send("HEAD", TAG, ALICE, asker)  # its window: 20 s

    await quiescent()
    assert (await setup.status())["registries"][HOST]["check"]["waiting"] == 1  # parked
    leaving.cancel()
    await quiescent()
    assert await cancelled(setup.client) == 1  # its client left: its ask stands
    await setup.gate.reached(1)  # the standing ask's read, at its window
    assert setup.gate.held == [ALICE]
    riders, own = await setup.held(
        [
            lambda: setup.send("HEAD", TAG, ALICE, asker),  # the retry: a rider (P11)
            lambda: setup.send("HEAD", TAG, ALICE, other),  # follow-ups (P10)
            lambda: setup.send("HEAD", TAG, ALICE, other),
            # not a follow-up there (bob's is the read it follows up): it waits for its turn
            lambda: setup.send("HEAD", TAG, BOB, other),
        ],
        [lambda: setup.send("HEAD", TAG, ANON, other)],
    )
    assert all(answered(got) for got in riders)
    assert [got.status for got in own] == [401]
    assert setup.reads("HEAD", TAG) == {BOB: 2, ALICE: 1, ANON: 1}
    assert (await setup.shared())["manifest-tag"] == 3  # the retry and the two follow-ups


async def test_p11_a_standing_asks_window_read_follows_a_follow_up_in_flight(
    start: Start,
) -> None:
    """The other way round: a monitor's follow-up with alice's secret is held in flight when
    the window comes that reads alice's standing ask of the same tag. That window's read
    follows it (windows open at fixed times, P1, so on the virtual clock "past the window" is
    exact; ``/status`` shows the check series busy with it): the registry is asked once for
    alice, and the asker's retry is answered at once from that read (P11). The anonymous
    follow-up, meanwhile, reads on its own."""
    setup = await start("check: {interval: 10s, timeout: 1m, followUp: 1m}")
    asker, other = "ImageMonitor/default/asker", "ImageMonitor/default/other"
    assert answered(await setup.send("HEAD", TAG, BOB, other))  # its window: 10 s
    leaving = setup.send("HEAD", TAG, ALICE, asker)  # its window: 20 s
    await quiescent()
    leaving.cancel()
    await quiescent()
    assert await cancelled(setup.client) == 1  # its client left: its ask stands
    setup.gate.close(route_is("HEAD", TAG))
    follow_up = setup.send("HEAD", TAG, ALICE, other)
    await setup.gate.reached(1)
    anonymous = setup.send("HEAD", TAG, ANON, other)
    await setup.gate.reached(2)
    await asyncio.sleep(10)  # past the window at 20 s
    assert (await setup.status())["registries"][HOST]["check"]["busy"]  # its read follows
    setup.gate.release()
    followed, refused = await follow_up, await anonymous
    assert answered(followed) and refused.status == 401
    assert followed.its_own and refused.its_own
    retry = setup.send("HEAD", TAG, ALICE, asker)
    assert answered(await retry)
    assert setup.reads("HEAD", TAG) == {BOB: 1, ALICE: 1, ANON: 1}


# -- (e) a stale answer's refresh, with a store (§15) ---------------------------------------


async def test_s15_requests_follow_a_stale_refresh_in_flight(start: Start, tmp_path: Path) -> None:
    """With a store and ``serveStale``, nodes pulled the tag with alice's and bob's secrets:
    a mapping each, kept apart (R5). The registry is then down (503): the node's check of
    the tag with bob's secret — a follow-up of its check with alice's (P10) — is the refresh,
    held in flight; bob's second check follows it, and both are answered stale from bob's
    mapping. The anonymous check reads on its own (its 401), and so does alice's, at its
    window (her own answer: stale, from her mapping)."""
    setup = await start(
        f"{PACE}\nserveStale: true",
        top=f"cache: {{maxAge: 100ms, blobs: {{path: {str(tmp_path)!r}}}}}",
    )
    assert answered(await setup.send("HEAD", TAG, ALICE))  # the follow-ups' check
    for identity in (ALICE, BOB):  # the pulls: the mappings
        assert answered(await setup.send("GET", TAG, identity), MANIFEST)
    setup.fake.fail[f"/v2/{REPO}/{TAG}"] = 503
    lead, followers, own = await setup.hold(
        route_is("HEAD", TAG),
        lambda: setup.send("HEAD", TAG, BOB),
        [lambda: setup.send("HEAD", TAG, BOB)],
        [lambda: setup.send("HEAD", TAG, ALICE), lambda: setup.send("HEAD", TAG, ANON)],
    )
    for got in (lead, *followers, own[0]):
        assert answered(got) and got.headers["Warning"].startswith("110"), got
    assert own[1].status == 401
    assert setup.reads("HEAD", TAG) == {ALICE: 2, BOB: 1, ANON: 1}
    assert (await setup.shared())["manifest-tag"] == 1


# -- R3: a 404 serves only the Accept set it was read with ----------------------------------


@pytest.mark.parametrize("path", ["copy-follow-up", "check-follow-up", "tags-follow-up"])
async def test_r3_a_404_in_flight_serves_only_its_accept_set(start: Start, path: str) -> None:
    """A registry answers 404 when no representation fits a narrow ``Accept``, so a 404 in
    flight serves only requests whose ``Accept`` is the same set of types (R3). Three
    concurrent follow-ups for something missing: the two with one ``Accept`` are one read;
    the third, with another, follows it too — and, the 404 not being its, reads on its own
    once it lands."""
    setup = await start(unknown_tags={MISSING_TAG}, tags={})
    if path == "copy-follow-up":
        method, route, identity, resource = "GET", f"manifests/{MISSING_DIGEST}", ALICE, "node"
        assert answered(await setup.send("GET", TAG, ALICE, resource))
    else:
        route = f"manifests/{MISSING_TAG}" if path == "check-follow-up" else "tags/list"
        method = "HEAD" if path == "check-follow-up" else "GET"
        identity, resource = BOB, "ImageMonitor/default/missing"
        assert (await setup.send(method, route, ALICE, resource)).status == 404

    def read(accept: str) -> Send:
        return lambda: setup.send(method, route, identity, resource, accept=accept)

    lead, followers, _ = await setup.hold(
        route_is(method, route), read(NARROW), [read(NARROW), read(WIDE)]
    )
    assert [got.status for got in (lead, *followers)] == [404] * 3
    sent = setup.seen(method, route)
    accepts = [
        ",".join(s.headers.get("accept", [])) for s in sent if who(s.authorization) == identity
    ]
    assert sorted(accepts) == sorted([NARROW, WIDE])
