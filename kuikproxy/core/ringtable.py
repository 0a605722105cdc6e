"""A ring's images stored by column: sorted chunks of keys and parallel arrays (P5, P8).

Why columns: ten million ring entries held as objects (a key ``str``, an entry object, an
ordered-dict slot and a sorted-set slot each) cost ~272 B apiece. Here an image costs its key as
``bytes`` (64 B for a 30-character key; UTF-8 order is the byte-wise order rings use), one list
slot, and 32 B of arrays: its lap, its place in last-asked order, when it was last asked,
answered and walked past. No per-image object is tracked by the cyclic GC.

Keys sit in sorted chunks of at most ``2 × _CHUNK`` with a list of each chunk's last key, as in
:mod:`kuikproxy.core.sortedset`: a lookup is two bisects. The last-asked order (retention, P8) is
a counter stamped on each ask (``seqs``); expiry and the oldest ask scan the ``asked`` and
``seqs`` arrays (C loops, ~10 ns an image), which they need only when an image's retention ends.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Collection, Iterable

from kuikproxy.core.ringstate import EntryState

_CHUNK = 512
_SEQ_LIMIT = 2**32 - 1  # seqs are unsigned 32-bit: renumbered, in order, before they overflow
UNSET = float("-inf")
"""A time never set (never answered, never walked past): below every time, so ``read <= passed``
is false for it, as it must be (any read for everyone spares an image never walked past)."""

Row = tuple[str, int, float, float]  # key, lap, asked, answered: what a restart keeps


class Chunk:
    __slots__ = ("answered", "asked", "keys", "laps", "passed", "seqs")

    def __init__(
        self, keys: list[bytes], laps: array[int], seqs: array[int], asked: array[float]
    ) -> None:
        self.keys = keys
        self.laps = laps  # the last lap each image was done in
        self.seqs = seqs  # last-asked order
        self.asked = asked
        self.answered = array("d", [UNSET]) * len(keys)
        self.passed = array("d", [UNSET]) * len(keys)  # prefetch: when the walk last went past

    def undone(self, start: int, stop: int, lap: int) -> list[str]:
        """The images ``start:stop`` not done in ``lap``."""
        laps = self.laps[start:stop]
        return [
            k.decode() for k, done in zip(self.keys[start:stop], laps, strict=True) if done < lap
        ]

    def walked_past(self, start: int, stop: int, lap: int, now: float) -> None:
        """Images ``start:stop`` are done in ``lap``, walked past at ``now``."""
        self.laps[start:stop] = array("i", [lap]) * (stop - start)
        self.passed[start:stop] = array("d", [now]) * (stop - start)

    def split(self) -> Chunk:
        """Move the upper half into a new chunk, returned."""
        half = len(self.keys) // 2
        upper = Chunk(self.keys[half:], self.laps[half:], self.seqs[half:], self.asked[half:])
        upper.answered, upper.passed = self.answered[half:], self.passed[half:]
        del self.keys[half:], self.laps[half:], self.seqs[half:], self.asked[half:]
        del self.answered[half:], self.passed[half:]
        return upper


class Table:
    __slots__ = ("_hit", "_hit_key", "_seq", "_size", "chunks", "maxes", "version")

    def __init__(self) -> None:
        self.chunks: list[Chunk] = []
        self.maxes: list[bytes] = []
        self._size = 0
        self._seq = 0
        self.version = 0  # counts the changes that move images between places
        # the last image found: a request's check asks about one image several times in a row
        self._hit_key: str | None = None
        self._hit: tuple[Chunk, int] | None = None

    def __len__(self) -> int:
        return self._size

    def find(self, key: str) -> tuple[Chunk, int] | None:
        if key == self._hit_key:
            return self._hit
        raw = key.encode()
        i = bisect_left(self.maxes, raw)
        if i == len(self.maxes):
            return None
        chunk = self.chunks[i]
        j = bisect_left(chunk.keys, raw)
        if chunk.keys[j] != raw:
            return None
        self._hit_key, self._hit = key, (chunk, j)
        return self._hit

    def _next_seq(self) -> int:
        if self._seq >= _SEQ_LIMIT:
            self._renumber()
        seq = self._seq
        self._seq = seq + 1
        return seq

    def _renumber(self) -> None:
        order = sorted((s, c, j) for c in self.chunks for j, s in enumerate(c.seqs))
        for n, (_, chunk, j) in enumerate(order):
            chunk.seqs[j] = n
        self._seq = len(order)

    # -- membership ---------------------------------------------------------------------------

    def insert(self, key: str, asked: float) -> None:
        """A new image, last in last-asked order, never answered nor done (lap -1)."""
        raw = key.encode()
        self._hit_key = self._hit = None
        self.version += 1
        seq = self._next_seq()
        self._size += 1
        if not self.chunks:
            self.chunks.append(
                Chunk([raw], array("i", [-1]), array("I", [seq]), array("d", [asked]))
            )
            self.maxes.append(raw)
            return
        i = bisect_left(self.maxes, raw)
        if i == len(self.maxes):
            i -= 1
        chunk = self.chunks[i]
        j = bisect_left(chunk.keys, raw)
        chunk.keys.insert(j, raw)
        chunk.laps.insert(j, -1)
        chunk.seqs.insert(j, seq)
        chunk.asked.insert(j, asked)
        chunk.answered.insert(j, UNSET)
        chunk.passed.insert(j, UNSET)
        self.maxes[i] = chunk.keys[-1]
        if len(chunk.keys) > 2 * _CHUNK:
            upper = chunk.split()
            self.chunks.insert(i + 1, upper)
            self.maxes[i : i + 1] = [chunk.keys[-1], upper.keys[-1]]

    def touch(self, chunk: Chunk, j: int, asked: float) -> None:
        """Asked again: last in last-asked order."""
        chunk.asked[j] = asked
        chunk.seqs[j] = self._next_seq()

    def join(self, keys: list[str], asked: float) -> None:
        """Many images asked at once, in that order (a benchmark): into an empty table, one
        sort, not n inserts."""
        if self._size:
            for key in keys:
                if self.find(key) is None:
                    self.insert(key, asked)
            return
        rows = dict.fromkeys(keys, (-1, asked, UNSET))
        self.build([(key, *row) for key, row in rows.items()])

    def build(self, rows: list[Row]) -> None:
        """Fill an empty table at once (a restart, a benchmark's join): one sort, not n inserts.
        ``rows`` come in last-asked order, distinct. Keys are encoded in key order: walks go
        through memory in the order it was taken, not the ask order's."""
        ordered = sorted(range(len(rows)), key=lambda n: rows[n][0])
        self.version += 1
        self._seq = len(rows)
        self._size = len(rows)
        for start in range(0, len(ordered), _CHUNK):
            part = ordered[start : start + _CHUNK]
            chunk = Chunk(
                [rows[n][0].encode() for n in part],
                array("i", [rows[n][1] for n in part]),
                array("I", part),
                array("d", [rows[n][2] for n in part]),
            )
            chunk.answered = array("d", [rows[n][3] for n in part])
            self.chunks.append(chunk)
            self.maxes.append(chunk.keys[-1])

    def _remove(self, raw: bytes) -> None:
        self._hit_key = self._hit = None
        self.version += 1
        i = bisect_left(self.maxes, raw)
        chunk = self.chunks[i]
        j = bisect_left(chunk.keys, raw)
        del chunk.keys[j], chunk.laps[j], chunk.seqs[j], chunk.asked[j]
        del chunk.answered[j], chunk.passed[j]
        self._size -= 1
        if chunk.keys:
            self.maxes[i] = chunk.keys[-1]
        else:
            del self.chunks[i], self.maxes[i]

    # -- retention (P8) -------------------------------------------------------------------------

    def oldest_ask(self) -> float | None:
        """When the image first in last-asked order was asked (None: empty)."""
        first: tuple[int, Chunk] | None = None
        for chunk in self.chunks:
            seq = min(chunk.seqs)
            if first is None or seq < first[0]:
                first = (seq, chunk)
        if first is None:
            return None
        seq, chunk = first
        return chunk.asked[chunk.seqs.index(seq)]

    def expire(self, before: float, now: float, waiting: Collection[str]) -> list[str]:
        """Drop the images last asked for before ``before``, in last-asked order, and return
        them; those in ``waiting`` are asked again at ``now`` instead (in that order)."""
        old: list[tuple[int, bytes]] = []
        for chunk in self.chunks:
            if min(chunk.asked) < before:
                old.extend(
                    (chunk.seqs[j], chunk.keys[j])
                    for j, asked in enumerate(chunk.asked)
                    if asked < before
                )
        old.sort()
        gone = []
        for _, raw in old:
            key = raw.decode()
            if key in waiting:
                found = self.find(key)
                assert found is not None
                self.touch(*found, now)
            else:
                self._remove(raw)
                gone.append(key)
        return gone

    # -- order ----------------------------------------------------------------------------------

    def position_after(self, key: str | None) -> tuple[int, int]:
        """Where the first image after ``key`` (the first image when None) is: chunk, index."""
        if key is None:
            return 0, 0
        raw = key.encode()
        i = bisect_right(self.maxes, raw)
        if i == len(self.chunks):
            return i, 0
        return i, bisect_right(self.chunks[i].keys, raw)

    def rank(self, key: str) -> int:
        """How many images are before ``key``; O(number of chunks)."""
        raw = key.encode()
        i = bisect_left(self.maxes, raw)
        before = sum(len(chunk.keys) for chunk in self.chunks[:i])
        if i < len(self.chunks):
            before += bisect_left(self.chunks[i].keys, raw)
        return before

    # -- what survives a restart (P13) -----------------------------------------------------

    @staticmethod
    def state(chunk: Chunk, j: int) -> EntryState:
        answered = chunk.answered[j]
        return EntryState(
            chunk.keys[j].decode(),
            chunk.asked[j],
            None if answered == UNSET else answered,
            chunk.laps[j],
        )

    def states(self) -> tuple[EntryState, ...]:
        """Every image as a restart keeps it, in last-asked order."""
        keys = [key for c in self.chunks for key in c.keys]
        laps, seqs, asked, answered = array("i"), array("I"), array("d"), array("d")
        for c in self.chunks:
            laps.extend(c.laps)
            seqs.extend(c.seqs)
            asked.extend(c.asked)
            answered.extend(c.answered)
        return tuple(
            EntryState(
                keys[n].decode(),
                asked[n],
                None if answered[n] == UNSET else answered[n],
                laps[n],
            )
            for n in sorted(range(len(keys)), key=seqs.__getitem__)
        )

    def restore(self, entries: Iterable[EntryState]) -> None:
        """Fill an empty table with saved images; their last-asked order is their asks'."""
        self.build(
            [
                (e.image, e.lap, e.asked, UNSET if e.answered is None else e.answered)
                for e in sorted(entries, key=lambda e: e.asked)
            ]
        )
