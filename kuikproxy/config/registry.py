"""The settings of one registry host (SPEC §7): its two series, credentials, TLS and quota.

A registry block has a ``copy`` block: that is why every config model is a pydantic
*dataclass* rather than a ``BaseModel`` (:mod:`kuikproxy.config.models`). What a block holds
once the ``default`` block is merged under it is a :class:`RegistrySettings`.
"""

from __future__ import annotations

from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field
from pydantic import model_validator as _model_validator
from pydantic.dataclasses import dataclass

from kuikproxy.config.base import MODEL_CONFIG
from kuikproxy.config.fields import Duration, PositiveDuration
from kuikproxy.config.quotas import QuotaSettings
from kuikproxy.core.images import DOCKER_HUB, normalize_host

__all__ = [
    "DOCKER_HUB_UPSTREAM",
    "CheckSettings",
    "CopySettings",
    "Credentials",
    "RegistrySettings",
    "TLSSettings",
]

DOCKER_HUB_UPSTREAM = "https://registry-1.docker.io"
"""Where Docker Hub's registry API is actually served."""


# --- per-registry settings -----------------------------------------------------------------


@dataclass(frozen=True, config=MODEL_CONFIG)
class CheckSettings:
    """The check series of a host: manifest reads, one image per window (SPEC P1-P7, P10)."""

    interval: PositiveDuration = 60.0
    """Seconds between two check windows (YAML ``interval``, default ``1m``)."""
    timeout: Duration = 10.0
    """Seconds one upstream check may take; ``0`` is no limit (default ``10s``)."""
    mode: Literal["hold", "prefetch"] = "hold"
    """``hold``: a request waits for its image's turn; ``prefetch``: every turn reads (P7)."""
    max_hold: Duration = 0.0
    """Seconds a request may wait before a 429 with ``Retry-After``; ``0`` is no limit."""
    follow_up: Duration = 2.0
    """Seconds after an answer during which follow-up checks of that image pass (P10)."""


@dataclass(frozen=True, config=MODEL_CONFIG)
class CopySettings:
    """The copy series of a host: blob and manifest downloads, one image per window (P9)."""

    interval: PositiveDuration = 300.0
    """Seconds between two copy windows (default ``5m``)."""
    timeout: Duration = 0.0
    """Seconds a copy may stay open in all; ``0`` (the default) is no limit."""
    idle: Duration = 5.0
    """Seconds a copy stays open after its last request ends (default ``5s``)."""
    follow_up: Duration = 600.0
    """Seconds after a copy's last request during which its resource's blob reads and
    manifest reads by digest in that repository go without a window (P9, default ``10m``): a
    pull resumed or retried after a pause is not sent to the back of the queue."""


@dataclass(frozen=True, config=MODEL_CONFIG)
class Credentials:
    """kuikproxy's own credentials for one host (R5): files only, never inline secrets."""

    username: str | None = None
    """The user name; goes with ``passwordFile``."""
    password_file: str | None = None
    """A file holding the password or token (read when used, so it can be rotated)."""
    docker_config_file: str | None = None
    """A Docker ``config.json`` whose ``auths`` entry for the host is used instead."""

    @_model_validator(mode="after")
    def _one_source(self) -> Credentials:
        pair = self.username is not None or self.password_file is not None
        if pair and self.docker_config_file is not None:
            raise ValueError("set either username and passwordFile, or dockerConfigFile, not both")
        if pair and (self.username is None or self.password_file is None):
            raise ValueError("username and passwordFile go together")
        if not pair and self.docker_config_file is None:
            raise ValueError("set username and passwordFile, or dockerConfigFile")
        return self


@dataclass(frozen=True, config=MODEL_CONFIG)
class TLSSettings:
    """How the upstream's TLS certificate is verified."""

    ca_file: str | None = None
    """A PEM bundle trusted for this host, on top of the system roots."""
    insecure_skip_verify: bool = False
    """Accept any certificate. For tests and labs only."""


def _upstream(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        parts = urlsplit(value.strip())
        port = parts.port  # raises ValueError on a bad port
    except ValueError:
        raise ValueError(f'invalid upstream "{value}"') from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f'invalid upstream "{value}" (expected http:// or https:// and a host)')
    # The OCI API lives at /v2/ of the host; a path prefix, query or embedded credentials
    # would be silently dropped or leaked, so they are refused rather than half-supported.
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f'invalid upstream "{value}" (no path, query or fragment)')
    if parts.username is not None or parts.password is not None:
        raise ValueError(f'invalid upstream "{value}" (use credentials, not user:pass@ in the URL)')
    host = parts.hostname
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    return f"{parts.scheme}://{netloc}"


@dataclass(frozen=True, config=MODEL_CONFIG)
class RegistrySettings:
    """The effective settings of one registry host (its block with ``default`` merged under)."""

    upstream: Annotated[str | None, AfterValidator(_upstream)] = None
    """The registry's endpoint, ``http(s)://host[:port]``; unset means ``https://<host>``."""
    paced: bool = True
    """``false`` for a destination kuik owns: passed through, never paced (P14)."""
    fleet: Literal["shared", "local"] = "shared"
    """With a ``fleet``: ``shared`` paces this host for the whole fleet (one image per window
    in total), ``local`` for this proxy alone."""
    check: CheckSettings = Field(default_factory=CheckSettings)
    """The check series (manifest reads)."""
    copy: CopySettings = Field(default_factory=CopySettings)
    """The copy series (image downloads)."""
    credentials: Credentials | None = None
    """kuikproxy's own credentials for this host; unset means anonymous or the client's own."""
    tls: TLSSettings = Field(default_factory=TLSSettings)
    """Verification of the upstream's certificate."""
    quota: QuotaSettings = Field(default_factory=QuotaSettings)
    """What the registry rations (SPEC §11); the empty default rations nothing."""
    serve_stale: Literal[False, True, "checks"] = False
    """While the host is blocked (§11) or unreachable, answer a manifest by tag from the
    newest mapping in the store, however old (``Warning: 110``): ``true`` for pulls,
    ``checks`` for kuik's checks too — a stale ``Available`` can hide a deletion (§15)."""

    def upstream_url(self, host: str) -> str:
        """The base URL of ``host``'s registry API, without a trailing slash."""
        if self.upstream is not None:
            return self.upstream
        host = normalize_host(host)
        return DOCKER_HUB_UPSTREAM if host == DOCKER_HUB else f"https://{host}"
