"""A ring's images: rows of one list for a few, sorted chunks of columns for more (P5, P8).

Why columns: ten million ring entries held as objects (a key ``str``, an entry object, an
ordered-dict slot and a sorted-set slot each) cost ~272 B apiece. By column an image costs its key
as ``bytes`` (64 B for a 30-character key; UTF-8 order is the byte-wise order rings use), one list
slot, and 32 B of arrays: its lap, its place in last-asked order (``seqs``, a counter stamped on
each ask: P8), when it was last asked, answered and walked past; no object the cyclic GC tracks.
Keys sit in sorted chunks of at most ``2 × _CHUNK`` with a list of each chunk's last key, as in
:mod:`kuikproxy.core.sortedset`: a lookup is two bisects.

Why rows for a few: a chunk is a list and five arrays, ~600 B before its first image, and most
resources track one image or a few. Up to ``FEW`` images a ring keeps them as rows of one list
sorted by key — key (the request's ``str``), lap, seq, asked, answered, walked past — ~100 B for
one image besides its key and floats. Past ``FEW`` it turns to columns, and back to rows when an
expiry leaves ``FEW // 2``: a ring whose size hovers at ``FEW`` does not convert at every ask.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Collection
from collections.abc import Sequence as Seq
from operator import itemgetter
from typing import Any

from kuikproxy.core.ringchunks import Chunk
from kuikproxy.core.ringstate import UNSET, EntryState, Row
from kuikproxy.core.sharedreads import SharedReads

_CHUNK = 512
FEW = 8  # at least 1
ROW_WIDTH = 6  # a row's width: key, lap, seq, asked, answered, passed
_LAP, _SEQ, _ASKED, _ANSWERED, _PASSED = range(1, ROW_WIDTH)
_NUMBERS = ("laps", "seqs", "asked", "answered", "passed")  # a chunk's arrays: "iIddd"
_SEQ_LIMIT = 2**32 - 1  # seqs are unsigned 32-bit: renumbered, in order, before they overflow


# where an image is: its chunk and index, or None and its row's offset; until an image joins or
# leaves (``Table.version`` counts those changes)
Spot = tuple[Chunk | None, int]
# an image a request waits for, as its ring keeps it: (requests waiting, ``Table.version``, spot)
Waiting = tuple[int, int, Chunk | None, int]

# a table holds rows or chunks, never both: the other side is one of these, shared by every table
# and never added to (:meth:`Table.insert` and :meth:`Table._fill` give a table lists of its own)
_NO_ROWS: list[Any] = []
_NO_CHUNKS: list[Chunk] = []
_NO_MAXES: list[bytes] = []
ROW_SPOTS = [(None, n * ROW_WIDTH) for n in range(FEW)]


class Table:
    __slots__ = ("_hit", "_hit_key", "_seq", "_size", "chunks", "maxes", "rows", "version")

    def __init__(self) -> None:
        self.rows = _NO_ROWS  # while chunks is empty: no image, or at most FEW
        self.chunks = _NO_CHUNKS
        self.maxes = _NO_MAXES
        self._size = self._seq = 0
        self.version = 0  # counts the changes that move images between places
        # the last image found: a check asks about one several times, a read's end answers it
        self._hit_key: str | None = None
        self._hit: Spot | None = None

    def __len__(self) -> int:
        return self._size

    def find(self, key: str) -> Spot | None:
        if key == self._hit_key:
            return self._hit
        if not self.chunks:
            keys = self.rows[::ROW_WIDTH]
            n = bisect_left(keys, key)
            if n == len(keys) or keys[n] != key:
                return None
            self._hit_key, self._hit = keys[n], ROW_SPOTS[n]  # nothing more to keep
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

    # -- one image, at its spot ----------------------------------------------------------------

    def remember(self, key: str, spot: Spot) -> None:
        """``key`` is at ``spot`` (a ring knew): the next lookup finds it at once."""
        if spot[0] is not None:  # rows: a lookup is as cheap, and ROW_SPOTS keeps nothing
            self._hit_key, self._hit = key, spot

    def lap(self, spot: Spot) -> int:
        chunk, j = spot
        return int(self.rows[j + _LAP]) if chunk is None else chunk.laps[j]

    def answered(self, spot: Spot) -> float | None:
        chunk, j = spot
        answered = float(self.rows[j + _ANSWERED]) if chunk is None else chunk.answered[j]
        return None if answered == UNSET else answered

    def answer(self, spot: Spot, now: float, lap: int) -> None:
        chunk, j = spot
        if chunk is None:
            self.rows[j + _ANSWERED], self.rows[j + _LAP] = now, lap
        else:
            chunk.answered[j], chunk.laps[j] = now, lap

    def take(self, key: str, spot: Spot, lap: int, now: float) -> bytes:
        """A turn took ``key``: done in ``lap``, walked past at ``now``; its key as columns hold
        it (for :meth:`SharedReads.taken`)."""
        chunk, j = spot
        if chunk is None:
            self.rows[j + _LAP], self.rows[j + _PASSED] = lap, now
            return key.encode()
        chunk.laps[j], chunk.passed[j] = lap, now
        return chunk.keys[j]

    def entry(self, spot: Spot) -> EntryState:
        """The image as a restart keeps it."""
        c, j = spot
        if c is None:
            r = self.rows
            return EntryState.stored(r[j], r[j + _ASKED], r[j + _ANSWERED], r[j + _LAP])
        return EntryState.stored(c.keys[j].decode(), c.asked[j], c.answered[j], c.laps[j])

    # -- membership ---------------------------------------------------------------------------

    def ask(self, key: str, now: float) -> float | None:
        """``key`` was asked for at ``now``: it joins, or its ask is renewed (last in
        last-asked order either way). When it was last answered (None: never)."""
        spot = self.find(key)
        if spot is None:
            self.insert(key, now)
            return None
        return self.touch(spot, now)

    def _next_seq(self) -> int:
        if self._seq >= _SEQ_LIMIT:
            self._renumber()
        seq = self._seq
        self._seq = seq + 1
        return seq

    def _renumber(self) -> None:
        rows = self.rows
        for n, at in enumerate(sorted(range(_SEQ, len(rows), ROW_WIDTH), key=rows.__getitem__)):
            rows[at] = n
        order = sorted((s, c, j) for c in self.chunks for j, s in enumerate(c.seqs))
        for n, (_, chunk, j) in enumerate(order):
            chunk.seqs[j] = n
        self._seq = self._size

    def touch(self, spot: Spot, asked: float) -> float | None:
        """Asked again: last in last-asked order. When it was last answered (None: never)."""
        chunk, j = spot
        seq = self._next_seq()
        if chunk is None:
            self.rows[j + _SEQ], self.rows[j + _ASKED] = seq, asked
            answered: float = self.rows[j + _ANSWERED]
        else:
            chunk.seqs[j], chunk.asked[j] = seq, asked
            answered = chunk.answered[j]
        return None if answered == UNSET else answered

    def insert(self, key: str, asked: float) -> None:
        """A new image, last in last-asked order, never answered nor done (lap -1)."""
        self._hit_key = self._hit = None
        self.version += 1
        seq = self._next_seq()
        self._size += 1
        if not self.chunks:
            if self._size <= FEW:
                n = bisect_left(self.rows[::ROW_WIDTH], key) * ROW_WIDTH
                row = [key, -1, seq, asked, UNSET, UNSET]
                self.rows = self.rows[:n] + row + self.rows[n:]  # its own list, no room to spare
                return
            self._fill(self._columns(), rows=False)  # grown past FEW (and FEW > 0)
        raw = key.encode()
        i = min(bisect_left(self.maxes, raw), len(self.maxes) - 1)
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

    def _columns(self) -> list[Seq[Any]]:
        """Every image's key as stored, lap, seq, asked, answered and passed, in key order."""
        if not self.chunks:
            return [self.rows[c::ROW_WIDTH] for c in range(ROW_WIDTH)]
        columns: list[Seq[Any]] = [[k for c in self.chunks for k in c.keys]]
        for name, code in zip(_NUMBERS, "iIddd", strict=True):
            column = array(code)
            for chunk in self.chunks:
                column += getattr(chunk, name)
            columns.append(column)
        return columns

    def _fill(self, columns: list[Seq[Any]], *, rows: bool) -> None:
        """Store ``columns`` (:meth:`_columns`) anew: as rows, or in chunks of ``_CHUNK``. Keys
        are encoded in key order: walks go through memory in the order it was taken."""
        self._hit_key = self._hit = None
        self.version += 1
        if rows:
            keys = [k if isinstance(k, str) else k.decode() for k in columns[0]]
            self.rows = [v for row in zip(keys, *columns[1:], strict=True) for v in row]
            self.rows = self.rows or _NO_ROWS
            self.chunks, self.maxes = _NO_CHUNKS, _NO_MAXES
            return
        names, laps, seqs, asked, answered, passed = columns  # no whole-column arrays: they
        self.rows, self.chunks, self.maxes = _NO_ROWS, [], []  # would leave holes in the heap
        for n in range(0, len(names), _CHUNK):
            part = slice(n, n + _CHUNK)
            chunk = Chunk(
                [k.encode() for k in names[part]], array("i", laps[part]), array("I", seqs[part]),
                array("d", asked[part]), answered=array("d", answered[part]),
                passed=array("d", passed[part]),
            )  # fmt: skip
            self.chunks.append(chunk)
            self.maxes.append(chunk.keys[-1])

    def join(self, keys: list[str], asked: float) -> None:
        """Many images asked at once (a benchmark): one sort into an empty table, not n inserts."""
        if self._size:
            for key in keys:
                if self.find(key) is None:
                    self.insert(key, asked)
            return
        self.build([(key, -1, asked, UNSET) for key in dict.fromkeys(keys)])

    def build(self, rows: list[Row]) -> None:
        """Fill an empty table at once (a restart, a benchmark's join): one sort, not n inserts.
        ``rows`` come in last-asked order, distinct."""
        order = sorted(range(len(rows)), key=lambda n: rows[n][0])
        self._seq = self._size = len(rows)
        columns: list[list[Any]] = [[], [], [], []]  # key, lap, asked, answered
        for n in range(0, len(rows), _CHUNK):  # rows in key order are all over the heap: a
            part = [rows[k] for k in order[n : n + _CHUNK]]  # chunk's at a time, while cached
            for c, column in enumerate(columns):
                column.extend(map(itemgetter(c), part))
        keys, laps, asked, answered = columns
        unset = array("d", [UNSET]) * len(rows)
        self._fill([keys, laps, order, asked, answered, unset], rows=len(rows) <= FEW)

    def _remove(self, key: str) -> None:
        self._hit_key = self._hit = None
        self.version += 1
        self._size -= 1
        if not self.chunks:
            n = bisect_left(self.rows[::ROW_WIDTH], key) * ROW_WIDTH
            del self.rows[n : n + ROW_WIDTH]
            return
        raw = key.encode()
        i = bisect_left(self.maxes, raw)
        chunk = self.chunks[i]
        j = bisect_left(chunk.keys, raw)
        del chunk.keys[j], chunk.laps[j], chunk.seqs[j], chunk.asked[j]
        del chunk.answered[j], chunk.passed[j]
        if chunk.keys:
            self.maxes[i] = chunk.keys[-1]
        else:
            del self.chunks[i], self.maxes[i]

    # -- retention (P8): by column, scans of the seqs and asked arrays (C loops, ~10 ns an image)

    def oldest_ask(self) -> float | None:
        """When the image first in last-asked order was asked (None: empty)."""
        if self.chunks:
            chunk = min(self.chunks, key=lambda c: min(c.seqs))
            return chunk.asked[chunk.seqs.index(min(chunk.seqs))]
        seqs = self.rows[_SEQ::ROW_WIDTH]
        return float(self.rows[seqs.index(min(seqs)) * ROW_WIDTH + _ASKED]) if seqs else None

    def expire(
        self, before: float, now: float, waiting: Collection[str]
    ) -> tuple[list[str], list[str]]:
        """Drop the images last asked for before ``before``, in last-asked order, and return
        them; those in ``waiting`` are asked again at ``now`` instead (in that order), and
        returned second."""
        rows = self.rows
        old: list[tuple[int, str | bytes]] = [
            (rows[n + _SEQ], rows[n])
            for n in range(0, len(rows), ROW_WIDTH)
            if rows[n + _ASKED] < before
        ]
        for chunk in self.chunks:
            if min(chunk.asked) < before:
                pairs = zip(chunk.seqs, chunk.keys, chunk.asked, strict=True)
                old.extend((seq, raw) for seq, raw, asked in pairs if asked < before)
        old.sort()
        gone, renewed = [], []
        for _, stored in old:
            key = stored if isinstance(stored, str) else stored.decode()
            if key in waiting:
                spot = self.find(key)
                assert spot is not None
                self.touch(spot, now)
                renewed.append(key)
            else:
                self._remove(key)
                gone.append(key)
        if self.chunks and self._size <= FEW // 2:
            self._fill(self._columns(), rows=True)
        return gone, renewed

    # -- order ----------------------------------------------------------------------------------

    def position_after(self, key: str | None) -> tuple[int, int]:
        """By column: where the first image after ``key`` (the first image when None) is."""
        if key is None:
            return 0, 0
        raw = key.encode()
        i = bisect_right(self.maxes, raw)
        return (i, 0) if i == len(self.chunks) else (i, bisect_right(self.chunks[i].keys, raw))

    def rank(self, key: str) -> int:
        """How many images are before ``key``; O(number of chunks)."""
        if not self.chunks:
            return bisect_left(self.rows[::ROW_WIDTH], key)
        raw = key.encode()
        i = bisect_left(self.maxes, raw)
        before = sum(len(chunk.keys) for chunk in self.chunks[:i])
        if i < len(self.chunks):
            before += bisect_left(self.chunks[i].keys, raw)
        return before

    def walk_rows(
        self, after: str | None, lap: int, now: float, shared: SharedReads | None,
        spared: Callable[[list[str]], None],
    ) -> tuple[str, Spot] | None:  # fmt: skip
        """In rows, the prefetch walk from the first image after ``after`` (None: the first):
        :meth:`~kuikproxy.core.rings.Ring._walk`'s rule one image at a time, which its runs
        only shorten. Images done in ``lap``, or read for everyone since the walk last went
        past them (``spared``), are stepped over; the next one is returned, not marked."""
        rows = self.rows
        start = 0 if after is None else bisect_right(rows[::ROW_WIDTH], after) * ROW_WIDTH
        for n in range(start, len(rows), ROW_WIDTH):
            if rows[n + _LAP] < lap:
                read = None if shared is None else shared.get(rows[n], now)
                if read is None or read <= rows[n + _PASSED]:
                    return rows[n], (None, n)
                rows[n + _LAP] = lap
                spared([rows[n]])
            rows[n + _PASSED] = now
        return None

    # -- what survives a restart (P13) -----------------------------------------------------

    def states(self) -> tuple[EntryState, ...]:
        """Every image as a restart keeps it, in last-asked order."""
        keys, laps, seqs, asked, answered, _ = self._columns()
        key = bytes.decode if self.chunks else str  # decoded as made: each new str in cache
        return tuple(  # EntryState.stored inlined: a million calls less at a million images
            EntryState(key(keys[n]), asked[n], None if (a := answered[n]) == UNSET else a, laps[n])
            for n in sorted(range(len(keys)), key=seqs.__getitem__)
        )
