"""Throttling arithmetic: what a registry's answer says about when to ask it again.

* ``Retry-After`` (RFC 9110 §10.2.3): delta-seconds or an HTTP date, the latter read against
  ``now_wall`` — the only wall-clock value the core ever sees, passed in like ``now``.
* A block lasts until a time and is never shortened: a later, shorter ``Retry-After`` leaves it
  where it is. One block never exceeds :data:`MAX_BLOCK`, whatever a registry says.
* A throttling answer without ``Retry-After`` backs off exponentially with "equal jitter":
  attempt *n* (from 0) waits between ``d/2`` and ``d``, ``d = min(cap, base·factorⁿ)``; by
  default base 1 s, factor 2, cap 5 min. A success resets it.
* Docker Hub's ``ratelimit-limit: 100;w=21600`` / ``ratelimit-remaining: N;w=21600`` are read on
  every answer; at ``remaining`` 0 the block is ``w / limit`` seconds, the time one pull takes to
  come back.
"""

from __future__ import annotations

import calendar
import email.utils
import math
import random as _random
import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

MAX_BLOCK = 24 * 3600.0  # a registry that says "a year" is believed for a day
DOCKER_HUB_WINDOW = 21600.0  # ``w`` when a ratelimit header leaves it out: Docker Hub's 6 h
THROTTLED = frozenset({429, 503})  # answers that mean "slow down" even without Retry-After
_DELTA = re.compile(r"\d+(?:\.\d+)?")
_COUNT = re.compile(r"[0-9]{1,18}")  # a count of requests; str.isdigit would take "²"
_JITTER = _random.Random()  # backoff jitter of every host that is not given a seed


def parse_retry_after(value: str | None, now_wall: float) -> float | None:
    """``Retry-After`` as seconds from now (never negative), or None when absent or unreadable.

    ``now_wall`` is the wall-clock time (Unix seconds) the answer arrived at, for HTTP dates;
    a date without a zone is GMT, as HTTP dates are.
    """
    if value is None:
        return None
    value = value.strip()
    if _DELTA.fullmatch(value):
        return float(value)
    parsed = email.utils.parsedate_tz(value)
    if parsed is None:
        return None
    try:
        when = calendar.timegm((*parsed[:6], 0, 1, 0)) - (parsed[9] or 0)
    except (OverflowError, ValueError):
        return None
    return max(0.0, when - now_wall)


@dataclass(frozen=True, slots=True)
class RateLimit:
    """Docker Hub's ``ratelimit-limit`` / ``ratelimit-remaining``, either possibly absent.
    ``window`` is ``w`` in seconds from either header, else :data:`DOCKER_HUB_WINDOW`."""

    limit: int | None
    remaining: int | None
    window: float

    def block(self) -> float | None:
        """At ``remaining`` 0, how long to stop: ``w / limit``; else None."""
        if self.remaining is None or self.remaining > 0 or not self.limit:
            return None
        return self.window / self.limit


def _ratelimit_value(value: str) -> tuple[int, float | None] | None:
    """``100;w=21600`` → (100, 21600.0); spaces anywhere, ``w`` optional; for a list of
    policies (``10, 100;w=3600``) the first one that reads."""
    for item in value.split(","):
        head, *params = item.split(";")
        head = head.strip()
        if not _COUNT.fullmatch(head):
            continue
        window: float | None = None
        for param in params:
            key, _, raw = param.partition("=")
            raw = raw.strip().strip('"')
            if key.strip().lower() == "w" and _DELTA.fullmatch(raw) and float(raw) > 0:
                window = float(raw)
        return int(head), window
    return None


def parse_ratelimit(headers: dict[str, str]) -> RateLimit | None:
    """Read the ``ratelimit-*`` headers of an answer (keys lower-case); None if neither reads."""
    limit = _ratelimit_value(headers.get("ratelimit-limit", ""))
    remaining = _ratelimit_value(headers.get("ratelimit-remaining", ""))
    if limit is None and remaining is None:
        return None
    windows = [p[1] for p in (limit, remaining) if p is not None and p[1] is not None]
    return RateLimit(
        limit=limit[0] if limit is not None and limit[0] > 0 else None,
        remaining=remaining[0] if remaining is not None else None,
        window=windows[0] if windows else DOCKER_HUB_WINDOW,
    )


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with equal jitter, for a throttling answer without Retry-After."""

    base: float = 1.0
    factor: float = 2.0
    cap: float = 300.0

    def __post_init__(self) -> None:
        if not (0 < self.base <= self.cap and self.factor >= 1 and math.isfinite(self.cap)):
            raise ValueError(f"invalid backoff {self!r}: need 0 < base <= cap and factor >= 1")

    def ceiling(self, attempt: int) -> float:
        """The most attempt ``attempt`` (0 for the first throttle) waits: base·factorⁿ, capped."""
        if self.factor == 1 or attempt <= 0:
            return self.base
        if attempt >= math.log(self.cap / self.base, self.factor):
            return self.cap
        return min(self.cap, self.base * self.factor**attempt)

    def delay(self, attempt: int, draw: float) -> float:
        """The wait for ``attempt``, with ``draw`` in [0, 1): between half the ceiling and it."""
        ceiling = self.ceiling(attempt)
        return ceiling / 2 + min(max(draw, 0.0), 1.0) * ceiling / 2


@dataclass(frozen=True, slots=True)
class ThrottleView:
    """The throttling state of a host or of one identity, for ``/status``."""

    blocked_until: float | None
    backoff_attempts: int
    ratelimit_limit: int | None
    ratelimit_remaining: int | None


class _State:
    __slots__ = ("attempts", "limit", "remaining", "until")

    def __init__(self) -> None:
        self.until = -math.inf
        self.attempts = 0
        self.limit: int | None = None
        self.remaining: int | None = None

    def view(self, now: float) -> ThrottleView:
        return ThrottleView(
            blocked_until=self.until if self.until > now else None,
            backoff_attempts=self.attempts,
            ratelimit_limit=self.limit,
            ratelimit_remaining=self.remaining,
        )


@dataclass(frozen=True, slots=True)
class Block:
    """A block an answer set or kept in place: until when, for one identity or (None) the
    whole host."""

    until: float
    identity: str | None


def countdown(until: float | None, now: float) -> int:
    """The ``Retry-After`` kuikproxy gives while blocked until ``until``: ``ceil(until − now)``,
    so successive refusals count down as the registry's own do; 0 when not blocked."""
    if until is None or until <= now:
        return 0
    return math.ceil(until - now)


class Throttle:
    """The blocks of one host, and of its identities, with their backoff and last counts.

    ``per_identity``: the registry rations per identity, so an answer to one identity blocks
    that identity only; otherwise (or for an answer to no known identity) it blocks the host.
    ``random`` draws jitter in [0, 1) (default: ``random.Random(seed).random``, or with no
    ``seed`` one generator shared by every host: its state is 2.5 KB, most of a host's).
    """

    SCAN = 16  # how far from the oldest an eviction looks for an identity with nothing to keep

    def __init__(
        self,
        *,
        per_identity: bool,
        backoff: Backoff | None = None,
        random: Callable[[], float] | None = None,
        seed: int | None = None,
        max_identities: int = 4096,
    ) -> None:
        self.per_identity = per_identity
        self.backoff = backoff or Backoff()
        self.random = random or (_JITTER if seed is None else _random.Random(seed)).random
        self.max_identities = max(1, max_identities)
        self.host = _State()
        self.last_remaining: int | None = None  # on any answer, to any identity
        self._identities: OrderedDict[str, _State] = OrderedDict()

    def __len__(self) -> int:
        """How many identities have throttle state of their own (``max_identities`` at most)."""
        return len(self._identities)

    def _scope(self, identity: str | None) -> str | None:
        return identity if self.per_identity else None

    def _state(self, identity: str | None, now: float) -> _State:
        if identity is None:
            return self.host
        state = self._identities.get(identity)
        if state is not None:
            self._identities.move_to_end(identity)
            return state
        if len(self._identities) >= self.max_identities:
            self._evict(now)
        state = self._identities[identity] = _State()
        return state

    def _evict(self, now: float) -> None:
        for n, (identity, state) in enumerate(self._identities.items()):
            if n >= self.SCAN:
                break
            if state.until <= now and state.attempts == 0:
                del self._identities[identity]
                return
        self._identities.popitem(last=False)

    def block(self, until: float, identity: str | None = None, *, now: float) -> float:
        """Block ``identity`` (None: the host) until ``until``, never earlier than a block in
        place; returns the block's end. Also how a block is restored after a restart."""
        state = self._state(identity, now)
        state.until = max(state.until, min(until, now + MAX_BLOCK))
        return state.until

    def blocked_until(self, now: float, identity: str | None = None) -> float | None:
        """When ``identity``'s requests (None: the host's own) may go again; None if now."""
        until = self.host.until
        if identity is not None:
            state = self._identities.get(identity)
            if state is not None:
                until = max(until, state.until)
        return until if until > now else None

    def answered(
        self,
        status: int,
        *,
        retry_after: float | None,
        ratelimit: RateLimit | None,
        identity: str | None,
        now: float,
    ) -> Block | None:
        """A registry answered ``identity`` (None: unknown): block, back off, or reset. Returns
        the block in force for that scope if the answer asked for one."""
        scope = self._scope(identity)
        state = self._state(scope, now)
        stops: list[float] = []
        if ratelimit is not None:
            if ratelimit.limit is not None:
                state.limit = ratelimit.limit
            if ratelimit.remaining is not None:
                state.remaining = self.last_remaining = ratelimit.remaining
            stop = ratelimit.block()
            if stop is not None:
                stops.append(stop)
        if status in THROTTLED:
            if retry_after is not None:
                stops.append(retry_after)
            else:
                stops.append(self.backoff.delay(state.attempts, self.random()))
            state.attempts += 1
        elif status >= 500:
            if retry_after is not None:  # an overloaded registry's 5xx that says when
                stops.append(retry_after)
        else:  # an answer (R4): the registry serves this scope again
            state.attempts = 0
            if scope is not None:
                self.host.attempts = 0
        if not stops:
            return None
        until = self.block(now + max(stops), scope, now=now)
        return Block(until, scope) if until > now else None

    def views(self, now: float) -> dict[str, ThrottleView]:
        """Each identity with something to show: a block, a backoff, a count."""
        return {
            identity: state.view(now)
            for identity, state in sorted(self._identities.items())
            if state.until > now or state.attempts or state.remaining is not None
        }
