"""``kuikproxy serve``: the application on its listen address until SIGTERM or SIGINT."""

from __future__ import annotations

import logging

from aiohttp import web

from kuikproxy.config import Config
from kuikproxy.web.app import build_app

log = logging.getLogger(__name__)


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
        access_log=None,
    )
