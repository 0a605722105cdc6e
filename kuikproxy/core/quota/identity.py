"""Who a request is, for a registry's per-identity limits (SPEC §11) — a key, never a secret.

* no ``Authorization`` from the client: kuikproxy's own credential for the host if it has one
  (:data:`OWN`), else :data:`ANONYMOUS` — every anonymous request is one identity;
* ``Basic``: the user name (ACR's admin account has two passwords and one identity). ACR's
  Entra sign-in sends the null GUID as the user name and a refresh token as the password: that
  password is keyed as a bearer token, or every Entra user would share one bucket;
* ``Bearer``: the JWT's ``sub``, read without verifying anything — it only picks a bucket, and
  a client that forges one throttles itself into someone else's bucket. A ``sub`` that is
  present but empty is a token server's anonymous token (Docker Hub hands one to every
  anonymous pull): :data:`ANONYMOUS`. No ``sub``, or not a JWT: a hash of the token;
* anything else: a hash of the header.

Names and ``sub`` values are kept as they are when short and printable (``user:<name>``),
hashed otherwise; tokens only ever as ``token:<hash>``. A credential is never kept.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json

ANONYMOUS = "anonymous"
OWN = "kuikproxy"  # kuikproxy's own credential for the host
ENTRA_USER = "00000000-0000-0000-0000-000000000000"  # ACR's user name for Entra tokens
MAX_NAME = 128
MAX_TOKEN = 16 * 1024  # longer bearer tokens are hashed without being decoded


def identity_of(authorization: str | None, *, own_credential: bool = False) -> str:
    """The identity of a request, from the ``Authorization`` its *client* sent (not the one
    kuikproxy adds when it signs in itself); ``own_credential``: kuikproxy has a credential
    for the host, used for requests that bring none."""
    if authorization is None or not authorization.strip():
        return OWN if own_credential else ANONYMOUS
    scheme, _, value = authorization.strip().partition(" ")
    value = value.strip()
    scheme = scheme.lower()
    if scheme == "basic":
        user = _basic_user(value)
        if user is not None:
            name, password = user
            if name == ENTRA_USER:
                return _bearer(password)
            if name:
                return _user(name)
    elif scheme == "bearer" and value:
        return _bearer(value)
    return _hashed(authorization.strip())


def _basic_user(value: str) -> tuple[str, str] | None:
    try:
        decoded = base64.b64decode(value, validate=True).decode("utf-8")
    except (binascii.Error, ValueError):
        return None
    name, colon, password = decoded.partition(":")
    return (name, password) if colon else None


def _bearer(token: str) -> str:
    sub = _jwt_sub(token)
    if sub is None:
        return _hashed(token)
    return _user(sub) if sub else ANONYMOUS


def _jwt_sub(token: str) -> str | None:
    """The ``sub`` claim of a compact JWS, unverified; None when there is none to read."""
    if len(token) > MAX_TOKEN:
        return None
    parts = token.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1]
    try:
        raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        claims = json.loads(raw)
    except (binascii.Error, ValueError, RecursionError):  # JSON and UTF-8 errors are ValueErrors
        return None
    sub = claims.get("sub") if isinstance(claims, dict) else None
    return sub if isinstance(sub, str) else None


def _user(name: str) -> str:
    if len(name) <= MAX_NAME and name.isprintable():
        return f"user:{name}"
    return "user:sha256:" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _hashed(secret: str) -> str:
    return "token:" + hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()[:32]
