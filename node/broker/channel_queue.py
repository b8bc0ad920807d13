"""The queue class of a channel: declare, bind, unbind, purge and delete queues.

A mixin of `Channel` (node/broker/channel.py). A queue answers its counts
and its purge through a callback: at once for a master here, later for one
on another node, so declare-ok, purge-ok and delete-ok may wait for it; the
channel holds its later frames meanwhile.
"""
from __future__ import annotations

from pamqp import commands as cmd

from ..protocol.replies import AMQPError, ReplyCode, error
from .channel_exchange import as_text
from .commands import Bind, QueueDeclare, QueueDelete, Unbind
from .permissions import CONFIGURE, READ, WRITE
from .vhost import server_name


class QueueMethods:
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
                    access.check(WRITE, "exchange", as_text(dlx), m)
                    access.check(READ, "queue", name, m)
            name = name or server_name("amq.gen-")
            if name.startswith("amq.") and not server_named and m.queue:
                raise error(ReplyCode.ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'", m)
            self._propose(QueueDeclare(self.vhost.name, name, m.durable, m.exclusive, m.auto_delete,
                                       m.arguments or {}, self.session.broker.metadata.name,
                                       self.session.key if m.exclusive else None, m.index),
                          lambda _r: self._declared(name, m.nowait), m.nowait)
            return
        queue = self.vhost.declare_queue(name, True, m.durable, m.exclusive, m.auto_delete,
                                         m.arguments, self.session, m)
        self.held = True
        self._declared(queue.name, m.nowait, passive=True)

    def _declared(self, name: str, nowait: bool = False, passive: bool = False):
        """declare-ok for a queue just declared, with the counts its master answers (returns None:
        the answer releases the channel)."""
        queue = self.vhost.queues.get(name)
        if queue is None:       # deleted (by another connection) as soon as it was declared
            return cmd.Queue.DeclareOk(name, 0, 0)
        self.last_queue = name
        if queue.exclusive_owner is self.session:
            self.session.exclusive_queues.add(queue)
        queue.stats_from(lambda counts, err: self._declare_ok(name, counts, err, nowait, passive))
        return None

    def _queue_bind(self, m) -> None:
        self._check_queue_binding(m)
        queue = self.vhost.queue(self._queue_name(m.queue, m), self.session, m)
        routing_key = m.routing_key if (m.routing_key or m.queue) else queue.name
        self._propose_binding(Bind, "queue", m.exchange, queue.name, routing_key, m, cmd.Queue.BindOk(), m.nowait)

    def _check_queue_binding(self, m) -> None:
        access = self.session.access
        if not access.unrestricted:
            access.check(WRITE, "queue", self._queue_name(m.queue, m), m)
            if m.exchange:
                access.check(READ, "exchange", m.exchange, m)

    def _queue_unbind(self, m) -> None:
        self._check_queue_binding(m)
        name = self._queue_name(m.queue, m)
        self._propose_binding(Unbind, "queue", m.exchange, name, m.routing_key, m, cmd.Queue.UnbindOk())

    def _queue_purge(self, m) -> None:
        self.session.access.check(READ, "queue", self._queue_name(m.queue, m), m)
        queue = self.vhost.queue(self._queue_name(m.queue, m), self.session, m)
        self.held = True
        queue.purge_from(lambda count, err: self._purged(count, err, m.nowait))

    def _declare_ok(self, name: str, counts, err, nowait: bool, passive: bool) -> None:
        if self.closed:
            return
        if err is not None:
            self.session.fail_channel(self.id, err)
            return
        reply = cmd.Queue.DeclareOk(name, *counts)
        if passive:
            self._reply_durable(reply, nowait)      # what it names must survive a crash first
        else:
            self._answer(reply, nowait)

    def _purged(self, count, err, nowait: bool) -> None:
        if self.closed:
            return
        if err is not None:
            self.session.fail_channel(self.id, err)
            return
        self._answer(cmd.Queue.PurgeOk(count), nowait)

    def _queue_delete(self, m) -> None:
        self.session.access.check(CONFIGURE, "queue", self._queue_name(m.queue, m), m)
        self.cancels_after_reply = []
        queue = self.vhost.queues.get(self._queue_name(m.queue, m))
        if queue is not None:      # its counts, as its master has them
            self.held = True
            queue.stats_from(lambda counts, err: self._propose_delete(queue, m, counts, err))
        else:
            self._propose_delete(queue, m, (0, 0), None)

    def _propose_delete(self, queue, m, counts, err) -> None:
        """queue.delete: the preconditions are checked here, once, against the counts of the
        queue's home; every node then applies the same unconditional delete."""
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
        self._propose(QueueDelete(self.vhost.name, self._queue_name(m.queue, m), self.session.key,
                                  method_index=m.index),
                      lambda r: cmd.Queue.DeleteOk(counts[0] if r.get("message_count") is None
                                                   else r["message_count"]), m.nowait)
