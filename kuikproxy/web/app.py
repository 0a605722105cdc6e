"""The aiohttp application: routes and the registry read path.

A registry read goes: parse the path → find the host → classify (resource, operation) → the
runtime answers it (kept answer, window, or go) → relay. Errors kuikproxy makes are OCI error
bodies (SPEC §12); anything unexpected is logged and answered 500, never allowed to take the
process down.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from kuikproxy.config import Config, RegistrySettings
from kuikproxy.core.scheduler import HostView, Operation
from kuikproxy.errors import (
    InternalError,
    NotFound,
    RegistryError,
    TooManyRequests,
    Unsupported,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from kuikproxy.fleet.backend import FleetBackend
from kuikproxy.forward.front import Forwarding
from kuikproxy.runtime.content import content_of
from kuikproxy.runtime.durable import Durable
from kuikproxy.runtime.fleet import FleetView
from kuikproxy.runtime.messages import Answer, Go, RegistryRequest, forwarded
from kuikproxy.runtime.metrics import NO_HOST, Metrics
from kuikproxy.runtime.pacer import Pacer
from kuikproxy.runtime.pings import KeptPings
from kuikproxy.runtime.watch import FileWatch
from kuikproxy.runtime.windowlog import WindowLog
from kuikproxy.upstream.client import (
    AiohttpTransport,
    Transport,
    UpstreamRequest,
    end_to_end,
)
from kuikproxy.upstream.guard import AddressGuard
from kuikproxy.upstream.registries import Registries
from kuikproxy.web import status as status_models
from kuikproxy.web.classify import Target, auth_key, classify
from kuikproxy.web.keys import (
    CURRENT,
    FORWARDING,
    METRICS,
    PACER,
    PINGS,
    REGISTRIES,
    RELOADER,
    WINDOW_LOG,
)
from kuikproxy.web.oci import API_VERSION, error_response
from kuikproxy.web.page import status_page
from kuikproxy.web.proxying import ProxyRequests
from kuikproxy.web.relay import answer_response, relocate, stream
from kuikproxy.web.reload import Current, Reloader

log = logging.getLogger(__name__)

STALE_WARNING = '110 - "Response is Stale"'  # RFC 7234 §5.5.1, as SPEC §11 asks
READ_METHODS = frozenset({"GET", "HEAD"})
MAX_PING_BODY = 64 * 1024


async def registry(request: web.Request) -> web.StreamResponse:  # noqa: PLR0915
    """Every ``/v2/`` route, in one function on purpose: a held request pays for every
    coroutine frame it sits in (errors are caught here rather than in a middleware for the same
    reason). The ``finally`` counts the answer (``kuik_proxy_requests_total``)."""
    host, operation, cache = "-", "-", "none"  # the metric's labels, as far as they are known
    response: web.StreamResponse | None = None
    try:
        current = request.app[CURRENT]  # read once: a reload swaps it whole
        config = current.config
        # from the raw line, not request.query: that one would stay cached on a held request
        url, write = request.rel_url, request.method not in READ_METHODS
        query, via = url.raw_query_string, None
        forwarding = request.app[FORWARDING]
        if forwarding is not None and (via := forwarding.via(request)) is not None:
            # a request that came through the proxy names its registry like ?ns= does (§13)
            query = f"ns={via.host}&{query}" if query else f"ns={via.host}"
        located = current.locator.locate(url.raw_path, query, request.host, write)
        target = located.target
        host = target.host
        ns = host if target.by_ns else None  # answered with OCI-Namespace (§3)
        settings = config.registry(host)
        registries = request.app[REGISTRIES]
        if write:
            if settings.paced:
                raise Unsupported(f"{request.method}: kuikproxy only reads {host} (it is paced)")
            response = await write_through(request, target, located.query)
        elif located.image is None:  # the /v2/ ping
            response = await ping(request, target, settings)
        else:
            pacer = request.app[PACER]
            proxy_authorization = None if via is None else via.proxy_authorization
            read = classify(
                request,
                located.image,
                located.query,
                config,
                pacer.flow,
                paced=settings.paced,
                proxy_authorization=proxy_authorization,
                signer=registries.signer(host),
            )
            operation, cache = read.operation.value.capitalize(), "miss"
            if not settings.paced:  # a destination kuik owns (§4.3): straight through
                async with pacer.upstream(read):
                    upstream = _upstream(read, registries)
                    response = await stream(
                        request, registries, host, upstream, ns, content=content_of(read.image)
                    )
                return response
            if read.gate.paced_exempt and read.flow.exempt:
                response, cache = await exempt(request, read, settings, ns)
                return response
            if pacer.fleet is not None and read.operation is Operation.CHECK:
                await pacer.from_fleet(read)
            outcome = pacer.admit(read)
            if isinstance(outcome, Answer):
                cache = "hit"
            elif not isinstance(outcome, Go):
                held_since = pacer.loop.time()
                outcome = await outcome
                wait = pacer.loop.time() - held_since
                request.app[METRICS].wait.labels(host, operation).observe(wait)
            if isinstance(outcome, Answer):
                response = answer_response(request, outcome, ns)
            else:
                try:
                    async with pacer.upstream(read):
                        timeout = _timeout(outcome, read, settings, pacer.loop.time())
                        upstream = _upstream(read, registries, timeout)
                        response = await stream(
                            request, registries, host, upstream, ns, content=content_of(read.image)
                        )
                finally:
                    outcome.done()
    except RegistryError as error:
        log.debug("%s %s: %s", request.method, request.path[:200], error.message)
        request.app[PACER].refused_now(None if host == "-" else host, error)
        response = error_response(error)
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path[:200])
        response = error_response(InternalError("internal error in kuikproxy"))
    finally:
        code = "cancelled" if response is None else str(response.status)
        request.app[METRICS].answered(host, operation, code, cache)
    return response


async def exempt(
    request: web.Request, read: RegistryRequest, settings: RegistrySettings, ns: str | None
) -> tuple[web.StreamResponse, str]:
    """A read on an ``Exempt`` priority level (kuik's webhook availability check): never paced,
    bounded by ``check.timeout`` alone (P14). It never adds to the count of a registry that
    said stop: while the host is blocked it is answered from a kept answer, however old (marked
    stale), or refused with the block's remaining time (§11). Returns the answer and whether a
    kept answer served it."""
    pacer, registries = request.app[PACER], request.app[REGISTRIES]
    now = pacer.loop.time()
    until = pacer.blocked_until(read.host, now)
    if until is None:
        upstream = _upstream(read, registries, settings.check.timeout or None)
        async with read.flow.seat():  # never waits: counted as executing
            content = content_of(read.image)
            return await stream(
                request, registries, read.host, upstream, ns, content=content
            ), "miss"
    kept = pacer.kept.find(read)
    if kept is None:
        raise TooManyRequests(
            f"{read.host} asked kuikproxy to stop; no kept answer to give instead",
            refusal="blocked",
            detail={"host": read.host},
            retry_after=until - now,
        )
    response = answer_response(request, kept, ns)
    response.headers["Warning"] = STALE_WARNING
    return response, "hit"


def _timeout(go: Go, read: RegistryRequest, settings: RegistrySettings, now: float) -> float | None:
    """How long a read that may go has: ``check.timeout`` for checks; for a copy's request, what
    is left of its ``copy.timeout`` (504 at once when nothing is)."""
    if read.operation is Operation.CHECK:
        return settings.check.timeout or None
    if go.deadline is None:
        return None
    left = go.deadline - now
    if left <= 0:
        raise UpstreamTimeout(f"{read.host}: the copy's copy.timeout has run out")
    return left


async def write_through(
    request: web.Request, target: Target, query: tuple[tuple[str, str], ...]
) -> web.StreamResponse:
    """A write to a host kuik owns (``paced: false``): passed through with its body streamed;
    upload locations pointed back through kuikproxy the way the client addressed it."""
    registries = request.app[REGISTRIES]
    base = registries.base(target.host)
    url = base.with_path(f"/v2/{target.route.repository}", encoded=True).with_query(
        [(k, v) for k, v in query if k != "ns"]
    )
    headers = forwarded(request.headers)
    if request.headers.get("Content-Length"):
        headers = (*headers, ("Content-Length", request.headers["Content-Length"]))
    body = request.content.iter_any() if request.body_exists else None
    upstream = UpstreamRequest(request.method, url, headers, None, body=body)
    ns = target.host if target.by_ns else None
    return await stream(
        request, registries, target.host, upstream, ns, relocated=relocate(target, base)
    )


def _upstream(
    read: RegistryRequest, registries: Registries, timeout: float | None = None
) -> UpstreamRequest:
    """The registry request for a read, built once it may go (not while it waits)."""
    return UpstreamRequest(read.method, read.url(registries.base(read.host)), read.headers, timeout)


async def ping(
    request: web.Request, target: Target, settings: RegistrySettings
) -> web.StreamResponse:
    """``/v2/``: unpaced, the registry's answer (200, or 401 and its challenge) kept 60 s.

    A bare ``/v2/`` names no registry (it is ``defaultRegistry``'s): path-prefix mirrors
    (podman, skopeo) ask it before every pull and skip the mirror unless it answers 200 or 401,
    so when that registry cannot answer, kuikproxy does rather than make every other registry
    unusable through the mirror."""
    try:
        return await _ping(request, target.host, settings, target.host if target.by_ns else None)
    except RegistryError:
        if not target.by_default:
            raise
        return web.json_response({}, headers=dict([API_VERSION]))


async def _ping(
    request: web.Request, host: str, settings: RegistrySettings, ns: str | None
) -> web.StreamResponse:
    pings, registries = request.app[PINGS], request.app[REGISTRIES]
    now = request.app[PACER].loop.time()
    # kuikproxy signs in for clients only where it holds credentials; elsewhere clients
    # must see the registry's challenge to sign in themselves (docs/decisions.md)
    signed = registries.has_credentials(host)
    auth, signer = auth_key(request), registries.signer(host) if signed else None
    kept = pings.find(host, auth, signer, now)
    if kept is not None:
        return answer_response(request, kept, ns)
    url = registries.base(host).with_path("/v2/")
    timeout = settings.check.timeout or None
    upstream = UpstreamRequest("GET", url, forwarded(request.headers), timeout)
    async with await registries.send(host, upstream, authenticate=signed) as answered:
        headers = tuple(end_to_end(answered.headers).items())
        body = await answered.read(MAX_PING_BODY)
    if answered.status >= 500:
        raise UpstreamUnreachable(f"{host} answered /v2/ with {answered.status}")
    answer = Answer(answered.status, headers, body, "GET", now, auth, None if auth else signer)
    pings.keep(host, answer)
    return answer_response(request, answer, ns)  # whole to this client: its own cookies


async def not_found(request: web.Request) -> web.StreamResponse:
    return error_response(NotFound(f"no such route {request.path[:200]!r}"))


async def healthz(request: web.Request) -> web.StreamResponse:
    return web.json_response({"status": "ok"})


def _views(app: web.Application) -> tuple[dict[str, HostView], float]:
    """Every host's snapshot now (without rings: a scrape reads those through
    :meth:`Pacer.ring_stats`), and the offset from loop time to wall time."""
    pacer = app[PACER]
    return pacer.views(pacer.loop.time()), pacer.wall_offset


async def metrics_page(request: web.Request) -> web.StreamResponse:
    """``/metrics`` (SPEC §9), Prometheus text format."""
    body = await request.app[METRICS].render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def status_schema(request: web.Request) -> web.StreamResponse:
    """The JSON Schema of ``/status`` (SPEC §8), from the same pydantic models."""
    return web.json_response(status_models.Status.model_json_schema(by_alias=True))


async def status(request: web.Request) -> web.StreamResponse:
    """``/status`` (SPEC §8), narrowed by ``?resource=`` and ``?registry=``; resources come a
    page at a time (``?after=``, ``?limit=``), so that no status holds the loop for long."""
    pacer = request.app[PACER]
    now = pacer.loop.time()
    clock = status_models.Clock(pacer.wall_offset)
    loaded = request.app[RELOADER].loaded
    query = request.query
    try:
        limit = int(query.get("limit", status_models.DEFAULT_PAGE))
    except ValueError:
        raise web.HTTPBadRequest(text="limit: not a number") from None
    page = status_models.resource_page(
        pacer.census,
        resource=query.get("resource"),
        after=query.get("after"),
        limit=min(max(limit, 1), status_models.MAX_PAGE),
    )
    # the state is read here, on the loop; the document is built and dumped in a worker
    # thread: with a thousand hosts that is tens of milliseconds the loop must not wait for
    views, quotas, levels = pacer.views(now, page.names), pacer.quotas(now), pacer.levels()
    fleet = None if pacer.fleet is None else pacer.fleet.view()
    refused, refused_elsewhere = pacer.refusals(), dict(pacer.refused.counts)
    concurrency = pacer.flow.settings.server_concurrency_limit

    def document() -> str:
        return status_models.build_status(
            views,
            clock,
            page=page,
            started=pacer.started,
            config=status_models.ConfigStatus(
                generation=loaded.generation,
                loadedAt=clock.rfc3339(loaded.at),
                lastError=loaded.error,
            ),
            kept=pacer.kept,
            quotas=quotas,
            flow=status_models.flow_control_status(concurrency, levels, clock),
            fleet=None if fleet is None else _fleet_status(fleet, clock),
            refused=refused,
            refused_elsewhere=refused_elsewhere,
            registry=query.get("registry"),
        ).model_dump_json(by_alias=True)

    return web.json_response(text=await asyncio.to_thread(document))


def _fleet_status(view: FleetView, clock: status_models.Clock) -> status_models.FleetStatus:
    return status_models.FleetStatus(
        name=view.name,
        connected=view.connected,
        size=view.size,
        since=clock.rfc3339(view.since),
        lastError=view.error,
    )


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
        app[FORWARDING] = Forwarding(
            lambda: current.config,
            authority,
            refused=lambda error: app[PACER].refused_now(None, error),
        )
    app[WINDOW_LOG] = WindowLog()
    app[PINGS] = KeptPings()
    lifecycle = _Lifecycle(config, transport, config_path, fleet)
    app.on_startup.append(lifecycle.start)
    app.on_shutdown.append(lifecycle.stop)
    app.on_cleanup.append(lifecycle.cleanup)
    _routes(app.router, forward=forward.enabled)
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

        def answered(
            host: str, method: str, status: int | None, headers: tuple[tuple[str, str], ...]
        ) -> None:
            app[METRICS].upstream_answered(host, method, status, headers)
            app[PACER].upstream_answered(host, method, status, headers)

        async def before_token(host: str) -> None:
            await app[PACER].spend_oauth(host)

        registries = app[REGISTRIES] = Registries(
            config, self.upstream, loop.time, self.guard, answered, before_token=before_token
        )
        # P13: a state file that cannot be used stops the start, before anything is paced
        durable = None if config.state.path is None else await Durable.open(config.state.path)
        fleet = self.fleet
        if fleet is None and config.fleet is not None:
            from kuikproxy.fleet.join import join  # redis-py only for a fleet

            fleet = self.fleet = await join(config.fleet)
        pacer = app[PACER] = Pacer(config, registries, durable=durable, fleet=fleet)
        if durable is not None:
            await durable.restore(pacer)
        link = pacer.fleet
        app[METRICS] = Metrics(
            lambda: _views(app),
            pacer.levels,
            lambda: pacer.quotas(pacer.loop.time()),
            None if link is None else link.view,
            rings=pacer.ring_stats,
            refused=lambda: [(NO_HOST, pacer.refused.counts), *pacer.refusals().items()],
            known=pacer.known,
        )
        pacer.observers.append(app[WINDOW_LOG].observe)
        pacer.forgetters += [app[WINDOW_LOG].forget, app[METRICS].forget]
        reloader = app[RELOADER] = Reloader(
            self.config_path, app[CURRENT], pacer, registries, lambda: app[METRICS]
        )
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
        durable = app[PACER].durable
        if durable is not None:  # the last write, once nothing changes any more
            await durable.close()
        if self.fleet is not None:
            await self.fleet.close()


def _routes(router: web.UrlDispatcher, *, forward: bool) -> None:
    router.register_resource(ProxyRequests(forward=forward))
    router.add_get("/healthz", healthz)
    router.add_get("/readyz", healthz)
    router.add_get("/", status_page)
    router.add_get("/status", status)
    router.add_get("/status/schema", status_schema)
    router.add_get("/metrics", metrics_page)
    router.add_route("*", "/v2{tail:.*}", registry)
    router.add_route("*", "/{tail:.*}", not_found)
