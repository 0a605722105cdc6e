"""A sorted set of strings with O(log n) successor queries: a hold ring's due images, the
resources ready for a turn, the census's names.

Rings order images byte-wise and the scheduler's hot question is "the first due image after the
cursor". A plain sorted ``list`` answers it with ``bisect`` but pays O(n) to insert; a ``set``
inserts in O(1) but cannot answer it. This keeps the keys in sorted *chunks* of at most
``_CHUNK`` keys, with a parallel list of each chunk's last key: a lookup bisects the chunk maxima,
then the chunk (O(log n)); an insert or removal moves at most ``_CHUNK`` pointers. It is the
layout of ``sortedcontainers.SortedList``, reduced to what the core needs, so that the runtime
dependencies stay the ones the product names.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Iterator

_CHUNK = 512


class SortedSet:
    """Distinct strings in byte-wise order (Python ``str`` order is code-point order, which is
    the same order as UTF-8 bytes)."""

    __slots__ = ("_chunks", "_maxes", "_members")

    def __init__(self, keys: Iterable[str] = ()) -> None:
        self._members: set[str] = set()
        self._chunks: list[list[str]] = []
        self._maxes: list[str] = []
        if keys:
            self.update(keys)

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, key: object) -> bool:
        return key in self._members

    def __iter__(self) -> Iterator[str]:
        for chunk in self._chunks:
            yield from chunk

    def update(self, keys: Iterable[str]) -> None:
        """Add many keys at once: one sort and a rebuild, O((n + k) log(n + k))."""
        new = set(keys) - self._members
        if not new:
            return
        if len(new) < _CHUNK:
            for key in new:
                self.add(key)
            return
        self._members |= new
        ordered = sorted(self._members)
        self._chunks = [ordered[i : i + _CHUNK] for i in range(0, len(ordered), _CHUNK)]
        self._maxes = [chunk[-1] for chunk in self._chunks]

    def add(self, key: str) -> None:
        if key in self._members:
            return
        self._members.add(key)
        if not self._chunks:
            self._chunks.append([key])
            self._maxes.append(key)
            return
        i = bisect_left(self._maxes, key)
        if i == len(self._maxes):
            i -= 1
            self._chunks[i].append(key)
            self._maxes[i] = key
        else:
            insort(self._chunks[i], key)
        if len(self._chunks[i]) > 2 * _CHUNK:
            chunk = self._chunks[i]
            self._chunks[i : i + 1] = [chunk[:_CHUNK], chunk[_CHUNK:]]
            self._maxes[i : i + 1] = [chunk[_CHUNK - 1], chunk[-1]]

    def discard(self, key: str) -> None:
        if key not in self._members:
            return
        self._members.discard(key)
        i = bisect_left(self._maxes, key)
        chunk = self._chunks[i]
        del chunk[bisect_left(chunk, key)]
        if not chunk:
            del self._chunks[i]
            del self._maxes[i]
        else:
            self._maxes[i] = chunk[-1]

    def first(self) -> str | None:
        return self._chunks[0][0] if self._chunks else None

    def after(self, key: str | None) -> str | None:
        """The smallest key strictly greater than ``key`` (the first key when ``key`` is None)."""
        if key is None:
            return self.first()
        i = bisect_right(self._maxes, key)
        if i == len(self._maxes):
            return None
        chunk = self._chunks[i]
        return chunk[bisect_right(chunk, key)]

    def iter_after(self, key: str | None) -> Iterator[str]:
        """The keys greater than ``key`` (all keys when None), in order: one bisect, then a plain
        walk of the chunks. The set must not change while the iterator is in use."""
        i, j = 0, 0
        if key is not None:
            i = bisect_right(self._maxes, key)
            if i < len(self._chunks):
                j = bisect_right(self._chunks[i], key)
        chunks = self._chunks
        while i < len(chunks):
            chunk = chunks[i]
            while j < len(chunk):
                yield chunk[j]
                j += 1
            i += 1
            j = 0

    def rank(self, key: str) -> int:
        """How many keys are smaller than ``key``; O(number of chunks)."""
        i = bisect_left(self._maxes, key)
        before = sum(len(chunk) for chunk in self._chunks[:i])
        if i < len(self._chunks):
            before += bisect_left(self._chunks[i], key)
        return before
