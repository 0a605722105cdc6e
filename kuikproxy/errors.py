"""One exception tree for everything kuikproxy raises on purpose.

::

    KuikProxyError
    ├── ConfigError                  an invalid config file (every error, with its path)
    ├── StateError                   a state file (``state.path``) that cannot be used safely
    └── RegistryError                an error a client receives as an OCI error body (SPEC §12)
        ├── NameInvalid              400 NAME_INVALID      a write's malformed path
        ├── DigestInvalid            400 DIGEST_INVALID    malformed digest
        ├── NameUnknown              404 NAME_UNKNOWN      a read of a malformed repository name
        ├── ManifestUnknown          404 MANIFEST_UNKNOWN  a read of a malformed tag
        ├── Ambiguous                400 UNSUPPORTED       two hosts named that disagree
        ├── BadRequest               400 UNSUPPORTED       a request aiohttp's parser refused
        ├── URITooLong               414 UNSUPPORTED       a request target past the parser's limit
        ├── HeadersTooLarge          431 UNSUPPORTED       a header too long, or too many
        ├── VersionNotSupported      505 UNSUPPORTED       not HTTP/1.x
        ├── Denied                   403 DENIED            host not allowed
        ├── NotFound                 404 NOT_FOUND         route kuikproxy does not serve
        ├── Unsupported              405 UNSUPPORTED       writes, unknown methods
        ├── TooManyRequests          429 TOOMANYREQUESTS   held too long, rejected (Retry-After)
        ├── InternalError            500 UNKNOWN           a bug of kuikproxy's (logged)
        ├── Unavailable              503 UNAVAILABLE       the proxy is shutting down, host removed
        └── UpstreamError            the registry could not be used
            ├── UpstreamUnreachable  502 UNAVAILABLE       connection refused, reset, broken off
            ├── ContentMismatch      502 UNAVAILABLE       content that does not hash to its digest
            └── UpstreamTimeout      504 UNAVAILABLE       no answer within the operation's timeout

Foreign exceptions (aiohttp, OSError, asyncio.TimeoutError) are mapped into this tree at the
boundary where they occur (``kuikproxy.upstream``), so the web edge renders one family only.
"""

from __future__ import annotations

import logging
import math
from typing import Any, ClassVar


class KuikProxyError(Exception):
    """The root of every error kuikproxy raises on purpose."""


class ConfigError(KuikProxyError):
    """An invalid configuration; ``errors`` holds one ``"path: reason"`` line per problem."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


class StateError(KuikProxyError):
    """The state file cannot be used: unreadable, corrupt, not kuikproxy's, or written by a
    newer kuikproxy. Refused at start rather than overwritten: its state would be lost."""


class RegistryError(KuikProxyError):
    """An error answered to a client with the OCI error body."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "UNKNOWN"

    def __init__(
        self,
        message: str,
        *,
        detail: dict[str, Any] | None = None,
        retry_after: float | None = None,
        refusal: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail
        self.retry_after = retry_after
        # why kuikproxy refused the request itself (SPEC §12: counted, shown and logged by
        # host and reason, at the edge, once per client it reaches), None for anything else;
        # ``counted`` when it was counted where it was made instead
        self.refusal = refusal
        self.counted = False

    def body(self) -> dict[str, Any]:
        """The OCI distribution error body for this error."""
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.detail is not None:
            error["detail"] = self.detail
        return {"errors": [error]}

    def headers(self) -> dict[str, str]:
        """Headers the answer carries besides the body (``Retry-After``, whole seconds, ≥ 1)."""
        if self.retry_after is None:
            return {}
        return {"Retry-After": str(max(1, math.ceil(self.retry_after)))}


class NameInvalid(RegistryError):
    status = 400
    code = "NAME_INVALID"


class DigestInvalid(RegistryError):
    status = 400
    code = "DIGEST_INVALID"


class NameUnknown(RegistryError):
    """A read of a repository whose name breaks the grammar: no such repository can exist, and
    the OCI distribution spec gives reads no 400 (§12)."""

    status = 404
    code = "NAME_UNKNOWN"


class ManifestUnknown(RegistryError):
    """A read of a manifest whose tag breaks the grammar: no such manifest can exist (§12)."""

    status = 404
    code = "MANIFEST_UNKNOWN"


class Ambiguous(RegistryError):
    """Two ways of naming the registry that disagree (two ``ns``, an ``ns`` and a path prefix,
    an ``ns`` and a forward-proxy target): kuikproxy will not guess which one was meant."""

    status = 400
    code = "UNSUPPORTED"


class BadRequest(RegistryError):
    """Not an HTTP/1.x request (RFC 9112 §2.2): 400."""

    status = 400
    code = "UNSUPPORTED"


class URITooLong(RegistryError):
    """A request target longer than the parser reads (RFC 9112 §3: a MUST)."""

    status = 414
    code = "UNSUPPORTED"


class HeadersTooLarge(RegistryError):
    """A header field too long, or too many of them (RFC 6585 §5)."""

    status = 431
    code = "UNSUPPORTED"


class VersionNotSupported(RegistryError):
    """No HTTP/1.x version (RFC 9110 §15.6.6): HTTP/2 in text, its preface, 0.9, 1.2, 3.0."""

    status = 505
    code = "UNSUPPORTED"


class Denied(RegistryError):
    status = 403
    code = "DENIED"


class NotFound(RegistryError):
    status = 404
    code = "NOT_FOUND"


class Unsupported(RegistryError):
    status = 405
    code = "UNSUPPORTED"


class TooManyRequests(RegistryError):
    status = 429
    code = "TOOMANYREQUESTS"


class InternalError(RegistryError):
    status = 500
    code = "UNKNOWN"


class Unavailable(RegistryError):
    status = 503
    code = "UNAVAILABLE"


class UpstreamError(RegistryError):
    """The registry could not be used; ``message`` says why."""


class UpstreamUnreachable(UpstreamError):
    status = 502
    code = "UNAVAILABLE"


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "UNAVAILABLE"


class ContentMismatch(UpstreamError):
    """The registry answered content that is not what its digest says (content addressing):
    a bad gateway, whatever status the registry gave it."""

    status = 502
    code = "UNAVAILABLE"


WARN_EVERY = 60.0
"""Seconds between two warnings of one refusal log's reason."""

_log = logging.getLogger("kuikproxy.runtime.refusals")  # where operators look for refusals


class RefusalLog:
    """Refusals of kuikproxy's own (§12), counted by reason and logged at ``warning`` at most
    once a minute per reason: of one host, or (``host`` None) of requests no host answers for."""

    __slots__ = ("_logged", "counts", "host")

    def __init__(self, host: str | None) -> None:
        self.host = host
        self.counts: dict[str, int] = {}
        self._logged: dict[str, float] = {}

    def count(self, reason: str, error: RegistryError, now: float) -> RegistryError:
        """Count a refusal (``now`` on the caller's monotonic clock) and return its error."""
        error.refusal = reason
        total = self.counts[reason] = self.counts.get(reason, 0) + 1
        last = self._logged.get(reason)
        if last is None or now - last >= WARN_EVERY:
            self._logged[reason] = now
            _log.warning(
                "%s refused (%s, %d so far): %s",
                self.host or "a request", reason, total, error.message,
            )  # fmt: skip
        return error
