"""Config reload in place (SPEC §7.2, P12): on a change of the file and on SIGHUP.

A valid new file replaces the running config everywhere at once — what the edge reads per
request (:class:`Current`), the upstream side (endpoints, credentials, TLS), and the runtime
(:meth:`~kuikproxy.runtime.pacer.Pacer.reconfigure`, which applies P12: only a changed interval
restarts its series). An invalid one leaves everything as it was: each error is logged with its
path, counted (``kuik_proxy_config_reloads_total{result="error"}``) and shown in
``/status.config.lastError`` until a valid file replaces it. A file that reads the same as the
running config (a touch, an editor's save without change) changes nothing and is not counted.

Settings that only take effect at start — ``listen``, ``state.path`` and ``cache.blobs.path``
— are logged as such when they change, and the rest of the file is applied.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from kuikproxy.config import Config, load_config
from kuikproxy.errors import ConfigError
from kuikproxy.runtime.pacer import Pacer
from kuikproxy.runtime.watch import Identity, identity
from kuikproxy.web.classify import Locator

log = logging.getLogger(__name__)


class Current:
    """The running config and what the edge derives from it, swapped whole by a reload."""

    __slots__ = ("config", "locator")

    def __init__(self, config: Config) -> None:
        self.config = config
        self.locator = Locator(config)


@dataclass(slots=True)
class Loaded:
    """What ``/status.config`` shows: the generation running, when it was loaded (loop time),
    and the errors of the last file that could not be (None once a valid one is loaded)."""

    generation: int
    at: float
    error: str | None = None


class Reloader:
    def __init__(
        self,
        path: str | None,
        current: Current,
        pacer: Pacer,
        counted: Callable[[str], None],
    ) -> None:
        self.path = path
        self.current = current
        self.pacer = pacer
        self.counted = counted  # told each reload's result: success, or error
        self.loaded = Loaded(1, pacer.started)
        self._read: Identity = None if path is None else identity(path)

    def changed(self) -> None:
        """The file watch saw the file change: reload, unless this version was read already
        (a SIGHUP sent with the edit reads it first; one version is reported once)."""
        if self.path is not None and identity(self.path) != self._read:
            self.reload()

    def reload(self) -> bool:
        """Read the file and apply it if it is valid and different; False if it is invalid."""
        if self.path is None:
            log.info(
                "reload asked for, but kuikproxy runs on its embedded default: nothing to read"
            )
            return True
        self._read = identity(self.path)
        try:
            config = load_config(self.path)
        except ConfigError as error:
            for line in error.errors:
                log.error("config reload refused, the running config stays: %s", line)
            self.loaded.error = "\n".join(error.errors)
            self.counted("error")
            return False
        self.loaded.error = None
        old = self.current.config
        if config == old:
            return True
        for name, before, after in (
            ("listen", old.listen, config.listen),
            ("state.path", old.state.path, config.state.path),
            ("cache.blobs.path", old.cache.blobs.path, config.cache.blobs.path),
        ):
            if before != after:
                log.warning(
                    "%s changed (%s → %s): it takes effect at the next start", name, before, after
                )
        self.apply(config)
        self.loaded = Loaded(self.loaded.generation + 1, self.pacer.loop.time())
        self.counted("success")
        log.info("config reloaded from %s (generation %d)", self.path, self.loaded.generation)
        return True

    def apply(self, config: Config) -> None:
        """Every part of the process on ``config``, in one step of the loop."""
        self.current.config = config
        self.current.locator = Locator(config)
        self.pacer.reconfigure(config)
