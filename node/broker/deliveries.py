"""One channel's deliveries the client has not answered yet, and the room its prefetch leaves.

Delivery tags are per channel (ACK-1). Every delivery in manual-ack mode
stays in `unacked` until acked, rejected or nacked (ACK-2..5); a consumer's
prefetch counts on its consumer, the channel-wide (global) one here (QOS-1,
QOS-2). Deliveries a queue's home node pushed over the global cap wait in
`parked`, in order, for acks to make room. This state is apart from the
AMQP methods that change it so that they read as the protocol does.
"""
from __future__ import annotations

from collections import deque
from time import monotonic

from ..protocol.replies import ReplyCode, error
from .message import Entry


class Unacked:
    """A delivery waiting for its ack: which entry, from which queue, through which consumer,
    and since when (node/broker/consumer_timeout.py)."""

    __slots__ = ("tag", "entry", "queue", "consumer", "at")

    def __init__(self, tag: int, entry: Entry, queue, consumer):
        self.tag = tag
        self.entry = entry
        self.queue = queue
        self.consumer = consumer
        self.at = monotonic()


class Deliveries:
    __slots__ = ("next_tag", "unacked", "prefetch_consumer", "prefetch_global", "global_unacked", "parked")

    def __init__(self):
        self.next_tag = 1
        self.unacked: dict[int, Unacked] = {}
        self.prefetch_consumer = 0        # basic.qos global=false: for consumers started after it
        self.prefetch_global = 0          # basic.qos global=true: for the whole channel
        self.global_unacked = 0
        self.parked: deque = deque()      # (consumer, entry) pushed by a home node over the global cap

    def tag(self) -> int:
        tag = self.next_tag
        self.next_tag = tag + 1
        return tag

    def room_for(self, consumer) -> bool:
        return consumer.no_ack or not self.prefetch_global or self.global_unacked < self.prefetch_global

    def delivered(self, tag: int, entry: Entry, queue, consumer) -> None:
        """A delivery the client must answer; `consumer` None for a basic.get."""
        self.unacked[tag] = Unacked(tag, entry, queue, consumer)
        if consumer is not None:
            consumer.unacked += 1
            self.global_unacked += 1

    def oldest(self) -> Unacked | None:
        """The delivery waiting longest (tags are handed out in order, and kept in it)."""
        return next(iter(self.unacked.values()), None)

    def take(self, tag: int, multiple: bool, method) -> list[Unacked]:
        """The deliveries an ack, nack or reject names; an unknown tag is a channel error (ACK-4)."""
        unacked = self.unacked
        if multiple:
            if tag == 0:
                return self.take_all()
            if tag not in unacked:
                raise error(ReplyCode.PRECONDITION_FAILED, f"unknown delivery tag {tag}", method)
            records = []
            for key in list(unacked):
                if key > tag:
                    break
                records.append(unacked.pop(key))
            return records
        record = unacked.pop(tag, None)
        if record is None:
            raise error(ReplyCode.PRECONDITION_FAILED, f"unknown delivery tag {tag}", method)
        return [record]

    def take_all(self) -> list[Unacked]:
        records = list(self.unacked.values())
        self.unacked.clear()
        return records

    def put_back(self, records: list[Unacked]) -> None:
        """tx.rollback: acks taken in the transaction are unacked again, in tag order."""
        restored = dict(self.unacked)
        for record in records:
            restored[record.tag] = record
        self.unacked = dict(sorted(restored.items()))

    def released(self, records: list[Unacked]) -> set:
        """The credit the answered deliveries held is free again. Returns the queues that credit
        belongs to now where a consumer moved to another queue handle since the delivery (its queue
        failed over to a master on this node)."""
        moved = set()
        for record in records:
            consumer = record.consumer
            if consumer is not None:
                consumer.unacked -= 1
                self.global_unacked -= 1
                if consumer.queue is not record.queue:
                    moved.add(consumer.queue)
        return moved
