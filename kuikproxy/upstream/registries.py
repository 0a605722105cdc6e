"""Talking to registry hosts: where each lives, how its TLS is checked, how kuikproxy signs in
to it, and where its redirects may lead.

Everything that leaves kuikproxy for a registry goes through :meth:`Registries.send`:

* the URL is the host's ``upstream`` (or ``https://<host>``), its TLS verified unless the host's
  ``tls`` says otherwise;
* a request that carries no ``Authorization`` of the client's is signed by kuikproxy: with a
  cached token for its scope when there is one, else sent as is and, on a ``401`` challenge,
  retried once with a token from the realm (with kuikproxy's own credentials for the host, or
  anonymously; each token request first waits for the host's ``OAuth`` quota, through the
  ``before_token`` hook) or Basic credentials. Answers read this way are shared by every
  client (R5); a client's own ``Authorization`` is passed through untouched and never mixed
  with kuikproxy's;
* redirects (blob storage) are followed here, at most :data:`MAX_REDIRECTS` hops, and an
  ``Authorization`` never crosses to another origin.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import replace

from yarl import URL

from kuikproxy.config import Config
from kuikproxy.errors import RegistryError, UpstreamUnreachable
from kuikproxy.upstream.auth import (
    Challenge,
    TokenCache,
    basic,
    load_credentials,
    parse_challenge,
    token_of,
)
from kuikproxy.upstream.client import Transport, UpstreamRequest, UpstreamResponse
from kuikproxy.upstream.guard import AddressGuard, Endpoint

log = logging.getLogger(__name__)

MAX_REDIRECTS = 5
MAX_TOKEN_ANSWER = 64 * 1024
TOKEN_TIMEOUT = 30.0
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
Headers = tuple[tuple[str, str], ...]
Observer = Callable[[str, str, int | None, Headers], None]
TokenGate = Callable[[str], Awaitable[None]]  # awaited before a token request to a host's realm


def trusted_endpoints(config: Config) -> set[Endpoint]:
    """The endpoints of explicit upstreams: the operator chose them, loopback included."""
    endpoints = set()
    for host in config.configured_hosts():
        upstream = config.registry(host).upstream
        if upstream is not None:
            url = URL(upstream)
            if url.host is not None and url.port is not None:
                endpoints.add((url.host, url.port))
    return endpoints


class Registries:
    def __init__(
        self,
        config: Config,
        transport: Transport,
        clock: Callable[[], float],
        guard: AddressGuard | None = None,
        observe: Observer | None = None,
        *,
        before_token: TokenGate | None = None,
    ) -> None:
        """``observe(host, method, status, headers)`` hears of every request sent and its
        answer (status None when no answer came): metrics count them, throttling reads them.
        ``before_token(host)`` is awaited before each token request kuikproxy sends for
        ``host``: the runtime holds it there until the host's ``OAuth`` buckets have a token
        (SPEC §11), as it holds a read until its buckets do."""
        self.transport = transport
        self._clock = clock
        self._guard = guard
        self._observe: Observer = observe or (lambda host, method, status, headers: None)
        self._before_token = before_token
        self._tokens = TokenCache()
        self._config = config
        self.configure(config)

    def configure(self, config: Config) -> None:
        """Take ``config`` (at start and at each reload): a host whose credentials or upstream
        changed forgets the tokens it had, which were not given for them."""
        old = self._config
        for host in {*old.registries, *config.registries}:
            before, after = old.registry(host), config.registry(host)
            if (before.credentials, before.upstream) != (after.credentials, after.upstream):
                self._tokens.forget(host)
        self._config = config
        self._tls: dict[str, ssl.SSLContext | bool] = {}
        if self._guard is not None:
            self._guard.trusted = trusted_endpoints(config)

    def base(self, host: str) -> URL:
        return URL(self._config.registry(host).upstream_url(host))

    def has_credentials(self, host: str) -> bool:
        return self._config.registry(host).credentials is not None

    def tls(self, host: str) -> ssl.SSLContext | bool:
        """How the host's certificate is checked: the system's roots, plus ``tls.caFile``, or
        not at all with ``tls.insecureSkipVerify``."""
        context = self._tls.get(host)
        if context is None:
            settings = self._config.registry(host).tls
            if settings.insecure_skip_verify:
                context = False
            elif settings.ca_file is not None:
                context = ssl.create_default_context()
                context.load_verify_locations(cafile=settings.ca_file)
            else:
                context = True
            self._tls[host] = context
        return context

    async def send(
        self,
        host: str,
        request: UpstreamRequest,
        *,
        authenticate: bool = True,
    ) -> UpstreamResponse:
        """Send ``request`` to ``host``; see the module's docstring for what is done on the way.
        ``authenticate=False`` relays a ``401`` as it is (the ``/v2/`` ping of a host kuikproxy
        holds no credentials for: clients must see the challenge to sign in themselves)."""
        client_auth = any(k.lower() == "authorization" for k, _ in request.headers)
        sign = authenticate and not client_auth
        scope = _scope_of(request.url)
        if sign and (auth := self._cached(host, scope)) is not None:
            request = _with_auth(request, auth)
        response = await self._follow(host, request)
        if sign and response.status == 401:
            header = response.headers.get("WWW-Authenticate", "")
            auth = await self._authorize(host, parse_challenge(header), scope, request.timeout)
            if auth is not None:
                response.release()
                response = await self._follow(host, _with_auth(request, auth))
        return response

    async def _follow(self, host: str, request: UpstreamRequest) -> UpstreamResponse:
        """Send, following redirects of reads; credentials stay with their origin."""
        request = replace(request, ssl=self.tls(host))
        origin = _origin(request.url)
        response = await self._send(host, request)
        for _ in range(MAX_REDIRECTS):
            location = response.headers.get("Location")
            if (
                response.status not in _REDIRECTS
                or location is None
                or request.method not in ("GET", "HEAD")
            ):
                return response
            response.release()
            target = request.url.join(URL(location))
            self._trust_beside(host, target)
            same = _origin(target) == origin
            headers = request.headers if same else _without_auth(request.headers)
            tls = self.tls(host) if same else True
            request = UpstreamRequest(request.method, target, headers, request.timeout, tls)
            response = await self._send(host, request)
        response.release()
        raise UpstreamUnreachable(f"{host}: more than {MAX_REDIRECTS} redirects")

    async def _send(self, host: str, request: UpstreamRequest) -> UpstreamResponse:
        """One request on the wire: counted, and logged by method and path only — headers
        (credentials) and queries (signed storage URLs) never reach a log."""
        where = f"{request.url.host}{request.url.path}"
        try:
            response = await self.transport.send(request)
        except RegistryError as error:
            self._observe(host, request.method, None, ())
            log.warning("%s: %s", host, error.message)  # the message names method and path
            raise
        self._observe(host, request.method, response.status, tuple(response.headers.items()))
        log.debug("%s: %s %s -> %d", host, request.method, where, response.status)
        return response

    def _trust_beside(self, host: str, named: URL) -> None:
        if self._guard is not None:
            self._guard.trust_beside(_endpoint(self.base(host)), _endpoint(named))

    def _cached(self, host: str, scope: str) -> str | None:
        token = self._tokens.get(host, scope, self._clock())
        if token is not None:
            return f"Bearer {token}"
        challenge = self._tokens.challenges.get(host)
        if challenge is not None and challenge.scheme == "basic":
            user = load_credentials(self._config.registry(host).credentials, host)
            return basic(*user) if user is not None else None
        return None

    async def _authorize(
        self, host: str, challenge: Challenge | None, scope: str, timeout: float | None
    ) -> str | None:
        """An ``Authorization`` answering ``challenge``, or None when there is none to give."""
        if challenge is None:
            return None
        self._tokens.challenges[host] = challenge
        user = load_credentials(self._config.registry(host).credentials, host)
        if challenge.scheme == "basic":
            return basic(*user) if user is not None else None
        if challenge.scheme != "bearer" or challenge.realm is None:
            return None
        realm = URL(challenge.realm)
        if realm.scheme not in ("http", "https") or realm.host is None:
            return None
        # credentials go over TLS, or to the same origin as a plain-http upstream chosen as such
        if (
            user is not None
            and realm.scheme != "https"
            and _origin(realm)[1] != self.base(host).host
        ):
            log.warning("%s: not sending credentials to plain-http realm %s", host, realm.host)
            user = None
        self._trust_beside(host, realm)
        query = {"service": challenge.params.get("service", host)}
        wanted = challenge.params.get("scope") or scope
        if wanted:
            query["scope"] = wanted
        headers: Headers = (("Authorization", basic(*user)),) if user is not None else ()
        token_request = UpstreamRequest(
            "GET", realm.update_query(query), headers, min(timeout or TOKEN_TIMEOUT, TOKEN_TIMEOUT)
        )
        if self._before_token is not None:
            await self._before_token(host)
        async with await self._follow(host, token_request) as answer:
            body = await answer.read(MAX_TOKEN_ANSWER)
            status = answer.status
        found = token_of(body) if status == 200 else None
        if found is None:
            log.warning("%s: the token realm %s answered %d", host, realm.host, status)
            return None
        token, lifetime = found
        self._tokens.put(host, scope, token, lifetime, self._clock())
        return f"Bearer {token}"


def _endpoint(url: URL) -> Endpoint:
    return (url.host or "", url.port or 0)


def _scope_of(url: URL) -> str:
    """The token scope a request needs: pull on its repository (``/v2/<repo>/...``)."""
    path = url.path
    for marker in ("/manifests/", "/blobs/", "/tags/", "/referrers/"):
        name, found, _ = path.partition(marker)
        if found and name.startswith("/v2/"):
            return f"repository:{name[len('/v2/') :]}:pull"
    return ""


def _origin(url: URL) -> tuple[str, str | None, int | None]:
    return (url.scheme, url.host, url.port)


def _without_auth(headers: Headers) -> Headers:
    return tuple((k, v) for k, v in headers if k.lower() != "authorization")


def _with_auth(request: UpstreamRequest, auth: str) -> UpstreamRequest:
    return replace(request, headers=(*_without_auth(request.headers), ("Authorization", auth)))
