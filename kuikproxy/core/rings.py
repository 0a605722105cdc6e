"""Rings, cursors and laps (P5, P6, P8): which image a resource takes when its turn comes.

A ring holds the images one resource asked for on one host, in byte-wise order, with a cursor
at the image last taken and a lap counter. When the turn comes, :meth:`Ring.take` finds the
first *due* image after the cursor; if there is none before the end but there would be one after
wrapping, the lap ends at this window and the search goes on from the start of the ring.

Each image remembers the lap it was last *done* in. An answer for an image ahead of the cursor
counts in the lap in progress; an answer for an image the cursor has already passed (another
resource's window read it, R2, or a kept answer served it, R1) counts in the *next* lap, which
will reach it only after it wraps. So when two resources track the same images, the one whose
lap ends just after the other read its first image does not read that image again: the ring
laps in N windows, exactly.

Which images are due depends on the mode (P7):

* ``hold``: images with a request waiting that are not done in this lap. They live in a
  :class:`SortedSet` (``_due``); waiting images already done sit in ``_deferred`` until the lap
  ends, and those done for the next lap in ``_ahead`` until the one after. The next due image
  is one successor query: O(log n). If at a wrap only images done for the next lap wait, that
  lap is over as it starts: they become due at once, so no request waits in vain.
* ``prefetch``: every image not done in this lap. The walk goes through the ring's order and
  skips images done out of turn: answered to the resource in this lap, or read for everyone
  (by another resource's turn) since the walk last went past them — which is this lap's read if
  it happened ahead of the cursor, and the next lap's if behind it, exactly as answers are
  counted. A read for everyone costs nothing per ring: it is found when the walk gets there,
  and a run of images read for everyone after the ring's last turn (``_walked``) is stepped
  over at once (:mod:`kuikproxy.core.sharedreads`): a decision is O(log n) plus O(runs).

The first lap starts at the resource's first turn on the host (P6); an answer before it (from
another resource's window or a kept answer) already counts in that first lap, but does not start
it: otherwise a resource whose first turn comes a window after another resource read its first
image would measure its first lap one window too long.

Membership (P8): an image joins when first asked for and leaves after ``unusedImageRetention``
without a request. What a ring knows of its images is stored in key order, as rows for a few and
by column for more (:mod:`kuikproxy.core.ringtable`); the last-asked order is a counter stamped
on each ask. What only waiting requests need (P7) exists while one waits: most rings, most of
the time, wait for nothing.
"""

from __future__ import annotations

from bisect import bisect_right

from kuikproxy.core import ringstate
from kuikproxy.core.ringstate import UNSET, EntryState, RingHeader, RingState, rows_of
from kuikproxy.core.ringtable import Spot, Table, Waiting
from kuikproxy.core.sharedreads import SharedReads, run_length
from kuikproxy.core.sortedset import SortedSet

SLOW_LAP, lap_ratio = ringstate.SLOW_LAP, ringstate.lap_ratio  # where the page and CLI look


class Ring:
    __slots__ = (
        "_ahead",
        "_at",
        "_deferred",
        "_due",
        "_table",
        "_waiting",
        "_walked",
        "_walks",
        "cursor",
        "cycle_duration",
        "cycle_started",
        "lap",
    )

    # whether :meth:`_spared` wants the images a run skipped (only a ring tracking its changes)
    _tracks = False

    def __init__(self) -> None:
        self._table = Table()
        # prefetch (P7): set from the ring's first prefetch turn or reload on; only the status
        # page's lap bar tells (a hold ring's position is not counted past a limit)
        self._walks = False
        self._walked = UNSET  # the last turn: no image was walked past after it
        self._at: tuple[str, int, int, int] | None = None  # the cursor: table version, place
        # hold (P7), made when first needed, let go when nothing waits: the images due, those
        # waiting but done in this lap, and those done for the next (answered behind the cursor)
        self._due: SortedSet | None = None
        self._deferred: set[str] | None = None
        self._ahead: set[str] | None = None
        # image → (requests waiting for it, table version, spot): where it is, so that a turn
        # needs no lookup by key while nothing joined or left
        self._waiting: dict[str, Waiting] | None = None
        self.cursor: str | None = None
        self.lap = 0
        self.cycle_started: float | None = None
        self.cycle_duration: float | None = None

    # -- membership (P8) ----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._table)

    @property
    def in_rows(self) -> bool:
        """Whether its images are kept as rows of one list (a few), not in column chunks."""
        return not self._table.chunks

    def __contains__(self, image: object) -> bool:
        return isinstance(image, str) and self._table.find(image) is not None

    def ask(self, image: str, now: float) -> float | None:
        """The resource asked for ``image``: it joins the ring, or its retention restarts;
        returns :meth:`previous_read` (a kept answer's path needs both)."""
        return self._table.ask(image, now)

    def join(self, images: list[str], now: float) -> None:
        """Many images join at once (a benchmark): one sort, not n inserts."""
        self._table.join(images, now)

    def walk_in_order(self) -> None:  # the ring's host prefetches (P7)
        self._walks = True

    def oldest_ask(self) -> float | None:
        return self._table.oldest_ask()

    def expire(self, before: float, now: float) -> list[str]:
        """Drop the images last asked for before ``before`` (P8) and return them.

        An image with a request still waiting is being asked for right now: it stays, its
        retention counted from ``now``. The cursor may name a dropped image; successor
        queries do not need it to be a member.
        """
        return self._table.expire(before, now, self._waiting or ())[0]

    # -- laps ---------------------------------------------------------------------------------

    def _end_lap(self, now: float) -> None:
        # a lap that starts and ends at one turn (everything was answered before the ring's
        # first turn) measured nothing: it is no lap to report
        if self.cycle_started is not None and now > self.cycle_started:
            self.cycle_duration = now - self.cycle_started
        self.cycle_started = now
        self._next_lap()

    def _next_lap(self) -> None:
        self.lap += 1
        if self._deferred:
            self._due = self._due or SortedSet()
            self._due.update(self._deferred)
        self._deferred, self._ahead = self._ahead, None

    def answered_in_lap(self, image: str) -> bool:
        spot = self._table.find(image)
        return spot is not None and self._table.lap(spot) >= self.lap

    def previous_read(self, image: str) -> float | None:
        spot = self._table.find(image)
        return None if spot is None else self._table.answered(spot)

    # -- waiting requests ---------------------------------------------------------------------

    def wait(self, image: str) -> None:
        """A request of this resource now waits for ``image`` (which is in the ring)."""
        waiting = self._waiting = self._waiting or {}
        entry = waiting.get(image)
        if entry is not None:
            waiting[image] = (entry[0] + 1, *entry[1:])
            return
        spot = self._table.find(image)
        assert spot is not None
        waiting[image] = (1, self._table.version, *spot)
        self._file(image, self._table.lap(spot))

    def unwait(self, image: str) -> None:
        """A waiting request was answered or went away (P11)."""
        waiting = self._waiting or {}
        entry = waiting.get(image)
        if entry is None:
            return
        if entry[1] == self._table.version:  # a read's end answers it next: no lookup then
            self._table.remember(image, entry[2:])
        if entry[0] > 1:
            waiting[image] = (entry[0] - 1, *entry[1:])
            return
        del waiting[image]
        if not waiting:  # the sets hold waiting images only: all empty now
            self._waiting = self._due = self._deferred = self._ahead = None
            return
        for filed in (self._due, self._deferred, self._ahead):
            if filed is not None:
                filed.discard(image)

    def _file(self, image: str, lap: int) -> None:
        """Put a waiting image in the set its lap says: due, done now, or done for the next."""
        if lap > self.lap:
            self._ahead = self._ahead or set()
            self._ahead.add(image)
        elif lap == self.lap:
            self._deferred = self._deferred or set()
            self._deferred.add(image)
        else:
            self._due = self._due or SortedSet()
            self._due.add(image)

    def answer(self, image: str, now: float) -> None:
        """The resource was answered ``image`` at ``now`` (by a window, R2, or a kept answer)."""
        spot = self._table.find(image)
        if spot is None:
            return
        behind = self.cursor is not None and image < self.cursor
        lap = self.lap + 1 if behind else self.lap
        self._table.answer(spot, now, lap)
        if self._waiting and image in self._waiting:  # its requests wait for the next lap (P5)
            for filed in (self._due, self._deferred):
                if filed is not None:
                    filed.discard(image)
            self._file(image, lap)

    def waiting(self, image: str) -> int:
        entry = None if self._waiting is None else self._waiting.get(image)
        return 0 if entry is None else entry[0]

    def has_due(self, prefetch: bool) -> bool:
        return bool(len(self._table) if prefetch else self._due or self._deferred or self._ahead)

    # -- the P5 rule --------------------------------------------------------------------------

    def take(self, now: float, prefetch: bool, shared: SharedReads | None = None) -> str | None:
        """The image this resource's turn takes at ``now`` (P5), or None if nothing is due.

        ``shared`` knows when a window last read an image for everyone within
        ``cache.maxAge`` (prefetch only): such a read spares this resource its own (R1).
        """
        if not self.has_due(prefetch):
            return None
        if self.cycle_started is None:
            self.cycle_started = now
        table = self._table
        if prefetch:
            walked = self._walk_lap(now, shared)
            if walked is None:
                return None
            image, spot = walked
        else:
            due = None if self._due is None else self._due.after(self.cursor)
            if due is None:
                self._end_lap(now)
                if not self._due:
                    # the new lap holds only answers given ahead of it (behind the cursor): it
                    # is over as it starts, and the requests waiting on them are due in the next
                    self._next_lap()
                due = None if self._due is None else self._due.after(None)
            entry = None if due is None or self._waiting is None else self._waiting.get(due)
            if entry is not None and entry[1] == table.version:
                found: Spot | None = entry[2:]
            else:
                found = None if due is None else table.find(due)
            if due is None or found is None:
                return None
            image, spot = due, found
        raw = table.take(image, spot, self.lap, now)
        self._walked = max(self._walked, now)
        self.cursor = image
        if prefetch and shared is not None:
            shared.taken(image, raw)
        return image

    def _walk_lap(self, now: float, shared: SharedReads | None) -> tuple[str, Spot] | None:
        """The prefetch walk from the cursor, wrapping into the next lap if nothing is due
        before the end of this one: the image taken, and its spot."""
        self._walks = True
        table = self._table
        if not table.chunks:  # a few images, as rows: one at a time
            taken = table.walk_rows(self.cursor, self.lap, now, shared, self._spared)
            if taken is None:
                self._end_lap(now)
                taken = table.walk_rows(None, self.lap, now, shared, self._spared)
            self._walked = max(self._walked, now)
            return taken
        log, i = ([], 0) if shared is None else shared.since(self._walked, now)
        cursor, at = self.cursor, self._at
        if at is not None and at[0] is cursor and at[1] == table.version:
            start = (at[2], at[3] + 1)  # where the last turn stopped, if nothing moved since
        else:
            start = table.position_after(cursor)
        found, i = self._walk(start, None, now, shared, log=log, i=i)
        if found is None:
            self._end_lap(now)
            # from the start, images up to the old cursor were last walked past before this
            # turn, the rest just now: runs of the log (going on where it stopped) stop there
            found, i = self._walk((0, 0), cursor or "", now, shared, log=log, i=i)
        self._walked = max(self._walked, now)
        if found is None:
            return None
        image, c, j = found
        self._at = (image, table.version, c, j)
        return image, (table.chunks[c], j)

    def _walk(
        self,
        start: tuple[int, int],
        fence: str | None,
        now: float,
        shared: SharedReads | None,
        *,
        log: list[bytes],
        i: int,
    ) -> tuple[tuple[str, int, int] | None, int]:
        """The prefetch walk from ``start`` (chunk, index): images done in this lap, or read for
        everyone since the walk last went past them, are stepped over (done in this lap now).
        ``log[i:]`` were read for everyone after any image up to ``fence`` (None: any image)
        was last walked past. Returns the image taken, its chunk and index (None: none before
        the end), and where the walk stopped in the log."""
        lap, end = self.lap, len(log)
        below = None if fence is None else fence.encode()
        chunks = self._table.chunks
        c, j = start
        while c < len(chunks):
            chunk = chunks[c]
            keys, laps, passed = chunk.keys, chunk.laps, chunk.passed
            stop = len(keys) if below is None else bisect_right(keys, below)
            while j < len(keys):
                if i < end and j < stop and keys[j] == log[i]:
                    # read for everyone since the walk last went past it, as are the images
                    # of the run that follows it in both
                    run = run_length(keys, j, log, i, min(stop - j, end - i))
                    # all in this lap: none ahead of the cursor is done for a later one
                    if self._tracks:
                        self._spared(chunk.undone(j, j + run, lap))
                    chunk.walked_past(j, j + run, lap, now)
                    if keys[j] is not log[i] or keys[j + run - 1] is not log[i + run - 1]:
                        keys[j : j + run] = log[i : i + run]  # equal: adopted (SharedReads.taken)
                    j += run
                    i += run
                    continue
                if laps[j] < lap:
                    image = keys[j].decode()
                    read = None if shared is None else shared.get(image, now)
                    if read is None or read <= passed[j]:
                        return (image, c, j), i
                    laps[j] = lap  # spared: read for everyone since the walk was last here
                    self._spared([image])
                passed[j] = now
                j += 1
            c += 1
            j = 0
        return None, i

    def _spared(self, images: list[str]) -> None:
        """The walk stepped over ``images``, read for everyone: a tracked ring records them."""

    # -- what survives a restart (P13) ---------------------------------------------------------

    def header(self) -> RingHeader:
        return RingHeader(self.cursor, self.lap, self.cycle_started, self.cycle_duration)

    def entry_state(self, image: str) -> EntryState:
        spot = self._table.find(image)
        assert spot is not None
        return self._table.entry(spot)

    def export(self) -> RingState:
        """The whole ring as plain values, images in last-asked order."""
        return RingState(self.header(), self._table.states())

    def load(self, state: RingState) -> None:
        """Become the ring ``state`` describes (into an empty ring). It resumes after its
        cursor; images done in the lap in progress stay done, so they are not due again in it;
        ``cycle_started`` keeps the start of that lap, so its duration counts the time the
        ring spent saved. Nothing waits yet: requests file their images as they come."""
        header = state.header
        self.cursor, self.lap = header.cursor, header.lap
        self.cycle_started, self.cycle_duration = header.cycle_started, header.cycle_duration
        self._table.build(rows_of(state.entries))

    # -- for people -----------------------------------------------------------------------------

    def position(self, limit: int) -> int | None:
        """Where the cursor is in the ring, for the status page's lap bar (never a decision):
        how many of its images are at or before the cursor, 0 before the first turn.

        The images are in order, so the answer is a rank, O(number of chunks); but a hold ring
        answers only when it holds at most ``limit`` images (None above), as when it kept no
        order: what the page shows does not change with how rings are stored."""
        cursor = self.cursor
        if cursor is None:
            return 0
        if not self._walks and len(self._table) > limit:
            return None
        return self._table.rank(cursor) + (cursor in self)

    def waiting_requests(self) -> int:
        """How many requests of this resource wait for a window: O(images waiting)."""
        return sum(entry[0] for entry in (self._waiting or {}).values())

    def due_before(self, image: str) -> int:
        """How many due images this resource's turns take before ``image`` (hold mode), for the
        ``Retry-After`` of a request held too long (P7): those after the cursor come first."""
        due = self._due
        if due is None:
            return 0
        rank = due.rank(image)
        if self.cursor is None:
            return rank
        past_cursor = due.rank(self.cursor) + (self.cursor in due)
        if image > self.cursor:
            return rank - past_cursor
        return len(due) - past_cursor + rank
