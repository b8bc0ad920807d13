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
    """The client closed a channel (channel.close, answered close-ok)."""
    channel: int


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
