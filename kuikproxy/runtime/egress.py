"""The one way a request leaves for a registry, and what the registry client saw on the way.

Every registry request goes through :meth:`Egress.send`: the registry client sends it (signing
in, following redirects: :mod:`kuikproxy.upstream.registries`) and writes down what each answer
on the wire said, a redirect's and a token realm's too; when the send ends the runtime reads
those here — the host's throttling hears each one (§11), and each is counted by host, method and
status (``kuik_registry_upstream_requests_total``). The client waits on nothing of the runtime:
a read it can sign only with a token from the host's realm comes back as a
:class:`~kuikproxy.upstream.registries.SignIn`, and the token is asked for here, once the
host's ``OAuth`` quota lets it (§11).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from kuikproxy.core.digests import Content
from kuikproxy.runtime.messages import Opened
from kuikproxy.upstream.client import UpstreamRequest, UpstreamResponse, end_to_end
from kuikproxy.upstream.registries import Headers, Registries, SignIn

NO_HOST = "-"  # the registry label of requests to hosts without series of their own


class Egress:
    """The registry client, and the runtime's side of what it saw."""

    __slots__ = ("_heard", "_known", "_oauth", "registries", "sent")

    def __init__(
        self,
        registries: Registries,
        *,
        heard: Callable[[str, str, int | None, Headers], None],
        known: Callable[[str], bool],
        oauth: Callable[[str], Awaitable[None]],
    ) -> None:
        """``heard``: the throttling's ear for every answer; ``known(host)``: whether the host
        has series of its own (else its requests count under :data:`NO_HOST`); ``oauth(host)``:
        until the host's quota lets kuikproxy ask its realm for a token."""
        self.registries = registries
        self._heard = heard
        self._known = known
        self._oauth = oauth
        # requests sent, by (registry label, method, status or "error"): the metrics read them
        self.sent: dict[tuple[str, str, str], int] = {}

    @asynccontextmanager
    async def send(
        self,
        host: str,
        request: UpstreamRequest,
        *,
        content: Content | None = None,
        authenticate: bool = True,
    ) -> AsyncIterator[Opened]:
        """Send ``request`` to ``host``; the answer is open inside the block, released after."""
        registries = self.registries
        try:
            sent = await registries.send(host, request, authenticate=authenticate)
            if isinstance(sent, SignIn):
                sent = await self._signed_in(sent)
        finally:
            self._read_what_was_heard()
        async with sent as response:
            headers = end_to_end(response.headers)
            opened = Opened(host, response.status, headers, content, response)
            try:
                yield opened
            finally:
                # what it would let go of refers to its read, whose stack holds this frame:
                # a cycle, broken here rather than left to the collector
                opened.paced = None

    async def _signed_in(self, sign_in: SignIn) -> UpstreamResponse:
        try:
            await self._oauth(sign_in.host)
        except BaseException:
            sign_in.challenged.release()
            raise
        return await self.registries.signed_in(sign_in)

    def _read_what_was_heard(self) -> None:
        registries = self.registries
        heard, registries.heard = registries.heard, []
        sent, known = self.sent, self._known
        for host, method, status, headers in heard:
            self._heard(host, method, status, headers)
            code = "error" if status is None else str(status)
            key = (host if known(host) else NO_HOST, method, code)
            sent[key] = sent.get(key, 0) + 1

    def forget(self, host: str) -> None:
        """The host's state was let go of: so are its counts (a wildcard's hosts come and go)."""
        for key in [k for k in self.sent if k[0] == host]:
            del self.sent[key]
