"""One channel's stream to a remote queue's home node (MIR-7).

A link carries the channel's calls to the queue's master in order (publish,
get, consume, cancel, prefetch, settle) and reads back its events (confirms,
deliveries, consume-ok, cancels, errors). Whatever piles up while the previous
message is on the wire goes as one `Batch`: grpc.aio's cost is per message.
What to do when the stream breaks is the remote queue's (a failover, or the
old master answering again after a blip).
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any, Callable

import grpc
import structlog

from haremq.node.broker.message import Entry, Message
from haremq.node.protocol.replies import AMQPError, ReplyCode

from haremq.cluster.links.codec import message_from_pb, pack_publishes
from haremq.cluster.rpc import cluster_pb2 as pb

if TYPE_CHECKING:
    from haremq.cluster.links.remote_queue import RemoteQueue

ACK, REQUEUE, DISCARD = 0, 1, 2      # QueueCall.Settle modes
MOVED = 0       # QueueEvent.Error code: the queue's master is elsewhere now (a failover)
MAX_BATCH = 1000      # calls (or events) sent as one message on a link's stream, at most
BATCH_BYTES = 4 << 20  # message bodies in one message on a link's stream: no more are added past it


class RemoteEntry(Entry):
    """A delivery from a remote queue: `seq` is the home node's delivery id, `key` the entry's
    key in the queue (the same on its mirrors, so after a failover too)."""

    __slots__ = ("link", "key")
    link: QueueLink
    key: int


class QueueLink:
    """One channel's stream to a remote queue's home node."""

    def __init__(self, queue: RemoteQueue, channel):
        self.queue = queue
        self.channel = channel
        self.calls: asyncio.Queue = asyncio.Queue()
        self.gets: deque = deque()          # (no_ack, callback) waiting for a get answer, in order
        self.consumers: dict[str, Any] = {}      # tag -> the client channel's Consumer
        self.consumed: dict[str, Callable[[], None]] = {}   # tag -> waiting for the home's consume-ok
        self.unconfirmed: dict[int, Message] = {}     # seq -> message, in publish order
        self.closed = False
        self.abandoned = False      # dropped without telling the home: nothing it says counts
        self.epoch = queue.epoch
        self.delivered: dict[int, RemoteEntry] = {}   # id -> delivered, not yet settled by the client
        peer = queue.peers(queue.home)
        if peer is None or peer.stub is None or not queue.home_up(queue.home):
            raise AMQPError(ReplyCode.NOT_FOUND, f"home node of {queue.describe()} is down")
        owner = getattr(channel.session, "key", "")
        self.calls.put_nowait(pb.QueueCall(open=pb.QueueCall.Open(vhost=queue.vhost, queue=queue.name, owner=owner,
                                                                  epoch=queue.epoch)))
        self._call = peer.stub.QueueSession(self._requests(), metadata=queue.metadata(), wait_for_ready=True)
        self._reader = queue.tasks.spawn(self._read())    # ends with the call; the node's group awaits it

    async def _requests(self):
        """The calls, in order; whatever piled up while the previous message was on the wire
        goes as one batch (grpc.aio's cost is per message, so a busy publisher pays it once per
        batch, not once per publish)."""
        calls = self.calls
        first = await calls.get()       # the open, alone: the home reads it before anything else
        if first is None:
            return
        yield first
        while True:
            call = await calls.get()
            if call is None:
                return
            batch, ended = piled_up(calls, call, publish_weight)
            batch = with_publishes_packed(batch)
            yield batch[0] if len(batch) == 1 else pb.QueueCall(batch=pb.QueueCall.Batch(calls=batch))
            if ended:
                return

    def send(self, call: pb.QueueCall) -> None:
        if not self.closed:
            self.calls.put_nowait(call)

    def send_publish(self, seq: int, message: Message) -> None:
        """A publish waits as (seq, message): consecutive ones go packed (with_publishes_packed)."""
        if not self.closed:
            self.calls.put_nowait((seq, message))

    async def _read(self) -> None:
        channel = self.channel
        try:
            async for event in self._call:
                if self.abandoned:      # a late answer of a link given up (its master moved or died)
                    return
                if event.WhichOneof("event") == "batch":
                    for one in event.batch.events:
                        if self._event(one) or self.abandoned:
                            return
                elif self._event(event):
                    return
        except grpc.aio.AioRpcError as exc:
            if not self.closed and not channel.closed and not self.abandoned:
                structlog.get_logger("haremq.cluster").warning(
                    "link to queue home lost", queue=self.queue.name, home=self.queue.home, code=exc.code().name)
                self.queue.home_lost()
                self._lost()
        finally:
            self.closed = True
            self._answer_gets()

    def _event(self, event) -> bool:
        """One event from the home node; True when the link is done with (the queue moved)."""
        channel = self.channel
        kind = event.WhichOneof("event")
        if kind == "confirm":
            for seq in event.confirm.seqs:
                self.unconfirmed.pop(seq, None)
            channel.remote_settled(event.confirm.seqs, event.confirm.ok)
        elif kind == "delivery":
            d = event.delivery
            self.queue.remote_count = d.message_count
            if d.tag and d.key and self.queue.seen_before(self, d):
                return False
            entry = RemoteEntry(message_from_pb(d.message), d.id, d.redelivered)
            entry.link = self
            entry.key = d.key
            if d.tag:
                consumer = self.consumers.get(d.tag)
                if consumer is not None and consumer.no_ack:
                    self.queue.note_acked(d.key, self.epoch, entry.message)
                elif consumer is not None and not channel.closed:
                    self.delivered[d.id] = entry
                if consumer is not None and not channel.closed:
                    channel.deliver_from_home(consumer, entry)
                    channel.session.wakeup()
                else:   # cancelled meanwhile: give it back
                    self.send(pb.QueueCall(settle=pb.QueueCall.Settle(ids=[d.id], mode=REQUEUE)))
            elif self.gets:
                no_ack, answer = self.gets.popleft()
                if no_ack:
                    self.queue.note_acked(d.key, self.epoch, entry.message)
                else:
                    self.delivered[d.id] = entry
                answer(entry, d.message_count)
        elif kind == "consume_ok":
            consumed = self.consumed.pop(event.consume_ok.tag, None)
            if consumed is not None:
                consumed()
        elif kind == "empty":
            if self.gets:
                self.gets.popleft()[1](None, 0)
        elif kind == "cancelled":
            consumer = self.consumers.pop(event.cancelled.tag, None)
            if consumer is not None:
                self.queue.consumers_remove(consumer)
                channel.consumer_cancelled_by_broker(consumer)
                channel.session.wakeup()
        elif kind == "error" and event.error.code == MOVED:
            if not self.closed and not channel.closed:
                self._lost()
            return True
        elif kind == "error":
            err = AMQPError(ReplyCode(event.error.code), event.error.text.split(" - ", 1)[-1])
            channel.session.fail_channel(channel.id, err)
        return False

    def _lost(self) -> None:
        """The home node went away: the channel stays open. For a mirrored queue, unconfirmed
        publishes wait for the new master and go to it (confirmed once safe there), consumers
        wait for it too (MIR-8). Otherwise unconfirmed publishes are nacked (CONF-5: the client
        may republish) and consumers get basic.cancel. What they had not acked goes back to
        the queue: on the new master at once, on the old home when it returns."""
        queue = self.queue
        if queue.mirrored:
            queue.failing_over()
            if queue._links.get(self.channel) is self:
                del queue._links[self.channel]
            queue._hold_front(self.channel, self.abandon(carry=True))
            return
        self.abandon()
        for consumer in list(self.consumers.values()):
            self.queue.consumers_remove(consumer)
            self.channel.consumer_cancelled_by_broker(consumer)
        self.consumers.clear()
        self.channel.session.wakeup()

    def abandon(self, carry: bool = False) -> list:
        """Stop using this link without telling the home (its call is cancelled, so a dead
        home that comes back never answers it). What it did not confirm is nacked, or with
        carry=True returned as [(seq, message)] for the queue's next master; pending gets are
        answered with nothing (or wait for that master)."""
        channel = self.channel
        self.close()
        self.abandoned = True
        if self._call is not None:
            self._call.cancel()
        unconfirmed, self.unconfirmed = list(self.unconfirmed.items()), {}
        delivered, self.delivered = self.delivered, {}
        self.queue.in_doubt(delivered.values())
        if unconfirmed and not carry:
            channel.remote_settled([seq for seq, _m in unconfirmed], False)
        self._answer_gets()
        consumed, self.consumed = self.consumed, {}
        for fn in consumed.values():     # consume-ok now: the consumer then waits for a failover,
            fn()                         # or gets basic.cancel, as any consumer of this queue
        channel.session.wakeup()
        return unconfirmed if carry else []

    def _answer_gets(self) -> None:
        """Gets the home never answered: a mirrored queue's wait for the new master, others
        are answered with nothing (basic.get-empty)."""
        queue = self.queue
        while self.gets:
            no_ack, answer = self.gets.popleft()
            if queue.mirrored and not self.channel.closed:
                down = AMQPError(ReplyCode.NOT_FOUND, f"home node of {queue.describe()} is down", 60, 70)
                queue._park(self.channel, down, lambda n=no_ack: self.channel.get_again(queue.name, n))
            else:
                answer(None, 0)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.calls.put_nowait(None)


def with_publishes_packed(batch: list) -> list:
    """A batch of calls with each run of publishes, waiting as (seq, message), as one
    QueueCall.Publishes: a protobuf object per run rather than three per publish."""
    out: list = []
    run: list = []
    for item in batch:
        if type(item) is tuple:
            run.append(item)
            continue
        if run:
            out.append(pb.QueueCall(publishes=pb.QueueCall.Publishes(packed=pack_publishes(run))))
            run = []
        out.append(item)
    if run:
        out.append(pb.QueueCall(publishes=pb.QueueCall.Publishes(packed=pack_publishes(run))))
    return out


def piled_up(items: asyncio.Queue, first, weight: Callable[[Any], int]) -> tuple[list, bool]:
    """`first` and whatever else already waits in `items`, to go as one message on a link's
    stream: MAX_BATCH at most, and no more once their bodies (`weight`) reach BATCH_BYTES (a
    heavier one goes alone); True if the stream's end (None) was among them."""
    batch = [first]
    size = weight(first)
    while not items.empty() and len(batch) < MAX_BATCH and size < BATCH_BYTES:
        item = items.get_nowait()
        if item is None:
            return batch, True
        batch.append(item)
        size += weight(item)
    return batch, False


def publish_weight(call) -> int:
    """A call's body bytes: a publish waits as (seq, message)."""
    return len(call[1].body) if type(call) is tuple else 0


def event_weight(event) -> int:
    """An event's body bytes: a delivery's."""
    return len(event.delivery.message.body) if event is not None and event.HasField("delivery") else 0
