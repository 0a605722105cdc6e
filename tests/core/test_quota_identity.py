"""Identities (SPEC §11): anonymous, kuikproxy's own credential, a Basic user name, a JWT's
``sub`` read without trusting it, else a hash — and never the credential itself."""

from __future__ import annotations

import base64
import hashlib
import json

import pytest

from kuikproxy.core.quota import ANONYMOUS, OWN, identity_of


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def jwt(claims: object) -> str:
    header = b64url(json.dumps({"alg": "RS256", "typ": "JWT"}).encode())
    return f"{header}.{b64url(json.dumps(claims).encode())}.c2lnbmF0dXJl"


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def token_key(secret: str) -> str:
    return "token:" + hashlib.sha256(secret.encode()).hexdigest()[:32]


def test_no_authorization_is_anonymous_or_kuikproxys_own() -> None:
    """Requests without credentials are one identity; with kuikproxy's own credential for the
    host, they are kuikproxy's identity."""
    assert identity_of(None) == ANONYMOUS
    assert identity_of("  ") == ANONYMOUS
    assert identity_of(None, own_credential=True) == OWN
    assert ANONYMOUS != OWN


def test_basic_user_name_is_the_identity() -> None:
    """A Basic user is its name, whatever the password (ACR's admin account has two)."""
    assert identity_of(basic("admin", "password1")) == "user:admin"
    assert identity_of(basic("admin", "password2")) == "user:admin"
    assert identity_of("basic " + basic("bob", "x").split()[1]) == "user:bob"
    # a client's credential wins over kuikproxy's own
    assert identity_of(basic("bob", "x"), own_credential=True) == "user:bob"


def test_bearer_jwt_is_keyed_by_sub_unverified() -> None:
    """A bearer JWT is its ``sub``; the signature is never checked (it only picks a bucket),
    and two tokens of one subject share an identity."""
    assert identity_of("Bearer " + jwt({"sub": "alice", "exp": 1})) == "user:alice"
    assert identity_of("Bearer " + jwt({"sub": "alice", "exp": 2})) == "user:alice"
    assert identity_of("bearer " + jwt({"sub": "bob"})) == "user:bob"


def test_empty_sub_is_an_anonymous_token() -> None:
    """A token server's anonymous token (Docker Hub's has ``sub: ""``) is the anonymous
    identity, not a new identity per token."""
    assert identity_of("Bearer " + jwt({"sub": "", "access": []})) == ANONYMOUS


@pytest.mark.parametrize(
    "token",
    [
        "opaque-token-0123456789",
        jwt({"iss": "no-sub"}),
        jwt({"sub": 42}),
        jwt(["not", "an", "object"]),
        "aaa.@@@notbase64!!.ccc",
        "aaa." + b64url(b"\xff\xfe not utf-8") + ".ccc",
        "aaa." + b64url(b"[" * 5000) + ".ccc",  # deep nesting
        "a.b.c.d.e",  # a JWE, not a JWS
    ],
)
def test_opaque_or_malformed_tokens_fall_back_to_a_hash(token: str) -> None:
    """Anything without a readable string ``sub`` is keyed by a hash of the token — never by
    the token itself."""
    identity = identity_of(f"Bearer {token}")
    assert identity == token_key(token)
    assert token not in identity


def test_malformed_basic_and_other_schemes_are_hashed() -> None:
    """Basic that does not decode, or has no colon, and unknown schemes: a hash of the header."""
    for header in ("Basic !!!", "Basic " + base64.b64encode(b"nocolon").decode(), "Digest x=1"):
        assert identity_of(header) == token_key(header)
    assert identity_of(basic("", "secret")).startswith("token:")


def test_entra_null_user_is_keyed_by_its_refresh_token() -> None:
    """ACR's Entra sign-in sends the null GUID as user and a token as password: the token's
    ``sub`` (or hash) is the identity, so Entra users do not share one bucket."""
    null = "00000000-0000-0000-0000-000000000000"
    assert identity_of(basic(null, jwt({"sub": "oid-1"}))) == "user:oid-1"
    assert identity_of(basic(null, jwt({"sub": "oid-2"}))) == "user:oid-2"
    assert identity_of(basic(null, "opaque")) == token_key("opaque")


def test_long_or_unprintable_names_are_hashed_and_no_secret_is_kept() -> None:
    """Keys stay short and printable; the password never appears in one."""
    long_name = "x" * 500
    identity = identity_of(basic(long_name, "pw"))
    assert identity.startswith("user:sha256:") and len(identity) < 64
    assert identity_of(basic("a\nb", "pw")).startswith("user:sha256:")
    assert "hunter2" not in identity_of(basic("carol", "hunter2"))
    huge = "h." + b64url(json.dumps({"sub": "x"}).encode()) + "." + "s" * 20000
    assert identity_of(f"Bearer {huge}") == token_key(huge)
