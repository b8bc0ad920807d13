"""The node-to-node message codec: a broker `Message` to and from its protobuf form.

One place for it, beside the generated stubs, because every stream between
nodes (remote queues, mirrors, direct replies) carries messages the same way.
The property bytes travel as the publisher sent them; what the broker acts
on (persistence, priority, expiration) is read back from them on arrival.
"""
from __future__ import annotations

import struct
from typing import Iterable

from haremq.node.broker.expiry import expiration_ms
from haremq.node.broker.message import Message
from haremq.node.protocol.properties import property_view

from haremq.cluster.rpc import cluster_pb2 as pb


def message_from_pb(m: pb.Message) -> Message:
    return message_from_parts(m.exchange, m.routing_key, m.properties, m.body, m.publish_id)


def message_from_parts(exchange: str, routing_key: str, properties: bytes, body: bytes, publish_id: int) -> Message:
    props = property_view(properties)
    message = Message(exchange, routing_key, properties, body, props.delivery_mode == 2,
                      props.priority, expiration_ms(props.expiration))
    message.publish_id = publish_id
    return message


# a packed publish (QueueCall.Publishes): seq, publish_id, then the lengths of the exchange,
# routing key, properties and body, which follow it in that order
PUBLISH_HEAD = struct.Struct("<QQBBII")


def pack_publishes(items: Iterable[tuple[int, Message]]) -> bytes:
    """[(seq, Message)] as one QueueCall.Publishes payload."""
    parts: list[bytes] = []
    head = PUBLISH_HEAD.pack
    for seq, m in items:
        exchange, routing_key = m.exchange.encode(), m.routing_key.encode()
        parts += (head(seq, m.publish_id, len(exchange), len(routing_key), len(m.props_raw), len(m.body)),
                  exchange, routing_key, m.props_raw, m.body)
    return b"".join(parts)


def unpack_publishes(data: bytes) -> list[tuple[int, Message]]:
    """What pack_publishes packed, as [(seq, Message)]."""
    out = []
    view = memoryview(data)
    unpack = PUBLISH_HEAD.unpack_from
    size = PUBLISH_HEAD.size
    at, end = 0, len(data)
    while at < end:
        seq, publish_id, ex_len, rk_len, props_len, body_len = unpack(view, at)
        at += size
        exchange = str(view[at:at + ex_len], "utf-8")
        at += ex_len
        routing_key = str(view[at:at + rk_len], "utf-8")
        at += rk_len
        properties = bytes(view[at:at + props_len])
        at += props_len
        body = bytes(view[at:at + body_len])
        at += body_len
        out.append((seq, message_from_parts(exchange, routing_key, properties, body, publish_id)))
    return out


def message_to_pb(message: Message) -> pb.Message:
    return pb.Message(exchange=message.exchange, routing_key=message.routing_key, properties=message.props_raw,
                      body=message.body, publish_id=message.publish_id)
