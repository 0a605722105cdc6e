"""Whose pace a relay goes at: the registry's, until its client has kept it waiting.

A read holds a flow-control seat, a place of the registry client's connection limit and, in an
open copy, its part of that copy while its answer is relayed, so that the registry is asked for
no more at once than its levels and windows allow (SPEC §10, P9). Once the relay has waited on
its client rather than on the registry for :data:`LAGGING_AFTER` in all, the client sets its
pace: the read lets go of all three (:meth:`Opened.lagging
<kuikproxy.runtime.messages.Opened.lagging>`) and goes on at the client's pace, holding only its
own connection and its relay's room. Thirty nodes on a bad link then hold thirty connections,
not every seat of their level nor their host's next copy window.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kuikproxy.runtime.messages import LAGGING_AFTER, Opened


class Pace:
    """The time a relay spent waiting on its client, on the loop: each wait is bracketed by
    :meth:`waiting` and :meth:`waited`, and one that runs past what is left of
    :data:`LAGGING_AFTER` calls ``lagging`` (once) as it goes on — a timer: a client that reads
    nothing never ends its wait."""

    __slots__ = ("_lagging", "_since", "_timer", "_waited")

    def __init__(self, lagging: Callable[[], None] | None) -> None:
        self._lagging = lagging  # None: nothing to let go of
        self._waited = 0.0
        self._since = 0.0
        self._timer: asyncio.TimerHandle | None = None

    @classmethod
    def of(cls, opened: Opened) -> Pace:
        """The pace of a relay of ``opened``: past :data:`LAGGING_AFTER`, it lets go of what
        the registry's pace held (:meth:`Opened.lagging`)."""
        return cls(opened.lagging if opened.paced is not None else None)

    def waiting(self) -> None:
        if self._lagging is None:
            return
        loop = asyncio.get_running_loop()
        self._since = loop.time()
        self._timer = loop.call_at(self._since + LAGGING_AFTER - self._waited, self._lag)

    def waited(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()
            self._waited += asyncio.get_running_loop().time() - self._since

    def _lag(self) -> None:
        lagging, self._lagging, self._timer = self._lagging, None, None
        if lagging is not None:
            lagging()
