"""The composition root: the application assembled from its parts, and their lifecycle.

Nothing else builds objects of more than one layer: the web edge gets the runtime through
the application's keys (:mod:`kuikproxy.web.keys`), what observes it gets its own
(:mod:`kuikproxy.observe.observed`), the runtime gets the registry client, whose answers it
reads (:mod:`kuikproxy.runtime.egress`), and the forward proxy's refusals, which it counts.
What the runtime knows (waits, windows, counts) is read from its snapshot by what observes it.
One callback still runs up a layer: the config file's watch (``runtime/watch.py``) tells the
edge's reloader that the file changed, as the signal handler does for SIGHUP.
"""

from __future__ import annotations

import asyncio
import signal

from aiohttp import web

from kuikproxy.blobs.store import BlobStore
from kuikproxy.config import Config
from kuikproxy.core.memorybudget import Bound
from kuikproxy.fleet.backend import FleetBackend
from kuikproxy.forward.front import Forwarding
from kuikproxy.observe.handlers import routes as observing
from kuikproxy.observe.metrics import Metrics
from kuikproxy.observe.observed import OBSERVED, Observed
from kuikproxy.runtime.durable import Durable
from kuikproxy.runtime.pacer import Pacer
from kuikproxy.runtime.snapshot import snapshot
from kuikproxy.runtime.watch import FileWatch
from kuikproxy.upstream.client import AiohttpTransport, Transport
from kuikproxy.upstream.guard import AddressGuard
from kuikproxy.upstream.registries import Registries
from kuikproxy.web.fastpath import serve_kept_answers
from kuikproxy.web.keys import ANSWERED, CURRENT, FORWARDING, PACER, RELOADER
from kuikproxy.web.reload import Current, Reloader
from kuikproxy.web.routes import add_routes


def build_app(
    config: Config,
    transport: Transport | None = None,
    *,
    config_path: str | None = None,
    fleet: FleetBackend | None = None,
) -> web.Application:
    """The whole application; ``transport`` defaults to aiohttp towards real registries.
    With ``config_path``, the file is watched and re-read on change and on SIGHUP (§7.2).
    With ``config.fleet``, windows are shared through ``fleet`` (default: its Redis)."""
    app = web.Application()
    current = app[CURRENT] = Current(config)
    forward = config.forward_proxy
    app[FORWARDING] = None
    if forward.enabled:  # cryptography is imported only by a forward proxy
        from kuikproxy.forward.authority import Authority

        authority = Authority(forward.ca.cert_file, forward.ca.key_file)
        app[FORWARDING] = Forwarding(lambda: current.config, authority)
    lifecycle = _Lifecycle(config, transport, config_path, fleet)
    app.on_startup.append(lifecycle.start)
    app.on_shutdown.append(lifecycle.stop)
    app.on_cleanup.append(lifecycle.cleanup)
    add_routes(app.router, forward=forward.enabled, more=observing())
    if not forward.enabled:  # a tunnel's requests name their registry by the tunnel (§13)
        serve_kept_answers(app)
    return app


class _Lifecycle:
    """What the application starts, and stops, with its event loop."""

    def __init__(
        self,
        config: Config,
        transport: Transport | None,
        config_path: str | None,
        fleet: FleetBackend | None,
    ) -> None:
        self.config = config
        self.guard = AddressGuard() if transport is None else None
        self.upstream = transport or AiohttpTransport(guard=self.guard)
        self.config_path = config_path
        self.fleet = fleet
        self.watches: list[FileWatch] = []

    async def start(self, app: web.Application) -> None:
        loop, config = asyncio.get_running_loop(), self.config

        registries = Registries(config, self.upstream, loop.time, self.guard)
        # P13: a state file that cannot be used stops the start, before anything is paced
        durable = None if config.state.path is None else await Durable.open(config.state.path)
        fleet = self.fleet
        if fleet is None and config.fleet is not None:
            from kuikproxy.fleet.join import join  # redis-py only for a fleet

            fleet = self.fleet = await join(config.fleet)
        blobs = config.cache.blobs
        store = None
        if blobs.path is not None:  # §15: the store's manifests are kept answers again
            entries = config.budget().value(Bound.CATALOG)  # two grants to a tag
            store = await BlobStore.open(
                blobs.path, blobs.max_bytes, max_grants=entries * 2 // 3, max_tags=entries // 3
            )
        pacer = app[PACER] = Pacer(config, registries, durable=durable, fleet=fleet, store=store)
        if pacer.cache is not None:
            pacer.cache.restore(pacer.kept)
        forwarding = app[FORWARDING]
        if forwarding is not None:  # the front's refusals are counted with the runtime's
            pacer.refused_also.append(forwarding.refused)
        if durable is not None:
            await durable.restore(pacer)
        metrics = Metrics(
            snapshot=lambda rings: snapshot(pacer, pacer.loop.time(), ring_stats=rings),
            known=pacer.known,
        )
        reloader = Reloader(self.config_path, app[CURRENT], pacer, metrics.reloaded)
        app[ANSWERED], app[RELOADER] = metrics, reloader
        app[OBSERVED] = Observed(pacer, metrics, lambda: reloader.loaded)
        if self.config_path is not None:
            self.watches.append(FileWatch(self.config_path, reloader.changed, loop))
            loop.add_signal_handler(signal.SIGHUP, reloader.reload)

    async def stop(self, app: web.Application) -> None:
        for watch in self.watches:
            watch.close()
        if self.config_path is not None:
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        # on shutdown, before aiohttp waits for handlers: held requests are answered 503 now
        # rather than cancelled after the grace period
        await app[PACER].close()

    async def cleanup(self, app: web.Application) -> None:
        await self.upstream.close()
        forwarding = app[FORWARDING]
        if forwarding is not None:
            forwarding.authority.close()
        pacer = app[PACER]
        if pacer.durable is not None:  # the last write, once nothing changes any more
            await pacer.durable.close()
        if pacer.cache is not None:
            await pacer.cache.close()
        if self.fleet is not None:
            await self.fleet.close()
