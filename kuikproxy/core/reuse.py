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


def negotiated_alike(read_accept: Iterable[str], request_accept: Iterable[str]) -> bool:
    """R3: whether a kept refusal (401, 403, 404) may serve a request. A registry answers 404
    when no representation fits a narrow ``Accept``, so a refusal serves only requests whose
    ``Accept`` is the same set of media types as the read's."""
    read = read_accept if isinstance(read_accept, tuple) else tuple(read_accept)
    request = request_accept if isinstance(request_accept, tuple) else tuple(request_accept)
    return _media_ranges(read) == _media_ranges(request)


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


def shared_with(
    kept_auth: str | None,
    kept_signer: str | None,
    status: int,
    request_auth: str | None,
    request_signer: str | None,
) -> bool:
    """R5: whether an answer may be given to a request, by whose it is.

    ``*_auth`` is a key of a client's own ``Authorization`` (None without one); ``*_signer`` a
    fingerprint of the kuikproxy credentials a request without one is signed with (None when
    kuikproxy holds none for the host: it goes anonymous). An answer read with a client's own
    ``Authorization`` serves only requests with the identical one. A shared answer (anonymous,
    or read with kuikproxy's own credentials) serves every client — but only while it holds the
    credentials the answer was read with (another proxy of a fleet, or this one before a reload,
    may have held others), and a shared *refusal* (401/403/404) only a request that would itself
    be sent the same way: credentials of a client's own, or kuikproxy's where the refusal was
    anonymous, may well open what the refusal was about."""
    if kept_auth is not None:
        return kept_auth == request_auth
    if kept_signer is not None and kept_signer != request_signer:
        return False
    return status == 200 or (request_auth is None and request_signer == kept_signer)


def owner_key(auth: str | None, signer: str | None) -> str | None:
    """Whose an answer is, as one key (kept answers are stored under it): the client's
    ``Authorization`` key, else kuikproxy's credentials (``own:`` and their fingerprint), else
    None (anonymous)."""
    if auth is not None:
        return auth
    return None if signer is None else f"own:{signer}"


def owners_serving(auth: str | None, signer: str | None) -> tuple[str | None, ...]:
    """The owner keys whose answers may serve a request with ``auth`` and ``signer``
    (:func:`shared_with` decides, per answer, whether each does): anonymous answers, those read
    with the credentials kuikproxy would sign it with, and the client's own."""
    owners: tuple[str | None, ...] = (None,)
    if signer is not None:
        owners += (owner_key(None, signer),)
    if auth is not None:
        owners += (auth,)
    return owners
