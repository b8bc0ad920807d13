"""A handle on a queue whose master lives on another node (MIR-7).

It offers channels what a local `Queue` offers (publish, get, consume, cancel,
ack, requeue, reject) and carries each over one gRPC stream per (channel,
queue) pair, so per-channel order holds. Delivery tags stay the client
channel's own; the home node knows each delivery by its own id, carried in
the entry.
"""
from __future__ import annotations

import asyncio
from collections import deque
from typing import Callable

import grpc
import structlog
from pamqp import encode

from node.broker.expiry import expiration_ms
from node.broker.message import Entry, Message
from node.protocol.properties import PropertyView
from node.protocol.replies import AMQPError, ReplyCode

from .rpc import cluster_pb2 as pb

ACK, REQUEUE, DISCARD = 0, 1, 2
MOVED = 0       # QueueEvent.Error code: the queue's master is elsewhere now (a failover)
PARK_TIMEOUT = 10.0   # how long a call on a mirrored queue waits for a new master


class RemoteEntry(Entry):
    """A delivery from a remote queue: `seq` is the home node's delivery id."""

    __slots__ = ("link",)


def message_from_pb(m) -> Message:
    props = PropertyView(m.properties)
    return Message(m.exchange, m.routing_key, bytes(m.properties), bytes(m.body), props.delivery_mode == 2,
                   props.priority, expiration_ms(props.expiration))


def message_to_pb(message: Message) -> pb.Message:
    return pb.Message(exchange=message.exchange, routing_key=message.routing_key, properties=message.props_raw,
                      body=message.body)


class QueueLink:
    """One channel's stream to a remote queue's home node."""

    def __init__(self, queue: "RemoteQueue", channel):
        self.queue = queue
        self.channel = channel
        self.calls: asyncio.Queue = asyncio.Queue()
        self.gets: deque = deque()          # (no_ack, callback) waiting for a get answer, in order
        self.consumers: dict[str, object] = {}
        self.consumed: dict[str, Callable[[], None]] = {}   # tag -> waiting for the home's consume-ok
        self.unconfirmed: set[int] = set()
        self.closed = False
        peer = queue.peers(queue.home)
        if peer is None or peer.stub is None or not queue.home_up(queue.home):
            raise AMQPError(ReplyCode.NOT_FOUND, f"home node of {queue.describe()} is down")
        owner = getattr(channel.session, "key", "")
        self.calls.put_nowait(pb.QueueCall(open=pb.QueueCall.Open(vhost=queue.vhost, queue=queue.name, owner=owner,
                                                                  epoch=queue.epoch)))
        self._call = peer.stub.QueueSession(self._requests(), metadata=peer_metadata(queue), wait_for_ready=True)
        self._reader = asyncio.ensure_future(self._read())

    async def _requests(self):
        while True:
            call = await self.calls.get()
            if call is None:
                return
            yield call

    def send(self, call: pb.QueueCall) -> None:
        if not self.closed:
            self.calls.put_nowait(call)

    async def _read(self) -> None:
        channel = self.channel
        try:
            async for event in self._call:
                kind = event.WhichOneof("event")
                if kind == "confirm":
                    self.unconfirmed.difference_update(event.confirm.seqs)
                    channel.remote_settled(event.confirm.seqs, event.confirm.ok)
                elif kind == "delivery":
                    d = event.delivery
                    entry = RemoteEntry(message_from_pb(d.message), d.id, d.redelivered)
                    entry.link = self
                    self.queue.remote_count = d.message_count
                    if d.tag:
                        consumer = self.consumers.get(d.tag)
                        if consumer is not None and not channel.closed:
                            channel.deliver_from_home(consumer, entry)
                            channel.session.wakeup()
                        else:   # cancelled meanwhile: give it back
                            self.send(pb.QueueCall(settle=pb.QueueCall.Settle(ids=[d.id], mode=REQUEUE)))
                    elif self.gets:
                        self.gets.popleft()[1](entry, d.message_count)
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
                    return
                elif kind == "error":
                    err = AMQPError(ReplyCode(event.error.code), event.error.text.split(" - ", 1)[-1])
                    channel.session.fail_channel(channel.id, err)
        except grpc.aio.AioRpcError as exc:
            if not self.closed and not channel.closed:
                structlog.get_logger("haremq.cluster").warning(
                    "link to queue home lost", queue=self.queue.name, home=self.queue.home, code=exc.code().name)
                self.queue.home_lost()
                self._lost()
        finally:
            self.closed = True
            self._answer_gets()

    def _lost(self) -> None:
        """The home node went away: the channel stays open. Unconfirmed publishes are nacked
        (CONF-5: the client may republish). Consumers of a mirrored queue wait for the new
        master (MIR-8); others get basic.cancel. What they had not acked goes back to the
        queue: on the new master at once, on the old home when it returns."""
        self.abandon()
        if self.queue.mirrored:
            self.queue.unlink(self.channel)
            return
        for tag, consumer in list(self.consumers.items()):
            self.queue.consumers_remove(consumer)
            self.channel.consumer_cancelled_by_broker(consumer)
        self.consumers.clear()
        self.channel.session.wakeup()

    def abandon(self) -> None:
        """Stop using this link without telling the home: nack what it did not confirm,
        answer pending gets with nothing."""
        channel = self.channel
        self.close()
        if self.unconfirmed:
            channel.remote_settled(sorted(self.unconfirmed), False)
        self.unconfirmed.clear()
        self._answer_gets()
        consumed, self.consumed = self.consumed, {}
        for fn in consumed.values():     # consume-ok now: the consumer then waits for a failover,
            fn()                         # or gets basic.cancel, as any consumer of this queue
        channel.session.wakeup()

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


def home_prefetch(consumer) -> int:
    """The cap a consumer has on its queue's home node: its own prefetch and, under a global
    one, no more than that either, so what waits on the client's node for room stays bounded."""
    prefetch = consumer.prefetch or 0
    channel_cap = getattr(consumer.channel, "prefetch_global", 0)
    if channel_cap and not consumer.no_ack:
        prefetch = min(prefetch, channel_cap) if prefetch else channel_cap
    return prefetch


def cancel_on_failover(consumer) -> bool:
    return bool((consumer.arguments or {}).get("x-cancel-on-ha-failover"))


def hand_over(consumers, attach) -> None:
    """Consumers of a queue whose master moved (MIR-8): attach(consumer) to the new one, or
    basic.cancel for those that asked for x-cancel-on-ha-failover (or cannot be attached)."""
    for consumer in consumers:
        channel = consumer.channel
        if cancel_on_failover(consumer) or channel.closed:
            channel.consumer_cancelled_by_broker(consumer)
            continue
        try:
            attach(consumer)
        except AMQPError:
            channel.consumer_cancelled_by_broker(consumer)
        channel.session.wakeup()


def peer_metadata(queue: "RemoteQueue"):
    return queue.metadata()


class _NodeItself:
    """The node as a publisher of its own (dead-lettering into a queue homed elsewhere):
    a channel with no client, no confirms and nothing to deliver to."""

    id = 0
    key = ""
    closed = False
    confirms = None

    @property
    def session(self):
        return self

    def note_confirms(self, _channel) -> None:
        return None

    def remote_settled(self, _seqs, _ok) -> None:
        return None

    def fail_channel(self, _channel_id, _err) -> None:
        return None

    def wakeup(self) -> None:
        return None

    def deliver_from_home(self, _consumer, _entry) -> None:
        return None

    def consumer_cancelled_by_broker(self, _consumer) -> None:
        return None


NODE_ITSELF = _NodeItself()


class RemoteQueue:
    """The cluster-wide record of a queue homed elsewhere, usable like a local queue."""

    store = None
    remote = True
    single_active = False     # x-single-active-consumer is enforced by the home node
    mirrored = False          # set from the metadata log: its consumers survive a failover
    epoch = 0

    def __init__(self, name: str, vhost: str, home: str, peers, durable: bool = False, exclusive_owner=None,
                 auto_delete: bool = False, arguments: dict | None = None):
        self.name = name
        self.vhost = vhost
        self.home = home
        self.peers = peers            # name -> Peer
        self.metadata = lambda: ()
        self.home_up = lambda _name: True
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = dict(arguments or {})
        self.consumers: deque = deque()
        self.deleted = False
        self.remote_count = 0
        self.unacked = 0
        self.on_home_lost = None
        self._links: dict[object, QueueLink] = {}
        self._parked: list = []       # calls waiting for a failover

    def __repr__(self) -> str:
        return f"<RemoteQueue {self.vhost}/{self.name}@{self.home}>"

    def describe(self) -> str:
        return f"queue '{self.name}' in vhost '{self.vhost}'"

    @property
    def message_count(self) -> int:
        return self.remote_count

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def link(self, channel) -> QueueLink:
        link = self._links.get(channel)
        if link is None or link.closed:
            link = self._links[channel] = QueueLink(self, channel)
        return link

    def unlink(self, channel) -> None:
        link = self._links.pop(channel, None)
        if link is not None:
            link.close()

    # ---- what a channel does with a queue --------------------------------------------------
    def publish_from(self, channel, message: Message, seq: int) -> None:
        """Forward a publish; while the home node is down it is nacked (or dropped without confirms)."""
        try:
            link = self.link(channel)
        except AMQPError:
            if seq:
                channel.remote_settled((seq,), False)
            return
        if seq:
            link.unconfirmed.add(seq)
        link.send(pb.QueueCall(publish=pb.QueueCall.Publish(seq=seq, message=message_to_pb(message))))

    def publish(self, message: Message) -> int:
        """A publish by the node itself (dead-lettering): forwarded, not confirmed."""
        from node.broker.queue import SAFE
        self.publish_from(NODE_ITSELF, message, 0)
        return SAFE

    def get_from(self, channel, no_ack: bool, answer) -> None:
        try:
            link = self.link(channel)
        except AMQPError as err:
            if not self.mirrored:
                raise
            self._park(channel, err, lambda: channel.get_again(self.name, no_ack))
            return
        link.gets.append((no_ack, answer))
        link.send(pb.QueueCall(get=pb.QueueCall.Get(no_ack=no_ack)))

    def add_consumer(self, consumer, consumed: Callable[[], None] | None = None) -> None:
        """Attach a consumer on the home node; consumed() once the home has it."""
        self.consumers.append(consumer)
        try:
            self._attach(consumer, consumed)
        except AMQPError:
            if not self.mirrored:
                self.consumers_remove(consumer)
                raise
            # its master is down: the consumer is attached to the mirror that takes over
            if consumed is not None:
                consumed()

    def _attach(self, consumer, consumed: Callable[[], None] | None = None) -> None:
        link = self.link(consumer.channel)
        link.consumers[consumer.tag] = consumer
        if consumed is not None:
            link.consumed[consumer.tag] = consumed
        link.send(pb.QueueCall(consume=pb.QueueCall.Consume(
            tag=consumer.tag, no_ack=consumer.no_ack, prefetch=home_prefetch(consumer), exclusive=consumer.exclusive,
            arguments=encode.field_table(consumer.arguments or {}))))

    def prefetch_changed(self, consumer) -> None:
        """basic.qos on the consumer's channel: its cap on the home node follows (QOS-4)."""
        link = self._links.get(consumer.channel)
        if link is not None and consumer.tag in link.consumers:
            link.send(pb.QueueCall(prefetch=pb.QueueCall.Prefetch(tag=consumer.tag,
                                                                  count=home_prefetch(consumer))))

    def consumers_remove(self, consumer) -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            pass

    def remove_consumer(self, consumer) -> None:
        self.consumers_remove(consumer)
        link = self._links.get(consumer.channel)
        if link is not None and link.consumers.pop(consumer.tag, None) is not None:
            link.send(pb.QueueCall(cancel=pb.QueueCall.Cancel(tag=consumer.tag)))

    def _settle(self, entries, mode: int) -> None:
        by_link: dict[QueueLink, list[int]] = {}
        for entry in entries:
            by_link.setdefault(entry.link, []).append(entry.seq)
        for link, ids in by_link.items():
            link.send(pb.QueueCall(settle=pb.QueueCall.Settle(ids=ids, mode=mode)))

    def settle(self, entries) -> None:
        self._settle(entries, ACK)

    def requeue(self, entries) -> None:
        self._settle(entries, REQUEUE)

    def reject(self, entries) -> None:
        self._settle(entries, DISCARD)

    def dispatch(self) -> None:
        return None      # the home node dispatches

    def touch(self) -> None:
        return None      # x-expires is the home node's business

    def apply_policy(self, _definition) -> None:
        return None      # the home node applies policies to the queue itself

    def purge_from(self, answer) -> None:
        """queue.purge on the home node; answer(count, error) when it has done it."""
        self._ask_home("purge_queue", lambda r: r["message_count"], answer, 30)

    def stats_from(self, answer) -> None:
        """The home node's message and consumer counts (a passive declare via another node)."""
        self._ask_home("queue_stats", lambda r: (r["message_count"], r["consumer_count"]), answer, 10)

    def _ask_home(self, command: str, pick, answer, method_id: int) -> None:
        down = AMQPError(ReplyCode.NOT_FOUND, f"home node of {self.describe()} is down", 50, method_id)
        peer = self.peers(self.home)
        if peer is None or peer.stub is None or not self.home_up(self.home):
            answer(None, down)
            return

        async def call():
            import json
            try:
                reply = await peer.stub.Control(pb.ControlRequest(
                    command=command, arguments=json.dumps({"vhost": self.vhost, "name": self.name}).encode()),
                    timeout=10.0, metadata=self.metadata())
            except grpc.aio.AioRpcError:
                answer(None, down)
                return
            if not reply.ok:
                answer(None, AMQPError(ReplyCode.NOT_FOUND, f"no {self.describe()}", 50, method_id))
                return
            answer(pick(json.loads(reply.result)), None)

        asyncio.ensure_future(call())

    # ---- failover (MIR-4, MIR-8) -------------------------------------------------------------
    def home_lost(self) -> None:
        """A stream to the home broke: have the membership look at it now."""
        if self.on_home_lost is not None:
            self.on_home_lost(self.home)

    def _park(self, channel, err: AMQPError, retry) -> None:
        """A mirrored queue's master is down: the call waits for the failover (as a RabbitMQ
        mirrored queue's clients do), and fails with `err` if none comes in time."""
        parked = (channel, retry)
        self._parked.append(parked)

        def give_up():
            if parked in self._parked:
                self._parked.remove(parked)
                if not channel.closed:
                    channel.session.fail_channel(channel.id, err)
        asyncio.get_running_loop().call_later(PARK_TIMEOUT, give_up)

    def rehome(self, home: str, epoch: int) -> None:
        """A mirror on `home` is the master now: links to the old one end (their unconfirmed
        publishes nacked) and consumers re-attach to the new one, unless they asked for
        x-cancel-on-ha-failover."""
        self.home = home
        self.epoch = epoch
        hand_over(self.abandon(), self.add_consumer)
        self.replay_parked()

    def replay_parked(self) -> None:
        """The failover is done: calls that waited for it go to the new master."""
        parked, self._parked = self._parked, []
        for channel, retry in parked:
            if not channel.closed:
                retry()

    def drop_orphans(self) -> list:
        """Consumers a lost home left without a link (no failover came): they are let go."""
        def linked(consumer) -> bool:
            link = self._links.get(consumer.channel)
            return link is not None and not link.closed and consumer.tag in link.consumers
        orphans = [c for c in self.consumers if not linked(c)]
        for consumer in orphans:
            self.consumers_remove(consumer)
        return orphans

    def abandon(self) -> list:
        """Drop every link (the master moved): returns the consumers, now attached to nothing."""
        links, self._links = self._links, {}
        for link in links.values():
            link.abandon()
        consumers = list(self.consumers)
        self.consumers.clear()
        return consumers

    def mark_deleted(self) -> list:
        self.deleted = True
        consumers = list(self.consumers)
        self.consumers.clear()
        for link in list(self._links.values()):
            link.close()
        self._links.clear()
        return consumers
