"""Kept answers (R1), bounded and least-recently-used first out (R6).

An entry is one answer per (host, image, method, owner — whose it is, R5): a HEAD and a GET
answer of the same image are kept side by side, since a HEAD answer never serves a GET (R3).
Lookups apply R3 and R5 and return the newest answer that may serve the request; whether it is
fresh enough for that resource is the scheduler's question (R1), asked with its ``read_at``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from kuikproxy.config import Config
from kuikproxy.core.memorybudget import Bound
from kuikproxy.core.reuse import owners_serving
from kuikproxy.runtime.messages import Answer, RegistryRequest

_Key = tuple[str, str, str, str | None]


@dataclass(frozen=True, slots=True)
class Unserved:
    """A check the kept answers did not serve at once (R1), with what the look-up found: its
    admission uses that instead of looking again (one look-up per request)."""

    found: Answer | None


def kept_bounds(config: Config) -> tuple[int, int, int]:
    """``maxEntries``, ``maxBytes`` and ``maxRefusals``: as written, or sized from the budget."""
    budget = config.budget()
    return (
        budget.value(Bound.KEPT_ENTRIES),
        budget.value(Bound.KEPT_BYTES),
        budget.value(Bound.REFUSALS),
    )


class KeptAnswers:
    def __init__(self, max_entries: int, max_bytes: int, max_refusals: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_refusals = max_refusals
        self._entries: OrderedDict[_Key, Answer] = OrderedDict()
        # the kept refusals' keys, oldest first: a name that does not exist costs a client
        # nothing to make, so refusals have a bound of their own inside the entries'
        self._refusals: OrderedDict[_Key, None] = OrderedDict()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    def keep(self, host: str, image_key: str, answer: Answer) -> None:
        kept = answer.kept()
        if kept.size > self.max_bytes:
            return
        key = (host, image_key, kept.method, kept.owner)
        self._drop(key)
        self._entries[key] = kept
        self.bytes += kept.size
        if kept.status != 200:
            self._refusals[key] = None
        self._shrink()

    @property
    def refusals(self) -> int:
        """Kept refusals (401, 403, 404) among the entries."""
        return len(self._refusals)

    def resize(self, max_entries: int, max_bytes: int, max_refusals: int) -> None:
        """New bounds (a reload): the least recently used answers go until it fits."""
        self.max_entries, self.max_bytes, self.max_refusals = max_entries, max_bytes, max_refusals
        self._shrink()

    def _drop(self, key: _Key) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.size
            self._refusals.pop(key, None)

    def _shrink(self) -> None:
        while len(self._refusals) > self.max_refusals:
            self._drop(next(iter(self._refusals)))
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def find(self, request: RegistryRequest) -> Answer | None:
        """The newest kept answer that may serve ``request`` (R3, R5), marked recently used."""
        best: tuple[_Key, Answer] | None = None
        host, image_key = request.host, request.image.key
        for method, auth in lookups(request):
            key = (host, image_key, method, auth)
            answer = self._entries.get(key)
            if (
                answer is not None
                and answer.may_serve(request)
                and (best is None or answer.read_at > best[1].read_at)
            ):
                best = (key, answer)
        if best is None:
            return None
        self._entries.move_to_end(best[0])
        return best[1]

    def count(self, hit: bool) -> None:
        if hit:
            self.hits += 1
        else:
            self.misses += 1


def lookups(request: RegistryRequest) -> list[tuple[str, str | None]]:
    """The (method, owner) of the kept answers that may serve ``request``: a GET's serves a
    HEAD too (R3); shared ones, and the client's own (R5)."""
    methods = ("GET", "HEAD") if request.method == "HEAD" else ("GET",)
    owners = owners_serving(request.auth, request.signer)
    return [(method, owner) for method in methods for owner in owners]
