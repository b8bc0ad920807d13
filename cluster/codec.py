"""The node-to-node message codec: a broker `Message` to and from its protobuf form.

One place for it, beside the generated stubs, because every stream between
nodes (remote queues, mirrors, direct replies) carries messages the same way.
The property bytes travel as the publisher sent them; what the broker acts
on (persistence, priority, expiration) is read back from them on arrival.
"""
from __future__ import annotations

from haremq.node.broker.expiry import expiration_ms
from haremq.node.broker.message import Message
from haremq.node.protocol.properties import property_view

from .rpc import cluster_pb2 as pb


def message_from_pb(m) -> Message:
    properties = m.properties
    props = property_view(properties)
    message = Message(m.exchange, m.routing_key, properties, m.body, props.delivery_mode == 2,
                      props.priority, expiration_ms(props.expiration))
    message.publish_id = m.publish_id
    return message


def message_to_pb(message: Message) -> pb.Message:
    return pb.Message(exchange=message.exchange, routing_key=message.routing_key, properties=message.props_raw,
                      body=message.body, publish_id=message.publish_id)
