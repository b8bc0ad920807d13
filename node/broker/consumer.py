"""One basic.consume on a local queue, and the x-priority it asks for."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..protocol.frames import shortstr
from ..protocol.replies import AMQPError, ReplyCode
from .queue_arguments import field_type, is_quorum

if TYPE_CHECKING:
    from .queue import Queue


class Consumer:
    """One basic.consume: where deliveries go and how many it may hold unacked."""

    __slots__ = ("tag", "tag_raw", "channel", "queue", "no_ack", "exclusive", "prefetch", "unacked",
                 "arguments", "priority")

    def __init__(self, tag: str, channel, queue: "Queue", no_ack: bool, exclusive: bool,
                 prefetch: int, arguments: dict):
        self.tag = tag
        self.tag_raw = shortstr(tag)
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch = prefetch
        self.unacked = 0
        self.arguments = arguments
        self.priority = arguments.get("x-priority", 0) if arguments else 0   # checked by consumer_priority()

    def can_take(self) -> bool:
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        return self.channel.can_deliver()


def consumer_priority(arguments: dict | None, queue: "Queue") -> int:
    """basic.consume's x-priority argument, or RabbitMQ's 406 for a bad one (and for another queue
    type's consumer argument: x-cancel-on-ha-failover on a quorum queue, x-stream-offset)."""
    for key in ("x-cancel-on-ha-failover", "x-stream-offset"):
        if key in (arguments or {}) and (key == "x-stream-offset" or is_quorum(queue.arguments)):
            kind = "quorum" if is_quorum(queue.arguments) else "classic"
            raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                            f"invalid arg '{key}' for {queue.describe()} of queue type rabbit_{kind}_queue", 60, 20)
    value = (arguments or {}).get("x-priority")
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                        f"invalid arg 'x-priority' for {queue.describe()}: "
                        f"\"expected integer, got {field_type(value)}\"", 60, 20)
    return value
