"""Credentials kept apart where requests wait together (SPEC R5 with R2, §4.3, the ping of §4.1).

The peers are ``test_auth.py``'s: the token-auth distribution registry (``secure_registry``)
and its token server, where alice may pull ``private/*``. Here mallory gets an account with no
grant there, an anonymous client gets tokens that grant nothing there, and a wrong password gets
no token at all. kuikproxy holds no credentials of its own, so each client's ``Authorization``
is passed through, and an answer read with one may serve only requests carrying the identical
one (R5) — also when a window's one read answers every request waiting for the image (R2).

Each test starts its own kuikproxy: nothing is kept from another test. A round of clients is
deterministic, not a race:

* it starts right after a window (:func:`clear_of_windows`), so nearly a whole interval lies
  ahead (2 s for copies, 1 s for checks) where it needs a few tens of milliseconds;
* the *leader* is started alone, and the others only once kuikproxy holds the leader's request
  (``kuik_proxy_waiting_requests``): the leader is the request its window takes (the first in
  arrival order of the one resource loopback clients are, or the resource whose name sorts
  first, P4);
* the round only counts once that gauge shows every request of the round held at the same
  time: one window then surely reads the image once for all of them. A window that fired
  before the last one arrived fails the test as a broken precondition, never as a pass.

skopeo sends a manifest GET refused with 401 once more with a fresh token: the leader decides
its first round only, the second comes in the clients' own order (:func:`mirror_conf`). Raw
HTTP clients, which never retry, pin every order on both series.

The registry sets no cookies, so ``Set-Cookie`` crossing between clients is not tested here.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import DEAD_END, REGISTRY, StartProxy, registries_conf, require
from tests.e2e.peers import (
    MANIFEST_TYPES,
    DistributionRegistry,
    Kuikproxy,
    RegistryClient,
    Run,
    SeededImage,
    TokenServer,
    clean_env,
    http,
    parse_challenge,
    run,
)
from tests.e2e.test_auth import PREFIX, explain

pytestmark = pytest.mark.e2e

T = TypeVar("T")

ALICE = ("alice", "s3cret")
"""May pull ``private/*`` (conftest's token server)."""
MALLORY = ("mallory", "m4llory")
"""A valid account of the token server's, granted nothing on ``private/*`` (:func:`mallory`)."""
WRONG = ("alice", "not-her-password")
"""alice's name with a wrong password: the token server gives it no token."""

CHECK_INTERVAL = 1.0
"""A round of raw HTTP clients is held within milliseconds: a second between windows is ample."""
COPY_INTERVAL = 2.0
"""A round of skopeo clients (a process start, a ping and a token each, the followers started
only once the leader is held) is held within about 0.1 s here, well under a second on a busy
machine; it starts with at least 1.5 s ahead of it (:func:`clear_of_windows`)."""
ACCEPT = ", ".join(MANIFEST_TYPES)
"""One ``Accept`` for every raw client: only credentials tell them apart (R3 aside)."""
AUTH_ERROR = ("unauthorized", "authentication required", "invalid username/password", "401")
"""What a client that the registry refused says (skopeo's wording, or the status)."""


@pytest.fixture
def mallory(token_server: TokenServer, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """mallory's account on the session's token server, for this test only."""
    monkeypatch.setitem(token_server.users, *MALLORY)
    return MALLORY


@pytest.fixture
def start(secure_registry: DistributionRegistry, start_proxy: StartProxy) -> Iterator[Kuikproxy]:
    """A fresh kuikproxy before the token-auth registry, without credentials of its own, with a
    check window every second and a copy window every two (:data:`COPY_INTERVAL`)."""
    with start_proxy(
        secure_registry.url,
        check={"interval": f"{CHECK_INTERVAL:g}s"},
        copy={"interval": f"{COPY_INTERVAL:g}s"},
    ) as proxy:
        yield proxy


# --- credentials -----------------------------------------------------------------------------


def bearer(token_server: TokenServer, user: tuple[str, str] | None, scope: str | None) -> str:
    """An ``Authorization: Bearer`` from the token server for ``user`` (None: anonymous), for
    pulling ``scope`` (None: no scope, what a ``/v2/`` ping with credentials carries)."""
    challenge = {"realm": token_server.realm, "service": token_server.service}
    if scope is not None:
        challenge["scope"] = f"repository:{scope}:pull"
    return "Bearer " + RegistryClient(token_server.realm, user).token(challenge)


def forged(authorization: str, other: str) -> str:
    """``authorization``'s bearer token with ``other``'s signature: a token the registry must
    refuse (what a client with stale or stolen-looking credentials sends)."""
    header, payload, _ = authorization.removeprefix("Bearer ").split(".")
    return f"Bearer {header}.{payload}.{other.rsplit('.', 1)[1]}"


def auth_file(path: Path, proxy: Kuikproxy, user: tuple[str, str] | None) -> Path:
    """A ``containers-auth.json(5)`` keyed by kuikproxy's address, the mirror's host (skopeo
    never sends ``--creds`` to a mirror); no entry for an anonymous client."""
    auths: dict[str, Any] = {}
    if user is not None:
        auths[proxy.host_port] = {"auth": base64.b64encode(":".join(user).encode()).decode()}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"auths": auths}))
    return path


def skopeo_env(auth: Path, tmp_path: Path) -> dict[str, str]:
    """skopeo's environment: ``auth`` its only credentials (no Docker config, no default file)."""
    return clean_env(REGISTRY_AUTH_FILE=str(auth), DOCKER_CONFIG=str(tmp_path / "no-docker"))


# --- watching kuikproxy ----------------------------------------------------------------------


def waiting(proxy: Kuikproxy, operation: str) -> int:
    """Requests kuikproxy holds for a window of ``operation`` (``Check`` or ``Copy``)."""
    _, _, body = http(proxy.url + "/metrics")
    for family in text_string_to_metric_families(body.decode()):
        if family.name == "kuik_proxy_waiting_requests":
            for sample in family.samples:
                if sample.labels == {"registry": REGISTRY, "operation": operation}:
                    return int(sample.value)
    return 0


def wait_for_held(proxy: Kuikproxy, operation: str, count: int, timeout: float) -> None:
    """Return once kuikproxy holds ``count`` requests of ``operation`` at once; fail (a broken
    precondition, not a verdict) when that never happens — a window took some before the last
    arrived, or a client gave up first."""
    deadline = time.monotonic() + timeout
    seen = 0
    while (seen := waiting(proxy, operation)) < count:
        if time.monotonic() > deadline:
            pytest.fail(
                f"precondition: {count} {operation} requests never waited together "
                f"(last seen {seen}); the round is not on one window\n" + explain("", proxy)
            )
        time.sleep(0.02)


def clear_of_windows(proxy: Kuikproxy, series: str, ahead: float) -> None:
    """Wait, if need be, until ``series``' next window is at least ``ahead`` seconds away: just
    past the window, when the one before it is nearer than that (read again until kuikproxy
    says so, should its window fire late)."""
    while True:
        state = proxy.status()["registries"][REGISTRY][series]
        left = dt.datetime.fromisoformat(state["nextWindow"]).timestamp() - time.time()
        if left >= ahead:
            return
        time.sleep(max(left, 0.0) + 0.05)


def round_of(
    proxy: Kuikproxy,
    operation: str,
    leader: Callable[[], T],
    followers: Mapping[str, Callable[[], T]],
    *,
    held: int,
    ahead: float,
) -> dict[str, T]:
    """One round (module docstring): ``leader`` alone, then every follower; ``held`` of the
    followers' requests must wait beside the leader's (a follower refused before it reaches the
    manifest, like a wrong password at the token server, is not held). Results by name, the
    leader's under ``"leader"``."""
    clear_of_windows(proxy, operation.lower(), ahead)
    with ThreadPoolExecutor(max_workers=len(followers) + 1) as pool:
        first = pool.submit(leader)
        wait_for_held(proxy, operation, 1, ahead)
        rest: dict[str, Future[T]] = {n: pool.submit(f) for n, f in followers.items()}
        wait_for_held(proxy, operation, 1 + held, ahead)
        results = {name: future.result(timeout=60) for name, future in rest.items()}
        results["leader"] = first.result(timeout=60)
    return results


# --- 1. skopeo inspect: a manifest GET by tag, one copy window for everyone --------------------


@dataclass(frozen=True)
class Puller:
    """A skopeo client: its credentials in its auth file, whether the registry lets it read
    ``private/app``, whether its manifest GET ever reaches kuikproxy (a wrong password is refused
    by the token server before)."""

    name: str
    user: tuple[str, str] | None
    allowed: bool
    reaches: bool = True


PULLERS = (
    Puller("alice", ALICE, allowed=True),
    Puller("anonymous", None, allowed=False),
    Puller("mallory", MALLORY, allowed=False),
    Puller("wrong-password", WRONG, allowed=False, reaches=False),
)


def mirror_conf(home: Path, proxy: Kuikproxy, mirror: str) -> Path:
    """A registries.conf sending ``REGISTRY`` through kuikproxy: ``prefixed``, the example's
    (``/v2/registry.test-5000/...``), or ``bare`` (``/v2/...``, read from ``defaultRegistry``).

    skopeo (containers/image) answers a manifest GET refused with 401 by asking the token
    server again for the challenge's scope and sending the GET once more. Through ``bare``, its
    first token is for ``private/app`` already: the first GET is decided by the credentials it
    carries. Through ``prefixed``, its first token is for the mirror's repository name
    (``registry.test-5000/private/app``) and opens nothing: every client's first GET is refused
    and its second one decides."""
    home.mkdir(parents=True, exist_ok=True)
    if mirror == "prefixed":
        return registries_conf(home, proxy)
    path = home / "registries.conf"
    path.write_text(
        f'[[registry]]\nprefix = "{REGISTRY}"\nlocation = "{DEAD_END}"\n'
        "mirror-by-digest-only = false\n"
        f'[[registry.mirror]]\nlocation = "{proxy.host_port}"\ninsecure = true\n'
    )
    return path


def inspect_raw(proxy: Kuikproxy, image: SeededImage, conf: Path, auth: Path) -> Run:
    """``skopeo inspect --raw`` of ``REGISTRY/<image>`` through the mirror of ``conf`` with the
    auth file ``auth``: only manifest GETs by tag (copies, §4.3), so a client that is given a
    manifest it may not read succeeds and prints it — a leak shows."""
    args = ["skopeo", "inspect", "--raw", "--registries-conf", str(conf), "--authfile", str(auth),
            f"docker://{REGISTRY}/{image.repository}:{image.tag}"]  # fmt: skip
    return run(args, 60, skopeo_env(auth, conf.parent))


def assert_pulled(result: Run, image: SeededImage, proxy: Kuikproxy) -> None:
    assert result.returncode == 0, explain(result, proxy)
    assert json.loads(result.output) == json.loads(image.index.data), explain(result, proxy)


def assert_refused(result: Run, image: SeededImage, proxy: Kuikproxy) -> None:
    """A client the registry refuses: it fails with an auth error and was never shown the
    private manifest (the index's bytes or digest)."""
    assert result.returncode != 0, f"a refused client read the private manifest\n{result}"
    assert image.index.digest.removeprefix("sha256:") not in result.output, result
    assert any(word in result.output.lower() for word in AUTH_ERROR), explain(result, proxy)


@pytest.mark.usefixtures("mallory")
@pytest.mark.parametrize(
    ("mirror", "leader"),
    [("bare", "alice"), ("bare", "anonymous"), ("bare", "mallory"), ("prefixed", "alice")],
)
def test_skopeo_clients_waiting_for_one_copy_window_each_get_their_own_answer(
    mirror: str, leader: str, start: Kuikproxy, private_image: SeededImage, tmp_path: Path
) -> None:
    """skopeo ``inspect --raw`` of the private image by alice, an anonymous client, mallory
    (valid account, no grant) and alice's name with a wrong password (refused by the token
    server, so it never reaches the manifest), the others' first GETs all held for the same
    copy window, ``leader``'s the one the window takes (R2, R5): alice gets the pushed index,
    every other client fails with an auth error and never sees it — neither alice's 200 nor,
    for alice, their 401 crosses over.

    ``leader`` decides the first round only. A client refused in it asks again at once with a
    fresh token (:func:`mirror_conf`), in whatever order the clients get there: that round is
    the clients' own, and the outcome must not depend on it. Through the ``prefixed`` mirror
    (the README's) the first round is refused for everyone and only that second round counts.
    :func:`test_raw_reads_waiting_for_one_window_each_get_their_own_answer` pins every order
    with clients that never retry."""
    require("skopeo")
    proxy = start
    by_name = {p.name: p for p in PULLERS}

    def pull(puller: Puller) -> Callable[[], Run]:
        conf = mirror_conf(tmp_path / puller.name, proxy, mirror)
        auth = auth_file(tmp_path / puller.name / "auth.json", proxy, puller.user)
        return lambda: inspect_raw(proxy, private_image, conf, auth)

    others = {p.name: pull(p) for p in PULLERS if p.name != leader}
    held = sum(p.reaches for p in PULLERS if p.name != leader)
    results = round_of(
        proxy, "Copy", pull(by_name[leader]), others, held=held, ahead=COPY_INTERVAL - 0.5
    )
    results[leader] = results.pop("leader")

    for puller in PULLERS:
        check = assert_pulled if puller.allowed else assert_refused
        check(results[puller.name], private_image, proxy)


# --- 2. raw clients: checks (HEAD) and copies (GET by tag), then the kept answers --------------


@dataclass(frozen=True)
class Reader:
    """A raw client reading the private manifest by tag with ``authorization`` (None: none at
    all): on the check series a ``HEAD`` (or a GET sent as a check, ``Kuik-Operation``), on
    the copy series a GET. Unlike skopeo it never retries: what it gets is what one read gave."""

    name: str
    authorization: str | None
    allowed: bool
    method: str = "HEAD"
    series: str = "Check"


@pytest.fixture
def readers(token_server: TokenServer, mallory: tuple[str, str]) -> tuple[Reader, ...]:
    """alice's token (twice: on the check series a HEAD and a GET beside it, one read serving
    both, R2), no ``Authorization``, an anonymous token, mallory's token, a forged token."""
    alice = bearer(token_server, ALICE, "private/app")
    anonymous = bearer(token_server, None, "private/app")
    return (
        Reader("alice", alice, allowed=True),
        Reader("alice-get", alice, allowed=True, method="GET"),
        Reader("anonymous", None, allowed=False),
        Reader("anonymous-token", anonymous, allowed=False),
        Reader("mallory", bearer(token_server, mallory, "private/app"), allowed=False),
        Reader("forged", forged(alice, anonymous), allowed=False),
    )


def ask(proxy: Kuikproxy, reader: Reader, resource: str | None) -> tuple[int, Any, bytes]:
    """``reader``'s read of ``private/app:v1`` through kuikproxy, path-prefix addressed, as
    ``resource`` (None: no ``Kuik-Resource``, so the client's address, 127.0.0.1, like every
    other client here). On the check series a GET says so (``Kuik-Operation``); on the copy
    series it opens a copy (§4.3)."""
    url = f"{proxy.url}/v2/{PREFIX}/private/app/manifests/v1"
    headers = {"Accept": ACCEPT}
    if reader.series == "Check":
        headers["Kuik-Operation"] = "check"
    if reader.authorization is not None:
        headers["Authorization"] = reader.authorization
    if resource is not None:
        headers["Kuik-Resource"] = resource
    return http(url, reader.method, headers=headers)


def on_series(readers: tuple[Reader, ...], series: str) -> tuple[Reader, ...]:
    """The readers as they read on ``series``: on the copy series every one is a GET by tag."""
    if series == "Check":
        return readers
    return tuple(Reader(r.name, r.authorization, r.allowed, "GET", series) for r in readers)


def assert_answer(
    reader: Reader, answer: tuple[int, Any, bytes], image: SeededImage, proxy: Kuikproxy
) -> None:
    """alice's requests get the index (its digest; the body for a GET); the others the
    registry's 401 with its Bearer challenge, without the digest or the body."""
    status, headers, body = answer
    said = f"{reader.name} {reader.method} -> {status} {dict(headers)} {body[:200]!r}"
    if reader.allowed:
        assert status == 200, explain(said, proxy)
        assert headers["Docker-Content-Digest"] == image.index.digest, explain(said, proxy)
        assert reader.method == "HEAD" or body == image.index.data, explain(said, proxy)
    else:
        assert status == 401, explain(said, proxy)
        assert parse_challenge(headers.get("WWW-Authenticate", ""))[0] == "bearer", said
        assert headers.get("Docker-Content-Digest") != image.index.digest, said
        assert image.index.data not in body, said


@dataclass(frozen=True)
class Plan:
    """A round of raw readers: on which ``series``, who leads, and whether they are ``one``
    resource (the client's address) or ``each`` its own (``Kuik-Resource``)."""

    series: str
    leader: str
    resources: str

    def __str__(self) -> str:
        return f"{self.series.lower()}-{self.leader}-{self.resources}"


PLANS = [
    Plan(series, leader, resources)
    for series in ("Check", "Copy")
    for leader in ("alice", "anonymous")
    for resources in ("one", "each")
]


@pytest.mark.parametrize("plan", PLANS, ids=str)
def test_raw_reads_waiting_for_one_window_each_get_their_own_answer(
    plan: Plan, start: Kuikproxy, private_image: SeededImage, readers: tuple[Reader, ...]
) -> None:
    """Reads of the private image by tag — alice's token's (two), none, an anonymous token's,
    mallory's, a forged token's — all held for the same window of the plan's series (checks:
    HEADs and a GET as a check; copies: GETs), the plan's leader's taken by it, from one
    resource (the client's address) or each its own (``Kuik-Resource``, the leader's sorting
    first): alice's get the index, the others the registry's 401 (R2, R5), whoever leads.
    Then, with alice's 200 kept and well within ``cache.maxAge``, the others asking again as
    new resources still get the 401, never her 200 (R1, R5)."""
    proxy, series, leader = start, plan.series, plan.leader
    readers = on_series(readers, series)
    ordered = sorted(readers, key=lambda r: r.name != leader)  # the leader first, stable

    def resource(n: int) -> str | None:
        return None if plan.resources == "one" else f"{n}-{ordered[n].name}"

    def asking(n: int) -> Callable[[], tuple[int, Any, bytes]]:
        return lambda: ask(proxy, ordered[n], resource(n))

    followers = {ordered[n].name: asking(n) for n in range(1, len(ordered))}
    interval = CHECK_INTERVAL if series == "Check" else COPY_INTERVAL
    results = round_of(
        proxy, series, asking(0), followers, held=len(followers), ahead=interval - 0.3
    )
    results[leader] = results.pop("leader")
    for reader in readers:
        assert_answer(reader, results[reader.name], private_image, proxy)

    # the kept answers path: alice's 200 is kept now; nobody without her Authorization gets it
    again = [r for r in readers if not r.allowed]
    with ThreadPoolExecutor(max_workers=len(again)) as pool:
        late = {r.name: pool.submit(ask, proxy, r, f"late-{r.name}") for r in again}
        for reader in again:
            assert_answer(reader, late[reader.name].result(timeout=60), private_image, proxy)


# --- 3. the /v2/ ping ------------------------------------------------------------------------


def ping(proxy: Kuikproxy, authorization: str | None = None) -> tuple[int, Any, bytes]:
    """``GET /v2/`` of kuikproxy (the mirror's ping, ``defaultRegistry``'s)."""
    headers = {} if authorization is None else {"Authorization": authorization}
    return http(f"{proxy.url}/v2/", headers=headers)


def assert_challenged(answer: tuple[int, Any, bytes], proxy: Kuikproxy, who: str) -> None:
    status, headers, body = answer
    said = f"{who}: GET /v2/ -> {status} {dict(headers)} {body[:200]!r}"
    assert status == 401, explain(said, proxy)
    assert parse_challenge(headers.get("WWW-Authenticate", ""))[0] == "bearer", said


def login(proxy: Kuikproxy, user: tuple[str, str], tmp_path: Path) -> Run:
    """``skopeo login`` to kuikproxy's address (what makes an auth file keyed by the mirror):
    an anonymous ping for the challenge, a token, then ``/v2/`` with the token must say 200."""
    auth = tmp_path / "login-auth.json"
    args = ["skopeo", "login", "--tls-verify=false", "--authfile", str(auth),
            "--username", user[0], "--password", user[1], proxy.host_port]  # fmt: skip
    return run(args, 60, skopeo_env(auth, tmp_path))


def test_login_succeeds_after_an_anonymous_ping_was_kept(
    start: Kuikproxy, private_image: SeededImage, tmp_path: Path
) -> None:
    """An anonymous ``/v2/`` gets the registry's 401 and its challenge (kept, §4.1); then
    ``skopeo login`` as alice through kuikproxy succeeds — her ping with her token is not
    answered with the anonymous 401 (R5) — and the auth file it writes lets ``skopeo inspect``
    read the private image through the mirror. An anonymous ping after hers is still 401."""
    require("skopeo")
    proxy = start
    assert_challenged(ping(proxy), proxy, "anonymous, first")
    result = login(proxy, ALICE, tmp_path)
    assert result.returncode == 0, explain(result, proxy)
    auths = json.loads((tmp_path / "login-auth.json").read_text())["auths"]
    assert base64.b64decode(auths[proxy.host_port]["auth"]) == b"alice:s3cret"
    conf = mirror_conf(tmp_path / "inspect", proxy, "prefixed")
    pulled = inspect_raw(proxy, private_image, conf, tmp_path / "login-auth.json")
    assert_pulled(pulled, private_image, proxy)
    assert_challenged(ping(proxy), proxy, "anonymous, after alice's login")


def test_an_anonymous_ping_after_alice_s_is_still_refused(
    start: Kuikproxy, token_server: TokenServer
) -> None:
    """On a fresh kuikproxy, alice's ``/v2/`` with her token goes first and gets the registry's
    200; a ping without ``Authorization`` after it gets the 401 and its challenge, and so does
    one with a forged token — alice's 200 is never theirs (R5)."""
    proxy = start
    alice = bearer(token_server, ALICE, None)
    status, _, body = ping(proxy, alice)
    assert status == 200, explain(f"alice: GET /v2/ -> {status} {body[:200]!r}", proxy)
    assert_challenged(ping(proxy), proxy, "anonymous, after alice")
    assert_challenged(ping(proxy, forged(alice, bearer(token_server, None, None))), proxy, "forged")
