"""Consumer timeouts, as RabbitMQ 3.10-3.12 have them: a channel whose oldest delivery has waited
for its ack longer than the timeout is closed with 406 PRECONDITION_FAILED, and what it held is
requeued (redelivered) for the queue's other consumers. A consumer that hangs would otherwise
keep its messages for ever.

The timeout of a delivery is its queue's (`x-consumer-timeout`, the `consumer-timeout` policy
key: the lower of the two) or else the node's `consumer_timeout` setting (30 minutes by
default, 0 for none). It is checked where the delivery was made, on the consumer's node, for a
queue mastered elsewhere too: `check` looks at every channel's oldest delivery, as RabbitMQ's
channel does on its tick.
"""
from __future__ import annotations

from ..protocol.replies import AMQPError, ReplyCode

DEFAULT_MS = 1_800_000      # RabbitMQ's consumer_timeout default: 30 minutes
CHECK_EVERY = 1.0           # seconds between checks (RabbitMQ's channel tick is a minute)


def timed_out_error(channel_id: int, timeout_ms: int) -> AMQPError:
    return AMQPError(ReplyCode.PRECONDITION_FAILED,
                     f"delivery acknowledgement on channel {channel_id} timed out. Timeout value used: "
                     f"{timeout_ms} ms. This timeout value can be configured, see consumers doc guide to learn more")


def timeout_ms(queue, node_default_ms: int) -> int:
    """The delivery's timeout in ms, 0 for none."""
    own = getattr(queue, "consumer_timeout", None)
    return own if own is not None else node_default_ms


def check(sessions, now: float, node_default_ms: int) -> list[tuple[object, int, int]]:
    """Close every channel whose oldest delivery is overdue. Returns (session, channel id,
    timeout ms) for each closed, for the log."""
    closed = []
    for session in list(sessions):
        for channel_id, channel in list(session.channels.items()):
            oldest = channel.deliveries.oldest()
            if oldest is None:
                continue
            limit = timeout_ms(oldest.queue, node_default_ms)
            if limit and now - oldest.at > limit / 1000.0:
                session.fail_channel(channel_id, timed_out_error(channel_id, limit))
                closed.append((session, channel_id, limit))
    return closed
