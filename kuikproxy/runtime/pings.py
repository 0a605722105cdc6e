"""Each host's ``/v2/`` answer, kept a minute per whose it is (§4.1, R5).

A ping answered ``200`` to a client's own ``Authorization`` says nothing of what an anonymous
client may do, and an anonymous ``401`` must not stop a client that brings credentials from
signing in (``skopeo login`` through kuikproxy): pings are kept under the owner key R5 keeps
answers under and given out by the same rule (:func:`~kuikproxy.core.reuse.shared_with`). Only
what :meth:`Answer.kept` keeps is given to anyone but the client whose ping was sent. Keys are
made by clients (every new ``Authorization`` is one), so the store is bounded, oldest out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from kuikproxy.core.reuse import owners_serving, shared_with
from kuikproxy.errors import UpstreamUnreachable
from kuikproxy.runtime.egress import Egress
from kuikproxy.runtime.messages import Answer, Headers
from kuikproxy.upstream.client import UpstreamRequest

PING_TTL = 60.0  # §4.1
MAX_PINGS = 4096
KEPT_PING_STATUSES = frozenset({200, 401})
MAX_PING_BODY = 64 * 1024


class KeptPings:
    def __init__(self, ttl: float = PING_TTL, max_entries: int = MAX_PINGS) -> None:
        self.ttl = ttl
        self.max_entries = max_entries
        self._entries: OrderedDict[tuple[str, str | None], Answer] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def find(self, host: str, auth: str | None, signer: str | None, now: float) -> Answer | None:
        """The newest ping answer kept for ``host`` that a client with ``auth`` (and kuikproxy
        signing with ``signer``) may be given, younger than the TTL."""
        best: Answer | None = None
        for owner in owners_serving(auth, signer):
            answer = self._entries.get((host, owner))
            if (
                answer is not None
                and now - answer.read_at < self.ttl
                and shared_with(answer.auth, answer.signer, answer.status, auth, signer)
                and (best is None or answer.read_at > best.read_at)
            ):
                best = answer
        return best

    def keep(self, host: str, answer: Answer) -> None:
        """Keep a ping answer (200 or 401 only: anything else is asked again next time)."""
        if answer.status not in KEPT_PING_STATUSES:
            return
        key = (host, answer.owner)
        self._entries.pop(key, None)
        self._entries[key] = answer.kept()
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)


class Pings:
    """``/v2/``: unpaced, the registry's answer (200, or 401 and its challenge) kept a minute."""

    def __init__(self, egress: Egress, clock: Callable[[], float]) -> None:
        self.egress = egress
        self.clock = clock
        self.kept = KeptPings()

    async def ping(
        self, host: str, auth: str | None, sent: Headers, timeout: float | None
    ) -> Answer:
        """``host``'s answer to a client's ping (``auth``: the key of its ``Authorization``),
        kept or read now. kuikproxy signs in for clients only where it holds credentials;
        elsewhere clients must see the registry's challenge to sign in themselves
        (docs/decisions.md). A registry that fails (5xx) is unreachable, not an answer."""
        registries, now = self.egress.registries, self.clock()
        signed = registries.has_credentials(host)
        signer = registries.signer(host) if signed else None
        kept = self.kept.find(host, auth, signer, now)
        if kept is not None:
            return kept
        url = registries.base(host).with_path("/v2/")
        upstream = UpstreamRequest("GET", url, sent, timeout)
        async with self.egress.send(host, upstream, authenticate=signed) as answered:
            headers = tuple(answered.headers.items())
            body = await answered.read(MAX_PING_BODY)
        if answered.status >= 500:
            raise UpstreamUnreachable(f"{host} answered /v2/ with {answered.status}")
        answer = Answer(answered.status, headers, body, "GET", now, auth, None if auth else signer)
        self.kept.keep(host, answer)
        return answer  # whole to this client: its own cookies
