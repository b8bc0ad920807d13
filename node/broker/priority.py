"""The ready list of a priority queue (`x-max-priority`, PUB-4).

As in RabbitMQ, a priority queue is one FIFO per priority level, 0 up to
the queue's maximum: the highest non-empty level is served first, FIFO
within a level, and a message published with a priority above the maximum
counts as the maximum (no priority counts as 0). A requeued message goes
back to its own level at its original position.

It stands in for the `deque` of a plain queue (append, popleft, [0], len,
iteration, clear). Priority queues are kept wholly in memory: they never
page messages out to the store's `tail` (persistent messages are still
logged and come back after a restart); a mirror's copy, which keeps them by
store id, is read in whole once a promotion takes it over. `insert`, `find`,
`remove` and `take_after` address an entry by position, as a mirror does.
"""
from __future__ import annotations

import bisect
import heapq
from collections import deque
from typing import Any, Callable, Iterator

from .message import Entry

MAX_PRIORITY = 255


class PriorityReady:
    __slots__ = ("levels", "max", "_len")

    def __init__(self, max_priority: int):
        self.max = max_priority
        self.levels: list[deque[Entry]] = [deque() for _ in range(max_priority + 1)]
        self._len = 0

    def level_of(self, entry: Entry) -> int:
        priority = entry.message.priority or 0
        return priority if priority <= self.max else self.max

    def append(self, entry: Entry) -> None:
        self.levels[self.level_of(entry)].append(entry)
        self._len += 1

    def popleft(self) -> Entry:
        for level in reversed(self.levels):
            if level:
                self._len -= 1
                return level.popleft()
        raise IndexError("pop from an empty priority queue")

    def __getitem__(self, index: int) -> Entry:
        if index != 0:
            raise IndexError("only the head of a priority queue can be read")
        for level in reversed(self.levels):
            if level:
                return level[0]
        raise IndexError("empty priority queue")

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[Entry]:
        for level in reversed(self.levels):
            yield from level

    def clear(self) -> None:
        for level in self.levels:
            level.clear()
        self._len = 0

    def put_back(self, entries: list[Entry]) -> None:
        """Requeue: each entry to its level, at its original position (entries sorted by seq)."""
        by_level: dict[int, list[Entry]] = {}
        for entry in entries:
            by_level.setdefault(self.level_of(entry), []).append(entry)
        for index, items in by_level.items():
            level = self.levels[index]
            if not level or items[-1].seq < level[0].seq:
                level.extendleft(reversed(items))
            else:
                self.levels[index] = deque(heapq.merge(items, level))
            self._len += len(items)

    def insert(self, entry: Entry) -> None:
        """At its position in its level (a mirror's copy: nearly always the newest)."""
        level = self.levels[self.level_of(entry)]
        if not level or level[-1].seq < entry.seq:
            level.append(entry)
        else:
            level.insert(bisect.bisect_left(level, entry.seq, key=_seq), entry)
        self._len += 1

    def find(self, seq: int) -> Entry | None:
        """The entry at that position, whichever its level."""
        for level in self.levels:
            i = index_at(level, seq)
            if i >= 0:
                return level[i]
        return None

    def remove(self, seq: int) -> Entry | None:
        """Take the entry at that position out, whichever its level."""
        for level in self.levels:
            i = index_at(level, seq)
            if i >= 0:
                entry = level[i]
                del level[i]
                self._len -= 1
                return entry
        return None

    def take_after(self, seq: int) -> list[Entry]:
        """Take out every entry past that position, in position order."""
        taken: list[Entry] = []
        for level in self.levels:
            while level and level[-1].seq > seq:
                taken.append(level.pop())
        self._len -= len(taken)
        taken.sort()
        return taken

    def drop_while_expired(self, now: float) -> list[Entry]:
        """Remove the expired heads of every level (RabbitMQ expires at the heads only)."""
        dropped = []
        for level in self.levels:
            while level and level[0].expires and level[0].expires <= now:
                dropped.append(level.popleft())
        self._len -= len(dropped)
        return dropped

    def next_expiry(self) -> float:
        soonest = 0.0
        for level in self.levels:
            if level and level[0].expires and (not soonest or level[0].expires < soonest):
                soonest = level[0].expires
        return soonest


def _seq(entry: Entry) -> int:
    return entry.seq


def _itself(seq: int) -> int:
    return seq


def index_at(items: deque[Any], seq: int, key: Callable[[Any], int] | None = _seq) -> int:
    """Where the item at position `seq` is in `items` rising by position (`key(item)`; with key
    None the items are the positions themselves), or -1: the positions are distinct integers, so
    it lies within seq - first of the left end and last - seq of the right one."""
    if not items:
        return -1
    position = key or _itself
    first, last = position(items[0]), position(items[-1])
    if seq < first or seq > last:
        return -1
    n = len(items)
    guess = seq - first              # no gaps before it
    if guess < n and position(items[guess]) == seq:
        return guess
    lo = max(0, n - 1 - (last - seq))
    hi = min(n, seq - first + 1)
    i = bisect.bisect_left(items, seq, lo, hi, key=key)
    return i if i < n and position(items[i]) == seq else -1
