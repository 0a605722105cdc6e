"""The routes, and the registry read path's edge: parse, classify, render.

A registry read goes: parse the path → find the host → classify (resource, operation) →
:meth:`Pacer.read <kuikproxy.runtime.pacer.Pacer.read>` → render what it yields (a whole answer,
or the registry's answer streamed). Errors kuikproxy makes are OCI error bodies (§12); anything
unexpected is logged and answered 500, never allowed to take the process down.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from aiohttp import web

from kuikproxy.config import Config, RegistrySettings
from kuikproxy.errors import InternalError, NotFound, RegistryError, Unsupported
from kuikproxy.runtime.messages import Reply, forwarded
from kuikproxy.web.classify import Located, Target, auth_key, classify
from kuikproxy.web.fastpath import admitted
from kuikproxy.web.keys import ANSWERED, CURRENT, FORWARDING, PACER
from kuikproxy.web.oci import API_VERSION, error_response
from kuikproxy.web.proxying import ProxyRequests, RegistryPaths
from kuikproxy.web.relay import answer_response, relocate, send_body, send_shared, stream

log = logging.getLogger(__name__)

STALE_WARNING = '110 - "Response is Stale"'  # RFC 7234 §5.5.1, as §11 asks
READ_METHODS = frozenset({"GET", "HEAD"})


async def registry(request: web.Request) -> web.StreamResponse:
    """Every ``/v2/`` route, in one function on purpose: a held request pays for every
    coroutine frame it sits in (errors are caught here rather than in a middleware for the same
    reason). The ``finally`` counts the answer (``kuik_proxy_requests_total``)."""
    host, operation, cache = "-", "-", "none"  # the metric's labels, as far as they are known
    response: web.StreamResponse | None = None
    pacer = request.app[PACER]
    early = admitted(request)  # admitted as aiohttp parsed it (web/fastpath.py): this one's
    try:
        if early is not None:  # located, classified and admitted then: carried out now
            held, ns = early
            host, operation = held.request.host, held.request.operation.value.capitalize()
            async with held as reply:
                cache = "hit" if reply.hit else "miss"
                response = await render(request, reply, ns)
            return response
        current = request.app[CURRENT]  # read once: a reload swaps it whole
        located, proxy_authorization = locate(request)
        target = located.target
        host, config = target.host, current.config
        ns = host if target.by_ns else None  # answered with OCI-Namespace (§3)
        if request.method not in READ_METHODS:
            response = await write_through(request, located, config)
        elif located.image is None:  # the /v2/ ping
            response = await ping(request, target, config.registry(host))
        else:
            asked = classify(
                request.method,
                request.headers,
                request.remote,
                located.image,
                query=located.query,
                config=config,
                flows=pacer.flow,
                paced=config.registry(host).paced,
                proxy_authorization=proxy_authorization,
                signer=pacer.signer(host),
            )
            operation, cache = asked.operation.value.capitalize(), "miss"
            async with pacer.read(asked, request.protocol) as reply:
                cache = "hit" if reply.hit else "miss"
                response = await render(request, reply, ns)
    except RegistryError as error:
        log.debug("%s %s: %s", request.method, request.path[:200], error.message)
        pacer.refused_now(None if host == "-" else host, error)
        response = error_response(error)
    except ConnectionError:  # its client left as its answer was written: nothing to answer
        log.debug("%s %s: the client left mid-answer", request.method, request.path[:200])
        raise  # aiohttp's protocol lets the connection go (web/fastpath.py's, at debug)
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path[:200])
        response = error_response(InternalError("internal error in kuikproxy"))
    finally:
        if early is not None:
            early[0].abandon()  # nothing if it was entered; else what admission gave, given up
        code = "cancelled" if response is None else str(response.status)
        request.app[ANSWERED].answered(host, operation, code, cache)
    return response


def locate(request: web.Request) -> tuple[Located, str | None]:
    """Where a request goes and what it reads (§3), and the ``Proxy-Authorization`` it came
    through the forward proxy with, if it did."""
    # from the raw line, not request.query: that one would stay cached on a held request
    url, write = request.rel_url, request.method not in READ_METHODS
    query, via = url.raw_query_string, None
    forwarding = request.app[FORWARDING]
    if forwarding is not None and (via := forwarding.via(request)) is not None:
        # a request that came through the proxy names its registry like ?ns= does (§13)
        query = f"ns={via.host}&{query}" if query else f"ns={via.host}"
    located = request.app[CURRENT].locator.locate(url.raw_path, query, request.host, write)
    return located, None if via is None else via.proxy_authorization


async def render(request: web.Request, reply: Reply, ns: str | None) -> web.StreamResponse:
    """What the runtime gave a read, to its client: whole, streamed as it arrives, or from the
    pull-through store's disk."""
    if reply.opened is not None:
        return await stream(request, reply.opened, ns)
    if reply.body is not None:
        return await send_body(request, reply.body, ns)
    if reply.shared is not None:
        return await send_shared(request, reply.shared, ns)
    assert reply.answer is not None
    response = answer_response(request, reply.answer, ns)
    if reply.stale:
        response.headers["Warning"] = STALE_WARNING
    return response


async def write_through(
    request: web.Request, located: Located, config: Config
) -> web.StreamResponse:
    """A write to a host kuik owns (``paced: false``): passed through with its body streamed;
    upload locations pointed back through kuikproxy the way the client addressed it."""
    target = located.target
    if config.registry(target.host).paced:
        raise Unsupported(f"{request.method}: kuikproxy only reads {target.host} (it is paced)")
    headers = forwarded(request.headers)
    if request.headers.get("Content-Length"):
        headers = (*headers, ("Content-Length", request.headers["Content-Length"]))
    body = request.content.iter_any() if request.body_exists else None
    ns = target.host if target.by_ns else None
    async with request.app[PACER].write(
        target.host,
        method=request.method,
        path=f"/v2/{target.route.repository}",
        query=[(k, v) for k, v in located.query if k != "ns"],
        headers=headers,
        body=body,
        relocate=lambda base: relocate(target, base),
    ) as opened:
        return await stream(request, opened, ns)


async def ping(
    request: web.Request, target: Target, settings: RegistrySettings
) -> web.StreamResponse:
    """``/v2/``: unpaced, the registry's answer (200, or 401 and its challenge) kept 60 s.

    A bare ``/v2/`` names no registry (it is ``defaultRegistry``'s): path-prefix mirrors
    (podman, skopeo) ask it before every pull and skip the mirror unless it answers 200 or 401,
    so when that registry cannot answer, kuikproxy does rather than make every other registry
    unusable through the mirror."""
    pacer = request.app[PACER]
    sent, timeout = forwarded(request.headers), settings.check.timeout or None
    try:
        answer = await pacer.ping(target.host, auth_key(request.headers), sent, timeout)
    except RegistryError:
        if not target.by_default:
            raise
        return web.json_response({}, headers=dict([API_VERSION]))
    return answer_response(request, answer, target.host if target.by_ns else None)


async def not_found(request: web.Request) -> web.StreamResponse:
    return error_response(NotFound(f"no such route {request.path[:200]!r}"))


async def healthz(request: web.Request) -> web.StreamResponse:
    return web.json_response({"status": "ok"})


def add_routes(
    router: web.UrlDispatcher, *, forward: bool, more: Iterable[web.RouteDef] = ()
) -> None:
    """The data path's routes, and ``more`` (what kuikproxy shows of itself) before the last
    one, which answers every other path 404."""
    router.register_resource(ProxyRequests(forward=forward))
    router.register_resource(RegistryPaths(registry))
    router.add_get("/healthz", healthz)
    router.add_get("/readyz", healthz)
    router.add_routes(more)
    router.add_route("*", "/{tail:.*}", not_found)
