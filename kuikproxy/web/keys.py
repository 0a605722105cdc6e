"""What the application holds, by typed key: one module that every handler module imports."""

from __future__ import annotations

from aiohttp import web

from kuikproxy.forward.front import Forwarding
from kuikproxy.runtime.metrics import Metrics
from kuikproxy.runtime.pacer import Pacer
from kuikproxy.runtime.windowlog import WindowLog
from kuikproxy.web.reload import Current, Reloader

CURRENT = web.AppKey("current", Current)
RELOADER = web.AppKey("reloader", Reloader)
FORWARDING: web.AppKey[Forwarding | None] = web.AppKey("forwarding")  # None: not a proxy
PACER = web.AppKey("pacer", Pacer)
METRICS = web.AppKey("metrics", Metrics)
WINDOW_LOG = web.AppKey("window_log", WindowLog)
