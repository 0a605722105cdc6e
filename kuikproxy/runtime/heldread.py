"""A read parked for its window, awaited as its waiter's future (:class:`HeldRead`), and what
a parked read does to its connection (:func:`not_idle`): what a held request costs is what it
holds, so it sits in no coroutine frame of its own, and its connection keeps no timer."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from typing import Any, Protocol

from kuikproxy.core.images import MANIFESTS
from kuikproxy.runtime.messages import Answer, Go, RegistryRequest, Reply
from kuikproxy.runtime.parking import Waiter
from kuikproxy.runtime.proofs import Proofs
from kuikproxy.runtime.services import Services


class Continued(Protocol):
    """The read a parked one continues as once its window lets it go upstream."""

    @property
    def services(self) -> Services: ...

    def go_upstream(self, go: Go) -> Coroutine[Any, Any, Reply]: ...


def not_idle(connection: object) -> None:
    """A parked request's connection is not idle while it waits: aiohttp keeps a keep-alive
    timer per connection (a timer handle, its context and callback: ~250 B of a held request),
    armed from the connection's start and armed again after each answer.
    ``RequestHandler.keep_alive(True)`` cancels it and changes nothing else while a request is
    in progress (aiohttp sets the flag from the answer once it is sent); duck-typed, so a
    connection without it (a test's, another server's) is left as it is."""
    keep_alive = getattr(connection, "keep_alive", None)
    if callable(keep_alive):
        keep_alive(True)


def prove(proofs: Proofs, request: RegistryRequest, answer: Answer) -> None:
    """A client given a 200 manifest proved access to its repository (R5)."""
    if answer.status == 200 and request.image.route == MANIFESTS:
        proofs.proved(request)


class HeldRead(Generator[Any, None, Reply]):
    """A parked read, awaited as its waiter's future in no coroutine frame of its own (a held
    request pays for every frame it sits in): ``await`` drives it as it would the future, and
    what a read's coroutine would do around its wait is done here — the waiter unparked however
    the wait ends (P11), the wait counted in ``Services.waits``, a read released to go upstream
    continued as the read's :meth:`~Continued.go_upstream`."""

    __slots__ = ("_read", "_then", "_wait", "_waiter")

    def __init__(self, read: Continued, waiter: Waiter) -> None:
        self._read = read
        self._waiter: Waiter | None = waiter  # None once unparked
        self._wait = waiter.future.__await__()  # yields the future while it is pending
        self._then: Coroutine[Any, Any, Reply] | None = None  # the read sent upstream

    def __await__(self) -> Generator[Any, None, Reply]:
        return self

    def __next__(self) -> Any:
        return self.send(None)

    def send(self, value: None) -> Any:
        if self._then is not None:
            return self._then.send(value)
        try:
            return self._wait.send(value)
        except StopIteration as done:
            outcome: Answer | Go = done.value
        except BaseException as error:  # refused meanwhile, or cancelled: its client left
            self._unpark(cancelled=isinstance(error, asyncio.CancelledError))
            raise
        waiter = self._unpark(cancelled=False)
        request = waiter.request
        services = self._read.services
        waited = waiter.parking.loop.time() - waiter.since
        services.waits.observe(request.host, request.operation, waited)
        if isinstance(outcome, Answer):
            prove(services.flights.proofs, request, outcome)
            raise StopIteration(Reply(answer=outcome))
        self._then = self._read.go_upstream(outcome)
        return self._then.send(None)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        """An exception thrown in while it waits (its handler cancelled: its client left)."""
        error = typ if val is None else val
        if isinstance(error, type):
            error = error()
        if self._then is not None:
            return self._then.throw(error)
        if self._waiter is not None:
            self._unpark(cancelled=isinstance(error, asyncio.CancelledError))
        try:
            raise error
        finally:  # not left in this frame, which its traceback holds: a cycle
            del error

    def close(self) -> None:
        if self._then is not None:
            self._then.close()
        elif self._waiter is not None:
            self._unpark(cancelled=False)

    def _unpark(self, *, cancelled: bool) -> Waiter:
        waiter, self._waiter = self._waiter, None
        assert waiter is not None
        waiter.parking.unpark(waiter, cancelled=cancelled)
        return waiter
