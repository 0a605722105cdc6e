"""Registry authentication as a client: challenges, credentials and tokens.

A registry that wants credentials answers ``401`` with ``WWW-Authenticate: Bearer realm=...,
service=..., scope=...`` (the Docker token protocol) or ``Basic realm=...``. kuikproxy answers a
Bearer challenge by asking the realm for a token — with its own credentials for the host when it
has some, anonymously otherwise — and keeps the token per scope until it expires, so later
requests carry it from the start and the registry never sees a second 401 for the same scope.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from kuikproxy.config import Credentials

# RFC 9110 §11.6.1: auth-param = token "=" ( token / quoted-string )
_PARAM = re.compile(r'\s*([A-Za-z0-9!#$%&\'*+.^_`|~-]+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s,]*)\s*,?')
_SCHEME = re.compile(r"\s*([A-Za-z0-9!#$%&'*+.^_`|~-]+)(?:\s+|$)")
DEFAULT_TOKEN_LIFETIME = 60.0  # the token spec's default when expires_in is absent
TOKEN_MARGIN = 5.0  # seconds before expiry a token is no longer used
MAX_TOKENS = 10_000
MAX_CHALLENGES = 1_024


@dataclass(frozen=True, slots=True)
class Challenge:
    scheme: str  # lower case: "bearer", "basic"
    params: dict[str, str]

    @property
    def realm(self) -> str | None:
        return self.params.get("realm")


def parse_challenge(header: str) -> Challenge | None:
    """The challenge of a ``WWW-Authenticate`` value (registries send one), or None."""
    scheme = _SCHEME.match(header)
    if scheme is None:
        return None
    params: dict[str, str] = {}
    position = scheme.end()
    while (param := _PARAM.match(header, position)) is not None and param.end() > position:
        value = param.group(2)
        if value.startswith('"'):
            value = re.sub(r"\\(.)", r"\1", value[1:-1])
        params[param.group(1).lower()] = value
        position = param.end()
    return Challenge(scheme.group(1).lower(), params)


def basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def signer_of(credentials: Credentials | None, host: str) -> str | None:
    """A fingerprint of kuikproxy's own credentials for ``host`` (R5: answers read with them
    are shared, and only by proxies that hold the same ones), None when it holds none. Never
    the credentials themselves: a truncated SHA-256 of user and password."""
    try:
        user = load_credentials(credentials, host)
    except (OSError, ValueError):
        # unreadable now, and kuikproxy's sign-in will fail alike: still not anonymous
        return None if credentials is None else _digest(repr(credentials))
    return None if user is None else _digest("\0".join(user))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:24]


def load_credentials(credentials: Credentials | None, host: str) -> tuple[str, str] | None:
    """kuikproxy's own user and password for ``host``: a user and a password file, or the
    host's entry in a Docker ``config.json``. Read at each use, so secrets can be rotated."""
    if credentials is None:
        return None
    if credentials.username is not None and credentials.password_file is not None:
        password = Path(credentials.password_file).read_text().strip()
        return credentials.username, password
    if credentials.docker_config_file is None:
        return None
    auths = json.loads(Path(credentials.docker_config_file).read_text()).get("auths", {})
    for key in _docker_config_keys(host):
        entry = auths.get(key)
        if not isinstance(entry, dict):
            continue
        if isinstance(entry.get("auth"), str):
            try:
                user, _, password = base64.b64decode(entry["auth"]).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                continue
            return user, password
        if isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
            return entry["username"], entry["password"]
    return None


def _docker_config_keys(host: str) -> list[str]:
    """The keys Docker's ``config.json`` may file a host under."""
    keys = [host, f"https://{host}", f"http://{host}"]
    if host == "docker.io":
        keys += ["https://index.docker.io/v1/", "index.docker.io", "registry-1.docker.io"]
    return keys


def token_of(body: bytes) -> tuple[str, float] | None:
    """The token and its lifetime from a token endpoint's JSON answer."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(document, dict):
        return None
    token = document.get("token") or document.get("access_token")
    if not isinstance(token, str) or not token:
        return None
    lifetime = document.get("expires_in")
    if not isinstance(lifetime, int | float) or lifetime <= 0:
        lifetime = DEFAULT_TOKEN_LIFETIME
    return token, float(lifetime)


class TokenCache:
    """Bearer tokens per (host, scope), until shortly before they expire; and, per host, the
    last Bearer challenge, so a new scope's token can be fetched before the first request."""

    def __init__(self) -> None:
        self._tokens: dict[tuple[str, str], tuple[str, float]] = {}
        self.challenges: dict[str, Challenge] = {}

    def __len__(self) -> int:
        """How many tokens it keeps (at most :data:`MAX_TOKENS`)."""
        return len(self._tokens)

    def get(self, host: str, scope: str, now: float) -> str | None:
        entry = self._tokens.get((host, scope))
        if entry is None or entry[1] <= now:
            self._tokens.pop((host, scope), None)
            return None
        return entry[0]

    def forget(self, host: str) -> None:
        """Drop the host's tokens and challenge (its credentials or endpoint changed)."""
        self._tokens = {k: v for k, v in self._tokens.items() if k[0] != host}
        self.challenges.pop(host, None)

    def put(self, host: str, scope: str, token: str, lifetime: float, now: float) -> None:
        if len(self._tokens) >= MAX_TOKENS:  # one per repository in use: drop the lapsed
            self._tokens = {k: v for k, v in self._tokens.items() if v[1] > now}
            while len(self._tokens) >= MAX_TOKENS:  # all alive: the oldest goes
                del self._tokens[next(iter(self._tokens))]
        self._tokens[(host, scope)] = (token, now + max(0.0, lifetime - TOKEN_MARGIN))

    def challenged(self, host: str, challenge: Challenge) -> None:
        """Remember ``host``'s last challenge; hosts under a wildcard are made up by clients,
        so at most :data:`MAX_CHALLENGES` are kept, the oldest forgotten first."""
        self.challenges.pop(host, None)
        self.challenges[host] = challenge
        while len(self.challenges) > MAX_CHALLENGES:
            del self.challenges[next(iter(self.challenges))]
