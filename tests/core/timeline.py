"""A tiny driver for :class:`HostScheduler` timelines: explicit ``now``, no clock, no asyncio.

A :class:`Timeline` plays the runtime's part the simplest way: it fires check windows at their
exact times, "reads" each :class:`Read` at once (or when the test says), answers every ticket the
read serves, remembers each kept answer's time as the runtime's cache would (the window time the
read was made at), and can play clients that ask again as soon as they are answered.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from kuikproxy.core.hoststate import HostPacing
from kuikproxy.core.images import Image
from kuikproxy.core.reuse import shared_with
from kuikproxy.core.scheduler import HostScheduler
from kuikproxy.core.tickets import Admission, Hold, Read, Reuse, Ticket, WindowResult
from kuikproxy.core.views import RingView

HOST = "docker.io"


def img(key: str, host: str = HOST) -> Image:
    """``repo:tag`` or ``repo@digest`` → an :class:`Image` on ``host``."""
    at = key.find("@")
    if at >= 0:
        return Image(host, key[:at], key[at + 1 :])
    repository, _, tag = key.rpartition(":")
    return Image(host, repository, tag)


def digest_of(key: str) -> str:
    """A stable fake manifest digest for an image key."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def images(n: int, prefix: str = "app") -> list[str]:
    """``n`` image keys whose byte-wise order is their index order."""
    return [f"{prefix}/img{i:05d}:latest" for i in range(n)]


@dataclass
class Timeline:
    sched: HostScheduler
    reask: bool = False  # clients ask again for an image as soon as they are answered
    # image key → (time of the kept read, key of the Authorization it was read with)
    kept: dict[str, tuple[float, str | None]] = field(default_factory=dict)
    held: dict[int, Ticket] = field(default_factory=dict)  # ticket id → ticket, still waiting
    reads: list[Read] = field(default_factory=list)
    results: list[WindowResult] = field(default_factory=list)
    reused: list[tuple[str, str, float]] = field(default_factory=list)  # (resource, key, now)

    @classmethod
    def start(cls, now: float = 0.0, *, reask: bool = False, **pacing: Any) -> Timeline:
        pacing.setdefault("check_interval", 60.0)
        pacing.setdefault("copy_interval", 60.0)
        return cls(HostScheduler(HOST, HostPacing(**pacing), now), reask)

    @property
    def next_window(self) -> float:
        return self.sched.check_series.next_window()

    def ask(self, resource: str, key: str, now: float, *, auth: str | None = None) -> Admission:
        """A check request of ``resource`` for ``key``, offered the kept answer if R5 lets it."""
        kept_at = None
        if key in self.kept:
            at, kept_auth = self.kept[key]
            kept_at = at if shared_with(kept_auth, None, 200, auth, None) else None
        decision = self.sched.check(resource, img(key), now, auth=auth, kept_at=kept_at)
        if isinstance(decision, Hold):
            self.held[decision.ticket.id] = decision.ticket
        elif isinstance(decision, Reuse):
            self.reused.append((resource, key, now))
        return decision

    def ask_all(self, resource: str, keys: list[str], now: float) -> list[Admission]:
        return [self.ask(resource, key, now) for key in keys]

    def window(self, *, read: bool = True) -> WindowResult:
        """Fire the next check window at its exact time; by default read its image at once."""
        result = self.sched.check_window(self.next_window)
        self.results.append(result)
        if result.read is not None:
            self.reads.append(result.read)
            if read:
                self.finish(result.read, result.at)
        return result

    def run(self, n: int) -> list[WindowResult]:
        return [self.window() for _ in range(n)]

    def finish(self, read: Read, now: float, *, kept: bool = True) -> list[Ticket]:
        """The upstream read ends at ``now``: every ticket it carries is answered."""
        released = self.sched.check_read_done(
            read, now, served=list(read.tickets), digest=digest_of(read.image.key), kept=kept
        )
        if kept:
            auth = None if read.leader is None else read.leader.auth
            self.kept[read.image.key] = (read.at, auth)
        for ticket in read.tickets:
            self.held.pop(ticket.id, None)
        for ticket in released:
            self.held.pop(ticket.id, None)
        if self.reask:
            for ticket in read.tickets:
                self.ask(ticket.resource, ticket.image.key, now, auth=ticket.auth)
        return released

    def cursor(self, resource: str) -> str | None:
        ring = self.sched.ring(resource)
        return None if ring is None else ring.cursor

    def ring_view(self, resource: str) -> RingView:
        return next(r for r in self.sched.view(self.next_window).rings if r.resource == resource)

    def counts(self) -> dict[str, int]:
        return self.sched.view(self.next_window).check.windows

    def read_keys(self) -> list[str]:
        return [read.image.key for read in self.reads]
