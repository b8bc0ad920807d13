"""The replicated metadata state machine: Raft entries applied to the broker, in log order.

Every node applies every committed entry, so all nodes hold the same
exchanges, bindings and queue records and route locally. A queue is a real
`Queue` on its home node and a `RemoteQueue` handle everywhere else. The
result of applying an entry (or the AMQP error it raised) is handed back to
the channel that proposed it, which replies to its client only then.
"""
from __future__ import annotations

import json

import structlog

from node.broker.exchange import Exchange
from node.protocol.replies import AMQPError, ReplyCode
from node.store import meta

from .remote_queue import RemoteQueue


def error_result(err: AMQPError) -> dict:
    return {"error": [int(err.code), err.text, err.class_id, err.method_id]}


def raise_result(result) -> dict:
    """Turn an applied entry's result back into the AMQP error it carried, if any."""
    if isinstance(result, dict) and "error" in result:
        code, text, class_id, method_id = result["error"]
        err = AMQPError(ReplyCode(code), text.split(" - ", 1)[-1], class_id, method_id)
        raise err
    return result


class _Owner:
    """An exclusive queue's owner as the cluster knows it: a connection key."""

    def __init__(self, key: str):
        self.key = key


class MetadataMachine:
    def __init__(self, node_name: str, broker, peers, call_metadata, is_up=lambda _n: True):
        self.node = node_name
        self.broker = broker
        self.peers = peers          # a callable: name -> cluster.membership.Peer | None
        self.call_metadata = call_metadata
        self.is_up = is_up
        self.recovered: dict[int, list] = {}
        self.log = structlog.get_logger("haremq.metadata").bind(node=node_name)

    def apply(self, index: int, command: bytes):
        c = json.loads(command)
        handler = getattr(self, "_" + c["op"].replace(".", "_"), None)
        if handler is None:
            return None
        try:
            return handler(index, c)
        except AMQPError as err:
            return error_result(err)

    def _vhost(self, c):
        vhost = self.broker.vhosts.get(c["vhost"])
        if vhost is None:
            raise AMQPError(ReplyCode.NOT_FOUND, f"no vhost '{c['vhost']}'")
        return vhost

    def _owner(self, key: str | None):
        if not key:
            return None
        return self.broker.sessions_by_key.get(key) or _Owner(key)

    # ---- entries ---------------------------------------------------------------------------
    def _noop(self, index, c):
        return None

    def _exchange_declare(self, index, c):
        self._vhost(c).declare_exchange(c["name"], c["type"], False, c["durable"], c["auto_delete"],
                                        c["internal"], meta.decode_table(c["arguments"]), _method(c))
        return {}

    def _exchange_delete(self, index, c):
        self._vhost(c).delete_exchange(c["name"], c["if_unused"], _method(c))
        return {}

    def _bind(self, index, c):
        vhost = self._vhost(c)
        args = meta.decode_table(c["arguments"])
        if c["kind"] == "queue":
            queue = vhost.queue(c["destination"], self._owner(c.get("owner")), _method(c))
            vhost.bind_queue(queue, c["source"], c["routing_key"], args, _method(c))
        else:
            vhost.bind_exchange(c["destination"], c["source"], c["routing_key"], args, _method(c))
        return {}

    def _unbind(self, index, c):
        vhost = self._vhost(c)
        args = meta.decode_table(c["arguments"])
        if c["kind"] == "queue":
            if c["destination"] in vhost.queues and c["source"] in vhost.exchanges:
                queue = vhost.queue(c["destination"], self._owner(c.get("owner")), _method(c))
                vhost.unbind_queue(queue, c["source"], c["routing_key"], args, _method(c))
        else:
            vhost.unbind_exchange(c["destination"], c["source"], c["routing_key"], args, _method(c))
        return {}

    def _queue_declare(self, index, c):
        vhost = self._vhost(c)
        owner = self._owner(c.get("owner"))
        name = c["name"]
        arguments = meta.decode_table(c["arguments"])
        existing = vhost.queues.get(name)
        if existing is not None:
            queue = vhost.declare_queue(name, False, c["durable"], c["exclusive"], c["auto_delete"], arguments,
                                        owner, _method(c))
            return {"queue": queue.name, "home": getattr(queue, "home", self.node)}
        if c["home"] == self.node:
            logged = c["durable"] and not c["exclusive"]
            queue = vhost.declare_queue(name, False, c["durable"], c["exclusive"], c["auto_delete"], arguments,
                                        owner, _method(c), store_id=index if logged else 0)
            if logged and index in self.recovered:
                queue.restore(self.recovered.pop(index))
        else:
            vhost.validate_new_queue(name, arguments, _method(c))
            queue = RemoteQueue(name, vhost.name, c["home"], self.peers, durable=c["durable"],
                                exclusive_owner=owner if c["exclusive"] else None, auto_delete=c["auto_delete"],
                                arguments=arguments)
            queue.metadata = self.call_metadata
            queue.home_up = self.is_up
            vhost.queues[name] = queue
        return {"queue": name, "home": c["home"]}

    def _queue_delete(self, index, c):
        vhost = self._vhost(c)
        queue = vhost.queues.get(c["name"])
        if queue is None:
            return {"message_count": 0}
        if isinstance(queue, RemoteQueue):
            vhost.remove_queue(queue)
            return {"message_count": None}
        count = vhost.delete_queue(c["name"], c["if_unused"], c["if_empty"], self._owner(c.get("owner")),
                                   _method(c))
        return {"message_count": count}

    def _node_restarted(self, index, c):
        """A node came back: its transient queues (and exclusive ones) did not survive it."""
        for vhost in self.broker.vhosts.values():
            for queue in list(vhost.queues.values()):
                home = getattr(queue, "home", self.node)
                if home == c["node"] and (not queue.durable or queue.exclusive_owner is not None):
                    vhost.remove_queue(queue)
        return {}

    def _broker_call(self, index, c):
        method = getattr(self.broker, c["method"], None)
        if method is None:
            return {"error": [540, f"NOT_IMPLEMENTED - {c['method']}", 0, 0]}
        try:
            return {"result": _jsonable(method(*c.get("args", [])))}
        except (ValueError, KeyError, LookupError) as exc:
            return {"error": [406, f"PRECONDITION_FAILED - {exc}", 0, 0]}


def _method(c):
    """A stand-in carrying the class/method ids of the AMQP method that proposed the entry."""
    index = c.get("method_index", 0)

    class M:
        pass
    m = M()
    m.index = index
    return m


def _jsonable(value):
    from .control import _jsonable as convert
    return convert(value)


def is_exchange(value) -> bool:
    return isinstance(value, Exchange)
