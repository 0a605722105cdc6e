"""What the pull-through store may answer (kuikproxy.core.stored): R5 over stored content, and
which requests are answered stale."""

from __future__ import annotations

import pytest

from kuikproxy.core.reuse import owner_key
from kuikproxy.core.stored import (
    ServeStale,
    content_serves,
    manifest_type,
    outage,
    owner_parts,
    serves_stale,
)

ALICE, BOB = "key-alice", "key-bob"
OWN = owner_key(None, "fingerprint")


def test_owner_parts_is_owner_key_read_back() -> None:
    for auth, signer in ((None, None), (ALICE, None), (None, "fingerprint")):
        assert owner_parts(owner_key(auth, signer)) == (auth, signer)


@pytest.mark.parametrize(
    ("owners", "auth", "signer", "serves"),
    [
        ({None}, None, None, True),  # anonymous content serves everyone
        ({None}, ALICE, None, True),
        ({OWN}, None, "fingerprint", True),  # kuikproxy's own, while it holds the same
        ({OWN}, None, "other", False),
        ({ALICE}, ALICE, None, True),  # a client's own: the identical Authorization
        ({ALICE}, BOB, None, False),
        ({ALICE}, None, None, False),
        ({ALICE, None}, BOB, None, True),
    ],
)
def test_content_serves_by_whose_it_is(
    owners: set[str | None], auth: str | None, signer: str | None, serves: bool
) -> None:
    assert content_serves(owners, False, auth, signer) is serves


def test_a_proof_opens_content_read_from_that_repository() -> None:
    assert content_serves({ALICE}, True, BOB, None)


def test_a_proof_opens_nothing_never_read_from_that_repository() -> None:
    """No owner there: the digest was stored from another repository or host, which a proof
    for this one (a registry one runs, a public repository) says nothing about."""
    assert not content_serves(set(), True, BOB, None)
    assert not content_serves(set(), True, None, None)


@pytest.mark.parametrize(
    ("setting", "check", "from_kuik", "stale"),
    [
        (False, False, False, False),
        (False, True, True, False),
        (True, False, False, True),  # a pull
        (True, True, False, True),  # a node's HEAD by tag: containerd resolving a pull
        (True, True, True, False),  # kuik's check: a stale "Available" could hide a deletion
        ("checks", True, True, True),
    ],
)
def test_serves_stale(setting: ServeStale, check: bool, from_kuik: bool, stale: bool) -> None:
    assert serves_stale(setting, check, from_kuik) is stale


def test_an_outage_is_a_gateways_or_an_unavailable_registrys_answer() -> None:
    assert [status for status in (200, 404, 429, 500, 502, 503, 504) if outage(status)] == [
        502, 503, 504,
    ]  # fmt: skip
    assert not outage(None)  # content from the disk


OCI = "application/vnd.oci.image.manifest.v1+json"


@pytest.mark.parametrize(
    ("body", "labelled", "served"),
    [
        (b'{"schemaVersion": 2, "mediaType": "%s"}' % OCI.encode(), "text/html", OCI),
        (b'{"schemaVersion": 2, "mediaType": "%s"}' % OCI.encode(), None, OCI),
        (b'{"schemaVersion": 2}', OCI, OCI),  # an OCI manifest need not declare it
        (b'{"schemaVersion": 2, "mediaType": ""}', OCI, OCI),
        (b'{"schemaVersion": 2, "mediaType": 7}', OCI, OCI),
        (b"[1, 2]", OCI, OCI),
        (b"\xff\xfe not json", OCI, OCI),
        (b"not json", None, None),
    ],
)
def test_a_stored_manifest_is_served_with_the_type_it_declares(
    body: bytes, labelled: str | None, served: str | None
) -> None:
    assert manifest_type(body, labelled) == served
