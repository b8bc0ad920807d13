"""The exchange class of a channel: declare, delete, bind and unbind exchanges.

A mixin of `Channel` (node/broker/channel.py). Every change is a command to
the broker's metadata port (applied here at once on a single node, through the
cluster's log when clustered); the reply goes when it is applied.
"""
from __future__ import annotations

from pamqp import commands as cmd

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
        if m.passive:
            self.vhost.declare_exchange(m.exchange, m.exchange_type, True, m.durable, m.auto_delete,
                                        m.internal, m.arguments, m)
            self._reply_durable(cmd.Exchange.DeclareOk(), m.nowait)
            return
        self._propose(ExchangeDeclare(self.vhost.name, m.exchange, m.exchange_type, m.durable, m.auto_delete,
                                      m.internal, m.arguments or {}, m.index),
                      lambda _r: cmd.Exchange.DeclareOk(), m.nowait)

    def _exchange_delete(self, m) -> None:
        if m.exchange and not m.exchange.startswith("amq."):
            self.session.access.check(CONFIGURE, "exchange", m.exchange, m)
        self._propose(ExchangeDelete(self.vhost.name, m.exchange, m.if_unused, m.index),
                      lambda _r: cmd.Exchange.DeleteOk(), m.nowait)

    def _exchange_bind(self, m) -> None:
        self._check_bind_exchanges(m)
        self._propose_binding(Bind, "exchange", m.source, m.destination, m.routing_key, m, cmd.Exchange.BindOk(),
                              m.nowait)

    def _exchange_unbind(self, m) -> None:
        self._check_bind_exchanges(m)
        self._propose_binding(Unbind, "exchange", m.source, m.destination, m.routing_key, m,
                              cmd.Exchange.UnbindOk(), m.nowait)

    def _check_bind_exchanges(self, m) -> None:
        if m.source and m.destination:
            access = self.session.access
            access.check(WRITE, "exchange", m.destination, m)
            access.check(READ, "exchange", m.source, m)


def as_text(value):
    return value.decode() if isinstance(value, bytes) else value
