"""What a mirrored queue's master reads of its backing queue for a mirror, by position.

A new mirror's sync reads the whole queue a chunk at a time (`ContentsReader`);
a promoted master reconciles a surviving mirror by keys alone (`keys_upto`),
then sends the messages it lacks (`entries_at`); a mirror in manual sync is
measured against the oldest position still held (`oldest_position`). Every message
is known by the position its first master gave it, in memory or paged out.
"""
from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from haremq.node.broker.backing_queue import BackingQueue
    from haremq.node.broker.message import Entry, Message

# (position, message, delivered before, TTL deadline or 0)
Item = tuple[int, "Message", bool, float]


def oldest_position(queue: BackingQueue) -> int:
    """The position of the oldest message still in the queue (next_seq when empty)."""
    oldest = queue.next_seq
    if queue.outstanding:
        oldest = min(oldest, min(queue.outstanding))
    ready = queue.ready
    if ready:
        oldest = min(oldest, ready[0].seq if queue.ordered else min(e.seq for e in ready))
    if queue.paged_out:
        oldest = min(oldest, queue.tail_keys[0])
    return oldest


def keys_upto(queue: BackingQueue, upto: int) -> tuple[list[int], list[int]]:
    """(every key up to `upto` still in the queue, those of them delivered), ascending: what a
    promoted master reconciles a surviving mirror with, without reading a message."""
    outstanding = queue.outstanding
    in_memory = [e for e in outstanding.values() if e.seq <= upto] + [e for e in queue.ready if e.seq <= upto]
    keys = [e.seq for e in in_memory]
    keys += [key for key in queue.tail_keys if key <= upto]
    keys.sort()
    delivered = sorted(e.seq for e in in_memory if e.redelivered or e.seq in outstanding)
    return keys, delivered


def entries_at(queue: BackingQueue, keys: list[int]) -> list[Item] | None:
    """Those keys still in the queue, ascending; None if a paged-out one has not reached the
    file yet (ask again after the store's next write)."""
    want = set(keys)
    outstanding = queue.outstanding
    out: list[Item] = [(e.seq, e.message, True, e.expires) for e in outstanding.values() if e.seq in want]
    out += [(e.seq, e.message, e.redelivered, e.expires) for e in queue.ready if e.seq in want]
    tail, tail_keys, store = queue.tail, queue.tail_keys, queue.store
    for key in sorted(want):
        i = bisect.bisect_left(tail_keys, key)
        if i < len(tail_keys) and tail_keys[i] == key and store is not None:
            msg_id = tail[i]
            if not store.is_written(msg_id):
                return None
            message, delivered = queue.read(msg_id)
            out.append((key, message, delivered, queue.tail_deadline(msg_id)))
    out.sort(key=_first)
    return out


class ContentsReader:
    """A queue's messages as of when the reader was made, read in chunks while the queue keeps
    serving: what a new mirror's sync sends. Paged-out messages are read from the store a chunk
    at a time, so neither side ever holds the whole queue in memory. A message that has left the
    queue since is skipped: its removal follows in the replication log anyway."""

    def __init__(self, queue: BackingQueue):
        self.queue = queue
        self.cut = queue.next_seq               # positions from here on come with the live log
        self.cursor = 0
        self.tail_ids = list(queue.tail)        # ids and positions only, not the messages
        self.tail_keys = list(queue.tail_keys)
        self.tail_at = 0                        # how far into them the reading is
        self.total = queue.message_count + len(queue.outstanding)
        self.sent = 0

    def read(self, limit: int) -> list[Item] | None:
        """The next chunk, oldest first; [] once done; None if a paged-out message has not
        reached the file yet (try again after a write)."""
        while True:
            out = self._in_memory(limit)
            if len(out) < limit and self.queue.tail:
                more = self._paged_out(limit - len(out), bool(out))
                if more is None:
                    return None
                out += more
            if out:
                self.cursor = out[-1][0] + 1
                self.sent += len(out)
                return out
            if self.queue.tail and self.tail_at < len(self.tail_keys):
                continue        # a whole chunk of them had left the queue: the reading moved on
            return out

    def _in_memory(self, limit: int) -> list[Item]:
        queue, cursor, cut = self.queue, self.cursor, self.cut
        outstanding = queue.outstanding
        found = [e for e in outstanding.values() if cursor <= e.seq < cut]
        ready = queue.ready
        if not queue.ordered:
            found += [e for e in ready if cursor <= e.seq < cut]
        elif ready and ready[-1].seq >= cursor:
            i = bisect.bisect_left(ready, cursor, key=_entry_seq)
            while i < len(ready) and len(found) < 2 * limit and ready[i].seq < cut:
                found.append(ready[i])
                i += 1
        found.sort()
        del found[limit:]
        return [(e.seq, e.message, e.redelivered or e.seq in outstanding, e.expires) for e in found]

    def _paged_out(self, limit: int, partial: bool) -> list[Item] | None:
        """Still paged out: from the queue's oldest paged-out position now (older ones were read
        in since, and come from memory)."""
        queue = self.queue
        store = queue.store
        if store is None:
            return []
        keys, ids = self.tail_keys, self.tail_ids
        i = bisect.bisect_left(keys, max(self.cursor, queue.tail_keys[0]), lo=self.tail_at)
        out: list[Item] = []
        while i < len(keys) and len(out) < limit and keys[i] < self.cut:
            msg_id = ids[i]
            if msg_id in store.index:           # else it has left the queue since
                if not store.is_written(msg_id):
                    if not out and not partial:
                        self.tail_at = i
                        return None
                    break
                message, delivered = queue.read(msg_id)
                out.append((keys[i], message, delivered, queue.tail_deadline(msg_id)))
            i += 1
        self.tail_at = i if i < len(keys) and keys[i] < self.cut else len(keys)
        if not out and not partial and self.tail_at < len(keys):
            self.cursor = max(self.cursor, keys[self.tail_at])
        return out


def _entry_seq(entry: Entry) -> int:
    return entry.seq


def _first(item: Item) -> int:
    return item[0]
