"""A handle on a queue whose master lives on another node (MIR-7).

It offers channels what a local `Queue` offers (publish, get, consume, cancel,
ack, requeue, reject) and carries each over one gRPC stream per (channel,
queue) pair, so per-channel order holds. Delivery tags stay the client
channel's own; the home node knows each delivery by its own id, carried in
the entry.
"""
from __future__ import annotations

import asyncio
import random
from collections import OrderedDict, deque
from typing import Callable

import grpc
import structlog
from pamqp import encode

from haremq.node.broker import policy as pol
from haremq.node.broker.message import Message
from haremq.node.broker.node_itself import NODE_ITSELF
from haremq.node.protocol.replies import AMQPError, ReplyCode
from haremq.node.tasks import TaskGroup

from haremq.cluster.links.failover import PARK_TIMEOUT, TICK, Act, FailoverWatch
from haremq.cluster.links.link import ACK, DISCARD, REQUEUE, QueueLink, RemoteEntry
from haremq.cluster.rpc import cluster_pb2 as pb

HELD_MAX = 100_000    # publishes held per queue while its master fails over; beyond, nacked
ACKED_KEYS = 20_000   # keys a node remembers its clients acked, to know a failover's redeliveries


def fingerprint(message) -> int:
    """Tells two messages under one key apart (a Message or a pb.Message) by their properties
    and body: what every copy of a message has alike, whether held in memory or read back
    from a store (a publish id is not kept in the store)."""
    props = message.props_raw if isinstance(message, Message) else message.properties
    return hash((bytes(props), bytes(message.body)))


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


class RemoteQueue:
    """The cluster-wide record of a queue homed elsewhere, usable like a local queue."""

    store = None
    remote = True
    single_active = False     # x-single-active-consumer is enforced by the home node
    mirrored = False          # set from the metadata log: its consumers survive a failover
    epoch = 0
    # statistics (QueuePort): the home node counts; a handle here has none of its own
    published_total = delivered_total = acked_total = 0
    message_bytes = paged_out = 0

    def __init__(self, name: str, vhost: str, home: str, peers, durable: bool = False, exclusive_owner=None,
                 auto_delete: bool = False, arguments: dict | None = None, *, metadata=lambda: (),
                 home_up=lambda _name: True, on_home_lost=None, tasks: TaskGroup | None = None):
        """`metadata()`: the gRPC metadata its calls carry (the cluster secret); `home_up(name)`:
        whether a member is up as the failure detector sees it; `on_home_lost(name)`: a call to
        the home failed, have membership probe it; `tasks`: the cluster node's task group."""
        self.name = name
        self.vhost = vhost
        self.home = home
        self.peers = peers            # name -> Peer
        self.metadata = metadata
        self.home_up = home_up
        self.tasks = tasks if tasks is not None else TaskGroup(f"remote queue {vhost}/{name}")
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = dict(arguments or {})
        # checked here, where its consumers' deliveries are (node/broker/consumer_timeout.py)
        self.consumer_timeout = pol.effective(self.arguments, {}, "consumer-timeout")
        self.consumers: deque = deque()
        self.deleted = False
        self.remote_count = 0
        self.unacked = 0
        self.on_home_lost = on_home_lost
        self.can_fail_over = lambda: True   # set from the log: a mirror that may take over is up
        self._links: dict[object, QueueLink] = {}
        self._parked: dict[int, tuple] = {}   # token -> (channel, retry, err, fail): calls waiting for a failover
        self._held: dict[object, list] = {}   # channel -> [(seq, message)] waiting for a new master
        self._held_count = 0
        self.watch = FailoverWatch()  # a stream to the home broke (mirrored queue): no new links meanwhile
        self._tick_timer: asyncio.TimerHandle | None = None
        # deliveries across a failover (MIR-8): keys this node's clients acked (key -> epoch),
        # old deliveries they still hold (key -> entry), and redeliveries of those by the new
        # master kept back until the client settles the old one (key -> (link, id))
        self._acked: OrderedDict = OrderedDict()
        self._pending: dict[int, RemoteEntry] = {}
        self._shadow: dict[int, tuple] = {}
        # the same by publish id (publish id -> epoch; publish id -> key): a master may deliver a
        # message before its mirrors have it, so the publisher's node, never confirmed, sends it
        # again to the new master, which gives it a new key
        self._acked_ids: OrderedDict = OrderedDict()
        self._pending_ids: dict[int, int] = {}
        self.successor = None         # this node masters the queue now: (Queue, {key: Entry})
        self.replacement = None       # the local Queue that replaced this handle (a promotion here)

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

    @property
    def dedup_stats(self) -> dict:
        return {}

    def link(self, channel) -> QueueLink:
        link = self._links.get(channel)
        if link is None or link.closed:
            if self.mirrored and self.watch.failing:     # not to a home whose stream just broke
                raise AMQPError(ReplyCode.NOT_FOUND, f"home node of {self.describe()} is down")
            link = self._links[channel] = QueueLink(self, channel)
            channel.linked_to(self)
        return link

    def unlink(self, channel, carry: bool = False) -> None:
        link = self._links.pop(channel, None)
        if link is not None:
            if carry:
                self._hold_front(channel, link.abandon(carry=True))
            else:
                link.close()
        if not carry and channel.closed:
            self._channel_gone(channel)

    def _channel_gone(self, channel) -> None:
        """A closed channel answers none of the old deliveries it held (those it never got to
        its client included): their redeliveries held back for it go to other consumers."""
        for entry in list(self._pending.values()):
            if entry.link.channel is channel:
                self._settle_old(entry, REQUEUE)

    # ---- what a channel does with a queue --------------------------------------------------
    def publish_from(self, channel, message: Message, seq: int) -> None:
        """Forward a publish. While the home node looks down, publishes wait: a mirrored queue's
        for the new master (and are confirmed by it), another's for a blip to pass (a member
        not heard from for a moment, or not yet since it started); then they are nacked (or
        dropped without confirms)."""
        if self.watch.failing:
            self._hold(channel, [(seq, message)])
            return
        try:
            link = self.link(channel)
        except AMQPError:
            self.failing_over()
            self._hold(channel, [(seq, message)])
            return
        if seq:
            if not message.publish_id:      # so that a new master knows it if it is sent again
                message.publish_id = random.getrandbits(63) or 1
            link.unconfirmed[seq] = message
        link.send_publish(seq, message)

    # ---- publishes held across a failover (CONF-4/5, MIR-4) -----------------------------------
    def failing_over(self) -> None:
        """A stream to the home broke: until a failover (or the home answers again) no new link
        is opened to it, so nothing more is sent where it may be lost."""
        if self.watch.broke(asyncio.get_running_loop().time()):
            if self.on_home_lost is not None:
                self.on_home_lost(self.home)
            self._wait()

    def _hold(self, channel, items: list) -> None:
        if not items:
            return
        if self._held_count + len(items) > HELD_MAX:     # too many to keep: the publisher may send them again
            seqs = [seq for seq, _m in items if seq]
            if seqs:
                channel.remote_settled(seqs, False)
            return
        self._held.setdefault(channel, []).extend(items)
        self._held_count += len(items)
        self._holding()

    def _hold_front(self, channel, items: list) -> None:
        """Publishes a link did not see confirmed: older than any held since, so they go first."""
        if items:
            self._held[channel] = items + self._held.get(channel, [])
            self._held_count += len(items)
            self._holding()

    def _holding(self) -> None:
        self.watch.holding(asyncio.get_running_loop().time())
        self._wait()

    def _wait(self) -> None:
        """Tick the failover watch every TICK while it waits for something."""
        if self._tick_timer is None and self.watch.waiting():
            self._tick_timer = asyncio.get_running_loop().call_later(TICK, self._tick)

    def _tick(self) -> None:
        self._tick_timer = None
        if self.replacement is not None:    # this node masters it now: what waited went there
            return
        now = asyncio.get_running_loop().time()
        for action in self.watch.tick(now, self.home_up(self.home), self.mirrored and self.can_fail_over()):
            if action.act is Act.GIVE_UP:
                self._give_up(action.token)
            elif self.deleted:
                continue
            elif action.act is Act.RESUME:      # the stream broke, the node lives: go on with it
                self.flush_held()
                hand_over(self.drop_orphans(), self.add_consumer)
                self.replay_parked()
            elif action.act is Act.FLUSH_HELD:
                self.flush_held()
            elif action.act is Act.NACK_HELD:   # no failover came in time, or none can come
                for channel, seq, _message in self.take_held():
                    if seq:
                        channel.remote_settled((seq,), False)
            elif action.act is Act.REPLAY_PARKED:
                self.replay_parked()
        self._wait()

    def take_held(self) -> list:
        """[(channel, seq, message)] held, in each channel's publish order; none are kept."""
        held, self._held, self._held_count = self._held, {}, 0
        self.watch.released()
        return [(channel, seq, message) for channel, items in held.items() if not channel.closed
                for seq, message in items]

    def flush_held(self) -> None:
        """The master is known again: held publishes go to it, each channel's in order."""
        held = self.take_held()
        if held:
            structlog.get_logger("haremq.cluster").info(
                "publishes carried to the queue's master", vhost=self.vhost, queue=self.name, home=self.home,
                epoch=self.epoch, publishes=len(held))
        for channel, seq, message in held:
            self.publish_from(channel, message, seq)

    def publish(self, message: Message) -> int:
        """A publish by the node itself (dead-lettering): forwarded, not confirmed."""
        from haremq.node.broker.queue import SAFE
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
            link = entry.link
            link.delivered.pop(entry.seq, None)
            if mode != REQUEUE and entry.key:
                self.note_acked(entry.key, link.epoch, entry.message)
            if link.abandoned:
                self._settle_old(entry, mode)
            else:
                by_link.setdefault(link, []).append(entry.seq)
        for link, ids in by_link.items():
            link.send(pb.QueueCall(settle=pb.QueueCall.Settle(ids=ids, mode=mode)))

    # ---- deliveries across a failover: each comes back once, only if the client did not ack it --
    def note_acked(self, key: int, epoch: int, message: Message) -> None:
        if key:
            acked = self._acked
            acked[key] = (epoch, fingerprint(message))
            if len(acked) > ACKED_KEYS:
                acked.popitem(last=False)
            if message.publish_id:
                ids = self._acked_ids
                ids[message.publish_id] = epoch
                if len(ids) > ACKED_KEYS:
                    ids.popitem(last=False)

    def in_doubt(self, entries) -> None:
        """Deliveries of a link given up: the client still holds them and may yet settle them."""
        for entry in entries:
            if entry.key:
                self._pending[entry.key] = entry
                if entry.message.publish_id:
                    self._pending_ids[entry.message.publish_id] = entry.key

    def seen_before(self, link: QueueLink, d) -> bool:
        """A delivery by a new master of what this node's client acked through the old one (its
        ack never reached the mirrors) is acked again at once; of what the client still holds,
        it waits for the client's answer to the old delivery. Neither reaches the client twice.
        Not only redeliveries: a mirror that never heard of the delivery calls it a first one,
        and a publish sent again to the new master comes under a new key (by its publish id)."""
        key = d.key
        acked = self._acked.get(key)
        pending = self._pending.get(key)
        if acked is not None or pending is not None:
            # a key a new master gave to another message (the old one had used it for a message
            # that never reached the mirrors) must not be taken for it: same message, same print
            print_ = fingerprint(d.message)
            if acked is not None and link.epoch > acked[0] and acked[1] == print_:
                link.send(pb.QueueCall(settle=pb.QueueCall.Settle(ids=[d.id], mode=ACK)))
                return True
            if pending is not None and fingerprint(pending.message) == print_:
                self._shadow[key] = (link, d.id)
                return True
        publish_id = d.message.publish_id
        if not publish_id:
            return False
        epoch = self._acked_ids.get(publish_id)
        if epoch is not None and link.epoch > epoch:
            link.send(pb.QueueCall(settle=pb.QueueCall.Settle(ids=[d.id], mode=ACK)))
            return True
        old_key = self._pending_ids.get(publish_id)
        if old_key is not None and old_key in self._pending and old_key not in self._shadow:
            self._shadow[old_key] = (link, d.id)
            return True
        return False

    def _settle_old(self, entry: RemoteEntry, mode: int) -> None:
        """The client settled a delivery made by a master since gone: the same goes for its
        redelivery by the new master (held back meanwhile), here or on the master's node."""
        key = entry.key
        self._pending.pop(key, None)
        self._pending_ids.pop(entry.message.publish_id, None)
        shadow = self._shadow.pop(key, None)
        if shadow is not None:
            link, delivery_id = shadow
            link.send(pb.QueueCall(settle=pb.QueueCall.Settle(ids=[delivery_id], mode=mode)))
        elif self.successor is not None:
            queue, held = self.successor
            held_entry = held.pop(key, None)
            if held_entry is not None and not queue.deleted:
                if mode == REQUEUE:
                    queue.requeue([held_entry])
                elif mode == DISCARD:
                    queue.reject([held_entry])
                else:
                    queue.settle([held_entry])

    def doubts(self) -> tuple[dict, dict, set]:
        """({key: print} acked, {key: print} still held by clients, publish ids acked) here: what
        a master taking over on this node must not deliver again, or only once the client has
        answered, nor enqueue again if its publisher's node sends it once more."""
        return ({key: print_ for key, (_epoch, print_) in self._acked.items()},
                {key: fingerprint(entry.message) for key, entry in self._pending.items()},
                set(self._acked_ids))

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

    def apply_policy(self, definition) -> None:
        """The home node applies policies to the queue itself; the consumer timeout is ours."""
        self.consumer_timeout = pol.effective(self.arguments, definition or {}, "consumer-timeout")

    def purge_from(self, answer) -> None:
        """queue.purge on the home node; answer(count, error) when it has done it."""
        self._ask_home("purge_queue", lambda r: r["message_count"], answer, 30)

    def stats_from(self, answer) -> None:
        """The home node's message and consumer counts (a passive declare via another node)."""
        self._ask_home("queue_stats", lambda r: (r["message_count"], r["consumer_count"]), answer, 10)

    def _ask_home(self, command: str, pick, answer, method_id: int, deadline: float = 0.0) -> None:
        """A Control command on the home node. A mirrored queue whose master is down or has
        moved waits for the failover (bounded by PARK_TIMEOUT) and asks the new master; a
        queue that has no live master after that is a clear 404."""
        loop = asyncio.get_running_loop()
        deadline = deadline or loop.time() + PARK_TIMEOUT
        down = AMQPError(ReplyCode.NOT_FOUND, f"home node of {self.describe()} is down", 50, method_id)
        gone = AMQPError(ReplyCode.NOT_FOUND, f"no {self.describe()}", 50, method_id)
        local = self.replacement
        if local is not None and not local.deleted:     # this node took over as its master
            if command == "purge_queue":
                answer(local.purge(), None)
            else:
                answer((local.message_count, local.consumer_count), None)
            return

        def wait_or(err: AMQPError) -> None:
            if self.mirrored and not self.deleted and loop.time() < deadline:
                self._park(None, err, lambda: self._ask_home(command, pick, answer, method_id, deadline),
                           lambda final: answer(None, final), deadline - loop.time())
            else:
                answer(None, err)

        peer = self.peers(self.home)
        if peer is None or peer.stub is None or not self.home_up(self.home) or \
                (self.mirrored and self.watch.failing):
            wait_or(down)
            return
        home, epoch = self.home, self.epoch

        async def call():
            import json
            try:
                reply = await peer.stub.Control(pb.ControlRequest(
                    command=command, arguments=json.dumps({"vhost": self.vhost, "name": self.name}).encode()),
                    timeout=10.0, metadata=self.metadata())
            except grpc.aio.AioRpcError:
                if self.mirrored:
                    self.failing_over()
                wait_or(down)
                return
            if not reply.ok:
                if self.mirrored and (self.home, self.epoch) != (home, epoch):
                    self._ask_home(command, pick, answer, method_id, deadline)   # it moved meanwhile
                else:
                    wait_or(gone)         # the home has not applied the failover yet, or no queue
                return
            answer(pick(json.loads(reply.result)), None)

        self.tasks.spawn(call())

    # ---- failover (MIR-4, MIR-8) -------------------------------------------------------------
    def home_lost(self) -> None:
        """A stream to the home broke: have the membership look at it now."""
        if self.on_home_lost is not None:
            self.on_home_lost(self.home)

    def _park(self, channel, err: AMQPError, retry, fail=None, timeout: float = PARK_TIMEOUT) -> None:
        """A mirrored queue's master is down: the call waits for the failover (as a RabbitMQ
        mirrored queue's clients do), and fails with `err` (or fail()) if none comes in time.
        channel None: a call on behalf of no channel in particular."""
        token = self.watch.park(asyncio.get_running_loop().time(), timeout)
        self._parked[token] = (channel, retry, err, fail)
        self._wait()

    def _give_up(self, token: int) -> None:
        self.watch.unpark(token)
        parked = self._parked.pop(token, None)
        if parked is None:
            return
        channel, _retry, err, fail = parked
        final = err
        if not self.can_fail_over():      # no in-sync mirror is up: none will take over
            final = AMQPError(err.code, f"home node of {self.describe()} is down and no synchronised "
                              "mirror can take over", err.class_id, err.method_id)
        if fail is not None:
            fail(final)
        elif not channel.closed:
            channel.session.fail_channel(channel.id, final)

    def rehome(self, home: str, epoch: int) -> None:
        """A mirror on `home` is the master now: links to the old one end, their unconfirmed
        publishes and those held meanwhile go to the new one (confirmed once safe there), and
        consumers re-attach to it, unless they asked for x-cancel-on-ha-failover."""
        self.home = home
        self.epoch = epoch
        self.watch.moved()
        consumers = self.abandon()
        self.flush_held()
        hand_over(consumers, self.add_consumer)
        self.replay_parked()

    def replay_parked(self) -> None:
        """The failover is done: calls that waited for it go to the new master."""
        parked, self._parked = self._parked, {}
        for token, (channel, retry, _err, _fail) in parked.items():
            self.watch.unpark(token)
            if channel is None or not channel.closed:
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
        """Drop every link (the master moved): returns the consumers, now attached to nothing.
        A mirrored queue's unconfirmed publishes are held for the new master (take_held)."""
        links, self._links = self._links, {}
        for channel, link in links.items():
            if self.mirrored:
                self._hold_front(channel, link.abandon(carry=True))
            else:
                link.abandon()
        consumers = list(self.consumers)
        self.consumers.clear()
        return consumers

    def mark_deleted(self) -> list:
        self.deleted = True
        self.watch.moved()      # nothing more to wait for, but parked calls' time-outs
        for channel, seq, _message in self.take_held():   # as RabbitMQ: a publish to a queue
            if seq:                                          # deleted meanwhile is confirmed
                channel.remote_settled((seq,), True)
        consumers = list(self.consumers)
        self.consumers.clear()
        for link in list(self._links.values()):
            link.close()
        self._links.clear()
        return consumers
