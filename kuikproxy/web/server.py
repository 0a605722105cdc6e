"""``kuikproxy serve``: the application on its listen address until SIGTERM or SIGINT."""

from __future__ import annotations

import logging

from aiohttp import web

from kuikproxy.config import Config
from kuikproxy.web.app import build_app

log = logging.getLogger(__name__)

KEEPALIVE_TIMEOUT = 75.0


def run(config: Config, config_path: str | None = None) -> None:
    host, port = config.listen_address()
    log.info(
        "kuikproxy listening on %s:%d (config: %s)", host or "*", port, config_path or "embedded"
    )
    web.run_app(
        build_app(config),
        host=host or None,
        port=port,
        print=None,
        # a client that goes away cancels its handler: a held request stops waiting (P11)
        handler_cancellation=True,
        # also the bound on a client that never finishes its request (slow headers): aiohttp
        # arms it when the connection is made, and bytes trickling in do not re-arm it
        keepalive_timeout=KEEPALIVE_TIMEOUT,
        access_log=None,
    )
