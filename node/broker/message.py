"""A published message and its place in one queue.

One `Message` is shared by every queue a publish routes to; each queue holds
its own `Entry` with the position and redelivery state that belong to that
queue alone.
"""
from __future__ import annotations


class Message:
    __slots__ = ("exchange", "routing_key", "props_raw", "body", "persistent", "priority",
                 "expiration", "exchange_raw", "routing_key_raw", "publish_id")

    def __init__(self, exchange: str, routing_key: str, props_raw: bytes, body: bytes,
                 persistent: bool = False, priority: int | None = None, expiration: int | None = None,
                 exchange_raw: bytes | None = None, routing_key_raw: bytes | None = None):
        self.exchange = exchange
        self.routing_key = routing_key
        self.props_raw = props_raw
        self.body = body
        self.persistent = persistent
        self.priority = priority
        self.expiration = expiration     # the `expiration` property in milliseconds, checked at publish
        # the two names as AMQP shortstrs, as the publish carried them: the store and every
        # delivery write them as they are
        if exchange_raw is None:
            raw = exchange.encode()
            exchange_raw = bytes((len(raw),)) + raw
        if routing_key_raw is None:
            raw = routing_key.encode()
            routing_key_raw = bytes((len(raw),)) + raw
        self.exchange_raw = exchange_raw
        self.routing_key_raw = routing_key_raw
        self.publish_id = 0      # set when forwarded to another node's queue (see cluster.links.remote_queue)

    @property
    def size(self) -> int:
        return len(self.body)



class Entry:
    """A message's copy in one queue: its position and whether it was delivered before."""

    __slots__ = ("message", "seq", "redelivered", "msg_id", "expires")

    def __init__(self, message: Message, seq: int, redelivered: bool = False, msg_id: int = 0,
                 expires: float = 0.0):
        self.message = message
        self.seq = seq
        self.redelivered = redelivered
        self.msg_id = msg_id     # the store's id when the message is logged, else 0
        self.expires = expires   # monotonic deadline (x-message-ttl / expiration), 0 = never

    def __lt__(self, other: "Entry") -> bool:
        return self.seq < other.seq
