"""Metadata commands applied to a broker, and the metadata port of a node that is not clustered.

A channel changes exchanges, queues and bindings only by proposing a command
(node/broker/commands.py) to its broker's metadata port and replying once it
is applied. Clustered, the port is cluster.node.ClusterNode: the command goes
through the Raft log and every node applies it (cluster/metadata.py, with the
functions below). On a single node the port is `LocalMetadata`: the command
applies here at once and the reply waits only for the change's record on
the store's metadata log (node/store/meta.py) to be on disk, as a durable
declare must survive a crash. The channel has one path either way.
"""
from __future__ import annotations

import structlog

from ..protocol.replies import AMQPError, ReplyCode
from . import commands as C


class _Owner:
    """An exclusive queue's owner as the cluster knows it: a connection key."""

    def __init__(self, key: str):
        self.key = key


def owner_of(broker, key: str | None):
    """The connection a command names (by key): the session itself if it is connected here."""
    if not key:
        return None
    return broker.sessions_by_key.get(key) or _Owner(key)


def owner_node(key: str | None) -> str:
    """The node a connection key names: a session is NODE/ID (node/broker/session.py)."""
    return key.rpartition("/")[0] if key else ""


class _Method:
    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def method_of(index: int) -> _Method:
    """A stand-in carrying the class/method ids of the AMQP method that proposed the command."""
    return _Method(index)


def vhost_of(broker, name: str):
    vhost = broker.vhosts.get(name)
    if vhost is None:
        raise AMQPError(ReplyCode.NOT_FOUND, f"no vhost '{name}'")
    return vhost


# ---- the changes every node applies alike ---------------------------------------------------
def declare_exchange(broker, c: C.ExchangeDeclare) -> dict:
    vhost_of(broker, c.vhost).declare_exchange(c.name, c.type, False, c.durable, c.auto_delete, c.internal,
                                               c.arguments, method_of(c.method_index))
    return {}


def delete_exchange(broker, c: C.ExchangeDelete) -> dict:
    vhost_of(broker, c.vhost).delete_exchange(c.name, c.if_unused, method_of(c.method_index))
    return {}


def bind(broker, c: C.Bind) -> dict:
    """queue.bind or exchange.bind, or (a C.Unbind) their unbind."""
    vhost = vhost_of(broker, c.vhost)
    method = method_of(c.method_index)
    args = c.arguments
    undo = isinstance(c, C.Unbind)
    if c.kind == "queue":
        if undo and not (c.destination in vhost.queues and c.source in vhost.exchanges):
            return {}       # unbinding nothing is fine
        queue = vhost.queue(c.destination, owner_of(broker, c.owner), method)
        (vhost.unbind_queue if undo else vhost.bind_queue)(queue, c.source, c.routing_key, args, method)
    else:
        (vhost.unbind_exchange if undo else vhost.bind_exchange)(c.destination, c.source, c.routing_key, args,
                                                                 method)
    return {}


# ---- a single node ------------------------------------------------------------------------------
def _declare_queue(broker, c: C.QueueDeclare) -> dict:
    """The proposer named the queue and refused a reserved name already (`server_named`)."""
    queue = vhost_of(broker, c.vhost).declare_queue(
        c.name, False, c.durable, c.exclusive, c.auto_delete, c.arguments,
        owner_of(broker, c.owner), method_of(c.method_index), server_named=True)
    return {"queue": queue.name, "home": broker.node_name}


def _delete_queue(broker, c: C.QueueDelete) -> dict:
    count = vhost_of(broker, c.vhost).delete_queue(c.name, c.if_unused, c.if_empty, owner_of(broker, c.owner),
                                                   method_of(c.method_index))
    return {"message_count": count}


LOCAL = {
    C.ExchangeDeclare: declare_exchange,
    C.ExchangeDelete: delete_exchange,
    C.Bind: bind,
    C.Unbind: bind,
    C.QueueDeclare: _declare_queue,
    C.QueueDelete: _delete_queue,
}


class LocalMetadata:
    """The metadata port of a broker with no cluster (node/broker/ports.py MetadataPort)."""

    def __init__(self, broker):
        self.broker = broker
        self.name = broker.node_name
        self.log = structlog.get_logger("haremq.metadata").bind(node=broker.node_name)

    def submit(self, command: C.Command, callback, *args) -> None:
        """Apply now; callback(result, error, *args) at once, or once the change is on disk."""
        try:
            result = LOCAL[type(command)](self.broker, command)
        except AMQPError as err:
            callback(None, err, *args)
            return
        if not self.broker.metadata_pending():
            callback(result, None, *args)
            return

        def durable(ok: bool) -> None:
            if not ok:
                self.log.error("a write was not made durable before this reply", op=command.op)
            callback(result, None, *args)
        self.broker.store.when_durable(durable)

    def forward_reply(self, node: str, token: str, message) -> bool:
        return False    # no other node to forward to
