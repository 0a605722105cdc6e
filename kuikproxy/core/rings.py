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
  counted. Each image is walked past once per lap, so a decision is amortised O(log n), and a
  read for everyone costs nothing per ring: it is looked up lazily, when the walk gets there.

The first lap starts at the resource's first turn on the host (P6); an answer before it (from
another resource's window or a kept answer) already counts in that first lap, but does not start
it: otherwise a resource whose first turn comes a window after another resource read its first
image would measure its first lap one window too long.

Membership (P8): an image joins when first asked for and leaves after ``unusedImageRetention``
without a request. ``_entries`` is kept in last-asked order, so expiry pops from its front.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from kuikproxy.core.ringstate import EntryState, RingHeader, RingState
from kuikproxy.core.sortedset import SortedSet

SharedReads = Callable[[str], float | None]

SLOW_LAP = 1.5
"""A lap this many times its best case, or more, is slow (the example alert's threshold)."""


def lap_ratio(cycle_duration: float | None, images: int, interval: float) -> float | None:
    """How much longer than its best case a ring's last lap took: ``cycleDuration / (images ×
    check.interval)``, the pacing document's "Watching the pace" (None before a lap). Above 1,
    the ring shares its host or loses windows."""
    if cycle_duration is None or not images or not interval:
        return None
    return cycle_duration / (images * interval)


class _Entry:
    """What a ring knows of one image."""

    __slots__ = ("answered", "asked", "lap", "passed")

    def __init__(self, asked: float) -> None:
        self.asked = asked
        self.answered: float | None = None  # last answered to this resource (R1's "previous read")
        self.lap = -1  # the last lap this image was done in (answered, or taken by a turn)
        self.passed: float | None = None  # prefetch: when the walk last went past it


class Ring:
    __slots__ = (
        "_ahead",
        "_deferred",
        "_due",
        "_entries",
        "_order",
        "_waiting",
        "cursor",
        "cycle_duration",
        "cycle_started",
        "lap",
    )

    def __init__(self) -> None:
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        # every image in order, for the prefetch walk only: hold rings (the default) never pay
        # for it; a prefetch ring keeps it from its start (:meth:`walk_in_order`)
        self._order: SortedSet | None = None
        self._due = SortedSet()
        self._deferred: set[str] = set()  # waiting, done in this lap
        self._ahead: set[str] = set()  # waiting, done for the next lap (answered behind the cursor)
        self._waiting: dict[str, int] = {}
        self.cursor: str | None = None
        self.lap = 0
        self.cycle_started: float | None = None
        self.cycle_duration: float | None = None

    # -- membership (P8) ----------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, image: object) -> bool:
        return image in self._entries

    def ask(self, image: str, now: float) -> None:
        """The resource asked for ``image``: it joins the ring, or its retention restarts."""
        entry = self._entries.get(image)
        if entry is None:
            self._entries[image] = _Entry(now)
            if self._order is not None:
                self._order.add(image)
        else:
            entry.asked = now
            self._entries.move_to_end(image)

    def join(self, images: list[str], now: float) -> None:
        """Many images join at once (a benchmark): one sort, not n inserts."""
        for image in images:
            if image not in self._entries:
                self._entries[image] = _Entry(now)
        if self._order is not None:
            self._order.update(images)

    def walk_in_order(self) -> None:
        """Keep every image in order from now on (prefetch, P7). Built at once if images are
        already here: a one-time sort, when a reload turns a host to prefetch."""
        if self._order is None:
            self._order = SortedSet(self._entries)

    def oldest_ask(self) -> float | None:
        for entry in self._entries.values():
            return entry.asked
        return None

    def expire(self, before: float, now: float) -> list[str]:
        """Drop the images last asked for before ``before`` (P8) and return them.

        An image with a request still waiting is being asked for right now: it stays, its
        retention counted from ``now``. The cursor may name a dropped image; successor
        queries do not need it to be a member.
        """
        gone = []
        while self._entries:
            image, entry = next(iter(self._entries.items()))
            if entry.asked >= before:
                break
            if image in self._waiting:
                entry.asked = now
                self._entries.move_to_end(image)
                continue
            del self._entries[image]
            if self._order is not None:
                self._order.discard(image)
            gone.append(image)
        return gone

    # -- laps ---------------------------------------------------------------------------------

    def _done(self, entry: _Entry) -> bool:
        return entry.lap >= self.lap

    def _start_if_first(self, now: float) -> None:
        if self.cycle_started is None:
            self.cycle_started = now

    def _end_lap(self, now: float) -> None:
        # a lap that starts and ends at one turn (everything was answered before the ring's
        # first turn) measured nothing: it is no lap to report
        if self.cycle_started is not None and now > self.cycle_started:
            self.cycle_duration = now - self.cycle_started
        self.cycle_started = now
        self._next_lap()

    def _next_lap(self) -> None:
        self.lap += 1
        self._due.update(self._deferred)
        self._deferred, self._ahead = self._ahead, set()

    def answered_in_lap(self, image: str) -> bool:
        entry = self._entries.get(image)
        return entry is not None and self._done(entry)

    def previous_read(self, image: str) -> float | None:
        entry = self._entries.get(image)
        return None if entry is None else entry.answered

    # -- waiting requests ---------------------------------------------------------------------

    def wait(self, image: str) -> None:
        """A request of this resource now waits for ``image`` (which is in the ring)."""
        count = self._waiting.get(image, 0)
        self._waiting[image] = count + 1
        if count == 0:
            self._file(image, self._entries[image])

    def unwait(self, image: str) -> None:
        """A waiting request was answered or went away (P11)."""
        count = self._waiting.get(image, 0) - 1
        if count > 0:
            self._waiting[image] = count
            return
        self._waiting.pop(image, None)
        self._due.discard(image)
        self._deferred.discard(image)
        self._ahead.discard(image)

    def _file(self, image: str, entry: _Entry) -> None:
        """Put a waiting image in the set its lap says: due, done now, or done for the next."""
        if entry.lap > self.lap:
            self._ahead.add(image)
        elif entry.lap == self.lap:
            self._deferred.add(image)
        else:
            self._due.add(image)

    def answer(self, image: str, now: float) -> None:
        """The resource was answered ``image`` at ``now`` (by a window, R2, or a kept answer)."""
        entry = self._entries.get(image)
        if entry is None:
            return
        entry.answered = now
        self._mark_done(image, entry)

    def _mark_done(self, image: str, entry: _Entry) -> None:
        behind = self.cursor is not None and image < self.cursor
        entry.lap = self.lap + 1 if behind else self.lap
        if image in self._waiting:  # requests still waiting for it wait for the next lap (P5)
            self._due.discard(image)
            self._deferred.discard(image)
            self._file(image, entry)

    def waiting(self, image: str) -> int:
        return self._waiting.get(image, 0)

    def has_due(self, prefetch: bool) -> bool:
        if prefetch:
            return bool(self._entries)
        return bool(self._due) or bool(self._deferred) or bool(self._ahead)

    # -- the P5 rule --------------------------------------------------------------------------

    def take(self, now: float, prefetch: bool, shared: SharedReads | None = None) -> str | None:
        """The image this resource's turn takes at ``now`` (P5), or None if nothing is due.

        ``shared(image)`` is when a window last read ``image`` for everyone within
        ``cache.maxAge`` (prefetch only): such a read spares this resource its own (R1).
        """
        if not self.has_due(prefetch):
            return None
        self._start_if_first(now)
        image = self._next_due(self.cursor, prefetch, now, shared)
        if image is None:
            self._end_lap(now)
            if not prefetch and not self._due:
                # the new lap holds only answers given ahead of it (behind the cursor): it is
                # over as it starts, and the requests waiting on them are due in the next
                self._next_lap()
            image = self._next_due(None, prefetch, now, shared)
            if image is None:
                return None
        entry = self._entries[image]
        entry.lap = self.lap
        entry.passed = now
        self.cursor = image
        return image

    def _next_due(
        self, after: str | None, prefetch: bool, now: float, shared: SharedReads | None
    ) -> str | None:
        if not prefetch:
            return self._due.after(after)
        entries, lap = self._entries, self.lap
        self.walk_in_order()
        assert self._order is not None
        for image in self._order.iter_after(after):
            entry = entries[image]
            if entry.lap < lap:
                read = None if shared is None else shared(image)
                if read is None or (entry.passed is not None and read <= entry.passed):
                    return image
                entry.lap = lap  # spared: read for everyone since the walk was last here
            entry.passed = now
        return None

    # -- what survives a restart (P13) ---------------------------------------------------------

    def header(self) -> RingHeader:
        return RingHeader(self.cursor, self.lap, self.cycle_started, self.cycle_duration)

    def entry_state(self, image: str) -> EntryState:
        entry = self._entries[image]
        return EntryState(image, entry.asked, entry.answered, entry.lap)

    def export(self) -> RingState:
        """The whole ring as plain values, images in last-asked order."""
        return RingState(
            self.header(),
            tuple(EntryState(i, e.asked, e.answered, e.lap) for i, e in self._entries.items()),
        )

    def load(self, state: RingState) -> None:
        """Become the ring ``state`` describes (into an empty ring). It resumes after its
        cursor; images done in the lap in progress stay done, so they are not due again in it;
        ``cycle_started`` keeps the start of that lap, so its duration counts the time the
        ring spent saved. Nothing waits yet: requests file their images as they come."""
        header = state.header
        self.cursor, self.lap = header.cursor, header.lap
        self.cycle_started, self.cycle_duration = header.cycle_started, header.cycle_duration
        # retention pops from the front of the last-asked order (P8): keep that order
        for saved in sorted(state.entries, key=lambda e: e.asked):
            entry = self._entries[saved.image] = _Entry(saved.asked)
            entry.answered, entry.lap = saved.answered, saved.lap
        if self._order is not None:
            self._order.update(self._entries)

    # -- for people -----------------------------------------------------------------------------

    def position(self, limit: int) -> int | None:
        """Where the cursor is in the ring, for the status page's lap bar (never a decision):
        how many of its images are at or before the cursor, 0 before the first turn.

        A prefetch ring keeps its images in order and answers from that index, O(number of
        chunks). A hold ring keeps no order (no decision needs one), so its images are counted
        in one pass, without sorting, and only when there are at most ``limit`` of them: above
        that the answer is None, so that a page never holds the event loop for long."""
        cursor = self.cursor
        if cursor is None:
            return 0
        if self._order is not None:
            return self._order.rank(cursor) + (cursor in self._order)
        if len(self._entries) > limit:
            return None
        return sum(image <= cursor for image in self._entries)

    def waiting_requests(self) -> int:
        """How many requests of this resource wait for a window: O(images waiting)."""
        return sum(self._waiting.values())

    def due_before(self, image: str) -> int:
        """How many due images this resource's turns take before ``image`` (hold mode), for the
        ``Retry-After`` of a request held too long (P7): those after the cursor come first."""
        rank = self._due.rank(image)
        if self.cursor is None:
            return rank
        past_cursor = self._due.rank(self.cursor) + (self.cursor in self._due)
        if image > self.cursor:
            return rank - past_cursor
        return len(self._due) - past_cursor + rank
