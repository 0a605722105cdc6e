"""What the observing side reads of the application, under one typed key: the runtime, the
metrics and the config's state — handed over by the composition root, so
that ``observe`` and the data path (``web``) never import each other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from kuikproxy.observe.metrics import Metrics
from kuikproxy.runtime.pacer import Pacer


class ConfigState(Protocol):
    """What ``/status.config`` shows: the generation running, when it was loaded (loop time),
    and the errors of the last file that could not be."""

    @property
    def generation(self) -> int: ...
    @property
    def at(self) -> float: ...
    @property
    def error(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class Observed:
    pacer: Pacer
    metrics: Metrics
    loaded: Callable[[], ConfigState]  # read per request: a reload replaces it


OBSERVED = web.AppKey("observed", Observed)
