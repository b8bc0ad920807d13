"""A queue master: ready messages in position order, consumers, limits.

Entries leave `ready` when delivered and come back (redelivered) in their
original position when requeued, so order survives nacks and channel loss.
Delivery is round-robin over the consumers that can take a message now:
a consumer is skipped while its prefetch is full, its channel is flowed off
or its connection's socket is not draining (TCP back pressure, QOS-5).
"""
from __future__ import annotations

import heapq
import itertools
from collections import deque
from typing import Callable

from ..protocol.replies import AMQPError, ReplyCode, vhost_text
from ..protocol.properties import PropertyView
from .message import Entry, Message

OVERFLOW_DROP_HEAD = "drop-head"
OVERFLOW_REJECT_PUBLISH = "reject-publish"
OVERFLOW_REJECT_PUBLISH_DLX = "reject-publish-dlx"
OVERFLOWS = (OVERFLOW_DROP_HEAD, OVERFLOW_REJECT_PUBLISH, OVERFLOW_REJECT_PUBLISH_DLX)

# Queue.publish outcomes
REFUSED = 0      # x-overflow=reject-publish: nack
SAFE = 1         # in memory, nothing more to wait for
LOGGED = 2       # safe once the store says the write is durable

HEAD_LIMIT = 8192    # entries a durable queue keeps in memory; the rest wait on disk as ids


class Consumer:
    """One basic.consume: where deliveries go and how many it may hold unacked."""

    __slots__ = ("tag", "tag_raw", "channel", "queue", "no_ack", "exclusive", "prefetch", "unacked",
                 "arguments")

    def __init__(self, tag: str, channel, queue: "Queue", no_ack: bool, exclusive: bool,
                 prefetch: int, arguments: dict):
        from ..protocol.frames import shortstr
        self.tag = tag
        self.tag_raw = shortstr(tag)
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch = prefetch
        self.unacked = 0
        self.arguments = arguments

    def can_take(self) -> bool:
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        return self.channel.can_deliver()


class Queue:
    def __init__(self, name: str, vhost: str, durable: bool = False, exclusive_owner=None,
                 auto_delete: bool = False, arguments: dict | None = None,
                 on_unused: Callable[["Queue"], None] | None = None, store=None, store_id: int = 0):
        self.name = name
        self.vhost = vhost
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = dict(arguments or {})
        self.ready: deque[Entry] = deque()
        self.ready_bytes = 0
        # Paged out: ids of logged messages, all newer than every entry in `ready`.
        self.tail: deque[int] = deque()
        self.tail_bytes = 0
        self.store = store if durable and exclusive_owner is None else None
        self.store_id = store_id
        self.dead_letter: Callable[["Queue", list, str], None] | None = None   # set when it has a DLX
        self.consumers: deque[Consumer] = deque()
        self.unacked = 0
        self.deleted = False
        self._had_consumers = False
        self._seq = itertools.count(1)
        self._on_unused = on_unused
        self._dispatching = False
        self.max_length = _int_arg(self.arguments, "x-max-length")
        self.max_length_bytes = _int_arg(self.arguments, "x-max-length-bytes")
        self.overflow = self.arguments.get("x-overflow", OVERFLOW_DROP_HEAD)
        if isinstance(self.overflow, bytes):
            self.overflow = self.overflow.decode()

    def __repr__(self) -> str:
        return f"<Queue {self.vhost}/{self.name}>"

    @property
    def message_count(self) -> int:
        return len(self.ready) + len(self.tail)

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def describe(self) -> str:
        return vhost_text("queue", self.name, self.vhost)

    # ---- messages in ----------------------------------------------------------
    def publish(self, message: Message) -> int:
        """Enqueue: SAFE, LOGGED (safe once the store syncs) or REFUSED (reject-publish)."""
        if self._would_overflow(message) and self.overflow in (OVERFLOW_REJECT_PUBLISH,
                                                               OVERFLOW_REJECT_PUBLISH_DLX):
            return REFUSED
        store = self.store
        outcome = SAFE
        if store is None:
            self.ready.append(Entry(message, next(self._seq)))
            self.ready_bytes += len(message.body)
        else:
            paging = bool(self.tail) or len(self.ready) >= HEAD_LIMIT
            if message.persistent or paging:
                msg_id = store.enqueue(self.store_id, message.exchange_raw, message.routing_key_raw,
                                       message.props_raw, message.body, transient=not message.persistent)
                outcome = LOGGED if message.persistent else SAFE
            else:
                msg_id = 0
            if paging:
                self.tail.append(msg_id)
                self.tail_bytes += len(message.body)
            else:
                self.ready.append(Entry(message, next(self._seq), False, msg_id))
                self.ready_bytes += len(message.body)
        if self.max_length is not None or self.max_length_bytes is not None:
            self._drop_head_to_limits()
        if self.consumers:
            self.dispatch()
        return outcome

    def _would_overflow(self, message: Message) -> bool:
        if self.max_length is not None and self.message_count >= self.max_length:
            return True
        if self.max_length_bytes is not None and \
                self.ready_bytes + self.tail_bytes + len(message.body) > self.max_length_bytes:
            return True
        return False

    def _drop_head_to_limits(self) -> None:
        while (self.max_length is not None and self.message_count > self.max_length) or \
                (self.max_length_bytes is not None and self.ready_bytes + self.tail_bytes > self.max_length_bytes):
            if not self.ready and not self._page_in():
                return
            dropped = self.ready.popleft()
            self.ready_bytes -= len(dropped.message.body)
            if self.dead_letter is not None:
                self.dead_letter(self, [dropped.message], "maxlen")
            self._forget([dropped])

    def _forget(self, entries) -> None:
        """These entries leave the queue for good: tell the store."""
        if self.store is not None:
            ids = [e.msg_id for e in entries if e.msg_id]
            if ids:
                self.store.ack(self.store_id, ids)

    def _page_in(self) -> bool:
        """Bring paged-out messages back into memory, oldest first; False if none could be."""
        store = self.store
        tail = self.tail
        moved = 0
        room = HEAD_LIMIT - len(self.ready)
        while tail and moved < room:
            msg_id = tail[0]
            if not store.is_durable(msg_id):
                break
            tail.popleft()
            exchange, routing_key, props_raw, body, delivered = store.read(msg_id)
            props = PropertyView(props_raw)
            message = Message(exchange, routing_key, props_raw, body, props.delivery_mode == 2,
                              props.priority, props.expiration)
            self.tail_bytes -= len(body)
            self.ready.append(Entry(message, next(self._seq), delivered, msg_id))
            self.ready_bytes += len(body)
            moved += 1
        return moved > 0

    def restore(self, messages: list[tuple[int, bool]]) -> None:
        """Recovered messages (ids in order): they start paged out and are read on demand."""
        self.tail.extend(msg_id for msg_id, _delivered in messages)

    def requeue(self, entries: list[Entry]) -> None:
        """Put delivered entries back at their original positions, flagged redelivered."""
        if not entries:
            return
        if self.deleted:
            self._forget(entries)
            return
        for entry in entries:
            entry.redelivered = True
            self.ready_bytes += len(entry.message.body)
        self.unacked -= len(entries)
        entries.sort()
        ready = self.ready
        if not ready or entries[-1].seq < ready[0].seq:
            ready.extendleft(reversed(entries))
        else:
            self.ready = deque(heapq.merge(entries, ready))
        if self.consumers:
            self.dispatch()

    # ---- messages out ---------------------------------------------------------
    def take(self, no_ack: bool) -> Entry | None:
        """Pop the head for basic.get (prefetch does not apply, QOS-3)."""
        if not self.ready and not (self.tail and self._page_in()):
            return None
        entry = self.ready.popleft()
        self.ready_bytes -= len(entry.message.body)
        self._delivered(entry, no_ack)
        return entry

    def _delivered(self, entry: Entry, no_ack: bool) -> None:
        if no_ack:
            if entry.msg_id:
                self._forget((entry,))
        else:
            self.unacked += 1
            if entry.msg_id and not entry.redelivered:
                self.store.deliver(self.store_id, entry.msg_id)

    def reject(self, entries: list[Entry]) -> None:
        """Delivered entries were rejected or nacked without requeue: dead-letter them if we can."""
        if self.dead_letter is not None and not self.deleted:
            self.dead_letter(self, [e.message for e in entries], "rejected")
        self.settle(entries)

    def settle(self, entries: list[Entry]) -> None:
        """Delivered entries were acked (or rejected without requeue)."""
        if not self.deleted:
            self.unacked -= len(entries)
        self._forget(entries)

    def dispatch(self) -> None:
        """Push ready messages to consumers that can take them, round-robin."""
        if self._dispatching:
            return
        self._dispatching = True
        try:
            if self.tail and len(self.ready) < HEAD_LIMIT // 2:
                self._page_in()
            ready = self.ready
            consumers = self.consumers
            while consumers and (ready or (self.tail and self._page_in())):
                for _ in range(len(consumers)):
                    consumer = consumers[0]
                    if consumer.can_take():
                        break
                    consumers.rotate(-1)
                else:
                    return
                ready = self.ready   # requeue may have replaced the deque
                entry = ready.popleft()
                self.ready_bytes -= len(entry.message.body)
                if len(consumers) > 1:
                    consumers.rotate(-1)
                self._delivered(entry, consumer.no_ack)
                consumer.channel.deliver(consumer, entry)
                ready = self.ready
        finally:
            self._dispatching = False

    # ---- consumers --------------------------------------------------------------
    def add_consumer(self, consumer: Consumer) -> None:
        if self.consumers and consumer.exclusive:
            raise AMQPError(ReplyCode.ACCESS_REFUSED,
                            f"queue '{self.name}' in vhost '{self.vhost}' in exclusive use", 60, 20)
        if any(c.exclusive for c in self.consumers):
            raise AMQPError(ReplyCode.ACCESS_REFUSED,
                            f"queue '{self.name}' in vhost '{self.vhost}' in exclusive use", 60, 20)
        self.consumers.append(consumer)
        self._had_consumers = True
        self.dispatch()

    def remove_consumer(self, consumer: Consumer) -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        if not self.consumers and self.auto_delete and self._had_consumers and self._on_unused:
            self._on_unused(self)

    # ---- whole queue --------------------------------------------------------------
    def purge(self) -> int:
        count = self.message_count
        self._forget(self.ready)
        if self.tail and self.store is not None:
            self.store.ack(self.store_id, list(self.tail))
        self.ready.clear()
        self.tail.clear()
        self.ready_bytes = self.tail_bytes = 0
        return count

    def mark_deleted(self) -> list[Consumer]:
        """Forget every message; return the consumers to notify with basic.cancel."""
        self.deleted = True
        consumers = list(self.consumers)
        self.consumers.clear()
        self.purge()
        return consumers


def _int_arg(arguments: dict, name: str) -> int | None:
    value = arguments.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                        f"invalid arg '{name}' for queue: {value!r}", 50, 10)
    return value
