"""x-delivery-count: how often a quorum queue's message came back, carried in its headers.

A quorum queue counts the returns of each message in the message itself, so the
count survives a failover (the promoted mirror has the header) and a restart.
"""
from __future__ import annotations

from ..protocol.properties import PropertyView, decode_properties, encode_properties
from ..protocol.replies import AMQPError
from .message import Entry, Message


def with_delivery_count(message: Message, count: int) -> Message:
    """A copy of the message with the x-delivery-count header (this queue's copy only: the
    message is shared by every queue the publish reached)."""
    props = decode_properties(message.props_raw)
    props.headers = {**(props.headers or {}), "x-delivery-count": count}
    copy = Message(message.exchange, message.routing_key, encode_properties(props), message.body,
                   message.persistent, message.priority, message.expiration, message.exchange_raw,
                   message.routing_key_raw)
    copy.publish_id = message.publish_id
    return copy


def delivery_count(message: Message) -> int:
    """The x-delivery-count a quorum queue gave the message (0 if none)."""
    try:
        count = PropertyView(message.props_raw).headers().get("x-delivery-count")
    except AMQPError:
        return 0
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0


def returned(message: Message) -> Message:
    """A quorum queue's message that was out when its master died or its node restarted: back in
    the queue as a redelivery, it counts as returned once more (x-delivery-count), as RabbitMQ's
    count grows when a consumer's channel goes away with it."""
    return with_delivery_count(message, delivery_count(message) + 1)


def count_returns(entries: list[Entry], limit: int | None, returns: dict[Entry, int],
                  in_header: bool) -> tuple[list[Entry], list[Entry]]:
    """x-delivery-limit: (the entries that may come back, those returned more than `limit`
    times, as a quorum queue counts). `returns` holds each entry's count; `in_header` (a quorum
    queue): the count goes on from the message's x-delivery-count, which survives a failover,
    and the consumer is told it."""
    keep, over = [], []
    for entry in entries:
        count = returns.get(entry)
        if count is None:
            count = delivery_count(entry.message) if in_header else 0
        count += 1
        if limit is not None and count > limit:
            over.append(entry)
        else:
            returns[entry] = count
            if in_header:
                entry.message = with_delivery_count(entry.message, count)
            keep.append(entry)
    return keep, over
