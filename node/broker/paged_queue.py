"""A queue's messages, paged to the store: the backing queue a `Queue` delivers from.

The head is in memory (`ready`, in position order; by level for a priority
queue); once it holds HEAD_LIMIT entries, newer logged messages wait on disk as
store ids (`tail`) with their positions (`tail_keys`) and are read back, oldest
first, as the head drains. Delivered and unsettled entries are `outstanding`, by
position. A transient queue has no store: everything stays in memory.
"""
from __future__ import annotations

import heapq
import sys
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable

from ..protocol.properties import PropertyView
from .delivery_count import returned
from .expiry import expiration_ms, monotonic
from .message import Entry, Message
from .priority import PriorityReady

if TYPE_CHECKING:
    from ..store.store import MessageStore
    from .backing_queue import BackingQueue, Contents
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
        # priority queues stay in memory, never paged out
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
        paging = bool(self.tail) or len(self.ready) >= self.head_limit
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

    def adopt(self, contents: Contents, deadline: Callable[[Message], float]) -> bool:
        """A promoted mirror's messages (MIR-4): keys ascending, kept (the positions the old
        master gave them). Those delivered on the old master come back redelivered; a TTL
        deadline the old master had set holds (one unknown to it is deadline(message)). The head
        is read into memory and the rest stays paged out, as on the mirror: taken over by
        columns, since a promotion must not hold the loop for a long queue. True if some
        message has a deadline."""
        keys = contents.keys
        if not keys:
            return False
        store = self.store
        ready = self.ready
        some_expire = False
        self.next_seq = max(self.next_seq, keys[-1] + 1)
        head = len(keys) if store is None else 0 if self.tail else max(0, self.head_limit - len(ready))
        held, ids, delivered_keys, deadlines = contents.held, contents.ids, contents.delivered, contents.expires
        for key in keys[:head]:
            message, msg_id, expires = held.get(key), ids.get(key, 0), deadlines.get(key, 0.0)
            delivered = key in delivered_keys
            if message is None:
                message, delivered = self.read(msg_id)
            if not expires:
                expires = deadline(message)
            if expires:
                some_expire = True
            if delivered and self.persist_all:
                message = returned(message)
            ready.append(Entry(message, key, delivered, msg_id, expires))
            self.ready_bytes += len(message.body)
        rest = keys[head:]
        if rest and store is not None:      # a transient queue takes every key into memory
            ids_here: dict[int, int] = {}
            if held:         # held in memory on the mirror: paged out here
                def stored(key: int) -> int:
                    msg_id = ids.get(key)
                    if msg_id is None:
                        message = held[key]
                        msg_id = store.enqueue(self.store_id, message.exchange_raw, message.routing_key_raw,
                                               message.props_raw, message.body, delivered=key in delivered_keys,
                                               transient=True)
                        ids_here[key] = msg_id
                    return msg_id
                self.tail.extend(map(stored, rest))
            else:
                self.tail.extend(map(ids.__getitem__, rest))
            self.tail_keys.extend(rest)
            if deadlines:
                in_rest = set(rest)
                for key, expires in deadlines.items():
                    if expires and key in in_rest:
                        self.tail_expiry[ids_here.get(key) or ids[key]] = expires
                        some_expire = True
        return some_expire

    # ---- messages out -------------------------------------------------------------------------
    def has_ready(self) -> bool:
        """Something at the head (paged in if need be)."""
        return bool(self.ready) or (bool(self.tail) and self._page_in())

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
            self.tail_bytes -= len(entry.message.body)
            self.ready.append(entry)
            self.ready_bytes += len(entry.message.body)
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
