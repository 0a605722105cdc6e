"""The queues of one ``Queue`` level: shuffle-sharded placement and virtual-time fair dispatch.

Placement: a flow's hand (:mod:`~kuikproxy.core.flowcontrol.sharding`) is scanned in hand
order and the request joins the queue with the fewest requests in it — the least waiting work,
every request costing one seat — ties to the first in hand order; when that queue already holds
``queueLengthLimit`` requests the request is refused. A queue's length counts its *parked*
requests too: those waiting for their window rather than a seat (SPEC §10). They hold a place,
so a flow parks at most ``handSize × queueLengthLimit``, but they are only counted — fair
queuing dispatches seat waiters alone. (Kubernetes starts the scan at a rotating
offset to spread ties; a fixed start keeps placement a function of the flow and the queues.)

Dispatch is Kubernetes' fair queuing with every request costing one unit of virtual work:

* each queue has the virtual start ``S`` of its head; dispatching the head of queue ``q``
  sets the level's virtual clock ``V = S(q)`` and then ``S(q) += 1`` (self-clocked: virtual time
  is the start of the request last dispatched, so it needs no real clock nor duration estimate);
* the non-empty queue with the smallest ``S`` goes next; ties go to the queue that has waited
  longest for its current ``S`` — round robin among equals;
* a queue that was empty restarts at ``S = max(S, V)``: idle queues do not accumulate credit.

With unit costs this is weighted round robin with memory: a queue that joins mid-round is served
at the current round, never ahead of queues already owed, and a flood that holds eight queues
gets eight turns per round, like any eight flows would.

Storage: each queue is an ordered dict (O(1) append, pop of the head, removal of a cancelled
ticket); the turn order is a heap with at most one live entry per queue, rebuilt when stale
entries outnumber the queues, so what a level holds is bounded by ``queues × queueLengthLimit``
tickets plus ``O(queues)``.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

from kuikproxy.core.flowcontrol.sharding import hand_for
from kuikproxy.core.flowcontrol.spec import QueuingConfiguration

T = TypeVar("T", bound=Hashable)


class QueueSet(Generic[T]):
    __slots__ = (
        "_active",
        "_entry",
        "_heap",
        "_seq",
        "_start",
        "_virtual",
        "config",
        "parked",
        "queues",
        "waiting",
    )

    def __init__(self, config: QueuingConfiguration) -> None:
        self.config = config
        self.queues: list[OrderedDict[T, None]] = [OrderedDict() for _ in range(config.queues)]
        self._start = [0] * config.queues  # S(q): the virtual start of each queue's head
        self._virtual = 0  # V
        self._seq = 0
        self._heap: list[tuple[int, int, int]] = []  # (S, seq, queue)
        self._entry: list[int] = [0] * config.queues  # seq of each queue's live heap entry
        self._active = 0  # queues with something waiting
        self.waiting = 0
        self.parked = [0] * config.queues  # places held by requests waiting for their window

    def hand(self, flow: str) -> list[int]:
        return hand_for(flow, self.config.queues, self.config.hand_size)

    def choose(self, flow: str) -> tuple[int, int]:
        """The queue of the flow's hand with the fewest requests, waiting or parked (first in
        hand order), and that number; the queue is full when it reaches ``queueLengthLimit``."""
        best, length = -1, -1
        for index in self.hand(flow):
            here = len(self.queues[index]) + self.parked[index]
            if best < 0 or here < length:
                best, length = index, here
                if here == 0:
                    break
        return best, length

    def full(self, length: int) -> bool:
        return length >= self.config.queue_length_limit

    def enqueue(self, index: int, ticket: T) -> None:
        queue = self.queues[index]
        if not queue:
            self._start[index] = max(self._start[index], self._virtual)
            self._active += 1
            self._push(index)
        queue[ticket] = None
        self.waiting += 1

    def park(self, index: int) -> None:
        self.parked[index] += 1

    def unpark(self, index: int) -> None:
        self.parked[index] -= 1

    def _push(self, index: int) -> None:
        self._seq += 1
        self._entry[index] = self._seq
        heapq.heappush(self._heap, (self._start[index], self._seq, index))
        if len(self._heap) > 2 * self.config.queues + 16:  # drop entries cancels left stale
            self._heap = [e for e in self._heap if self.queues[e[2]] and e[1] == self._entry[e[2]]]
            heapq.heapify(self._heap)

    def remove(self, index: int, ticket: T) -> None:
        """A waiting ticket leaves (its client went away). Its queue keeps its ``S``."""
        queue = self.queues[index]
        del queue[ticket]
        self.waiting -= 1
        if not queue:
            self._active -= 1
            self._entry[index] = 0  # its heap entry is stale now
            if not self._active:
                self._heap.clear()  # every entry is stale: an idle level holds nothing

    def dispatch(self) -> T | None:
        """The head of the queue whose turn it is, or None when nothing waits."""
        heap = self._heap
        while heap:
            start, seq, index = heapq.heappop(heap)
            queue = self.queues[index]
            if seq != self._entry[index]:
                continue  # stale: its queue was emptied by cancels
            ticket, _ = queue.popitem(last=False)
            self.waiting -= 1
            self._virtual = start
            self._start[index] = start + 1
            if queue:
                self._push(index)
            else:
                self._active -= 1
                self._entry[index] = 0
            return ticket
        return None

    def active_queues(self) -> int:
        """Queues with something waiting."""
        return self._active

    def stored(self) -> int:
        """Entries held: waiting tickets and turn-heap entries."""
        return self.waiting + len(self._heap)
