"""The exchange class of a channel: declare, delete, bind and unbind exchanges.

A mixin of `Channel` (node/broker/channel.py), over its state; single-node
changes apply to the vhost at once, clustered ones go through the metadata log.
"""
from __future__ import annotations

from pamqp import commands as cmd

from ..protocol.tables import encode_table
from .commands import Bind, ExchangeDeclare, ExchangeDelete, Unbind
from .permissions import CONFIGURE, READ, WRITE


class ExchangeMethods:
    # ---- exchange class -------------------------------------------------------------
    def _exchange_declare(self, m) -> None:
        if not m.passive and m.exchange:
            access = self.session.access
            access.check(CONFIGURE, "exchange", m.exchange, m)
            alternate = (m.arguments or {}).get("alternate-exchange")
            if alternate is not None:
                access.check(WRITE, "exchange", as_text(alternate), m)
                access.check(READ, "exchange", m.exchange, m)
        if m.passive or self.session.broker.cluster is None:
            self.vhost.declare_exchange(m.exchange, m.exchange_type, m.passive, m.durable, m.auto_delete,
                                        m.internal, m.arguments, m)
            self._reply_durable(cmd.Exchange.DeclareOk(), m.nowait)
            return
        self._propose(ExchangeDeclare(self.vhost.name, m.exchange, m.exchange_type, m.durable, m.auto_delete,
                                      m.internal, encode_table(m.arguments or {}), m.index),
                      lambda _r: cmd.Exchange.DeclareOk(), m.nowait)

    def _exchange_delete(self, m) -> None:
        if m.exchange and not m.exchange.startswith("amq."):
            self.session.access.check(CONFIGURE, "exchange", m.exchange, m)
        if self.session.broker.cluster is not None:
            self._propose(ExchangeDelete(self.vhost.name, m.exchange, m.if_unused, m.index),
                          lambda _r: cmd.Exchange.DeleteOk(), m.nowait)
            return
        self.vhost.delete_exchange(m.exchange, m.if_unused, m)
        self._reply_durable(cmd.Exchange.DeleteOk(), m.nowait)

    def _exchange_bind(self, m) -> None:
        self._check_bind_exchanges(m)
        if self.session.broker.cluster is not None:
            self._propose_binding(Bind, "exchange", m.source, m.destination, m.routing_key, m,
                                  cmd.Exchange.BindOk(), m.nowait)
            return
        self.vhost.bind_exchange(m.destination, m.source, m.routing_key, m.arguments, m)
        self._reply_durable(cmd.Exchange.BindOk(), m.nowait)

    def _exchange_unbind(self, m) -> None:
        self._check_bind_exchanges(m)
        if self.session.broker.cluster is not None:
            self._propose_binding(Unbind, "exchange", m.source, m.destination, m.routing_key, m,
                                  cmd.Exchange.UnbindOk(), m.nowait)
            return
        self.vhost.unbind_exchange(m.destination, m.source, m.routing_key, m.arguments, m)
        self._reply_durable(cmd.Exchange.UnbindOk(), m.nowait)

    def _check_bind_exchanges(self, m) -> None:
        if m.source and m.destination:
            access = self.session.access
            access.check(WRITE, "exchange", m.destination, m)
            access.check(READ, "exchange", m.source, m)


def as_text(value):
    return value.decode() if isinstance(value, bytes) else value
