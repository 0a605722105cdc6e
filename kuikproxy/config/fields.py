"""The field types of the config models, and the checks of single values they share.

Durations are ``float`` seconds, accepted as Go-style strings or numbers
(:mod:`kuikproxy.durations`); sizes are bytes, written ``"256Mi"`` or as numbers. Host names
are normalised and checked by :func:`validate_host`, cached: every request's host goes through
it.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator

from kuikproxy.core.images import normalize_host
from kuikproxy.durations import parse_duration, parse_size

__all__ = ["Duration", "IdentitySource", "PositiveDuration", "Size", "validate_host"]

_LABEL = r"[a-z0-9_](?:[a-z0-9_-]*[a-z0-9_])?"
_HOST = re.compile(rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9a-f:.]+\])(?::(\d{{1,5}}))?")


@lru_cache(maxsize=4096)  # every request's host goes through it, from a handful of hosts
def validate_host(host: str) -> str:
    """A normalised ``host[:port]``, or ``ValueError`` if it is not one (no scheme, no path)."""
    normal = normalize_host(host)
    match = _HOST.fullmatch(normal)
    if match is None or (match.group(1) is not None and int(match.group(1)) > 65535):
        raise ValueError(f'invalid host "{host}" (expected host or host:port, no scheme or path)')
    return normal


# --- field types ---------------------------------------------------------------------------


def _duration(value: Any) -> float:
    if not isinstance(value, str | int | float):
        raise ValueError(f'invalid duration "{value}"')
    return parse_duration(value)


def _positive(value: float) -> float:
    # A zero interval would open windows back to back: no pacing at all, and a busy loop.
    if value <= 0:
        raise ValueError("must be greater than 0")
    return value


def _size(value: Any) -> int:
    if not isinstance(value, str | int):
        raise ValueError(f'invalid size "{value}"')
    return parse_size(value)


Duration = Annotated[float, BeforeValidator(_duration)]
"""Non-negative seconds, written ``"1m30s"`` or ``90``."""
PositiveDuration = Annotated[float, BeforeValidator(_duration), AfterValidator(_positive)]
"""Seconds greater than zero."""
Size = Annotated[int, BeforeValidator(_size)]
"""Bytes, written ``"256Mi"`` or ``268435456``."""

_HEADER_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def _identity_source(value: str) -> str:
    if value in ("proxyUser", "clientAddress"):
        return value
    if value.startswith("header:") and _HEADER_TOKEN.fullmatch(value.removeprefix("header:")):
        return value
    raise ValueError(
        f'unknown resource identity "{value}" (expected header:<Name>, proxyUser or clientAddress)'
    )


IdentitySource = Annotated[str, AfterValidator(_identity_source)]
"""One way to tell which resource a request belongs to (SPEC §4.2)."""
