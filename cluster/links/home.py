"""The home node's side of a remote queue link: one stream per (client channel, queue).

A `LinkChannel` stands in for the client's channel towards the local queue:
the queue delivers to it as to any channel, it numbers deliveries, keeps
them until the client node acks, requeues or rejects them, and requeues
whatever is left when the stream ends (the client channel closed or its node
died, ACK-6), or when the cluster agrees the client's node is down (node.down:
`Links.end_from`), whichever comes first. Publishes on the stream are confirmed
back when the queue says they are safe (in memory, or fsynced when persistent
to a durable queue).
"""
from __future__ import annotations

import asyncio
import time

from pamqp import decode

from haremq.node.broker.metadata import owner_node
from haremq.node.broker.queue import LOGGED, SAFE, Consumer, Queue
from haremq.node.protocol.replies import AMQPError, ReplyCode
from haremq.node.tasks import TaskGroup

from haremq.cluster.links.codec import message_from_pb, message_to_pb, unpack_publishes
from haremq.cluster.links.link import DISCARD, MOVED, REQUEUE, event_weight, piled_up
from haremq.cluster.links.received_ids import ReceivedIds
from haremq.cluster.rpc import cluster_pb2 as pb

MAX_PENDING_EVENTS = 2000


class LinkChannel:
    def __init__(self, queue: Queue, events: asyncio.Queue, mirroring, received: ReceivedIds):
        self.queue = queue
        self.events = events
        self.mirroring = mirroring
        self.received = received
        self.next_id = 1
        self.unacked: dict[int, tuple] = {}     # id -> (entry, consumer or None)
        self.consumers: dict[str, Consumer] = {}
        self.closed = False
        self.starved = False
        self._open_confirm = None  # the newest event, if it is a confirm: more seqs may join it

    # the interface a Queue uses towards a channel
    def can_deliver(self) -> bool:
        if self.closed:
            return False
        if self.events.qsize() >= MAX_PENDING_EVENTS:
            self.starved = True
            return False
        return True

    def deliver(self, consumer: Consumer, entry) -> None:
        delivery_id = self._remember(entry, consumer, consumer.no_ack)
        if not consumer.no_ack:
            consumer.unacked += 1
        self._emit(pb.QueueEvent(delivery=pb.QueueEvent.Delivery(
            tag=consumer.tag, id=delivery_id, redelivered=entry.redelivered, message=message_to_pb(entry.message),
            message_count=self.queue.message_count, key=entry.seq)))

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None:
        if self.consumers.pop(consumer.tag, None) is not None:
            self._emit(pb.QueueEvent(cancelled=pb.QueueEvent.Cancelled(tag=consumer.tag)))

    def _remember(self, entry, consumer, no_ack: bool) -> int:
        delivery_id = self.next_id
        self.next_id += 1
        if not no_ack:
            self.unacked[delivery_id] = (entry, consumer)
        return delivery_id

    def _emit(self, event) -> None:
        self._open_confirm = None
        self.events.put_nowait(event)

    # calls from the client node
    def handle(self, call) -> None:
        kind = call.WhichOneof("call")
        if kind == "batch":
            for one in call.batch.calls:
                try:
                    self.handle(one)
                except AMQPError as err:    # the calls after it are handled, as if sent apart
                    self._emit(pb.QueueEvent(error=pb.QueueEvent.Error(code=int(err.code), text=err.text)))
            return
        if kind == "publishes":
            for seq, message in unpack_publishes(call.publishes.packed):
                self._publish(seq, message)
            return
        if kind == "publish":
            self._publish(call.publish.seq, message_from_pb(call.publish.message))
            return
        queue = self.queue
        if queue.deleted or self.closed:    # deposed or deleted meanwhile, or the link ended
            return
        if kind == "get":
            entry = queue.take(call.get.no_ack)
            if entry is None:
                self._emit(pb.QueueEvent(empty=pb.QueueEvent.Empty()))
            else:
                delivery_id = self._remember(entry, None, call.get.no_ack)
                self._emit(pb.QueueEvent(delivery=pb.QueueEvent.Delivery(
                    tag="", id=delivery_id, redelivered=entry.redelivered, message=message_to_pb(entry.message),
                    message_count=queue.message_count, key=entry.seq)))
        elif kind == "consume":
            c = call.consume
            if queue.consumers and (c.exclusive or any(x.exclusive for x in queue.consumers)):
                raise AMQPError(ReplyCode.ACCESS_REFUSED,
                                f"queue '{queue.name}' in vhost '{queue.vhost}' in exclusive use", 60, 20)
            arguments = decode.field_table(c.arguments)[1] if c.arguments else {}
            consumer = Consumer(c.tag, self, queue, c.no_ack, c.exclusive, c.prefetch, arguments)
            self.consumers[c.tag] = consumer
            self._emit(pb.QueueEvent(consume_ok=pb.QueueEvent.ConsumeOk(tag=c.tag)))   # before its deliveries
            queue.add_consumer(consumer)
        elif kind == "prefetch":
            consumer = self.consumers.get(call.prefetch.tag)
            if consumer is not None:
                consumer.prefetch = call.prefetch.count
                queue.dispatch()
        elif kind == "cancel":
            consumer = self.consumers.pop(call.cancel.tag, None)
            if consumer is not None:
                queue.remove_consumer(consumer)
        elif kind == "settle":
            self._settle(call.settle.ids, call.settle.mode)

    def _publish(self, seq: int, message) -> None:
        queue = self.queue
        if queue.deleted or self.closed:    # deposed or deleted meanwhile, or the link ended:
            if seq:                         # nothing more is confirmed here
                self._confirm(seq, False)
            return
        publish_id = message.publish_id
        if publish_id and (self.mirroring.holds_already(queue, message)
                           or self.received.seen(queue, publish_id, time.monotonic())):
            # sent again after a failover (the promoted mirror had it already) or a blip of
            # this node's (it came here before the publisher's link broke)
            if seq:
                self.mirroring.confirm_held(queue, lambda ok, s=seq: self._durable(ok, s))
            return
        outcome = queue.publish(message)
        if publish_id and outcome in (LOGGED, SAFE):
            self.received.add(queue, publish_id, time.monotonic())
        if seq:
            if outcome == LOGGED:
                queue.when_safe(self._durable, seq)
            else:
                self._confirm(seq, outcome == SAFE)

    def _settle(self, ids, mode: int) -> None:
        entries = []
        for delivery_id in ids:
            item = self.unacked.pop(delivery_id, None)
            if item is None:
                continue
            entry, consumer = item
            if consumer is not None:
                consumer.unacked -= 1
            entries.append(entry)
        if not entries:
            return
        if mode == REQUEUE:
            self.queue.requeue(entries)
        elif mode == DISCARD:
            self.queue.reject(entries)
        else:
            self.queue.settle(entries)
        if self.queue.consumers:
            self.queue.dispatch()

    def _confirm(self, seq: int, ok: bool) -> None:
        """Confirms that come together go as one event (a group commit settles many at once)."""
        pending = self._open_confirm
        if pending is not None and pending.ok == ok and self.events.qsize():    # not yet taken to send
            pending.seqs.append(seq)
            return
        event = pb.QueueEvent(confirm=pb.QueueEvent.Confirm(seqs=[seq], ok=ok))
        self._emit(event)
        self._open_confirm = event.confirm

    def _durable(self, ok: bool, seq: int) -> None:
        if not self.closed:
            self._confirm(seq, ok)

    def close(self) -> None:
        """The stream ended: requeue what the client never settled, then remove its consumers
        (in that order, as RabbitMQ does when a channel goes: a single-active consumer that
        takes over gets the requeued messages first, in their places)."""
        if self.closed:
            return
        self.closed = True
        entries = [entry for entry, _consumer in self.unacked.values()]
        self.unacked.clear()
        if entries:
            self.queue.requeue(entries)      # not to this link's consumers: it takes nothing now
        consumers = list(self.consumers.values())
        self.consumers.clear()
        for consumer in consumers:
            self.queue.remove_consumer(consumer)

    def end(self) -> None:
        """Close, and end the stream (its client's node is down)."""
        self.close()
        self._emit(None)


class Links:
    """The queue links open on this node, by the node of the client connection behind each
    (a link the node itself opened to dead-letter names none and is not kept)."""

    def __init__(self):
        self.by_node: dict[str, set[LinkChannel]] = {}
        self.received = ReceivedIds()     # publish ids their publishes brought, by queue

    def add(self, node: str, link: LinkChannel) -> None:
        if node:
            self.by_node.setdefault(node, set()).add(link)

    def remove(self, node: str, link: LinkChannel) -> None:
        links = self.by_node.get(node)
        if links is not None:
            links.discard(link)
            if not links:
                del self.by_node[node]

    def end_from(self, node: str) -> int:
        """node.down: end every link from that node's clients; how many were still open."""
        links = self.by_node.pop(node, set())
        for link in links:
            link.end()
        return len(links)


async def serve_link(broker, first, request_iterator, context, links: Links, mirroring):
    """The QueueSession handler, given the stream's first call and the rest: yields events while
    a task handles the calls. `links`: the links open on this node; `mirroring`: the node's
    (cluster/mirroring/manager.py)."""
    events: asyncio.Queue = asyncio.Queue()
    if first.WhichOneof("call") != "open":
        yield pb.QueueEvent(error=pb.QueueEvent.Error(code=503, text="COMMAND_INVALID - link not opened"))
        return
    # the client node may have seen a failover this node has not applied yet
    await mirroring.caught_up(first.open.vhost, first.open.queue, first.open.epoch)
    vhost = broker.vhosts.get(first.open.vhost)
    queue = vhost.queues.get(first.open.queue) if vhost is not None else None
    moved = mirroring.check_link(first.open.vhost, first.open.queue, first.open.epoch)
    if moved:       # not an error for the client's channel: its node re-links once it learns
        yield pb.QueueEvent(error=pb.QueueEvent.Error(code=MOVED, text=moved))
        return
    state = mirroring.states.get((first.open.vhost, first.open.queue))
    if (not isinstance(queue, Queue) or queue.deleted) and first.open.epoch and (state is None or state.mirrors):
        # a mirrored queue not (or no longer, or not yet) mastered here: the client's node
        # waits for the log to say where it is rather than telling its client "no queue"
        yield pb.QueueEvent(error=pb.QueueEvent.Error(
            code=MOVED, text=f"queue '{first.open.queue}' in vhost '{first.open.vhost}' is not mastered here"))
        return
    if not isinstance(queue, Queue) or queue.deleted:
        yield pb.QueueEvent(error=pb.QueueEvent.Error(
            code=404, text=f"NOT_FOUND - no queue '{first.open.queue}' in vhost '{first.open.vhost}'"))
        return
    link = LinkChannel(queue, events, mirroring, links.received)
    origin = owner_node(first.open.owner)
    links.add(origin, link)

    async def handle_calls():
        try:
            async for call in request_iterator:
                try:
                    link.handle(call)
                except AMQPError as err:
                    events.put_nowait(pb.QueueEvent(error=pb.QueueEvent.Error(code=int(err.code), text=err.text)))
        finally:
            link.close()
            events.put_nowait(None)

    stream = TaskGroup(f"queue link {first.open.vhost}/{first.open.queue}")   # handles the calls
    stream.spawn(handle_calls())
    try:
        while True:
            event = await events.get()
            if event is None:
                break
            batch, ended = piled_up(events, event, event_weight)   # what piled up meanwhile: one message
            yield batch[0] if len(batch) == 1 else pb.QueueEvent(batch=pb.QueueEvent.Batch(events=batch))
            if ended:
                break
            if link.starved and events.qsize() < MAX_PENDING_EVENTS // 2:
                link.starved = False
                queue.dispatch()
    finally:
        await stream.close()
        link.close()
        links.remove(origin, link)
