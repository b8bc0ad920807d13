"""One AMQP channel as the broker sees it: its mode, consumers, confirms and transactions.

The channel's mode is normal, confirm or tx; switching between confirm and
tx is refused (CONF-1). Its deliveries the client has not answered and its
prefetch are one `Deliveries` (node/broker/deliveries.py); whatever is left
unanswered when the channel ends goes back to its queue as redelivered
(ACK-6).

This module holds the delivery path a queue pushes into, the method table,
and the ways a method is answered: at once, once written durably, or once
the cluster's log or a queue's home node has answered (the channel is
"held" meanwhile and its later frames wait). The methods themselves live
with their AMQP class: channel_exchange.py, channel_queue.py,
channel_basic.py and channel_confirm_tx.py.
"""
from __future__ import annotations

from collections import defaultdict, deque

from pamqp import commands as cmd

from ..protocol.frames import encode_deliver
from ..protocol.replies import AMQPError, ReplyCode, error
from .channel_basic import BasicMethods
from .channel_confirm_tx import CommitWait, ConfirmTxMethods, Mode
from .channel_exchange import ExchangeMethods
from .channel_queue import QueueMethods
from .commands import Bind, Command
from .confirms import ConfirmTracker
from .deliveries import Deliveries
from .message import Entry
from .queue import Consumer, Queue


class Channel(ExchangeMethods, QueueMethods, BasicMethods, ConfirmTxMethods):
    def __init__(self, session, channel_id: int):
        self.session = session
        self.id = channel_id
        self.vhost = session.vhost
        self.deliveries = Deliveries()
        self.consumers: dict[str, Consumer] = {}
        self.mode = Mode.NORMAL
        self.confirms: ConfirmTracker | None = None
        self.tx_publishes: list[tuple] = []
        self.tx_acks: list[tuple[str, list, bool]] = []
        self.tx_commit: CommitWait | None = None   # during tx.commit: its publishes, until each is safe
        self.last_queue = ""
        self.reply_token: str | None = None
        self.reply_consumer_tag: str | None = None
        self.replies_dropped = 0          # direct replies its connection could not take (not reading)
        self.closed = False
        self.remote_queues: set = set()   # queues homed elsewhere this channel has a link to
        self.held = False                 # waiting for durability: later frames wait in backlog
        self.backlog: deque = deque()
        self.cancels_after_reply: list[str] | None = None   # during queue.delete: basic.cancel after delete-ok
        # counters read by the management API and /metrics; the broker keeps them when it closes
        self.published_total = self.delivered_total = self.acked_total = 0

    def __repr__(self) -> str:
        return f"<Channel {self.id}>"

    # ---- delivery --------------------------------------------------------------------
    @property
    def prefetch_global(self) -> int:
        return self.deliveries.prefetch_global

    def linked_to(self, queue) -> None:
        """A queue homed elsewhere opened a link for this channel: unlinked when the channel ends."""
        self.remote_queues.add(queue)

    def can_deliver(self) -> bool:
        deliveries = self.deliveries      # is the channel-wide prefetch used up? (asked before every delivery)
        if self.closed or (deliveries.prefetch_global and deliveries.global_unacked >= deliveries.prefetch_global):
            return False
        return self.session.can_write()

    def deliver(self, consumer: Consumer, entry: Entry) -> None:
        self.delivered_total += 1
        deliveries = self.deliveries
        tag = deliveries.next_tag         # Deliveries.tag(), written out: the hottest path
        deliveries.next_tag = tag + 1
        message = entry.message
        self.session.write(encode_deliver(self.id, consumer.tag_raw, tag, entry.redelivered,
                                          message.exchange_raw, message.routing_key_raw,
                                          message.props_raw, message.body, self.session.frame_max))
        if not consumer.no_ack:
            deliveries.delivered(tag, entry, consumer.queue, consumer)
            if entry.msg_id and consumer.queue.store.is_written(entry.msg_id):
                # Its DELIVER record must be in the OS before the client sees it; if the
                # ENQUEUE is not written yet, both go out in the same write anyway.
                self.session.gate_on(consumer.queue.store)

    def deliver_from_home(self, consumer: Consumer, entry) -> None:
        """A delivery pushed by the home node of a queue homed elsewhere. The home keeps each
        consumer's prefetch; the channel-wide (global) one is kept here: deliveries over it wait,
        in order, for acks to make room (QOS-1, QOS-2)."""
        parked = self.deliveries.parked
        if parked:
            parked.append((consumer, entry))
            self._unpark()
        elif self.deliveries.room_for(consumer):
            self.deliver(consumer, entry)
        else:
            parked.append((consumer, entry))

    def _unpark(self) -> None:
        parked = self.deliveries.parked
        while parked and not self.closed:
            consumer, entry = parked[0]
            if entry.link.closed:          # its home went away; the home requeues it, if it returns
                parked.popleft()
                entry.link.queue.requeue([entry])   # and the client never had it (a failover's redelivery)
                continue
            if not self.deliveries.room_for(consumer):
                return
            parked.popleft()
            self.deliver(consumer, entry)

    def _give_back_parked(self, consumer: Consumer) -> None:
        """A cancelled consumer's deliveries that never reached the client go back to the queue."""
        parked = self.deliveries.parked
        if not parked:
            return
        mine = [entry for c, entry in parked if c is consumer]
        if mine:
            self.deliveries.parked = deque((c, e) for c, e in parked if c is not consumer)
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

    def _propose(self, command: Command, reply, nowait: bool = False) -> None:
        """Change metadata through the broker's metadata port (node/broker/metadata.py); reply once
        it is applied here. The channel holds its later frames until then, so its order is kept."""
        self.held = True
        self.session.broker.metadata.submit(command, self._proposed, reply, nowait)

    def _proposed(self, result, err, reply, nowait: bool) -> None:
        if self.closed:
            return
        if err is not None:
            self.session.fail_channel(self.id, err)
            self._resume()
            return
        try:
            method = reply(result)
        except AMQPError as exc:
            self.session.fail_channel(self.id, exc)
            return
        if method is None:
            return     # the reply needs one more answer (from a queue's home node); it releases us
        self._answer(method, nowait)

    def _answer(self, method, nowait: bool = False) -> None:
        """Reply to the call the channel was held for, then handle the frames that waited."""
        self._reply(method, nowait)
        self._resume()

    def _resume(self) -> None:
        self.held = False
        self.session.resume(self)

    def _propose_binding(self, op: type[Bind], kind: str, source: str, destination: str, routing_key: str, m,
                         reply, nowait: bool = False) -> None:
        self._propose(op(self.vhost.name, kind, source, destination, routing_key, m.arguments or {},
                         self.session.key, m.index), lambda _r: reply, nowait)

    def _reply_durable(self, method, nowait: bool = False) -> None:
        """Reply once pending metadata is on disk; a durable declare must survive a crash. A
        channel held for the call (a queue answered it) goes on after the reply."""
        if not nowait and self.session.broker.metadata_pending():
            self._hold(method)
        elif self.held:
            self._answer(method, nowait)
        else:
            self._reply(method, nowait)

    def _hold(self, reply, commit: "CommitWait | None" = None) -> None:
        """Send `reply` when everything written so far is durable (and every publish of `commit`
        is safe on its queue: durable, on every in-sync mirror, on its home node); frames after
        it wait."""
        store = self.session.broker.store
        if store is None and commit is None:
            self._reply(reply)
            return
        self.held = True
        if commit is None:
            store.when_durable(self._release, reply)
        elif store is None:
            commit.when_settled(lambda ok: self._release(ok, reply))
        else:
            commit.when_settled(lambda ok: store.when_durable(lambda durable: self._release(durable and ok, reply)))

    def _release(self, ok: bool, reply) -> None:
        if self.closed:
            return
        if not ok and isinstance(reply, cmd.Tx.CommitOk):
            # a publish of the transaction was refused or not made safe: never commit-ok, but
            # RabbitMQ's answer (rabbit_channel complete_tx with tx = failed)
            self.session.fail_channel(self.id, AMQPError(ReplyCode.PRECONDITION_FAILED, "partial tx completion",
                                                         90, 20))
            return
        if not ok:
            self.session.log.error("a write was not made durable before this reply", channel=self.id,
                                   reply=reply.name)
        self._answer(reply)

    def _queue_name(self, name: str, method) -> str:
        if name:
            return name
        if not self.last_queue:
            raise error(ReplyCode.NOT_FOUND, "no previously declared queue", method)
        return self.last_queue

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
        self.deliveries.parked.clear()   # still out on their home nodes, which requeue them (below)
        self._drop_reply_to()
        consumers = list(self.consumers.values())
        self.consumers.clear()
        for consumer in consumers:
            consumer.queue.remove_consumer(consumer)
        pending = self.deliveries.take_all()
        for _kind, records, _requeue in self.tx_acks:
            pending.extend(records)
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
