"""R1–R5: one upstream read serves every resource; when a kept answer may stand in for it."""

from __future__ import annotations

import pytest
from timeline import Timeline, img

from kuikproxy.core.reuse import (
    accept_admits,
    fresh_for,
    is_kept_status,
    method_serves,
    owner_key,
    owners_serving,
    shared_with,
)
from kuikproxy.core.tickets import Hold, Reuse
from kuikproxy.core.windows import Outcome

MIN = 60.0
HOUR = 3600.0
NGINX = "library/nginx:1.27"


def test_r1_reuse_when_kept_answer_is_newer_than_the_previous_read_and_young() -> None:
    """A's window reads nginx at 1m; B, which never read it, asks at 1m30: it is answered from
    the kept answer at once (Reuse), the read counts as B's in this lap and takes no turn."""
    t = Timeline.start(0.0, check_interval=MIN)
    t.ask("A", NGINX, 0.0)
    t.window()
    assert isinstance(t.ask("B", NGINX, 1.5 * MIN), Reuse)
    assert t.sched.ring("B").previous_read(NGINX) == 1.5 * MIN
    assert t.sched.ring("B").answered_in_lap(NGINX)
    assert t.window().outcome is Outcome.IDLE  # B's answer spent no window


def test_r1_no_reuse_when_kept_answer_is_older_than_the_previous_read() -> None:
    """B read nginx itself at 2m; a kept answer from 1m is older than that: B waits for its
    turn instead of going back in time."""
    t = Timeline.start(0.0, check_interval=MIN)
    t.ask("B", NGINX, 0.0)
    t.window()  # B's own read at 1m
    decision = t.sched.check("B", img(NGINX), 2 * MIN, auth=None, kept_at=0.5 * MIN)
    assert isinstance(decision, Hold)
    # the same kept time newer than B's read would have served it
    assert isinstance(t.sched.check("C", img(NGINX), 2 * MIN, auth=None, kept_at=MIN), Reuse)


def test_r1_no_reuse_when_kept_answer_is_older_than_max_age() -> None:
    """A kept answer ``cache.maxAge`` old or more serves nobody, not even a first read."""
    t = Timeline.start(0.0, check_interval=MIN, max_age=HOUR)
    now = 2 * HOUR
    assert isinstance(t.sched.check("A", img(NGINX), now, auth=None, kept_at=now - HOUR), Hold)
    assert isinstance(t.sched.check("B", img(NGINX), now, auth=None, kept_at=now - 3599), Reuse)


def test_r1_fresh_for_predicate() -> None:
    """``fresh_for``: newer than the previous read (none counts as older), younger than max age."""
    assert fresh_for(10.0, None, 20.0, 60.0)
    assert fresh_for(10.0, 9.0, 20.0, 60.0)
    assert not fresh_for(10.0, 10.0, 20.0, 60.0)
    assert not fresh_for(10.0, 11.0, 20.0, 60.0)
    assert not fresh_for(10.0, None, 70.0, 60.0)
    assert not fresh_for(None, None, 20.0, 60.0)


def test_r2_one_read_serves_every_resource_waiting_for_the_image() -> None:
    """When A's turn reads nginx, the requests of B and C waiting for nginx ride on that read:
    one upstream request answers all, and it counts as their read in this lap."""
    t = Timeline.start(0.0, check_interval=MIN)
    a = t.ask("A", NGINX, 0.0)
    b1 = t.ask("B", NGINX, 1.0)
    b2 = t.ask("B", NGINX, 2.0)
    c = t.ask("C", NGINX, 3.0)
    t.ask("C", "library/redis:7", 3.0)
    read = t.window().read
    assert read is not None
    assert all(isinstance(d, Hold) for d in (a, b1, b2, c))
    assert set(read.tickets) == {d.ticket for d in (a, b1, b2, c) if isinstance(d, Hold)}
    assert read.leader is not None and read.leader.resource == "A"
    assert {ticket.image.key for ticket in t.held.values()} == {"library/redis:7"}
    assert t.sched.ring("C").answered_in_lap(NGINX)
    following = t.window().read
    assert following is not None and following.image.key == "library/redis:7"


@pytest.mark.parametrize(
    ("kept", "asked", "serves"),
    [("GET", "HEAD", True), ("GET", "GET", True), ("HEAD", "HEAD", True), ("HEAD", "GET", False)],
)
def test_r3_get_answer_serves_head_but_head_never_serves_get(
    kept: str, asked: str, serves: bool
) -> None:
    """``method_serves``: a GET answer serves a HEAD; a HEAD answer never serves a GET."""
    assert method_serves(kept, asked) is serves


OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_V2 = "application/vnd.docker.distribution.manifest.v2+json"


@pytest.mark.parametrize(
    ("accept", "content_type", "admits"),
    [
        ([], DOCKER_V2, True),
        (["*/*"], DOCKER_V2, True),
        ([f"{OCI_INDEX}, {DOCKER_V2}"], DOCKER_V2, True),
        ([OCI_INDEX, DOCKER_V2.upper()], DOCKER_V2, True),
        ([f"{DOCKER_V2};q=0.5"], f"{DOCKER_V2}; charset=utf-8", True),
        (["application/*"], OCI_INDEX, True),
        ([OCI_INDEX], DOCKER_V2, False),
        (["text/*"], DOCKER_V2, False),
        ([OCI_INDEX], None, True),
        ([" , "], DOCKER_V2, True),
    ],
)
def test_r3_kept_answer_serves_a_request_whose_accept_admits_its_type(
    accept: list[str], content_type: str | None, admits: bool
) -> None:
    """``accept_admits``: exact types, ``type/*`` and ``*/*`` ranges, parameters ignored, any
    number of Accept headers; no Accept admits anything; an untyped answer is admitted."""
    assert accept_admits(accept, content_type) is admits


@pytest.mark.parametrize(
    ("status", "kept"), [(200, True), (401, True), (403, True), (404, True), (429, False)]
)
def test_r4_answers_are_kept_errors_are_not(status: int, kept: bool) -> None:
    """200, 401, 403 and 404 are answers; 429 and 5xx are not kept."""
    assert is_kept_status(status) is kept
    assert not any(is_kept_status(s) for s in (500, 502, 503, 504))


def test_r5_answer_read_with_a_clients_authorization_serves_only_the_identical_one() -> None:
    """``shared_with``: an answer obtained with a client's own Authorization is reused only for
    the identical Authorization; an anonymous (or kuikproxy-credential) answer serves everyone,
    except that a shared refusal is not given to a client bringing its own credentials."""
    assert shared_with("k1", None, 200, "k1", None)
    assert not shared_with("k1", None, 200, "k2", None)
    assert not shared_with("k1", None, 200, None, None)
    assert shared_with(None, None, 200, None, None)
    assert shared_with(None, None, 200, "k1", None)
    assert shared_with(None, None, 401, None, None)
    assert not shared_with(None, None, 401, "k1", None)
    assert not shared_with(None, None, 404, "k1", None)


# (kept auth, kept signer, status, request auth, request signer) → may serve. "own" is the
# fingerprint of the credentials kuikproxy signs with; "other" another proxy's (a fleet), or
# this one's before a reload changed them.
R5_CASES = [
    # read with kuikproxy's own credentials: shared while it holds the same ones
    ((None, "own", 200, None, "own"), True),
    ((None, "own", 200, "k1", "own"), True),
    ((None, "own", 404, None, "own"), True),
    ((None, "own", 404, "k1", "own"), False),
    ((None, "own", 200, None, None), False),  # a proxy without credentials
    ((None, "own", 200, None, "other"), False),  # other credentials
    ((None, "own", 200, "k1", None), False),
    ((None, "own", 401, None, None), False),
    # read anonymously: a 200 is public; a refusal serves only requests sent anonymously too
    ((None, None, 200, None, "own"), True),
    ((None, None, 401, None, "own"), False),  # kuikproxy's credentials may open it
    ((None, None, 404, None, "own"), False),
    ((None, None, 403, None, None), True),
    # read with a client's own Authorization: only the identical one, whatever the signer
    (("k1", None, 200, "k1", "own"), True),
    (("k1", None, 401, "k1", None), True),
    (("k1", None, 200, None, "own"), False),
    (("k1", None, 200, "k2", None), False),
]


@pytest.mark.parametrize(("whose", "serves"), R5_CASES)
def test_r5_shared_answers_serve_only_where_their_credentials_are_held(
    whose: tuple[str | None, str | None, int, str | None, str | None], serves: bool
) -> None:
    """R5 across identities: an answer read with kuikproxy's own credentials serves every
    client of a proxy that holds those credentials, never one that holds none or others (a
    fleet's other proxies, a reload); an anonymous refusal is not given where kuikproxy would
    sign in; a client's own answer serves only the identical Authorization."""
    assert shared_with(*whose) is serves


def test_r5_owner_keys_name_every_answer_a_request_may_be_given() -> None:
    """The owner keys looked up for a request are anonymous, kuikproxy's (when it signs) and
    the client's own; each identity is its own key."""
    assert owners_serving(None, None) == (None,)
    assert owners_serving(None, "f") == (None, "own:f")
    assert owners_serving("k1", "f") == (None, "own:f", "k1")
    assert owner_key("k1", "f") == "k1"
    assert owner_key(None, "f") == "own:f"
    assert owner_key(None, None) is None
