"""Talking to registry hosts: where each lives, how its TLS is checked, how kuikproxy signs in
to it, and where its redirects may lead.

Everything that leaves kuikproxy for a registry goes through :meth:`Registries.send`:

* the URL is the host's ``upstream`` (or ``https://<host>``), its TLS verified unless the host's
  ``tls`` says otherwise;
* a request that carries no ``Authorization`` of the client's is signed by kuikproxy: with a
  cached token for its scope when there is one, else sent as is and, on a ``401`` challenge,
  retried once with a token from the realm (with kuikproxy's own credentials for the host, or
  anonymously) or Basic credentials. A token request is not made by :meth:`Registries.send`:
  it answers a :class:`SignIn` instead, for its caller to make once the host's ``OAuth`` quota
  lets it (:meth:`Registries.signed_in`): the client waits on nothing of its callers'. Answers
  read this way are shared by every client (R5); a client's own ``Authorization`` is passed
  through untouched and never mixed with kuikproxy's;
* redirects (blob storage) are followed here, at most :data:`MAX_REDIRECTS` hops, and an
  ``Authorization`` never crosses to another origin;
* a redirect is followed only to a well-formed http(s) URL without userinfo, and through the
  same address guard as a registry (SPEC §3.1): its target may be a loopback, link-local or
  metadata address only when that very endpoint is an explicit ``upstream`` of the
  configuration. Anything else is a prompt ``502`` saying why (the client's host is allowed:
  what the registry sent kuikproxy to is what cannot be used).

Token realms differ in one way: a trusted registry may name another port of its own host for
its realm (a registry and its token server side by side on one machine is common), and token
requests may go there (:meth:`AddressGuard.trust_realm`). A realm's answer is read for a token
and never relayed to a client, so the realm cannot be used to read a local service; a
redirect's answer is relayed, so a redirect never reaches such an endpoint on the registry's
say-so — token requests use connections of their own (:class:`AiohttpTransport`).

URLs reach messages and log lines through :func:`shown` only: never a query (signed storage
URLs, tokens) or userinfo.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass, replace

from yarl import URL

from kuikproxy.config import Config
from kuikproxy.core.images import READ_KINDS
from kuikproxy.errors import RegistryError, UpstreamTimeout, UpstreamUnreachable
from kuikproxy.upstream.auth import (
    Challenge,
    TokenCache,
    basic,
    load_credentials,
    parse_challenge,
    signer_of,
    token_of,
)
from kuikproxy.upstream.client import Transport, UpstreamRequest, UpstreamResponse, shown
from kuikproxy.upstream.guard import AddressGuard, Endpoint

log = logging.getLogger(__name__)

MAX_REDIRECTS = 5
MAX_TOKEN_ANSWER = 64 * 1024
MAX_SIGNERS = 1024
TOKEN_TIMEOUT = 30.0
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_BAD_PORT = "a port that is not a number from 1 to 65535"
Headers = tuple[tuple[str, str], ...]
# what one answer on the wire said: host, method, status (None: no answer came), headers
Heard = tuple[str, str, int | None, Headers]


@dataclass(frozen=True, slots=True)
class SignIn:
    """A read the registry challenged, that a token from its realm would sign: the challenge's
    answer (``challenged``, open until :meth:`Registries.signed_in`), and what to send."""

    host: str
    request: UpstreamRequest
    token_request: UpstreamRequest
    scope: str
    challenged: UpstreamResponse


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
    ) -> None:
        """Every answer on the wire (a redirect's, a token realm's too) is written down in
        :attr:`heard`, for the runtime to read (its throttling, its counts) when a send ends."""
        self.transport = transport
        self._clock = clock
        self._guard = guard
        self.heard: list[Heard] = []
        self._tokens = TokenCache()
        self._config = config
        # the reads the registries were sent, by kind: what a registry's own log counts (a read
        # signed in after a challenge is two), for an operator to compare with its count
        self.reads: dict[str, int] = dict.fromkeys(READ_KINDS, 0)
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
        self._tls: dict[str, ssl.SSLContext] = {}
        self._signers: dict[str, str | None] = {}
        if self._guard is not None:
            self._guard.configure(trusted_endpoints(config))

    def kept_per_host(self) -> tuple[int, int]:
        """How many TLS contexts and signers' fingerprints it keeps (bounded: hosts under a
        wildcard come and go)."""
        return len(self._tls), len(self._signers)

    def base(self, host: str) -> URL:
        return URL(self._config.registry(host).upstream_url(host))

    def has_credentials(self, host: str) -> bool:
        return self._config.registry(host).credentials is not None

    def signer(self, host: str) -> str | None:
        """The fingerprint of the credentials kuikproxy signs ``host``'s requests with (R5), None
        when it holds none; read once per configuration (a rotated secret file keeps the
        fingerprint until the next reload: answers stay with the account, not the password)."""
        credentials = self._config.registry(host).credentials
        if credentials is None:
            return None
        signers = self._signers
        if host not in signers:
            if len(signers) >= MAX_SIGNERS:  # hosts under a wildcard with default credentials
                signers.clear()
            signers[host] = signer_of(credentials, host)
        return signers[host]

    def tls(self, host: str) -> ssl.SSLContext | bool:
        """How the host's certificate is checked: the system's roots, plus ``tls.caFile``, or
        not at all with ``tls.insecureSkipVerify``."""
        settings = self._config.registry(host).tls
        if settings.insecure_skip_verify:
            return False
        if settings.ca_file is None:
            return True
        # kept per CA file, not per host: hosts under a wildcard share the default's
        context = self._tls.get(settings.ca_file)
        if context is None:
            context = self._tls[settings.ca_file] = ssl.create_default_context()
            context.load_verify_locations(cafile=settings.ca_file)
        return context

    async def send(
        self,
        host: str,
        request: UpstreamRequest,
        *,
        authenticate: bool = True,
    ) -> UpstreamResponse | SignIn:
        """Send ``request`` to ``host``; see the module's docstring for what is done on the way.
        ``authenticate=False`` relays a ``401`` as it is (the ``/v2/`` ping of a host kuikproxy
        holds no credentials for: clients must see the challenge to sign in themselves). A
        :class:`SignIn` when a token from the host's realm is what the read needs."""
        client_auth = any(k.lower() == "authorization" for k, _ in request.headers)
        sign = authenticate and not client_auth
        scope = _scope_of(request.url)
        if sign and (auth := self._cached(host, scope)) is not None:
            request = _with_auth(request, auth)
        response = await self._follow(host, request)
        if sign and response.status == 401:
            header = response.headers.get("WWW-Authenticate", "")
            wanted = self._authorize(host, parse_challenge(header), scope, request.timeout)
            if isinstance(wanted, UpstreamRequest):
                return SignIn(host, request, wanted, scope, response)
            if wanted is not None:
                response.release()
                response = await self._follow(host, _with_auth(request, wanted))
        return response

    async def signed_in(self, sign_in: SignIn) -> UpstreamResponse:
        """The challenged read sent again with a token from the host's realm; the challenge's
        answer as it came when the realm gives none."""
        host, challenged = sign_in.host, sign_in.challenged
        try:
            async with await self._follow(host, sign_in.token_request, "token realm") as answer:
                body = await answer.read(MAX_TOKEN_ANSWER)
                status = answer.status
        except BaseException:
            challenged.release()
            raise
        found = token_of(body) if status == 200 else None
        if found is None:
            realm = sign_in.token_request.url.host
            log.warning("%s: the token realm %s answered %d", host, realm, status)
            return challenged
        token, lifetime = found
        self._tokens.put(host, sign_in.scope, token, lifetime, self._clock())
        challenged.release()
        return await self._follow(host, _with_auth(sign_in.request, f"Bearer {token}"))

    async def _follow(
        self, host: str, request: UpstreamRequest, via: str | None = None
    ) -> UpstreamResponse:
        """Send, following redirects of reads; credentials stay with their origin. ``via``
        says where ``request`` goes when it is not to the host's registry (its token realm)."""
        request = replace(request, ssl=self.tls(host))
        origin = _origin(request.url)
        response = await self._send(host, request, via)
        for _ in range(MAX_REDIRECTS):
            location = response.headers.get("Location")
            if (
                response.status not in _REDIRECTS
                or location is None
                or request.method not in ("GET", "HEAD")
            ):
                return response
            response.release()
            target = _redirect_target(host, request.url, location)
            same = _origin(target) == origin
            headers = request.headers if same else _without_auth(request.headers)
            tls = self.tls(host) if same else True
            request = UpstreamRequest(request.method, target, headers, request.timeout, tls)
            response = await self._send(host, request, "redirected")
        response.release()
        raise UpstreamUnreachable(f"{host}: more than {MAX_REDIRECTS} redirects")

    async def _send(
        self, host: str, request: UpstreamRequest, via: str | None = None
    ) -> UpstreamResponse:
        """One request on the wire: counted, and logged by method and :func:`shown` URL only
        — headers (credentials) and queries (signed storage URLs) never reach a log. A failure
        where the registry sent kuikproxy (``via``: a redirect, a realm) is the registry's
        (502, or 504 for a timeout), named by host: its client's host is allowed."""
        if request.kind is not None and via is None:
            self.reads[request.kind] += 1
        try:
            response = await self.transport.send(request)
        except RegistryError as error:
            self.heard.append((host, request.method, None, ()))
            log.warning("%s: %s", host, error.message)  # the message names method and URL
            if via is None:
                raise
            kind = UpstreamTimeout if isinstance(error, UpstreamTimeout) else UpstreamUnreachable
            raise kind(f"{host}: {via}: {error.message}", refusal=error.refusal) from error
        self.heard.append((host, request.method, response.status, tuple(response.headers.items())))
        log.debug("%s: %s %s -> %d", host, request.method, shown(request.url), response.status)
        return response

    def _cached(self, host: str, scope: str) -> str | None:
        token = self._tokens.get(host, scope, self._clock())
        if token is not None:
            return f"Bearer {token}"
        challenge = self._tokens.challenges.get(host)
        if challenge is not None and challenge.scheme == "basic":
            user = load_credentials(self._config.registry(host).credentials, host)
            return basic(*user) if user is not None else None
        return None

    def _authorize(
        self, host: str, challenge: Challenge | None, scope: str, timeout: float | None
    ) -> str | UpstreamRequest | None:
        """An ``Authorization`` answering ``challenge``, the token request that would get one,
        or None when there is none to give."""
        if challenge is None:
            return None
        self._tokens.challenged(host, challenge)
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
        if self._guard is not None:
            self._guard.trust_realm(_endpoint(self.base(host)), _endpoint(realm))
        query = {"service": challenge.params.get("service", host)}
        wanted = challenge.params.get("scope") or scope
        if wanted:
            query["scope"] = wanted
        headers: Headers = (("Authorization", basic(*user)),) if user is not None else ()
        return UpstreamRequest(
            "GET",
            realm.update_query(query),
            headers,
            min(timeout or TOKEN_TIMEOUT, TOKEN_TIMEOUT),
            realm=True,
        )


def _endpoint(url: URL) -> Endpoint:
    return (url.host or "", url.port or 0)


def _redirect_target(host: str, current: URL, location: str) -> URL:
    """Where ``location`` sends a read of ``current``, or a 502 saying why it is not followed.
    The Location itself is never echoed: its query may be a signature, and a URL too broken to
    parse cannot be shown without it."""

    def refused(why: str) -> UpstreamUnreachable:
        error = UpstreamUnreachable(f"{host}: redirect not followed: {why}")
        log.warning("%s", error.message)  # as a failure on the wire is (_send)
        return error

    if not location:
        raise refused("an empty Location")
    # RFC 3986 has no room for them, and yarl would quietly drop some (CR, LF, tab)
    if any(c.isspace() or not c.isprintable() for c in location):
        raise refused("a malformed Location (whitespace or a control character)")
    try:
        named = URL(location)
        target = current.join(named)
        port = target.port
    except ValueError as error:  # yarl's message may quote the authority, userinfo and all
        why = _BAD_PORT if "port" in str(error).lower() else "a malformed Location"
        raise refused(why) from None
    if target.scheme not in ("http", "https"):
        raise refused(f"a {target.scheme}: URL (only http and https are followed)")
    if (named.scheme or location.startswith("//")) and not named.host:
        raise refused("a Location with no host")
    if "@" in (named.raw_authority or ""):  # RFC 9110 §4.2.4: treat userinfo as an error
        raise refused("a Location with userinfo")
    if not port:
        raise refused(_BAD_PORT)
    return target


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
