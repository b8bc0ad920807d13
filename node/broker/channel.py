"""One AMQP channel's broker-side state: deliveries, acks, prefetch, confirms, transactions.

Delivery tags are per channel (ACK-1). Every delivery in manual-ack mode
stays in `unacked` until acked, rejected or nacked; whatever is left when the
channel ends goes back to its queue as redelivered (ACK-6). The channel's
mode is normal, confirm or tx; switching between confirm and tx is refused
(CONF-1).
"""
from __future__ import annotations

import enum
from collections import defaultdict, deque
from typing import Callable

from pamqp import commands as cmd

from ..protocol.frames import encode_content, encode_deliver, shortstr
from ..protocol.properties import PropertyView, with_reply_to
from ..protocol.replies import AMQPError, ReplyCode, error
from ..protocol.tables import encode_table
from .confirms import ConfirmTracker
from .message import Entry, Message
from .expiry import parse_expiration
from .queue import LOGGED, SAFE, Consumer, Queue, consumer_priority
from .reply_to import REPLY_TO, REPLY_TO_PREFIX
from .permissions import CONFIGURE, READ, WRITE
from .vhost import server_name


class Mode(enum.Enum):
    NORMAL = "normal"
    CONFIRM = "confirm"
    TX = "tx"


class Unacked:
    """A delivery waiting for its ack: which entry, from which queue, through which consumer."""

    __slots__ = ("tag", "entry", "queue", "consumer")

    def __init__(self, tag: int, entry: Entry, queue: Queue, consumer: Consumer | None):
        self.tag = tag
        self.entry = entry
        self.queue = queue
        self.consumer = consumer


class Channel:
    def __init__(self, session, channel_id: int):
        self.session = session
        self.id = channel_id
        self.vhost = session.vhost
        self.next_tag = 1
        self.unacked: dict[int, Unacked] = {}
        self.consumers: dict[str, Consumer] = {}
        self.prefetch_consumer = 0
        self.prefetch_global = 0
        self.global_unacked = 0
        self.mode = Mode.NORMAL
        self.confirms: ConfirmTracker | None = None
        self.tx_publishes: list[tuple] = []
        self.tx_acks: list[tuple[str, list[Unacked], bool]] = []
        self.tx_replicas: dict | None = None     # during tx.commit: mirrored queues published to
        self.tx_remote: RemoteWait | None = None  # during tx.commit: publishes to queues homed elsewhere
        self.tx_remote_seq = 0
        self.last_queue = ""
        self.reply_token: str | None = None
        self.reply_consumer_tag: str | None = None
        self.closed = False
        self.remote_queues: set = set()   # queues homed elsewhere this channel has a link to
        self.held = False                 # waiting for durability: later frames wait in backlog
        self.backlog: deque = deque()
        self.parked: deque = deque()      # (consumer, entry) pushed by a home node over the global cap
        self.cancels_after_reply: list[str] | None = None   # during queue.delete: basic.cancel after delete-ok
        # counters read by the management API and /metrics; the broker keeps them when it closes
        self.published_total = self.delivered_total = self.acked_total = 0

    def __repr__(self) -> str:
        return f"<Channel {self.id}>"

    # ---- delivery --------------------------------------------------------------------
    def can_deliver(self) -> bool:
        if self.closed:
            return False
        if self.prefetch_global and self.global_unacked >= self.prefetch_global:
            return False
        return self.session.can_write()

    def deliver(self, consumer: Consumer, entry: Entry) -> None:
        self.delivered_total += 1
        tag = self.next_tag
        self.next_tag = tag + 1
        message = entry.message
        self.session.write(encode_deliver(self.id, consumer.tag_raw, tag, entry.redelivered,
                                          message.exchange_raw, message.routing_key_raw,
                                          message.props_raw, message.body, self.session.frame_max))
        if not consumer.no_ack:
            self.unacked[tag] = Unacked(tag, entry, consumer.queue, consumer)
            consumer.unacked += 1
            self.global_unacked += 1
            if entry.msg_id and consumer.queue.store.is_written(entry.msg_id):
                # Its DELIVER record must be in the OS before the client sees it; if the
                # ENQUEUE is not written yet, both go out in the same write anyway.
                self.session.gate_on(consumer.queue.store)

    def deliver_from_home(self, consumer: Consumer, entry) -> None:
        """A delivery pushed by the home node of a queue homed elsewhere. The home keeps each
        consumer's prefetch; the channel-wide (global) one is kept here: deliveries over it wait,
        in order, for acks to make room (QOS-1, QOS-2)."""
        if self.parked:
            self.parked.append((consumer, entry))
            self._unpark()
        elif self._room_for(consumer):
            self.deliver(consumer, entry)
        else:
            self.parked.append((consumer, entry))

    def _room_for(self, consumer: Consumer) -> bool:
        return consumer.no_ack or not self.prefetch_global or self.global_unacked < self.prefetch_global

    def _unpark(self) -> None:
        parked = self.parked
        while parked and not self.closed:
            consumer, entry = parked[0]
            if entry.link.closed:          # its home went away; the home requeues it, if it returns
                parked.popleft()
                entry.link.queue.requeue([entry])   # and the client never had it (a failover's redelivery)
                continue
            if not self._room_for(consumer):
                return
            parked.popleft()
            self.deliver(consumer, entry)

    def _give_back_parked(self, consumer: Consumer) -> None:
        """A cancelled consumer's deliveries that never reached the client go back to the queue."""
        if not self.parked:
            return
        mine = [entry for c, entry in self.parked if c is consumer]
        if mine:
            self.parked = deque((c, e) for c, e in self.parked if c is not consumer)
            consumer.queue.requeue(mine)
            self._unpark()

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None:
        """The queue went away: tell the client with basic.cancel if it understands it."""
        self._give_back_parked(consumer)
        if self.consumers.pop(consumer.tag, None) is None or self.closed:
            return
        if self.session.client_capability("consumer_cancel_notify"):
            if self.cancels_after_reply is not None:
                self.cancels_after_reply.append(consumer.tag)
            else:
                self.session.send_method(self.id, cmd.Basic.Cancel(consumer.tag, nowait=True))

    def _send_cancels(self) -> None:
        """RabbitMQ answers queue.delete before it cancels the deleting channel's own consumers
        on that queue; clients (kombu, amqplib) wait for delete-ok and fail on a cancel first."""
        tags, self.cancels_after_reply = self.cancels_after_reply, None
        for tag in tags or ():
            self.session.send_method(self.id, cmd.Basic.Cancel(tag, nowait=True))

    def queues_to_dispatch(self) -> set[Queue]:
        return {c.queue for c in self.consumers.values()}

    # ---- method dispatch -------------------------------------------------------------
    def handle(self, method) -> None:
        handler = HANDLERS.get(type(method))
        if handler is None:
            raise error(ReplyCode.COMMAND_INVALID, f"unexpected method {method.name}", method)
        handler(self, method)

    def _reply(self, method, nowait: bool = False) -> None:
        if not nowait:
            self.session.send_method(self.id, method)
        if self.cancels_after_reply is not None:
            self._send_cancels()

    def _propose(self, command: dict, method, reply, nowait: bool = False) -> None:
        """Clustered: change metadata through the cluster's log; reply once it is applied here.
        The channel holds its later frames until then, so its order is kept."""
        command.update(vhost=self.vhost.name, method_index=method.index)
        self.held = True
        self.session.broker.cluster.submit(command, self._proposed, reply, nowait)

    def _proposed(self, result, err, reply, nowait: bool) -> None:
        if self.closed:
            return
        if err is not None:
            self.session.fail_channel(self.id, err)
        else:
            try:
                method = reply(result)
            except AMQPError as exc:
                self.session.fail_channel(self.id, exc)
                return
            if method is None:
                return     # the reply needs one more answer (from a queue's home node); it releases us
            self._reply(method, nowait)
        self.held = False
        self.session.resume(self)

    def _propose_binding(self, op: str, kind: str, source: str, destination: str, routing_key: str, m,
                         reply, nowait: bool = False) -> None:
        self._propose({"op": op, "kind": kind, "source": source, "destination": destination,
                       "routing_key": routing_key, "arguments": encode_table(m.arguments or {}),
                       "owner": self.session.key}, m, lambda _r: reply, nowait)

    def _reply_durable(self, method, nowait: bool = False) -> None:
        """Reply once pending metadata is on disk; a durable declare must survive a crash."""
        if nowait or not self.session.broker.metadata_pending():
            self._reply(method, nowait)
        else:
            self._hold(method)

    def _hold(self, reply, replicated=(), remote: "RemoteWait | None" = None) -> None:
        """Send `reply` when everything written so far is durable (and, for each (replica, seq)
        in `replicated`, on every in-sync mirror of that queue; and every publish in `remote`
        safe on its queue's home node); frames after it wait."""
        store = self.session.broker.store
        waits = [lambda done, r=replica, s=seq: r.when_replicated(s, True, done, ())
                 for replica, seq in replicated]
        if remote is not None and remote.seqs:
            waits.append(remote.when_settled)
        if store is None and not waits:
            self._reply(reply)
            return
        self.held = True
        if not waits:
            store.when_durable(self._release, reply)
            return
        waiting = [len(waits), True]

        def arrived(ok: bool) -> None:
            waiting[0] -= 1
            waiting[1] = waiting[1] and ok
            if waiting[0] == 0:
                if store is None:
                    self._release(waiting[1], reply)
                else:
                    store.when_durable(lambda durable: self._release(durable and waiting[1], reply))
        for wait in waits:
            wait(arrived)

    def _release(self, ok: bool, reply) -> None:
        if self.closed:
            return
        if not ok:
            self.session.log.error("a write was not made durable before this reply", channel=self.id,
                                   reply=reply.name)
        self.session.send_method(self.id, reply)
        if self.cancels_after_reply is not None:
            self._send_cancels()
        self.held = False
        self.session.resume(self)

    def _queue_name(self, name: str, method) -> str:
        if name:
            return name
        if not self.last_queue:
            raise error(ReplyCode.NOT_FOUND, "no previously declared queue", method)
        return self.last_queue

    # ---- exchange class -------------------------------------------------------------
    def _exchange_declare(self, m) -> None:
        if not m.passive and m.exchange:
            access = self.session.access
            access.check(CONFIGURE, "exchange", m.exchange, m)
            alternate = (m.arguments or {}).get("alternate-exchange")
            if alternate is not None:
                access.check(WRITE, "exchange", _text(alternate), m)
                access.check(READ, "exchange", m.exchange, m)
        if m.passive or self.session.broker.cluster is None:
            self.vhost.declare_exchange(m.exchange, m.exchange_type, m.passive, m.durable, m.auto_delete,
                                        m.internal, m.arguments, m)
            self._reply_durable(cmd.Exchange.DeclareOk(), m.nowait)
            return
        self._propose({"op": "exchange.declare", "name": m.exchange, "type": m.exchange_type,
                       "durable": m.durable, "auto_delete": m.auto_delete, "internal": m.internal,
                       "arguments": encode_table(m.arguments or {})}, m,
                      lambda _r: cmd.Exchange.DeclareOk(), m.nowait)

    def _exchange_delete(self, m) -> None:
        if m.exchange and not m.exchange.startswith("amq."):
            self.session.access.check(CONFIGURE, "exchange", m.exchange, m)
        if self.session.broker.cluster is not None:
            self._propose({"op": "exchange.delete", "name": m.exchange, "if_unused": m.if_unused}, m,
                          lambda _r: cmd.Exchange.DeleteOk(), m.nowait)
            return
        self.vhost.delete_exchange(m.exchange, m.if_unused, m)
        self._reply_durable(cmd.Exchange.DeleteOk(), m.nowait)

    def _exchange_bind(self, m) -> None:
        self._check_bind_exchanges(m)
        if self.session.broker.cluster is not None:
            self._propose_binding("bind", "exchange", m.source, m.destination, m.routing_key, m,
                                  cmd.Exchange.BindOk(), m.nowait)
            return
        self.vhost.bind_exchange(m.destination, m.source, m.routing_key, m.arguments, m)
        self._reply_durable(cmd.Exchange.BindOk(), m.nowait)

    def _exchange_unbind(self, m) -> None:
        self._check_bind_exchanges(m)
        if self.session.broker.cluster is not None:
            self._propose_binding("unbind", "exchange", m.source, m.destination, m.routing_key, m,
                                  cmd.Exchange.UnbindOk(), m.nowait)
            return
        self.vhost.unbind_exchange(m.destination, m.source, m.routing_key, m.arguments, m)
        self._reply_durable(cmd.Exchange.UnbindOk(), m.nowait)

    def _check_bind_exchanges(self, m) -> None:
        if m.source and m.destination:
            access = self.session.access
            access.check(WRITE, "exchange", m.destination, m)
            access.check(READ, "exchange", m.source, m)

    # ---- queue class ------------------------------------------------------------------
    def _queue_declare(self, m) -> None:
        name = m.queue or ("" if not m.passive else self._queue_name("", m))
        server_named = False
        if not m.passive:
            access = self.session.access
            if not access.unrestricted:
                if not name:     # RabbitMQ checks the name it generates
                    name, server_named = server_name("amq.gen-"), True
                access.check(CONFIGURE, "queue", name, m)
                dlx = (m.arguments or {}).get("x-dead-letter-exchange")
                if dlx is not None:
                    access.check(WRITE, "exchange", _text(dlx), m)
                    access.check(READ, "queue", name, m)
        if not m.passive and self.session.broker.cluster is not None:
            name = name or server_name("amq.gen-")
            if name.startswith("amq.") and not server_named and m.queue:
                raise error(ReplyCode.ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'", m)
            self._propose({"op": "queue.declare", "name": name, "durable": m.durable, "exclusive": m.exclusive,
                           "auto_delete": m.auto_delete, "arguments": encode_table(m.arguments or {}),
                           "owner": self.session.key if m.exclusive else None,
                           "home": self.session.broker.cluster.name}, m,
                          lambda _r: self._declared(name, m.nowait), m.nowait)
            return
        queue = self.vhost.declare_queue(name, m.passive, m.durable, m.exclusive, m.auto_delete,
                                         m.arguments, self.session, m, server_named=server_named)
        if queue.remote:    # homed on another node: its counts come from there
            self.last_queue = queue.name
            self.held = True
            queue.stats_from(lambda counts, err: self._remote_declared(queue.name, counts, err, m.nowait))
            return
        if queue.exclusive_owner is self.session:
            self.session.exclusive_queues.add(queue)
        self.last_queue = queue.name
        self._reply_durable(cmd.Queue.DeclareOk(queue.name, queue.message_count, queue.consumer_count),
                             m.nowait)

    def _declared(self, name: str, nowait: bool = False):
        """declare-ok for a queue the cluster has just declared (None: it comes from the home node)."""
        queue = self.vhost.queues[name]
        if queue.remote:
            self.last_queue = name
            queue.stats_from(lambda counts, err: self._remote_declared(name, counts, err, nowait))
            return None
        if queue.exclusive_owner is self.session:
            self.session.exclusive_queues.add(queue)
        self.last_queue = name
        return cmd.Queue.DeclareOk(name, queue.message_count, queue.consumer_count)

    def _queue_bind(self, m) -> None:
        self._check_queue_binding(m)
        queue = self.vhost.queue(self._queue_name(m.queue, m), self.session, m)
        routing_key = m.routing_key if (m.routing_key or m.queue) else queue.name
        if self.session.broker.cluster is not None:
            self._propose_binding("bind", "queue", m.exchange, queue.name, routing_key, m, cmd.Queue.BindOk(),
                                  m.nowait)
            return
        self.vhost.bind_queue(queue, m.exchange, routing_key, m.arguments, m)
        self._reply_durable(cmd.Queue.BindOk(), m.nowait)

    def _check_queue_binding(self, m) -> None:
        access = self.session.access
        if not access.unrestricted:
            access.check(WRITE, "queue", self._queue_name(m.queue, m), m)
            if m.exchange:
                access.check(READ, "exchange", m.exchange, m)

    def _queue_unbind(self, m) -> None:
        self._check_queue_binding(m)
        name = self._queue_name(m.queue, m)
        if self.session.broker.cluster is not None:
            self._propose_binding("unbind", "queue", m.exchange, name, m.routing_key, m, cmd.Queue.UnbindOk())
            return
        if name in self.vhost.queues and m.exchange in self.vhost.exchanges:   # unbinding nothing is fine
            queue = self.vhost.queue(name, self.session, m)
            self.vhost.unbind_queue(queue, m.exchange, m.routing_key, m.arguments, m)
        self._reply_durable(cmd.Queue.UnbindOk())

    def _queue_purge(self, m) -> None:
        self.session.access.check(READ, "queue", self._queue_name(m.queue, m), m)
        queue = self.vhost.queue(self._queue_name(m.queue, m), self.session, m)
        if queue.remote:    # homed on another node: reply when it has purged
            self.held = True
            queue.purge_from(lambda count, err: self._purged(count, err, m.nowait))
            return
        self._reply(cmd.Queue.PurgeOk(queue.purge()), m.nowait)

    def _remote_declared(self, name: str, counts, err, nowait: bool) -> None:
        if self.closed:
            return
        if err is not None:
            self.session.fail_channel(self.id, err)
            return
        self._reply(cmd.Queue.DeclareOk(name, *counts), nowait)
        self.held = False
        self.session.resume(self)

    def _purged(self, count, err, nowait: bool) -> None:
        if self.closed:
            return
        if err is not None:
            self.session.fail_channel(self.id, err)
            return
        self._reply(cmd.Queue.PurgeOk(count), nowait)
        self.held = False
        self.session.resume(self)

    def _queue_delete(self, m) -> None:
        self.session.access.check(CONFIGURE, "queue", self._queue_name(m.queue, m), m)
        self.cancels_after_reply = []
        if self.session.broker.cluster is not None:
            queue = self.vhost.queues.get(self._queue_name(m.queue, m))
            if queue is not None and queue.remote:    # its counts come from its home node
                self.held = True
                queue.stats_from(lambda counts, err: self._propose_delete(queue, m, counts, err))
            else:
                counts = (queue.message_count, queue.consumer_count) if queue is not None else (0, 0)
                self._propose_delete(queue, m, counts, None)
            return
        count = self.vhost.delete_queue(self._queue_name(m.queue, m), m.if_unused, m.if_empty,
                                        self.session, m)
        self._reply_durable(cmd.Queue.DeleteOk(count), m.nowait)

    def _propose_delete(self, queue, m, counts, err) -> None:
        """Clustered queue.delete: the preconditions are checked here, once, against the home's
        counts; every node then applies the same unconditional delete."""
        if self.closed:
            return
        try:
            if err is not None:
                raise err
            if queue is not None:
                self.vhost.check_delete(queue, m.if_unused, m.if_empty, self.session, *counts, m)
        except AMQPError as exc:
            self.held = False
            self.session.fail_channel(self.id, exc)
            return
        self._propose({"op": "queue.delete", "name": self._queue_name(m.queue, m), "if_unused": False,
                       "if_empty": False, "owner": self.session.key}, m,
                      lambda r: cmd.Queue.DeleteOk(counts[0] if r.get("message_count") is None
                                                   else r["message_count"]), m.nowait)

    # ---- basic class: consuming ---------------------------------------------------------
    def _basic_qos(self, m) -> None:
        if m.prefetch_size:
            raise error(ReplyCode.NOT_IMPLEMENTED, f"prefetch_size!=0 ({m.prefetch_size})", m)
        if m.prefetch_count < 0 or m.prefetch_count > 65535:
            raise error(ReplyCode.PRECONDITION_FAILED, f"prefetch count {m.prefetch_count} out of range", m)
        if m.global_:
            self.prefetch_global = m.prefetch_count
            for consumer in self.consumers.values():   # their caps on other nodes follow
                if consumer.queue.remote:
                    consumer.queue.prefetch_changed(consumer)
        else:
            self.prefetch_consumer = m.prefetch_count
        self._reply(cmd.Basic.QosOk())
        self._unpark()
        self._dispatch_all()

    def _basic_consume(self, m) -> None:
        if m.queue == REPLY_TO:
            self._consume_reply_to(m)
            return
        self.session.access.check(READ, "queue", self._queue_name(m.queue, m), m)
        queue = self.vhost.queue(self._queue_name(m.queue, m), self.session, m)
        tag = m.consumer_tag or server_name("amq.ctag-")
        if tag in self.consumers or tag == self.reply_consumer_tag:
            raise error(ReplyCode.NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'", m)
        if (queue.consumers or queue.single_active) and \
                (m.exclusive or any(c.exclusive for c in queue.consumers)):
            raise error(ReplyCode.ACCESS_REFUSED,
                        f"queue '{queue.name}' in vhost '{queue.vhost}' in exclusive use", m)
        consumer_priority(m.arguments, queue)
        consumer = Consumer(tag, self, queue, m.no_ack, m.exclusive, self.prefetch_consumer,
                            dict(m.arguments or {}))
        self.consumers[tag] = consumer
        if queue.remote and not m.nowait:
            # consume-ok once the home node has the consumer (or refused it: a channel error)
            self._remote(queue)
            self.held = True
            try:
                queue.add_consumer(consumer, lambda: self._consumed(tag))
            except AMQPError:
                self.held = False
                self.consumers.pop(tag, None)
                raise
            return
        self._reply(cmd.Basic.ConsumeOk(tag), m.nowait)
        if queue.remote:
            self._remote(queue)
        queue.add_consumer(consumer)

    def _consumed(self, tag: str) -> None:
        if self.closed:
            return
        self._reply(cmd.Basic.ConsumeOk(tag))
        self.held = False
        self.session.resume(self)

    def _consume_reply_to(self, m) -> None:
        if not m.no_ack:
            raise error(ReplyCode.PRECONDITION_FAILED, "reply consumer cannot acknowledge", m)
        if self.reply_consumer_tag is not None:
            raise error(ReplyCode.PRECONDITION_FAILED, "reply consumer already set", m)
        tag = m.consumer_tag or server_name("amq.ctag-")
        if tag in self.consumers:
            raise error(ReplyCode.NOT_ALLOWED, f"attempt to reuse consumer tag '{tag}'", m)
        self.reply_consumer_tag = tag
        self.reply_token = self.session.broker.register_reply_to(self)
        self._reply(cmd.Basic.ConsumeOk(tag), m.nowait)

    def deliver_reply(self, message: Message) -> None:
        """A direct reply-to message: straight to this channel's reply consumer, no ack."""
        if self.closed or self.reply_consumer_tag is None:
            return
        tag = self.next_tag
        self.next_tag = tag + 1
        self.session.write(encode_deliver(self.id, shortstr(self.reply_consumer_tag), tag, False,
                                          message.exchange_raw, message.routing_key_raw,
                                          message.props_raw, message.body, self.session.frame_max))

    def _basic_cancel(self, m) -> None:
        if m.consumer_tag == self.reply_consumer_tag and m.consumer_tag is not None:
            self._drop_reply_to()
        consumer = self.consumers.pop(m.consumer_tag, None)
        self._reply(cmd.Basic.CancelOk(m.consumer_tag), m.nowait)
        if consumer is not None:
            consumer.queue.remove_consumer(consumer)
            self._give_back_parked(consumer)

    def _drop_reply_to(self) -> None:
        if self.reply_token is not None:
            self.session.broker.unregister_reply_to(self.reply_token)
        self.reply_token = None
        self.reply_consumer_tag = None

    def _remote(self, queue):
        self.remote_queues.add(queue)
        return queue

    def _basic_get(self, m) -> None:
        self.session.access.check(READ, "queue", self._queue_name(m.queue, m), m)
        queue = self.vhost.queue(self._queue_name(m.queue, m), self.session, m)
        self._get_from(queue, m.no_ack)

    def get_again(self, name: str, no_ack: bool) -> None:
        """A basic.get that waited for a mirrored queue's failover, asked again of the new master."""
        if self.closed:
            return
        queue = self.vhost.queues.get(name)
        if queue is None:
            self.session.fail_channel(self.id, AMQPError(ReplyCode.NOT_FOUND, f"no queue '{name}' in vhost "
                                                         f"'{self.vhost.name}'", 60, 70))
        else:
            self.held = False            # the get is asked again: it holds the channel anew if need be
            self._get_from(queue, no_ack)
            if not self.held:
                self.session.resume(self)
        self.session.wakeup()

    def _get_from(self, queue, no_ack: bool) -> None:
        if queue.remote:     # homed on another node: answer when it does; later frames wait
            self.held = True
            self._remote(queue).get_from(self, no_ack, lambda entry, count: self._got(queue, no_ack, entry, count))
            return
        entry = queue.take(no_ack)
        self._answer_get(queue, no_ack, entry, queue.message_count)

    def _got(self, queue, no_ack: bool, entry, message_count: int) -> None:
        """A queue's home node answered a basic.get."""
        if self.closed:
            if entry is not None and not no_ack:
                queue.requeue([entry])
            return
        self._answer_get(queue, no_ack, entry, message_count)
        self.held = False
        self.session.resume(self)

    def _answer_get(self, queue, no_ack: bool, entry, message_count: int) -> None:
        if entry is None:
            self.session.send_method(self.id, cmd.Basic.GetEmpty())
            return
        self.delivered_total += 1
        tag = self.next_tag
        self.next_tag = tag + 1
        message = entry.message
        self.session.send_method(self.id, cmd.Basic.GetOk(tag, entry.redelivered, message.exchange,
                                                          message.routing_key, message_count))
        self.session.write(encode_content(self.id, message.props_raw, message.body, self.session.frame_max))
        if not no_ack:
            self.unacked[tag] = Unacked(tag, entry, queue, None)
            if entry.msg_id and queue.store.is_written(entry.msg_id):
                self.session.gate_on(queue.store)

    # ---- basic class: acknowledgements ---------------------------------------------------
    def _take_unacked(self, tag: int, multiple: bool, method) -> list[Unacked]:
        unacked = self.unacked
        if multiple:
            if tag == 0:
                records = list(unacked.values())
                unacked.clear()
                return records
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

    def _basic_ack(self, m) -> None:
        records = self._take_unacked(m.delivery_tag, m.multiple, m)
        if self.mode is Mode.TX:
            self.tx_acks.append(("ack", records, False))
            return
        self._settle(records, requeue=None)

    def _basic_reject(self, m) -> None:
        records = self._take_unacked(m.delivery_tag, False, m)
        if self.mode is Mode.TX:
            self.tx_acks.append(("reject", records, m.requeue))
            return
        self._settle(records, requeue=m.requeue)

    def _basic_nack(self, m) -> None:
        records = self._take_unacked(m.delivery_tag, m.multiple, m)
        if self.mode is Mode.TX:
            self.tx_acks.append(("nack", records, m.requeue))
            return
        self._settle(records, requeue=m.requeue)

    def _settle(self, records: list[Unacked], requeue: bool | None) -> None:
        """Finish deliveries: acked (requeue None), discarded (False) or put back (True)."""
        if requeue is None:
            self.acked_total += len(records)
        touched: dict[Queue, list[Entry]] = defaultdict(list)
        for record in records:
            consumer = record.consumer
            if consumer is not None:
                consumer.unacked -= 1
                self.global_unacked -= 1
            touched[record.queue].append(record.entry)
        for queue, entries in touched.items():
            if requeue:
                queue.requeue(entries)
            elif requeue is None:
                queue.settle(entries)
            else:
                queue.reject(entries)
        if self.prefetch_global:
            if self.parked:
                self._unpark()
            self._dispatch_all()
        for queue in touched:
            if queue.consumers:
                queue.dispatch()

    def _basic_recover(self, m) -> None:
        if not m.requeue:
            raise error(ReplyCode.NOT_IMPLEMENTED, "requeue=false", m)
        records = list(self.unacked.values())
        self.unacked.clear()
        self._settle(records, requeue=True)
        if isinstance(m, cmd.Basic.Recover):
            self._reply(cmd.Basic.RecoverOk())

    def _dispatch_all(self) -> None:
        for queue in self.queues_to_dispatch():
            queue.dispatch()

    # ---- basic class: publishing ---------------------------------------------------------
    def publish(self, publish, props_raw: bytes, body: bytes) -> None:
        self.published_total += 1
        if publish.immediate:
            raise AMQPError(ReplyCode.NOT_IMPLEMENTED, "immediate=true", 60, 40)
        exchange = self.vhost.exchange_for_publish(publish.exchange, publish)
        access = self.session.access
        if not access.unrestricted:
            access.check(WRITE, "exchange", publish.exchange, publish)
        props = PropertyView(props_raw)
        if props.user_id is not None and props.user_id != self.session.user:
            raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                            f"user_id property set to '{props.user_id}' but authenticated user was "
                            f"'{self.session.user}'", 60, 40)
        if props.reply_to == REPLY_TO:
            if self.reply_token is None:
                raise AMQPError(ReplyCode.PRECONDITION_FAILED, "fast reply consumer does not exist", 60, 40)
            props_raw = with_reply_to(props_raw, self.reply_token)
        expiration = props.expiration
        if expiration is not None:
            expiration = parse_expiration(expiration)
        message = Message(publish.exchange, publish.routing_key, props_raw, body,
                          props.delivery_mode == 2, props.priority, expiration)
        if self.mode is Mode.TX:
            self.tx_publishes.append((exchange, message, props, publish.mandatory))
            return
        self._route_and_enqueue(exchange, message, props, publish.mandatory)

    def _route_and_enqueue(self, exchange, message: Message, props: PropertyView, mandatory: bool) -> None:
        vhost = self.vhost
        if exchange.name == "" and message.routing_key.startswith(REPLY_TO_PREFIX):
            if not self.session.broker.deliver_reply(message.routing_key, message) and mandatory:
                self._return(message)
            if self.confirms is not None:
                self.confirms.publish(0)
            return
        headers = props.headers() if props._headers_span is not None and vhost.needs_headers() else None
        queues = vhost.route(exchange, message.routing_key, headers)
        confirms = self.confirms
        if not queues:
            if mandatory:
                self._return(message)
            if confirms is not None:
                confirms.publish(0)
            return
        if confirms is None:
            for queue in queues:
                if queue.remote:
                    seq = 0
                    if self.tx_replicas is not None:   # committing: the commit-ok waits for the home
                        self.tx_remote_seq += 1
                        seq = self.tx_remote_seq
                        self.tx_remote.seqs.add(seq)
                    self._remote(queue).publish_from(self, message, seq)
                else:
                    queue.publish(message)
                    if queue.replica is not None and self.tx_replicas is not None:
                        self.tx_replicas[queue.replica] = queue.replica.seq
            return
        seq = confirms.publish(len(queues))
        for queue in queues:
            if queue.remote:   # homed on another node
                self._remote(queue).publish_from(self, message, seq)
                continue
            outcome = queue.publish(message)
            if outcome == LOGGED:
                queue.when_safe(self._on_durable, seq)
            else:
                confirms.settle(seq, outcome == SAFE)

    def remote_settled(self, seqs, ok: bool) -> None:
        """A queue's home node reports forwarded publishes safe (or refused them, or went away):
        they are confirmed or nacked, or a tx.commit waiting for them goes on."""
        if self.closed:
            return
        if self.confirms is not None:
            for seq in seqs:
                self.confirms.settle(seq, ok)
            self.session.note_confirms(self)
        elif self.tx_remote is not None:
            self.tx_remote.settled(seqs, ok)

    def republish(self, queue, message: Message, seq: int) -> None:
        """A publish held while its mirrored queue failed over, placed on the new master (here or
        on another node): confirmed (or a tx.commit released) once it is safe there."""
        if self.closed:
            return
        if queue.remote:
            self._remote(queue).publish_from(self, message, seq)
            return
        outcome = queue.publish(message)
        if not seq:
            return
        if outcome == LOGGED:
            queue.when_safe(lambda ok, s: self.remote_settled((s,), ok), seq)
        else:
            self.remote_settled((seq,), outcome == SAFE)

    def _on_durable(self, ok: bool, seq: int) -> None:
        if self.closed:
            return
        self.confirms.settle(seq, ok)
        self.session.note_confirms(self)

    def _return(self, message: Message) -> None:
        self.session.send_method(self.id, cmd.Basic.Return(ReplyCode.NO_ROUTE, "NO_ROUTE",
                                                           message.exchange, message.routing_key))
        self.session.write(encode_content(self.id, message.props_raw, message.body, self.session.frame_max))

    def flush_confirms(self) -> None:
        confirms = self.confirms
        if confirms is None or not confirms.ready or self.closed:
            return
        for tag, multiple, nack in confirms.flush():
            self.session.write_confirm(self.id, tag, multiple, nack)

    # ---- confirm and tx classes ------------------------------------------------------------
    def _confirm_select(self, m) -> None:
        if self.mode is Mode.TX:
            raise error(ReplyCode.PRECONDITION_FAILED, "cannot switch from tx to confirm mode", m)
        if self.mode is Mode.NORMAL:
            self.mode = Mode.CONFIRM
            self.confirms = ConfirmTracker()
        self._reply(cmd.Confirm.SelectOk(), m.nowait)

    def _tx_select(self, m) -> None:
        if self.mode is Mode.CONFIRM:
            raise error(ReplyCode.PRECONDITION_FAILED, "cannot switch from confirm to tx mode", m)
        self.mode = Mode.TX
        self._reply(cmd.Tx.SelectOk())

    def _tx_commit(self, m) -> None:
        if self.mode is not Mode.TX:
            raise error(ReplyCode.PRECONDITION_FAILED, "channel is not transactional", m)
        publishes, self.tx_publishes = self.tx_publishes, []
        acks, self.tx_acks = self.tx_acks, []
        self.tx_replicas = {}
        self.tx_remote = remote = RemoteWait()
        for exchange, message, props, mandatory in publishes:
            self._route_and_enqueue(exchange, message, props, mandatory)
        replicas, self.tx_replicas = self.tx_replicas, None
        for kind, records, requeue in acks:
            self._settle(records, requeue=None if kind == "ack" else requeue)
        # CONF-8: commit-ok only once its writes are durable here, held by every in-sync mirror,
        # and safe on the home node of every queue homed elsewhere
        self._hold(cmd.Tx.CommitOk(), tuple(replicas.items()), remote)

    def _tx_rollback(self, m) -> None:
        if self.mode is not Mode.TX:
            raise error(ReplyCode.PRECONDITION_FAILED, "channel is not transactional", m)
        self.tx_publishes = []
        acks, self.tx_acks = self.tx_acks, []
        if acks:
            restored = dict(self.unacked)
            for _kind, records, _requeue in acks:
                for record in records:
                    restored[record.tag] = record
            self.unacked = dict(sorted(restored.items()))
        self._reply(cmd.Tx.RollbackOk())

    # ---- channel class ------------------------------------------------------------------------
    def _channel_flow(self, m) -> None:
        if not m.active:   # RabbitMQ 3.x: consumers use prefetch instead
            raise error(ReplyCode.NOT_IMPLEMENTED, "active=false", m)
        self._reply(cmd.Channel.FlowOk(True))

    def _channel_flow_ok(self, m) -> None:
        return

    # ---- end of life -----------------------------------------------------------------------------
    def teardown(self) -> None:
        """The channel is gone: cancel its consumers and requeue what it had not acked (ACK-6)."""
        if self.closed:
            return
        self.closed = True
        self.session.broker.retire_counters(self)
        self.backlog.clear()
        self.parked.clear()          # still out on their home nodes, which requeue them (below)
        self._drop_reply_to()
        consumers = list(self.consumers.values())
        self.consumers.clear()
        for consumer in consumers:
            consumer.queue.remove_consumer(consumer)
        pending = list(self.unacked.values())
        for _kind, records, _requeue in self.tx_acks:
            pending.extend(records)
        self.unacked.clear()
        self.tx_acks = []
        self.tx_publishes = []
        by_queue: dict[Queue, list[Entry]] = defaultdict(list)
        for record in pending:
            by_queue[record.queue].append(record.entry)
        for queue, entries in by_queue.items():
            queue.requeue(entries)
        for queue in self.remote_queues:
            queue.unlink(self)      # the home node requeues whatever is still out
        self.remote_queues.clear()


class RemoteWait:
    """One tx.commit's publishes to queues homed on other nodes, until each home reports them."""

    __slots__ = ("seqs", "ok", "_done")

    def __init__(self):
        self.seqs: set[int] = set()
        self.ok = True
        self._done: Callable[[bool], None] | None = None

    def settled(self, seqs, ok: bool) -> None:
        self.seqs.difference_update(seqs)
        self.ok = self.ok and ok
        if not self.seqs:
            self._finish()

    def when_settled(self, done: Callable[[bool], None]) -> None:
        self._done = done
        if not self.seqs:
            self._finish()

    def _finish(self) -> None:
        if self._done is not None:
            done, self._done = self._done, None
            done(self.ok)


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


HANDLERS = {
    cmd.Exchange.Declare: Channel._exchange_declare,
    cmd.Exchange.Delete: Channel._exchange_delete,
    cmd.Exchange.Bind: Channel._exchange_bind,
    cmd.Exchange.Unbind: Channel._exchange_unbind,
    cmd.Queue.Declare: Channel._queue_declare,
    cmd.Queue.Bind: Channel._queue_bind,
    cmd.Queue.Unbind: Channel._queue_unbind,
    cmd.Queue.Purge: Channel._queue_purge,
    cmd.Queue.Delete: Channel._queue_delete,
    cmd.Basic.Qos: Channel._basic_qos,
    cmd.Basic.Consume: Channel._basic_consume,
    cmd.Basic.Cancel: Channel._basic_cancel,
    cmd.Basic.Get: Channel._basic_get,
    cmd.Basic.Ack: Channel._basic_ack,
    cmd.Basic.Reject: Channel._basic_reject,
    cmd.Basic.Nack: Channel._basic_nack,
    cmd.Basic.Recover: Channel._basic_recover,
    cmd.Basic.RecoverAsync: Channel._basic_recover,
    cmd.Confirm.Select: Channel._confirm_select,
    cmd.Tx.Select: Channel._tx_select,
    cmd.Tx.Commit: Channel._tx_commit,
    cmd.Tx.Rollback: Channel._tx_rollback,
    cmd.Channel.Flow: Channel._channel_flow,
    cmd.Channel.FlowOk: Channel._channel_flow_ok,
}
