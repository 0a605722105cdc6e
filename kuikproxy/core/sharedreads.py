"""When each image was last read for everyone, within ``cache.maxAge`` (R1 for prefetch, P7).

A prefetch walk skips an image read for everyone since the walk last went past it. Looked up one
image at a time, that is O(resources sharing the images) per window: each turn steps over what
every other resource read since its last turn. So the reads are also kept in the order they came
(``since``): everything read after a ring's last turn was read after its walk last went past any
image, so a run of the ring's images that equals a run of that log is skipped in one comparison
(:meth:`kuikproxy.core.rings.Ring.take`).
"""

from __future__ import annotations

from bisect import bisect_right

from kuikproxy.core.timedmap import TimedMap

_COMPACT = 1024  # log entries dropped from its front before the lists are shortened


class SharedReads:
    __slots__ = ("_at", "_head", "_keys", "_map", "_taken", "_until")

    def __init__(self) -> None:
        self._map: TimedMap[str, float] = TimedMap()
        # the log: keys (as rings store them), read times and deadlines, both never decreasing
        self._keys: list[bytes] = []
        self._at: list[float] = []
        self._until: list[float] = []
        self._head = 0  # entries before it have lapsed
        # the key of the image a prefetch turn took last, as its ring stores it (see ``taken``)
        self._taken: tuple[str, bytes] | None = None

    def taken(self, key: str, raw: bytes) -> None:
        """A prefetch turn took ``key``, which its ring stores as ``raw``. If the window's read
        is put here, the log holds that very object: rings whose walks step over it adopt it
        (:meth:`~kuikproxy.core.rings.Ring.take`), so rings that share images come to share
        their keys, and compare them by identity, without reading the bytes."""
        self._taken = (key, raw)

    def put(self, key: str, at: float, until: float, *, logged: bool = True) -> None:
        """``key`` was read for everyone at ``at``, kept until ``until``. Not ``logged`` (the
        host holds, nothing walks): a walk after a switch to prefetch finds it in the map, one
        image at a time, as it does any read missing from the log."""
        self._map.put(key, at, until)
        if not logged:
            return
        if self._at and (at < self._at[-1] or until < self._until[-1]):
            # a shorter cache.maxAge (a reload): the log's deadlines must not decrease, so it
            # starts again; the map alone still answers every lookup
            self._keys, self._at, self._until, self._head = [], [], [], 0
        taken = self._taken
        self._keys.append(taken[1] if taken is not None and taken[0] == key else key.encode())
        self._at.append(at)
        self._until.append(until)

    def get(self, key: str, now: float) -> float | None:
        return self._map.get(key, now)

    def prune(self, now: float) -> None:
        self._map.prune(now)
        head = bisect_right(self._until, now, self._head)
        if head > _COMPACT and head * 2 > len(self._keys):
            del self._keys[:head], self._at[:head], self._until[:head]
            head = 0
        self._head = head

    def since(self, after: float, now: float) -> tuple[list[bytes], int]:
        """The log, and the index of its first read after ``after`` that ``get`` still returns
        at ``now``: every read from there on is one too (times and deadlines never decrease)."""
        start = max(
            bisect_right(self._at, after, self._head), bisect_right(self._until, now, self._head)
        )
        return self._keys, start


def run_length(keys: list[bytes], j: int, log: list[bytes], i: int, most: int) -> int:
    """How many of ``keys`` from ``j`` equal ``log`` from ``i`` (at least one, at most
    ``most``). List comparisons are C loops that stop at the first difference: one for the
    whole, else blocks that double while they match, then halve into the one that does not,
    so the cost stays proportional to the run, not to its square."""
    if keys[j : j + most] == log[i : i + most]:
        return most
    same, size = 0, 1
    while keys[j + same : j + same + size] == log[i + same : i + same + size]:
        same += size
        size = min(2 * size, most - same)
    while size > 1:  # the first difference is among the ``size`` after ``same``
        half = size // 2
        if keys[j + same : j + same + half] == log[i + same : i + same + half]:
            same, size = same + half, size - half
        else:
            size = half
    return same
