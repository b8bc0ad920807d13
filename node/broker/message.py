"""A published message and its place in one queue.

One `Message` is shared by every queue a publish routes to; each queue holds
its own `Entry` with the position and redelivery state that belong to that
queue alone.
"""
from __future__ import annotations

from ..protocol.frames import shortstr


class Message:
    __slots__ = ("exchange", "routing_key", "props_raw", "body", "persistent", "priority",
                 "expiration", "_exchange_raw", "_routing_key_raw", "publish_id")

    def __init__(self, exchange: str, routing_key: str, props_raw: bytes, body: bytes,
                 persistent: bool = False, priority: int | None = None, expiration: int | None = None):
        self.exchange = exchange
        self.routing_key = routing_key
        self.props_raw = props_raw
        self.body = body
        self.persistent = persistent
        self.priority = priority
        self.expiration = expiration     # the `expiration` property in milliseconds, checked at publish
        self._exchange_raw = None
        self._routing_key_raw = None
        self.publish_id = 0      # set when forwarded to another node's queue (see cluster.remote_queue)

    @property
    def size(self) -> int:
        return len(self.body)

    @property
    def exchange_raw(self) -> bytes:
        """The exchange name as an AMQP shortstr, encoded once for every delivery."""
        if self._exchange_raw is None:
            self._exchange_raw = shortstr(self.exchange)
        return self._exchange_raw

    @property
    def routing_key_raw(self) -> bytes:
        if self._routing_key_raw is None:
            self._routing_key_raw = shortstr(self.routing_key)
        return self._routing_key_raw


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
