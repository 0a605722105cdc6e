"""When a kept answer may serve a request instead of a window (R1, R3, R4, R5).

These are the rules alone, as predicates over plain values; the runtime's LRU store keeps the
answers and asks these questions, and the scheduler asks :func:`fresh_for` at a turn.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

# R4: these statuses are answers (kuik's verdicts Available, InvalidAuth, NotFound); 429 and 5xx
# are not kept.
KEPT_STATUSES = frozenset({200, 401, 403, 404})


def is_kept_status(status: int) -> bool:
    return status in KEPT_STATUSES


def fresh_for(kept_at: float | None, previous: float | None, now: float, max_age: float) -> bool:
    """R1: a kept answer read at ``kept_at`` serves a resource whose previous read of the image
    was at ``previous`` when it is newer than that read and younger than ``max_age``."""
    if kept_at is None or now - kept_at >= max_age:
        return False
    return previous is None or kept_at > previous


def method_serves(kept_method: str, request_method: str) -> bool:
    """R3: a GET answer serves a HEAD; a HEAD answer never serves a GET."""
    return kept_method == "GET" or request_method == "HEAD"


def accept_admits(accept: Iterable[str], content_type: str | None) -> bool:
    """R3: whether the request's ``Accept`` values admit a kept answer's ``Content-Type``.

    No ``Accept`` (or ``*/*``) admits anything; an answer without a type is admitted by any
    ``Accept`` (error bodies and 401 challenges carry none that matters).
    """
    ranges = _media_ranges(accept if isinstance(accept, tuple) else tuple(accept))
    if not ranges or content_type is None or "*/*" in ranges:
        return True
    media = content_type.split(";", 1)[0].strip().lower()
    return media in ranges or f"{media.split('/', 1)[0]}/*" in ranges


@lru_cache(maxsize=256)
def _media_ranges(accept: tuple[str, ...]) -> frozenset[str]:
    """The media ranges of ``Accept`` values, parameters dropped. Clients send the same few
    lists again and again: parsed once each."""
    return frozenset(
        part.split(";", 1)[0].strip().lower()
        for value in accept
        for part in value.split(",")
        if part.strip()
    )


def shared_with(kept_auth: str | None, status: int, request_auth: str | None) -> bool:
    """R5: an answer read with a client's own ``Authorization`` (``kept_auth`` is its key) serves
    only requests with the identical one; a shared one (key None: anonymous or kuikproxy's own
    credentials) serves everyone — except that a shared *refusal* (401/403/404) is not given to a
    client that brought credentials of its own, which may well open what anonymity could not."""
    if kept_auth is not None:
        return kept_auth == request_auth
    return request_auth is None or status == 200
