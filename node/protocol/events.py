"""Events the connection state machine hands to the broker session.

Small value objects, so the protocol layer never calls into the broker and
the broker never reads bytes.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class ConnectionOpened:
    user: str
    vhost: str
    client_properties: dict


@dataclass(slots=True)
class ConnectionClosedByPeer:
    """The client closed the connection (connection.close, answered close-ok)."""
    reply_code: int
    reply_text: str


@dataclass(slots=True)
class ChannelOpened:
    channel: int


@dataclass(slots=True)
class ChannelClosedByPeer:
    """The client closed a channel (channel.close). The session answers close-ok
    (`AMQPConnection.channel_close_ok`) once it has handled what came before the close."""
    channel: int


@dataclass(slots=True)
class ChannelFailed:
    """A channel error found while reading a channel's frames (a message over the size
    limit). The session closes the channel (`AMQPConnection.close_channel`) once it has
    handled what came before; the channel's later frames are discarded."""
    channel: int
    error: object


@dataclass(slots=True)
class MethodReceived:
    """A channel-level method with no content (everything but publish)."""
    channel: int
    method: object


@dataclass(slots=True)
class MessageReceived:
    """A complete basic.publish: method, raw property bytes and body."""
    channel: int
    publish: object
    props_raw: bytes
    body: bytes


@dataclass(slots=True)
class PublishingStarted:
    """The connection's first content frame arrived (once per connection): it publishes from
    now on, so a resource alarm blocks it even while its messages are still partial."""
