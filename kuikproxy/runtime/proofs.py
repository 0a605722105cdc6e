"""Proofs of access (R5): who was answered 200 for a manifest of which repository, lately.

Registries hand every client a token of its own, so two nodes pulling one private image never
send the identical ``Authorization``: the identical header alone would share nothing of what
one of them read. A client that was answered 200 for a manifest of a repository has shown the
registry lets it read there; for ``copy.followUp`` after that, content by digest of that
repository read by someone else may be given to it — from the pull-through store (§15) or from
a read of it in flight (R2).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from kuikproxy.core.reuse import owner_key
from kuikproxy.runtime.messages import RegistryRequest

MAX_PROOFS = 100_000  # (host, repository, whose) proofs of access kept at once, oldest out
_Proof = tuple[str, str, str | None]


class Proofs:
    """The proofs of access of the last ``copy.followUp`` of each host, bounded."""

    __slots__ = ("_follow_up", "_proofs")

    def __init__(self, follow_up: Callable[[str], float]) -> None:
        self._follow_up = follow_up  # a host's ``copy.followUp`` in force (a reload swaps it)
        self._proofs: OrderedDict[_Proof, float] = OrderedDict()  # → monotonic time

    def __len__(self) -> int:
        return len(self._proofs)

    def proved(self, request: RegistryRequest) -> None:
        """``request`` was given a 200 manifest of its repository: whoever sent it may read that
        repository's content (R5), for ``copy.followUp``."""
        key = (request.host, request.image.repository, owner_key(request.auth, request.signer))
        proofs = self._proofs
        proofs[key] = time.monotonic()
        proofs.move_to_end(key)
        if len(proofs) > MAX_PROOFS:
            proofs.popitem(last=False)

    def holds(self, request: RegistryRequest) -> bool:
        """Whether whoever sent ``request`` proved access to its repository lately."""
        if not self._proofs:
            return False
        key = (request.host, request.image.repository, owner_key(request.auth, request.signer))
        at = self._proofs.get(key)
        return at is not None and time.monotonic() - at < self._follow_up(request.host)
