"""R5 as a property: whatever clients ask, in whatever order, the pull-through store never gives
anyone content the registry would have refused them.

The store (§15) keeps each digest once for every host and repository, and decides itself who
may have it: the identical ``Authorization``, a proof of access (a manifest of that repository
answered 200 lately), an anonymous read, a grant per (host, repository). Each of those is a
shortcut past the registry, and a wrong one hands out someone's private layer. The example
tests of ``test_store_http.py`` pin the cases thought of; this one lets hypothesis look for the
others.

The world is fixed and small, so that collisions are likely: two registries, each with the
same repository names (``pub`` public, ``priv`` and ``team`` private, with readers that differ
between the hosts), and a handful of blobs and manifests, several of them in more than one
repository, across hosts too, public in one place and private in another. Each registry
(:class:`Upstream`) answers like one behind Basic sign-in: 401 without credentials, 403 to a
user who may not read the repository, 404 for what the repository does not hold, the content
otherwise. Its answers are a pure function of (host, repository, reference, user): that
function is the oracle (:func:`allowed`).

Hypothesis draws a sequence of batches of requests — blob GET (whole or a range) and HEAD,
manifest GET and HEAD by tag, manifest GET by digest; as anonymous, alice, bob or eve; with or
without ``Kuik-Resource``; the hosts, repositories, users and digests among a few drawn per
example (:func:`batches`) — and each host paced or not. The requests of a batch run at once (a
read under way is followed by others, or not), the batches one after another. After each
answer:

* a 200 or 206 is allowed by the oracle for that (host, repository, reference, user), and its
  bytes (or, for a HEAD, its length and digest) are exactly that content's: anything else is
  a leak, or content served under the wrong name;
* nothing is a 5xx: these registries never fail, so kuikproxy has none to relay, and one of
  its own would be a crash.

Every example starts a fresh kuikproxy with an empty store in a directory of its own, before
fresh registries: a sequence that fails fails alone, and hypothesis shrinks it to the few
requests that make the leak (with the registries' logs in the message). Time is virtual
(looptime): windows and chunked blobs cost nothing; the file takes some 15 s.

It has teeth. When it was written, each of these breaks of R5 made it fail for each of three
seeds (without the example database), shrunk to a few requests: a proof opening content never
read from its repository (``content_serves`` without ``if not owners``), a read under way
followed from another host or repository (``PullThrough.find`` not comparing the fill's), an
answer read with a client's ``Authorization`` shared with anyone (``shared_with``). A proof
counted for every repository of its host (``PullThrough._proved`` without the repository), which
takes three contexts lining up, made it fail for two seeds of three.

"Content the registry holds" is by digest, whatever the route: the store serves a manifest it
holds by digest to a blob GET of that digest, which the registry (distribution) might answer
404, but that gives nobody anything they could not read.

The property assumes honest registries: each one's ``Docker-Content-Digest`` is the digest of
what it serves. A registry that lies in it (one run by whoever asks, under a wildcard) is the
subject of :func:`test_a_registry_that_names_a_digest_it_lacks_in_a_head_gets_nothing_of_it`.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
from aiohttp import ClientResponse, web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import event, given, settings
from hypothesis import strategies as st

from kuikproxy.app import build_app
from kuikproxy.config import parse_config

pytestmark = pytest.mark.looptime

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
HOSTS = ("one.test", "two.test")
USERS = ("alice", "bob", "eve")
RANGE = (10, 99)  # a ranged GET asks for bytes 10-99 (inclusive), as a resumed pull would


def digest_of(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def layer(name: str, size: int) -> bytes:
    """A blob's bytes: distinct per name, large enough to come in several chunks."""
    return (name.encode() * size)[:size]


# The blobs, by a short name so that a failing sequence reads. ``gone`` is in no repository:
# nothing may ever serve it.
BLOBS: dict[str, bytes] = {
    name: layer(name, size)
    for name, size in (("x", 48_000), ("y", 64_000), ("z", 40_000), ("w", 56_000), ("gone", 500))
}


def manifest(name: str, layers: tuple[str, ...]) -> bytes:
    """An image manifest naming ``layers``: the same ``name`` and layers give the same bytes,
    so one manifest can be in several repositories, as images copied between them are."""
    body = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "layers": [{"digest": digest_of(BLOBS[n]), "size": len(BLOBS[n])} for n in layers],
        "annotations": {"image": name},
    }
    return json.dumps(body, sort_keys=True).encode()


MANIFESTS: dict[str, bytes] = {
    "m-secret": manifest("secret", ("x", "y")),  # alice's private image on one.test
    "m-shared": manifest("shared", ("y", "w")),  # in a private and a public repository
    "m-base": manifest("base", ("z",)),
    "m-lonely": manifest("lonely", ("gone",)),  # in no repository
}
NAMES = {**BLOBS, **MANIFESTS}
CONTENT = {digest_of(body): body for body in NAMES.values()}
DIGEST = {name: digest_of(body) for name, body in NAMES.items()}


def named(path: str) -> str:
    """``path`` with a digest of the world shown by its name, for reports."""
    for name, digest in DIGEST.items():
        path = path.replace(digest, f"<{name}>")
    return path


@dataclass(frozen=True)
class Repo:
    """A repository: who may read it (None: anyone, anonymous included), the blobs it holds,
    and its tags (tag → manifest name); the manifests its tags name are held by digest too."""

    readers: frozenset[str] | None
    blobs: frozenset[str]
    tags: Mapping[str, str]

    def holds(self, digest: str) -> bool:
        names = self.blobs | set(self.tags.values())
        return any(DIGEST[name] == digest for name in names)

    def may_read(self, user: str | None) -> bool:
        return self.readers is None or (user is not None and user in self.readers)


def repo(readers: set[str] | None, blobs: str, **tags: str) -> Repo:
    """A :class:`Repo`; ``blobs`` are names of ``BLOBS``, space-separated."""
    return Repo(None if readers is None else frozenset(readers), frozenset(blobs.split()), tags)


# The same repository names on both hosts with other readers and contents: a grant, a proof or
# a read under way for one must never count for the other. ``y`` is in four repositories,
# public in two.test/pub alone; ``z`` public on one.test and private on two.test; ``w`` the
# other way round; ``x`` in alice's one.test/priv alone.
WORLD: dict[str, dict[str, Repo]] = {
    "one.test": {
        "pub": repo(None, "z", v1="m-base"),
        "priv": repo({"alice"}, "x y", v1="m-secret", v2="m-shared"),
        "team": repo({"alice", "bob"}, "y w", v1="m-shared"),
    },
    "two.test": {
        "pub": repo(None, "w y", v1="m-shared"),
        "priv": repo({"bob"}, "y", v1="m-base"),
        "team": repo({"alice", "eve"}, "z", v1="m-base", v2="m-shared"),
    },
}
REPOS = ("pub", "priv", "team", "nowhere")  # ``nowhere`` exists on neither host
TAGS = ("v1", "v2")

Kind = Literal["blob", "blob-head", "tag", "tag-head", "manifest"]


@dataclass(frozen=True)
class Ask:
    """One request to kuikproxy. ``ref`` is a name of ``BLOBS`` or ``MANIFESTS`` (``blob``,
    ``blob-head``, ``manifest``: by its digest) or a tag (``tag``, ``tag-head``)."""

    host: str
    repo: str
    kind: Kind
    ref: str
    user: str | None  # None: no Authorization
    resource: str | None  # the Kuik-Resource header; None: none (the client's address)
    ranged: bool = False  # a blob GET with a Range

    @property
    def method(self) -> str:
        return "HEAD" if self.kind.endswith("-head") else "GET"

    @property
    def reference(self) -> str:
        return self.ref if self.kind.startswith("tag") else DIGEST[self.ref]

    @property
    def path(self) -> str:
        route = "blobs" if self.kind.startswith("blob") else "manifests"
        return f"/v2/{self.repo}/{route}/{self.reference}"

    def __str__(self) -> str:
        text = f"{self.method} {self.host} {named(self.path)} as {self.user or 'anonymous'}"
        if self.resource is not None:
            text += f", Kuik-Resource {self.resource}"
        return text + (f", Range {RANGE}" if self.ranged else "")


def authorization(user: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{user}-pw".encode()).decode()


def allowed(host: str, repository: str, reference: str, user: str | None) -> bytes | None:
    """The oracle: what the registry gives ``user`` for ``reference`` in ``repository`` of
    ``host`` — the content, or None for a refusal (401, 403 or 404)."""
    found = WORLD[host].get(repository)
    if found is None or not found.may_read(user):
        return None
    if reference.startswith("sha256:"):
        return CONTENT[reference] if found.holds(reference) else None
    name = found.tags.get(reference)
    return None if name is None else MANIFESTS[name]


@dataclass
class Upstream:
    """One registry of the world, behind Basic sign-in; records every request it gets (method,
    path, user) for the report of a failing sequence."""

    host: str
    seen: list[tuple[str, str, str | None]] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v2/", self.ping)
        app.router.add_route("*", "/v2/{name:.+}/manifests/{reference}", self.content)
        app.router.add_route("*", "/v2/{name:.+}/blobs/{reference}", self.content)
        return app

    @staticmethod
    def user(request: web.Request) -> str | None:
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return None
        user, _, password = base64.b64decode(value).decode().partition(":")
        return user if user in USERS and password == f"{user}-pw" else None

    async def ping(self, request: web.Request) -> web.Response:
        return web.json_response({}, headers={"Docker-Distribution-API-Version": "registry/2.0"})

    async def content(self, request: web.Request) -> web.StreamResponse:
        user = self.user(request)
        self.seen.append((request.method, request.path, user))
        name, reference = request.match_info["name"], request.match_info["reference"]
        found = WORLD[self.host].get(name)
        if found is not None and not found.may_read(user):
            if user is None:
                return error(401, "UNAUTHORIZED", {"WWW-Authenticate": 'Basic realm="test"'})
            return error(403, "DENIED")
        body = allowed(self.host, name, reference, user)
        if body is None:
            return error(404, "NAME_UNKNOWN" if found is None else "MANIFEST_UNKNOWN")
        manifest = "/manifests/" in request.path
        headers = {
            "Content-Type": MANIFEST_TYPE if manifest else "application/octet-stream",
            "Docker-Content-Digest": digest_of(body),
        }
        response = web.StreamResponse(headers=headers)
        response.content_length = len(body)
        await response.prepare(request)
        if request.method == "GET":
            # blobs in four chunks 10 ms apart (virtual time): long enough for the other
            # requests of a batch to find the read under way and follow it, or not
            chunks = 1 if manifest else 4
            size = -(-len(body) // chunks)
            for start in range(0, len(body), size):
                await response.write(body[start : start + size])
                if not manifest:
                    await asyncio.sleep(0.01)
        await response.write_eof()
        return response


def error(status: int, code: str, headers: dict[str, str] | None = None) -> web.Response:
    body = {"errors": [{"code": code, "message": code.lower()}]}
    return web.json_response(body, status=status, headers=headers)


PACED = "    check: {interval: 20ms}\n    copy: {interval: 20ms, idle: 20ms}\n"


def kuikproxy_config(store: Path, ports: Mapping[str, int], paced: Mapping[str, bool]) -> str:
    """Both hosts before their registries. A paced host has short windows (free in virtual
    time): its reads go through windows, kept answers (R1) and the sharing of one read by its
    waiters (R2), an unpaced one straight through; both meet the same store."""
    text = f"cache: {{blobs: {{path: {str(store)!r}, maxBytes: 64Mi}}}}\nregistries:\n"
    for host in HOSTS:
        text += f"  {host}:\n    upstream: http://127.0.0.1:{ports[host]}\n"
        text += PACED if paced[host] else "    paced: false\n"
    return text


@dataclass(frozen=True)
class Got:
    status: int
    headers: Mapping[str, str]
    body: bytes


async def send(client: TestClient[Any, Any], ask: Ask) -> Got:
    headers: dict[str, str] = {}
    if ask.user is not None:
        headers["Authorization"] = authorization(ask.user)
    if ask.resource is not None:
        headers["Kuik-Resource"] = ask.resource
    if ask.ranged:
        headers["Range"] = f"bytes={RANGE[0]}-{RANGE[1]}"
    response: ClientResponse = await client.request(
        ask.method, f"{ask.path}?ns={ask.host}", headers=headers
    )
    async with response:
        # a body that breaks off (a fill that failed its digest) raises here: with honest
        # registries that is a failure too
        body = await response.read()
    return Got(response.status, dict(response.headers), body)


def leak(ask: Ask, got: Got) -> str | None:
    """What is wrong with kuikproxy's answer ``got`` to ``ask``, by the oracle; None if
    nothing."""
    if got.status >= 500:
        return f"answered {got.status}"
    if got.status not in (200, 206):
        return None
    content = allowed(ask.host, ask.repo, ask.reference, ask.user)
    if content is None:
        return f"answered {got.status} where the registry refuses"
    digest = got.headers.get("Docker-Content-Digest")
    if digest is not None and digest != digest_of(content):
        return f"answered {digest} for {digest_of(content)}"
    if ask.method == "HEAD":
        length = got.headers.get("Content-Length")
        if length is not None and int(length) != len(content):
            return f"a HEAD of length {length} for {len(content)} bytes"
        return None
    if got.status == 206 and not ask.ranged:
        return "a 206 to a request without a Range"
    expected = content[RANGE[0] : RANGE[1] + 1] if got.status == 206 else content
    if got.body != expected:
        return f"answered {len(got.body)} bytes that are not the content asked for"
    return None


Context = tuple[str, str, str | None]  # host, repository, user
Batches = list[list[Ask]]


@st.composite
def one_ask(draw: st.DrawFn, contexts: list[Context], digests: list[str], kinds: list[Kind]) -> Ask:
    """A request of one of ``kinds`` in one of ``contexts``, by one of ``digests`` or a tag."""
    host, repository, user = draw(st.sampled_from(contexts))
    kind = draw(st.sampled_from(kinds))
    # by digest, any of the example's: a blob GET or HEAD of a manifest's digest too (the
    # store holds both under one namespace of digests), a manifest GET of a blob's digest
    ref = draw(st.sampled_from(TAGS if kind.startswith("tag") else digests))
    return Ask(
        host=host,
        repo=repository,
        kind=kind,
        ref=ref,
        user=user,
        resource=draw(st.sampled_from([None, "r1", "r2"])),
        ranged=kind == "blob" and draw(st.booleans()),
    )


def holders(names: list[str]) -> list[Context]:
    """The contexts whose user may read a repository holding one of ``names``."""
    return [
        (host, name, user)
        for host, repos in WORLD.items()
        for name, found in repos.items()
        for user in (None, *USERS)
        if found.may_read(user) and any(found.holds(DIGEST[n]) for n in names)
    ]


@st.composite
def batches(draw: st.DrawFn) -> Batches:
    """A few digests and a few (host, repository, user) contexts per example, every request in
    one of them: a leak takes several requests that line up — content stored by one, a proof
    by another, then the ask — which requests drawn independently from the whole world would
    seldom do.

    The contexts are every combination of the hosts, repositories and users of one to three
    drawn ones, so that a user met in one repository is met in the others too (a proof for
    one must not open another), and a repository with its other users. About half the drawn
    ones may read a repository that holds one of the digests: reads that succeed and store
    something, which the others then try to get."""
    digests = draw(st.lists(st.sampled_from(list(NAMES)), min_size=1, max_size=3, unique=True))
    anyone = st.tuples(
        st.sampled_from(HOSTS), st.sampled_from(REPOS), st.sampled_from([None, *USERS])
    )
    readers = holders(digests)
    context = st.one_of(anyone, st.sampled_from(readers)) if readers else anyone
    drawn = draw(st.lists(context, min_size=1, max_size=3, unique=True))
    hosts = {host for host, _, _ in drawn}
    repositories = {repository for _, repository, _ in drawn}
    users = {user for _, _, user in drawn}
    contexts = sorted(itertools.product(hosts, repositories, users), key=str)
    every = one_ask(contexts, digests, ["blob", "blob-head", "tag", "tag-head", "manifest"])
    batch = st.one_of(st.lists(every, min_size=1, max_size=3), rush(contexts, digests))
    return draw(st.lists(batch, min_size=1, max_size=20))


@st.composite
def rush(draw: st.DrawFn, contexts: list[Context], digests: list[str]) -> list[Ask]:
    """Several contexts, each another if there are enough, ask for one digest at once, as nodes
    pulling one image do: the first read of it is under way while the others look for it (a
    read under way followed, or not)."""
    digest = draw(st.sampled_from(digests))
    order = draw(st.permutations(contexts))
    size = draw(st.integers(min_value=2, max_value=4))
    kinds: list[Kind] = ["blob", "blob", "manifest"]
    return [draw(one_ask([order[n % len(order)]], [digest], kinds)) for n in range(size)]


pacings = st.fixed_dictionaries({host: st.booleans() for host in HOSTS})


async def started(app: web.Application) -> TestServer:
    server = TestServer(app)
    await server.start_server()
    return server


def port(server: TestServer) -> int:
    assert server.port is not None
    return server.port


@dataclass
class Played:
    """What a sequence got: every answer with its request and the number of its batch, the
    registries' logs, and the store's counts from ``/status`` at the end (what it answered
    from the disk, and from a read under way)."""

    answers: list[tuple[int, Ask, Got]]
    upstreams: dict[str, Upstream]
    store: Mapping[str, Any]

    def wrong(self) -> list[str]:
        return [
            f"  {ask} → {got.status}: {why}"
            for _, ask, got in self.answers
            if (why := leak(ask, got)) is not None
        ]

    def report(self) -> str:
        """The wrong answers, then every answer (those of a batch were asked at once) and
        what each registry was asked, in order."""
        lines = ["wrong:", *self.wrong(), "answers:"]
        lines += [f"  {n}: {ask} → {got.status}" for n, ask, got in self.answers]
        for host, upstream in self.upstreams.items():
            lines.append(f"{host} was asked:")
            lines += [
                f"  {m} {named(path)} as {user or 'anonymous'}" for m, path, user in upstream.seen
            ]
        return "\n".join(lines)


async def run(store: Path, steps: Batches, paced: Mapping[str, bool]) -> Played:
    """Play ``steps`` against a fresh kuikproxy and store before the world's registries."""
    upstreams = {host: Upstream(host) for host in HOSTS}
    servers = {host: await started(up.app()) for host, up in upstreams.items()}
    ports = {host: port(server) for host, server in servers.items()}
    text = kuikproxy_config(store, ports, paced)
    client: TestClient[Any, Any] = TestClient(TestServer(build_app(parse_config(text))))
    await client.start_server()
    answers: list[tuple[int, Ask, Got]] = []
    try:
        for n, batch in enumerate(steps):
            gots = await asyncio.gather(*(send(client, ask) for ask in batch))
            answers += ((n, ask, got) for ask, got in zip(batch, gots, strict=True))
        status = await (await client.get("/status")).json()
    finally:
        await client.close()
        for server in servers.values():
            await server.close()
    return Played(answers, upstreams, status["cache"]["store"])


@settings(max_examples=300, deadline=None)
@given(steps=batches(), paced=pacings)
async def test_the_store_never_gives_what_the_registry_refuses(
    tmp_path_factory: pytest.TempPathFactory, steps: Batches, paced: dict[str, bool]
) -> None:
    played = await run(tmp_path_factory.mktemp("store"), steps, paced)
    # what the examples exercised, for --hypothesis-show-statistics: a property that never
    # reached the store would prove nothing
    for _, ask, got in played.answers:
        event(f"{ask.kind} {got.status}")
    reads = played.store["reads"]
    if reads["store"]:
        event("some answered from the store")
    if reads["shared"]:
        event("some answered from a read under way")
    if played.wrong():
        # not pytest.fail(pytrace=False): that would hide the falsifying example hypothesis
        # adds to the exception
        raise AssertionError(played.report())


def liar(digest: str) -> web.Application:
    """A registry run by whoever asks (one reached under a wildcard, say): a HEAD of any tag
    names ``digest``, which it does not hold; a GET of a tag is its 503 (down, so that a stale
    answer is due); anything by digest is its 404."""

    async def manifest(request: web.Request) -> web.Response:
        if request.match_info["reference"].startswith("sha256:"):
            return error(404, "MANIFEST_UNKNOWN")
        if request.method == "GET":
            return error(503, "UNAVAILABLE")
        return web.Response(
            headers={"Content-Type": MANIFEST_TYPE, "Docker-Content-Digest": digest}
        )

    async def blob(request: web.Request) -> web.Response:
        return error(404, "BLOB_UNKNOWN")

    app = web.Application()
    app.router.add_route("*", "/v2/{name:.+}/manifests/{reference}", manifest)
    app.router.add_route("*", "/v2/{name:.+}/blobs/{reference}", blob)
    return app


async def test_a_registry_that_names_a_digest_it_lacks_in_a_head_gets_nothing_of_it(
    tmp_path: Path,
) -> None:
    """alice pulls her private layer ``x`` from one.test. The registry of evil.test, run by
    whoever wants ``x`` (digests are no secret: image references, logs and CI carry them),
    answers an anonymous HEAD of a tag with ``Docker-Content-Digest`` naming ``x``. kuikproxy
    keeps that check's answer (R1) and, for the store (§15), the tag's mapping — but a HEAD
    proves nothing of the digest it names, so none of the store's paths gives ``x`` under
    evil.test: not a GET of the blob (evil.test's own 404), not the tag answered stale while
    evil.test is down (``serveStale: true``: its own 503), not the tag after a restart.

    This was a leak found by the property above: the HEAD granted evil.test/app the digest,
    for anyone. A GET by tag never could (its body's own digest is used, :func:`verified`);
    an unpaced host's HEAD is relayed, not kept."""
    honest = await started(Upstream("one.test").app())
    lying = await started(liar(DIGEST["x"]))
    text = (
        f"cache: {{blobs: {{path: {str(tmp_path)!r}, maxBytes: 64Mi}}}}\n"
        f"registries:\n  one.test:\n    upstream: http://127.0.0.1:{port(honest)}\n"
        "    paced: false\n"
        # paced, as a host reached under a wildcard is by default: an unpaced host's HEAD is
        # relayed, not kept
        f"  evil.test:\n    upstream: http://127.0.0.1:{port(lying)}\n{PACED}"
        "    serveStale: true\n"
    )

    async def not_x(client: TestClient[Any, Any], path: str, status: int) -> None:
        got = await client.get(f"{path}?ns=evil.test")
        body = await got.read()
        assert not (got.status == 200 and BLOBS["x"] in body), f"alice's layer, at {path}"
        assert got.status == status  # evil.test's own answer

    try:
        client: TestClient[Any, Any] = TestClient(TestServer(build_app(parse_config(text))))
        await client.start_server()
        try:
            stored = await send(client, Ask("one.test", "priv", "blob", "x", "alice", None))
            assert stored.status == 200 and stored.body == BLOBS["x"]
            head = await client.head("/v2/app/manifests/latest?ns=evil.test")
            assert head.status == 200  # the liar's answer, relayed
            await not_x(client, f"/v2/app/blobs/{DIGEST['x']}", 404)
            await not_x(client, "/v2/app/manifests/latest", 503)
        finally:
            await client.close()
        restarted: TestClient[Any, Any] = TestClient(TestServer(build_app(parse_config(text))))
        await restarted.start_server()
        try:
            await not_x(restarted, "/v2/app/manifests/latest", 503)
        finally:
            await restarted.close()
    finally:
        await honest.close()
        await lying.close()
