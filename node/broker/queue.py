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
from .message import Entry, Message

OVERFLOW_DROP_HEAD = "drop-head"
OVERFLOW_REJECT_PUBLISH = "reject-publish"
OVERFLOW_REJECT_PUBLISH_DLX = "reject-publish-dlx"
OVERFLOWS = (OVERFLOW_DROP_HEAD, OVERFLOW_REJECT_PUBLISH, OVERFLOW_REJECT_PUBLISH_DLX)


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
                 on_unused: Callable[["Queue"], None] | None = None):
        self.name = name
        self.vhost = vhost
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = dict(arguments or {})
        self.ready: deque[Entry] = deque()
        self.ready_bytes = 0
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
        return len(self.ready)

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def describe(self) -> str:
        return vhost_text("queue", self.name, self.vhost)

    # ---- messages in ----------------------------------------------------------
    def publish(self, message: Message) -> bool:
        """Enqueue; False when the queue refuses it (x-overflow=reject-publish)."""
        if self._would_overflow(message):
            if self.overflow in (OVERFLOW_REJECT_PUBLISH, OVERFLOW_REJECT_PUBLISH_DLX):
                return False
            self.ready.append(Entry(message, next(self._seq)))
            self.ready_bytes += len(message.body)
            self._drop_head_to_limits()
        else:
            self.ready.append(Entry(message, next(self._seq)))
            self.ready_bytes += len(message.body)
        if self.consumers:
            self.dispatch()
        return True

    def _would_overflow(self, message: Message) -> bool:
        if self.max_length is not None and len(self.ready) >= self.max_length:
            return True
        if self.max_length_bytes is not None and self.ready_bytes + len(message.body) > self.max_length_bytes:
            return True
        return False

    def _drop_head_to_limits(self) -> None:
        while self.ready and (
                (self.max_length is not None and len(self.ready) > self.max_length)
                or (self.max_length_bytes is not None and self.ready_bytes > self.max_length_bytes)):
            dropped = self.ready.popleft()
            self.ready_bytes -= len(dropped.message.body)

    def requeue(self, entries: list[Entry]) -> None:
        """Put delivered entries back at their original positions, flagged redelivered."""
        if self.deleted or not entries:
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
        if not self.ready:
            return None
        entry = self.ready.popleft()
        self.ready_bytes -= len(entry.message.body)
        if not no_ack:
            self.unacked += 1
        return entry

    def settle(self, count: int = 1) -> None:
        """Delivered entries were acked (or rejected without requeue)."""
        self.unacked -= count

    def dispatch(self) -> None:
        """Push ready messages to consumers that can take them, round-robin."""
        if self._dispatching:
            return
        self._dispatching = True
        try:
            ready = self.ready
            consumers = self.consumers
            while ready and consumers:
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
                if not consumer.no_ack:
                    self.unacked += 1
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
        count = len(self.ready)
        self.ready.clear()
        self.ready_bytes = 0
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
