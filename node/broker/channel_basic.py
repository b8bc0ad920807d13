"""The basic class of a channel: consuming, getting, acknowledging and publishing.

A mixin of `Channel` (node/broker/channel.py), over its delivery and ack
state (`Deliveries`: delivery tags, the unacked map, prefetch accounting) and
its confirm tracker. A publish routes to its queues here and goes to each
the same way, whether the queue's master is here or on another node
(`publish_from`); its confirm is released when every queue reports it safe
(CONF-4).
"""
from __future__ import annotations

from collections import defaultdict

from pamqp import commands as cmd

from ..protocol.frames import encode_content, encode_deliver, shortstr
from ..protocol.properties import PropertyView, property_view, with_reply_to
from ..protocol.replies import AMQPError, ReplyCode, error
from .channel_confirm_tx import Mode
from .expiry import parse_expiration
from .message import Entry, Message
from .permissions import READ, WRITE
from .deliveries import Unacked
from .queue import Consumer, Queue, consumer_priority, is_quorum
from .reply_to import REPLY_TO, REPLY_TO_PREFIX
from .vhost import server_name


class BasicMethods:
    # ---- basic class: consuming ---------------------------------------------------------
    def _basic_qos(self, m) -> None:
        if m.prefetch_size:
            raise error(ReplyCode.NOT_IMPLEMENTED, f"prefetch_size!=0 ({m.prefetch_size})", m)
        if m.prefetch_count < 0 or m.prefetch_count > 65535:
            raise error(ReplyCode.PRECONDITION_FAILED, f"prefetch count {m.prefetch_count} out of range", m)
        if m.global_:
            self.deliveries.prefetch_global = m.prefetch_count
            for consumer in self.consumers.values():   # their caps on other nodes follow
                consumer.queue.prefetch_changed(consumer)
        else:
            self.deliveries.prefetch_consumer = m.prefetch_count
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
        if self.deliveries.prefetch_global and is_quorum(queue.arguments):
            # rabbit_quorum_queue:consume/3 with limiter_active (Celery's default global_qos)
            raise error(ReplyCode.NOT_IMPLEMENTED, f"{queue.describe()} does not support global qos", m)
        consumer_priority(m.arguments, queue)
        consumer = Consumer(tag, self, queue, m.no_ack, m.exclusive, self.deliveries.prefetch_consumer,
                            dict(m.arguments or {}))
        self.consumers[tag] = consumer
        if m.nowait:
            queue.add_consumer(consumer)
            return
        # consume-ok once the queue has the consumer, before its first delivery (or refused it: a
        # channel error); a master on another node answers later and later frames wait till then
        self.held = True
        try:
            queue.add_consumer(consumer, lambda: self._consumed(tag))
        except AMQPError:
            self.held = False
            self.consumers.pop(tag, None)
            raise

    def _consumed(self, tag: str) -> None:
        if self.closed:
            return
        self._answer(cmd.Basic.ConsumeOk(tag))

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

    def deliver_reply(self, message: Message) -> bool:
        """A direct reply-to message: straight to this channel's reply consumer, no ack. False
        (the reply is dropped) when the channel is gone or its connection cannot take more
        output now: a requester that does not read its replies must not make the node hold
        them without limit, and a reply has no queue to wait in (RabbitMQ too drops a direct
        reply it cannot deliver; a mandatory one goes back to its publisher as unroutable)."""
        if self.closed or self.reply_consumer_tag is None:
            return False
        if not self.session.can_write():
            self.replies_dropped += 1
            if self.replies_dropped == 1 or self.replies_dropped % 1000 == 0:
                self.session.log.info("direct replies dropped: the requester is not reading them",
                                      channel=self.id, dropped=self.replies_dropped)
            return False
        tag = self.deliveries.tag()
        self.session.write(encode_deliver(self.id, shortstr(self.reply_consumer_tag), tag, False,
                                          message.exchange_raw, message.routing_key_raw,
                                          message.props_raw, message.body, self.session.frame_max))
        return True

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
            self._get_from(queue, no_ack)     # still held: resumed once it is answered
        self.session.wakeup()

    def _get_from(self, queue, no_ack: bool) -> None:
        """Answered at once by a master here, later by one elsewhere: later frames wait till then."""
        self.held = True
        queue.get_from(self, no_ack, lambda entry, count: self._got(queue, no_ack, entry, count))

    def _got(self, queue, no_ack: bool, entry, message_count: int) -> None:
        """The queue answered a basic.get."""
        if self.closed:
            if entry is not None and not no_ack:
                queue.requeue([entry])
            return
        self._answer_get(queue, no_ack, entry, message_count)
        self._resume()

    def _answer_get(self, queue, no_ack: bool, entry, message_count: int) -> None:
        if entry is None:
            self.session.send_method(self.id, cmd.Basic.GetEmpty())
            return
        self.delivered_total += 1
        tag = self.deliveries.tag()
        message = entry.message
        self.session.send_method(self.id, cmd.Basic.GetOk(tag, entry.redelivered, message.exchange,
                                                          message.routing_key, message_count))
        self.session.write(encode_content(self.id, message.props_raw, message.body, self.session.frame_max))
        if not no_ack:
            self.deliveries.delivered(tag, entry, queue, None)
            if entry.msg_id and queue.store.is_written(entry.msg_id):
                self.session.gate_on(queue.store)

    # ---- basic class: acknowledgements ---------------------------------------------------
    def _basic_ack(self, m) -> None:
        records = self.deliveries.take(m.delivery_tag, m.multiple, m)
        if self.mode is Mode.TX:
            self.tx_acks.append(("ack", records, False))
            return
        self._settle(records, requeue=None)

    def _basic_reject(self, m) -> None:
        records = self.deliveries.take(m.delivery_tag, False, m)
        if self.mode is Mode.TX:
            self.tx_acks.append(("reject", records, m.requeue))
            return
        self._settle(records, requeue=m.requeue)

    def _basic_nack(self, m) -> None:
        records = self.deliveries.take(m.delivery_tag, m.multiple, m)
        if self.mode is Mode.TX:
            self.tx_acks.append(("nack", records, m.requeue))
            return
        self._settle(records, requeue=m.requeue)

    def _settle(self, records: list[Unacked], requeue: bool | None) -> None:
        """Finish deliveries: acked (requeue None), discarded (False) or put back (True)."""
        if requeue is None:
            self.acked_total += len(records)
        moved = self.deliveries.released(records)
        touched: dict[Queue, list[Entry]] = defaultdict(list)
        for record in records:
            touched[record.queue].append(record.entry)
        for queue, entries in touched.items():
            if requeue:
                queue.requeue(entries)
            elif requeue is None:
                queue.settle(entries)
            else:
                queue.reject(entries)
        if self.deliveries.prefetch_global:
            if self.deliveries.parked:
                self._unpark()
            self._dispatch_all()
        for queue in touched.keys() | moved:
            if queue.consumers:
                queue.dispatch()

    def _basic_recover(self, m) -> None:
        if not m.requeue:
            raise error(ReplyCode.NOT_IMPLEMENTED, "requeue=false", m)
        self._settle(self.deliveries.take_all(), requeue=True)
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
        props = property_view(props_raw)
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
                          props.delivery_mode == 2, props.priority, expiration,
                          publish.exchange_raw, publish.routing_key_raw)
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
        if confirms is not None:
            seq = confirms.publish(len(queues))
        elif self.tx_commit is not None:     # committing: the commit-ok waits for every queue
            seq = self.tx_commit.publish(len(queues))
        else:
            seq = 0
        for queue in queues:
            queue.publish_from(self, message, seq)

    def publish_settled(self, ok: bool, seq: int) -> None:
        """A queue reports publish `seq` safe (or refused it): one signal towards its confirm, or
        towards the tx.commit that is waiting for it."""
        if self.closed:
            return
        if self.confirms is not None:
            self.confirms.settle(seq, ok)
            self.session.note_confirms(self)
        elif self.tx_commit is not None:
            self.tx_commit.settled(seq, ok)

    def remote_settled(self, seqs, ok: bool) -> None:
        """A queue's home node reports forwarded publishes safe (or refused them, or went away)."""
        for seq in seqs:
            self.publish_settled(ok, seq)

    def republish(self, queue, message: Message, seq: int) -> None:
        """A publish held while its mirrored queue failed over, placed on the new master (here or
        on another node): confirmed (or a tx.commit released) once it is safe there."""
        if not self.closed:
            queue.publish_from(self, message, seq)

    def _return(self, message: Message) -> None:
        self.session.send_method(self.id, cmd.Basic.Return(ReplyCode.NO_ROUTE, "NO_ROUTE",
                                                           message.exchange, message.routing_key))
        self.session.write(encode_content(self.id, message.props_raw, message.body, self.session.frame_max))
