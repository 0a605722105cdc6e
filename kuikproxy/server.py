"""``kuikproxy serve``: the application on its listen address until SIGTERM or SIGINT — as a
forward proxy too with ``forwardProxy.enabled`` (§13)."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal

from aiohttp import web

from kuikproxy.allocator import keep_large_blocks_mapped
from kuikproxy.app import build_app
from kuikproxy.config import Config
from kuikproxy.forward.front import FrontSite
from kuikproxy.web.keys import FORWARDING

log = logging.getLogger(__name__)

KEEPALIVE_TIMEOUT = 75.0
# SIGTERM: requests held for a window are answered 503 at once (Pacer.close); requests already
# streaming from a registry (a blob) get this long to finish before their connections close
SHUTDOWN_GRACE = 30.0
# kuikproxy's heap is mostly long-lived pacing state (rings of up to millions of entries) and
# short-lived request objects. CPython's default first threshold (700 allocations) runs the
# young collection thousands of times a second under load, and each pass promotes survivors
# that the older collections then walk again: measured, a third of the throughput of kept
# answers. A larger nursery keeps that work proportional to what is really garbage.
GC_THRESHOLDS = (50_000, 20, 20)


def tune_garbage_collection() -> None:
    """Raise the collector's thresholds, and freeze what start-up made (modules, config): it
    lives as long as the process and need never be walked again."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run(config: Config, config_path: str | None = None) -> None:
    keep_large_blocks_mapped()
    tune_garbage_collection()
    asyncio.run(serve(config, config_path))


async def serve(config: Config, config_path: str | None = None) -> None:
    """Listen until SIGTERM or SIGINT, then shut down: new connections refused, held requests
    answered 503, streams in flight given :data:`SHUTDOWN_GRACE` (§7.2)."""
    app = build_app(config, config_path=config_path)
    runner = web.AppRunner(
        app,
        # a client that goes away cancels its handler: a held request stops waiting (P11)
        handler_cancellation=True,
        # also the bound on a client that never finishes its request (slow headers): aiohttp
        # arms it when the connection is made, and bytes trickling in do not re-arm it
        keepalive_timeout=KEEPALIVE_TIMEOUT,
        access_log=None,
        shutdown_timeout=SHUTDOWN_GRACE,
    )
    await runner.setup()
    host, port = config.listen_address()
    forwarding = app[FORWARDING]
    site: web.BaseSite = (
        web.TCPSite(runner, host or None, port)
        if forwarding is None
        else FrontSite(runner, forwarding, host or None, port)
    )
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await site.start()
        log.info(
            "kuikproxy listening on %s:%d%s (config: %s)",
            host or "*", port, "" if forwarding is None else " as a forward proxy",
            config_path or "embedded",
        )  # fmt: skip
        await stop.wait()
        log.info("kuikproxy stopping")
    finally:
        await runner.cleanup()
