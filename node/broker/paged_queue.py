"""A queue's messages, paged to the store: the backing queue a `Queue` delivers from.

The head is in memory (`ready`, in position order; by level for a priority
queue); once it holds HEAD_LIMIT entries, newer logged messages wait on disk as
store ids (`tail`) with their positions (`tail_keys`) and are read back, oldest
first, as the head drains. Delivered and unsettled entries are `outstanding`, by
position. A transient queue has no store: everything stays in memory.

A mirror keeps its copy of a mirrored queue in a PagedQueue too, filled by
position (`place`, `remove_keys`, `flag_delivered`) as its master's changes
arrive and never reading a body back; a promotion hands that copy to the new
master's `Queue` as it is (`taken_over`).
"""
from __future__ import annotations

import bisect
import heapq
import sys
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..protocol.properties import PropertyView
from .delivery_count import returned
from .expiry import expiration_ms, monotonic
from .message import Entry, Message
from .priority import PriorityReady, index_at

if TYPE_CHECKING:
    from ..store.store import MessageStore
    from .backing_queue import BackingQueue
    from .deduplication import IdCache

# Queue.publish outcomes
REFUSED = 0      # x-overflow=reject-publish: nack
SAFE = 1         # in memory, nothing more to wait for
LOGGED = 2       # safe once the store says the write is durable

HEAD_LIMIT = 8192    # entries a durable queue keeps in memory; the rest wait on disk as ids

class PagedQueue:
    """The store-backed, paged contents of one queue (the BackingQueue of backing_queue.py)."""

    def __init__(self, store: MessageStore | None, store_id: int, max_priority: int | None, persist_all: bool,
                 recovered_deadline: Callable[[Message, float], float]):
        self.store = store
        self.store_id = store_id
        self.ready: deque[Entry] | PriorityReady = deque() if max_priority is None else PriorityReady(max_priority)
        self.ordered = max_priority is None      # `ready` is in position order
        self.ready_bytes = 0
        # Paged out: ids of logged messages, all newer than every entry in `ready`, and their
        # positions (seqs, rising): a mirror knows a message by its position.
        self.tail: deque[int] = deque()
        self.tail_keys: deque[int] = deque()
        self.tail_bytes = 0
        self.tail_expiry: dict[int, float] = {}  # paged-out message id -> deadline
        # delivered and not yet settled, by seq: a mirror started now must hold these too
        self.outstanding: dict[int, Entry] = {}
        self.next_seq = 1                        # the position the next message gets
        # priority queues stay in memory, never paged out (a mirror's copy taken over is read in whole)
        self.head_limit = HEAD_LIMIT if max_priority is None else sys.maxsize
        self.persist_all = persist_all           # a quorum queue logs transient messages too
        self._recovered_deadline = recovered_deadline
        self._restored_upto = 0                  # ids up to here were recovered at start
        self._restored_at = 0.0

    # ---- what it holds ------------------------------------------------------------------------
    @property
    def message_count(self) -> int:
        return len(self.ready) + len(self.tail)

    @property
    def message_bytes(self) -> int:
        return self.ready_bytes + self.tail_bytes

    @property
    def paged_out(self) -> int:
        return len(self.tail)

    @property
    def logs(self) -> bool:
        """A publish here waits for something (the store's fsync) before it is confirmed."""
        return self.store is not None

    # ---- messages in --------------------------------------------------------------------------
    def publish(self, message: Message, expires: float, seen: tuple[bytes, int] | None) -> int:
        """Append at the next position: SAFE, or LOGGED (safe once the store's write is durable)."""
        seq = self.next_seq
        self.next_seq = seq + 1
        store = self.store
        if store is None:
            self.ready.append(Entry(message, seq, False, 0, expires))
            self.ready_bytes += len(message.body)
            return SAFE
        outcome = SAFE
        # a priority queue pages nothing out (a copy it took over is read in as its writes land)
        paging = (bool(self.tail) and self.ordered) or len(self.ready) >= self.head_limit
        persistent = message.persistent or self.persist_all
        if persistent or paging:
            msg_id = store.enqueue(self.store_id, message.exchange_raw, message.routing_key_raw,
                                   message.props_raw, message.body, transient=not persistent, dedup=seen)
            outcome = LOGGED if persistent else SAFE
        else:
            msg_id = 0
        if paging:
            self.tail.append(msg_id)
            self.tail_keys.append(seq)
            self.tail_bytes += len(message.body)
            if expires:
                self.tail_expiry[msg_id] = expires
        else:
            self.ready.append(Entry(message, seq, False, msg_id, expires))
            self.ready_bytes += len(message.body)
        return outcome

    def when_safe(self, fn: Callable[..., None], *args: Any) -> None:
        """fn(ok, *args) once everything published so far is durable here."""
        if self.store is None:
            fn(True, *args)
        else:
            self.store.when_durable(fn, *args)

    def restore(self, messages: list[int]) -> None:
        """Recovered messages (store ids, in order): they start paged out and are read on demand
        (a priority queue reads them all now: it keeps everything in memory)."""
        if messages:
            self._restored_upto = messages[-1]
            self._restored_at = monotonic()
        if self.ordered:
            if messages:
                self.tail_keys.extend(range(self.next_seq, self.next_seq + len(messages)))
                self.next_seq += len(messages)
                self.tail.extend(messages)
        else:
            for msg_id in messages:
                entry = self._load(msg_id, self.next_seq)
                self.next_seq += 1
                self.ready.append(entry)
                self.ready_bytes += len(entry.message.body)

    # ---- messages out -------------------------------------------------------------------------
    def has_ready(self) -> bool:
        """Something at the head (paged in if need be). A priority queue has a paged-out part only
        when taken over from a mirror: it serves once all of it is in memory, in priority order."""
        if self.tail and (not self.ready or not self.ordered):
            self._page_in()
            if self.tail and not self.ordered:
                return False
        return bool(self.ready)

    def pop(self) -> Entry:
        """Take the head (has_ready() said there is one)."""
        entry = self.ready.popleft()
        self.ready_bytes -= len(entry.message.body)
        return entry

    def top_up(self) -> None:
        """Before a run of deliveries: page in while less than half the head is in memory."""
        if self.tail and len(self.ready) < HEAD_LIMIT // 2:
            self._page_in()

    def delivered(self, entry: Entry, no_ack: bool) -> None:
        """The entry went to a consumer: gone with no_ack, else outstanding until settled."""
        if no_ack:
            if entry.msg_id:
                self.forget((entry,))
        else:
            self.outstanding[entry.seq] = entry
            if entry.msg_id and not entry.redelivered and self.store is not None:
                self.store.deliver(self.store_id, entry.msg_id)

    def forget(self, entries: Iterable[Entry]) -> None:
        """These entries leave the queue for good: tell the store."""
        outstanding = self.outstanding
        if outstanding:
            for entry in entries:
                outstanding.pop(entry.seq, None)
        if self.store is not None:
            ids = [e.msg_id for e in entries if e.msg_id]
            if ids:
                self.store.ack(self.store_id, ids)

    def requeue(self, entries: list[Entry]) -> None:
        """Delivered entries back at their original positions, flagged redelivered."""
        outstanding = self.outstanding
        for entry in entries:
            entry.redelivered = True
            self.ready_bytes += len(entry.message.body)
            outstanding.pop(entry.seq, None)
        entries.sort()
        ready = self.ready
        if isinstance(ready, PriorityReady):
            ready.put_back(entries)
        elif not ready or entries[-1].seq < ready[0].seq:
            ready.extendleft(reversed(entries))
        else:
            self.ready = deque(heapq.merge(entries, ready))

    def purge(self) -> None:
        """Every ready message leaves (those delivered stay outstanding)."""
        self.forget(self.ready)
        if self.tail and self.store is not None:
            self.store.ack(self.store_id, list(self.tail))
        self._clear()

    def let_go(self) -> list[int]:
        """Forget every message here but leave them in the store: their store ids, in position
        order (a node replaying its metadata log may be given the queue back)."""
        entries = sorted([*self.ready, *self.outstanding.values()], key=_entry_seq)
        ids = [entry.msg_id for entry in entries if entry.msg_id]
        ids.extend(self.tail)
        self.outstanding.clear()
        self._clear()
        return ids

    def _clear(self) -> None:
        self.ready.clear()
        self.tail.clear()
        self.tail_keys.clear()
        self.tail_expiry.clear()
        self.ready_bytes = self.tail_bytes = 0

    # ---- deadlines ----------------------------------------------------------------------------
    def drop_expired_heads(self, now: float) -> list[Entry]:
        """Take the expired messages at the head (RabbitMQ expires at the head only)."""
        ready = self.ready
        if isinstance(ready, PriorityReady):
            dropped = ready.drop_while_expired(now)
            for entry in dropped:
                self.ready_bytes -= len(entry.message.body)
            return dropped
        dropped = []
        while self.has_ready():
            head = self.ready[0]
            if not head.expires or head.expires > now:
                break
            dropped.append(self.pop())
        return dropped

    def next_expiry(self) -> float:
        """The deadline at the head (0: none)."""
        ready = self.ready
        if isinstance(ready, PriorityReady):
            return ready.next_expiry()
        if ready:
            return ready[0].expires
        if self.tail:
            deadline = self.tail_expiry.get(self.tail[0], 0.0)
            if deadline and self.store is not None and not self.store.is_durable(self.tail[0]):
                return max(deadline, monotonic() + 0.05)   # readable once its write lands
            return deadline
        return 0.0

    def tail_deadline(self, msg_id: int) -> float:
        """A paged-out message's deadline (0: none)."""
        return self.tail_expiry.get(msg_id, 0.0)

    def restamp(self, deadline: float) -> None:
        """A policy brought or shortened message-ttl: no message expires later than `deadline`."""
        for entry in self.ready:
            if not entry.expires or entry.expires > deadline:
                entry.expires = deadline
        for msg_id in self.tail:
            if self.tail_expiry.get(msg_id, deadline + 1) > deadline:
                self.tail_expiry[msg_id] = deadline

    # ---- by position: a mirror's copy, and a promotion taking it over ---------------------------
    def place(self, key: int, message: Message, delivered: bool, expires: float,
              seen: tuple[bytes, int] | None) -> None:
        """A message at the position its master gave it, held as a mirror holds its copy: with a
        store, a persistent message by id alone (paged out) and a transient one in memory while
        nothing is paged out, up to HEAD_LIMIT; a copy never reads a body back. Nearly always
        appended; a snapshot repeating a message replaces it, a reconcile's fill puts an older
        one among those held."""
        older = key < self.next_seq
        if older:
            self.remove_keys((key,))
        else:
            self.next_seq = key + 1
        store = self.store
        if store is not None:
            persistent = message.persistent or self.persist_all
            if persistent or len(self.ready) >= HEAD_LIMIT or (self.tail and key > self.tail_keys[0]):
                if older:
                    self._page_out_after(key)       # every paged-out message stays newer than the head
                msg_id = store.enqueue(self.store_id, message.exchange_raw, message.routing_key_raw,
                                       message.props_raw, message.body, delivered=delivered,
                                       transient=not persistent, dedup=seen)
                self._paged_out(key, msg_id, expires)
                return
        entry = Entry(message, key, delivered, 0, expires)
        if older or not self.ordered:
            self._hold(entry)
        else:
            self.ready.append(entry)
            self.ready_bytes += len(message.body)

    def remove_keys(self, keys: Iterable[int], ack: bool = True) -> None:
        """Those positions leave the queue wherever they are (a mirror applying its master's
        removals, most of them at the head); with `ack` the store forgets them. No body is read.
        Taken oldest first, so that a purge's or a reconcile's many keys each cost little."""
        acked: list[int] = []
        tail, tail_keys, ready = self.tail, self.tail_keys, self.ready
        for key in sorted(keys):
            if tail_keys and tail_keys[0] == key:          # the commonest: the oldest paged out
                tail_keys.popleft()
                msg_id = tail.popleft()
                if self.tail_expiry:
                    self.tail_expiry.pop(msg_id, None)
            elif self.ordered and ready and ready[0].seq == key:     # or the oldest in memory
                entry = ready.popleft()
                self.ready_bytes -= len(entry.message.body)
                msg_id = entry.msg_id
            else:
                msg_id = self._pull(key) or 0
            if msg_id:
                acked.append(msg_id)
        if acked and ack and self.store is not None:
            self.store.ack(self.store_id, acked)

    def flag_delivered(self, keys: Iterable[int]) -> None:
        """Those positions were delivered (or requeued) on the master: they come back redelivered
        if this copy is promoted. A paged-out one is flagged in the store, as a delivery is."""
        store = self.store
        for key in keys:
            i = index_at(self.tail_keys, key, None)
            if i >= 0:
                if store is not None:
                    store.deliver(self.store_id, self.tail[i])
                continue
            entry = self._ready_entry(key)
            if entry is not None:
                entry.redelivered = True

    def positions(self) -> set[int]:
        """Every position held: ready, paged out, delivered and not settled."""
        held = set(self.tail_keys)
        held.update(entry.seq for entry in self.ready)
        held.update(self.outstanding)
        return held

    def entry_at(self, key: int) -> Entry | None:
        """The message at that position (a paged-out one read from the store), or None."""
        i = index_at(self.tail_keys, key, None)
        if i >= 0:
            msg_id = self.tail[i]
            message, delivered = self.read(msg_id)
            return Entry(message, key, delivered, msg_id, self.tail_expiry.get(msg_id, 0.0))
        return self._ready_entry(key) or self.outstanding.get(key)

    def taken_over(self, recovered_deadline: Callable[[Message, float], float]) -> bool:
        """This copy is now its queue's backing queue, as it is: no message is copied (MIR-4).
        Those delivered on the old master come back redelivered (a quorum queue's counted as
        returned, as a paged-out one is when read in); the head is read in now. True if some
        message has a deadline."""
        self._recovered_deadline = recovered_deadline
        if self.persist_all:
            for entry in self.ready:
                if entry.redelivered:
                    entry.message = returned(entry.message)
        if self.tail:
            self._page_in()
        return bool(self.tail_expiry) or any(entry.expires for entry in self.ready)

    @property
    def max_priority(self) -> int | None:
        ready = self.ready
        return ready.max if isinstance(ready, PriorityReady) else None

    def reshaped(self, max_priority: int | None) -> PagedQueue:
        """The same messages in a queue of another shape (a copy begun before its queue's
        arguments were known here): those in memory placed again, the paged-out part as it is."""
        other = PagedQueue(self.store, self.store_id, max_priority, self.persist_all, self._recovered_deadline)
        for entry in sorted(self.ready):
            other._hold(entry)
        other.tail, other.tail_keys, other.tail_expiry = self.tail, self.tail_keys, self.tail_expiry
        other.outstanding, other.next_seq = self.outstanding, self.next_seq
        return other

    def _hold(self, entry: Entry) -> None:
        """In memory, at its position."""
        ready = self.ready
        if isinstance(ready, PriorityReady):
            ready.insert(entry)
        elif not ready or ready[-1].seq < entry.seq:
            ready.append(entry)
        else:
            ready.insert(bisect.bisect_left(ready, entry.seq, key=_entry_seq), entry)
        self.ready_bytes += len(entry.message.body)

    def _paged_out(self, key: int, msg_id: int, expires: float) -> None:
        """Among the paged-out messages, at its position."""
        tail, keys = self.tail, self.tail_keys
        if not keys or keys[-1] < key:
            tail.append(msg_id)
            keys.append(key)
        else:
            i = bisect.bisect_left(keys, key)
            tail.insert(i, msg_id)
            keys.insert(i, key)
        if expires:
            self.tail_expiry[msg_id] = expires

    def _page_out_after(self, key: int) -> None:
        """The messages held in memory past `key` are logged (as transient, unless they are) and
        paged out, ahead of those paged out already: an older one is about to be paged out."""
        ready, store = self.ready, self.store
        if store is None or not ready:
            return
        if isinstance(ready, PriorityReady):
            later = ready.take_after(key)
        else:
            later = []
            while ready and ready[-1].seq > key:
                later.append(ready.pop())
            later.reverse()
        for entry in reversed(later):
            message = entry.message
            self.ready_bytes -= len(message.body)
            msg_id = entry.msg_id or store.enqueue(self.store_id, message.exchange_raw, message.routing_key_raw,
                                                   message.props_raw, message.body, delivered=entry.redelivered,
                                                   transient=not (message.persistent or self.persist_all))
            self.tail.appendleft(msg_id)
            self.tail_keys.appendleft(entry.seq)
            if entry.expires:
                self.tail_expiry[msg_id] = entry.expires

    def _ready_entry(self, key: int) -> Entry | None:
        ready = self.ready
        if isinstance(ready, PriorityReady):
            return ready.find(key)
        i = index_at(ready, key)
        return ready[i] if i >= 0 else None

    def _pull(self, key: int) -> int | None:
        """Take the message at that position out: its store id (0 if not logged), None if absent."""
        i = index_at(self.tail_keys, key, None)
        if i >= 0:
            msg_id = self.tail[i]
            del self.tail[i]
            del self.tail_keys[i]
            if self.tail_expiry:
                self.tail_expiry.pop(msg_id, None)
            return msg_id
        ready = self.ready
        entry: Entry | None
        if isinstance(ready, PriorityReady):
            entry = ready.remove(key)
        else:
            j = index_at(ready, key)
            entry = ready[j] if j >= 0 else None
            if entry is not None:
                del ready[j]
        if entry is not None:
            self.ready_bytes -= len(entry.message.body)
        else:
            entry = self.outstanding.pop(key, None)
        return entry.msg_id if entry is not None else None

    # ---- the store ----------------------------------------------------------------------------
    def read(self, msg_id: int) -> tuple[Message, bool]:
        """A logged message read back from the store, and whether it was delivered before."""
        if self.store is None:
            raise LookupError("a transient queue logs no message")
        exchange, routing_key, props_raw, body, delivered = self.store.read(msg_id)
        props = PropertyView(props_raw)
        message = Message(exchange, routing_key, props_raw, body, props.delivery_mode == 2,
                          props.priority, expiration_ms(props.expiration))
        return message, bool(delivered)

    def keep_ids(self, cache: IdCache) -> list[tuple[bytes, int]]:
        """Deduplication on: the store keeps the cache's ids; those it recovered, oldest first."""
        return self.store.keep_ids(self.store_id, cache) if self.store is not None else []

    def forget_ids(self, cache: IdCache) -> None:
        if self.store is not None:
            self.store.forget_ids(self.store_id, cache)

    def give_back_ids(self, cache: IdCache) -> None:
        if self.store is not None:
            self.store.give_back_ids(self.store_id, cache)

    def _page_in(self) -> bool:
        """Bring paged-out messages back into memory, oldest first; False if none could be."""
        store = self.store
        if store is None:         # nothing is paged out without a store
            return False
        tail = self.tail
        moved = 0
        room = self.head_limit - len(self.ready)
        while tail and moved < room:
            msg_id = tail[0]
            if not store.is_durable(msg_id):
                break
            tail.popleft()
            entry = self._load(msg_id, self.tail_keys.popleft())
            # a mirror's copy and recovered messages page out uncounted (their sizes are not known)
            self.tail_bytes = max(0, self.tail_bytes - len(entry.message.body))
            if self.ordered:
                self.ready.append(entry)
                self.ready_bytes += len(entry.message.body)
            else:       # at its position: among those published since a copy was taken over
                self._hold(entry)
            moved += 1
        return moved > 0

    def _load(self, msg_id: int, seq: int) -> Entry:
        """A logged message read back from the store, at position `seq`."""
        message, delivered = self.read(msg_id)
        expires = 0.0
        if self.tail_expiry:
            expires = self.tail_expiry.pop(msg_id, 0.0)
        if msg_id <= self._restored_upto:
            # Recovered after a restart: the time it arrived is not in the log, so its
            # TTL counts from when the node started.
            expires = self._recovered_deadline(message, self._restored_at) or expires
        if delivered and self.persist_all:
            message = returned(message)
        return Entry(message, seq, delivered, msg_id, expires)


def _entry_seq(entry: Entry) -> int:
    return entry.seq


if TYPE_CHECKING:
    def _is_a_backing_queue(queue: PagedQueue) -> BackingQueue:
        return queue      # mypy (`make lint`) fails here unless PagedQueue has every member of the port
