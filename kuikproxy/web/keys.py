"""What the data path's handlers read of the application, by typed key."""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

from kuikproxy.forward.front import Forwarding
from kuikproxy.runtime.pacer import Pacer
from kuikproxy.web.reload import Current, Reloader


class Answered(Protocol):
    """Where the edge counts each request it answered (``kuik_proxy_requests_total``)."""

    def answered(self, host: str, operation: str, code: str, cache: str) -> None: ...


CURRENT = web.AppKey("current", Current)
RELOADER = web.AppKey("reloader", Reloader)
FORWARDING: web.AppKey[Forwarding | None] = web.AppKey("forwarding")  # None: not a proxy
PACER = web.AppKey("pacer", Pacer)
ANSWERED = web.AppKey("answered", Answered)
