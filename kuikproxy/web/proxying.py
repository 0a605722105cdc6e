"""Resources matched before aiohttp's path index: requests that ask for a forward proxy, refused
unless kuikproxy is one (§13), and the registry API's paths.

``CONNECT host:port`` (authority-form) and ``OPTIONS *`` (asterisk-form) name no path, so no
path route can ever match them, and absolute-form requests (``GET http://host/...``) must not be
read as if they were addressed to kuikproxy. Without ``forwardProxy.enabled`` they are all
``405 UNSUPPORTED``, whatever host they name, before any connection. With it, ``CONNECT`` never
gets here (:mod:`kuikproxy.forward.front` takes it) and absolute-form requests are routed by
their path like any other: the registry handler reads their host as the registry.

aiohttp's router looks at rule-matched sub-application resources before its path index, for
every request; this resource is one of those, and matches these requests only.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.web_urldispatcher import (
    Domain,
    MatchedSubAppResource,
    ResourceRoute,
    UrlMappingMatchInfo,
)

from kuikproxy.errors import Unsupported
from kuikproxy.web.oci import error_response

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def asks_for_a_proxy(request: web.Request) -> bool:
    return request.method == "CONNECT" or not request.raw_path.startswith("/")


async def refuse(request: web.Request) -> web.StreamResponse:
    return error_response(
        Unsupported(f"{request.method} to another host: kuikproxy is not a forward proxy")
    )


class ProxyRequests(MatchedSubAppResource):
    """Matches the requests :func:`asks_for_a_proxy` and answers them with :func:`refuse`;
    as a forward proxy, only those that name no path."""

    def __init__(self, forward: bool = False) -> None:
        # the rule and application are placeholders: resolve() below decides alone
        super().__init__(Domain("proxy.invalid"), web.Application())
        self._route = ResourceRoute("*", refuse, self)
        self._forward = forward

    async def resolve(self, request: web.Request) -> tuple[UrlMappingMatchInfo | None, set[str]]:
        forwarded = self._forward and request.rel_url.raw_path.startswith("/")
        if asks_for_a_proxy(request) and not forwarded:
            return UrlMappingMatchInfo({}, self._route), {request.method}
        return None, set()


class RegistryPaths(MatchedSubAppResource):
    """Every ``/v2`` path, for ``handler``: matched before aiohttp's path index, which walks a
    path's prefixes and runs the route's regular expression — on a kept answer, more than the
    handler's own bookkeeping. Registered after :class:`ProxyRequests`, which keeps its say."""

    def __init__(self, handler: Handler) -> None:
        super().__init__(Domain("registry.invalid"), web.Application())
        self._route = ResourceRoute("*", handler, self)

    async def resolve(self, request: web.Request) -> tuple[UrlMappingMatchInfo | None, set[str]]:
        if request.rel_url.raw_path.startswith("/v2"):
            return UrlMappingMatchInfo({}, self._route), {request.method}
        return None, set()
