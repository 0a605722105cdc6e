"""Kept answers: bounded, least recently used out first (R6), served per R3 and R5."""

from __future__ import annotations

from typing import cast

from kuikproxy.core.images import Image
from kuikproxy.core.tickets import Operation
from kuikproxy.runtime.flowgate import FlowGate
from kuikproxy.runtime.kept import KeptAnswers
from kuikproxy.runtime.messages import Answer, RegistryRequest

HOST = "registry.test"
TYPE = "application/vnd.oci.image.manifest.v1+json"


def answer(
    body: bytes = b"{}",
    *,
    method: str = "GET",
    at: float = 0.0,
    auth: str | None = None,
    status: int = 200,
) -> Answer:
    headers = (("Content-Type", TYPE), ("Content-Length", str(len(body))), ("X-Other", "1"))
    return Answer(status, headers, body if method == "GET" else b"", method, at, auth)


def request(
    ref: str = "v1", *, method: str = "HEAD", auth: str | None = None, accept: tuple[str, ...] = ()
) -> RegistryRequest:
    return RegistryRequest(
        host=HOST,
        image=Image(HOST, "app", ref),
        resource="r",
        operation=Operation.CHECK,
        method=method,
        opens=False,
        sent=(),
        auth=auth,
        accept=accept,
        gate=cast("FlowGate", None),  # never classified here
    )


def test_r1_keeps_only_the_headers_a_client_needs() -> None:
    """A kept answer remembers Content-Type, Content-Length, Docker-Content-Digest,
    WWW-Authenticate and ETag — not every header the registry sent."""
    kept = KeptAnswers(10, 1 << 20, 10)
    kept.keep(HOST, "app:v1", answer())
    found = kept.find(request())
    assert found is not None
    assert {k for k, _ in found.headers} == {"Content-Type", "Content-Length"}


def test_r3_get_serves_head_but_head_never_serves_get() -> None:
    """A GET answer serves a HEAD; a HEAD answer never serves a GET."""
    kept = KeptAnswers(10, 1 << 20, 10)
    kept.keep(HOST, "app:v1", answer(method="HEAD"))
    assert kept.find(request(method="GET")) is None
    assert kept.find(request(method="HEAD")) is not None
    kept.keep(HOST, "app:v1", answer(method="GET", at=1.0))
    got = kept.find(request(method="GET"))
    assert got is not None and got.method == "GET"


def test_r3_accept_must_admit_the_kept_content_type() -> None:
    """A kept manifest serves a request whose Accept admits its Content-Type only."""
    kept = KeptAnswers(10, 1 << 20, 10)
    kept.keep(HOST, "app:v1", answer())
    assert (
        kept.find(request(accept=("application/vnd.docker.distribution.manifest.v2+json",))) is None
    )
    assert kept.find(request(accept=(f"{TYPE}, application/json",))) is not None
    assert kept.find(request(accept=("*/*",))) is not None


def test_r5_client_credentials_answer_serves_only_identical_credentials() -> None:
    """An answer read with a client's own Authorization serves only that Authorization; a
    shared one serves everyone, but a shared refusal is not given to a client with its own."""
    kept = KeptAnswers(10, 1 << 20, 10)
    kept.keep(HOST, "app:private", answer(auth="alice"))
    assert kept.find(request("private", auth="alice")) is not None
    assert kept.find(request("private", auth="bob")) is None
    assert kept.find(request("private")) is None
    kept.keep(HOST, "app:v1", answer())
    assert kept.find(request(auth="bob")) is not None
    kept.keep(HOST, "app:v2", answer(status=401))
    assert kept.find(request("v2")) is not None
    assert kept.find(request("v2", auth="bob")) is None


def test_r6_bounded_by_entries_least_recently_used_out_first() -> None:
    """Past cache.maxEntries the least recently used answer goes first."""
    kept = KeptAnswers(2, 1 << 20, 2)
    kept.keep(HOST, "app:v1", answer())
    kept.keep(HOST, "app:v2", answer())
    assert kept.find(request("v1")) is not None  # v1 is now the most recently used
    kept.keep(HOST, "app:v3", answer())
    assert kept.find(request("v2")) is None
    assert kept.find(request("v1")) is not None
    assert len(kept) == 2


def test_r6_bounded_by_bytes() -> None:
    """Past cache.maxBytes answers are evicted; an answer larger than the bound is not kept."""
    kept = KeptAnswers(100, 1000, 100)
    for i in range(5):
        kept.keep(HOST, f"app:v{i}", answer(b"x" * 300))
    assert kept.bytes <= 1000
    assert kept.find(request("v4")) is not None
    assert kept.find(request("v0")) is None
    kept.keep(HOST, "app:huge", answer(b"x" * 5000))
    assert kept.find(request("huge")) is None


def test_r6_refusals_have_a_bound_of_their_own_oldest_out_first() -> None:
    """Past cache.maxRefusals the oldest kept 404 goes, and a 200 never does for it: names that
    do not exist cost a client nothing to make, and cannot push out the answers that are used."""
    kept = KeptAnswers(100, 1 << 20, 3)
    kept.keep(HOST, "app:v1", answer())
    for i in range(10):
        kept.keep(HOST, f"app:missing-{i}", answer(b"", status=404))
    assert kept.refusals == 3 and len(kept) == 4
    assert kept.find(request("v1")) is not None
    assert kept.find(request("missing-9")) is not None
    assert kept.find(request("missing-6")) is None
    kept.keep(HOST, "app:missing-9", answer())  # the image came to exist: no refusal kept
    assert kept.refusals == 2
    kept.resize(100, 1 << 20, 0)
    assert (kept.refusals, len(kept)) == (0, 2)
