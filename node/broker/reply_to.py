"""Direct reply-to tokens: `amq.rabbitmq.reply-to.<node>.<unique>`, so that a reply published
on any node of a cluster can be sent to the node its requester is connected to."""
from __future__ import annotations

import base64

REPLY_TO = "amq.rabbitmq.reply-to"
REPLY_TO_PREFIX = REPLY_TO + "."


def reply_token(node: str, unique: str) -> str:
    """A reply-to token naming the requester's node (clients treat it as opaque)."""
    return f"{REPLY_TO_PREFIX}{base64.urlsafe_b64encode(node.encode()).decode().rstrip('=')}.{unique}"


def token_node(token: str) -> str | None:
    """The node a reply-to token names, or None for a token that names none."""
    encoded, dot, _unique = token[len(REPLY_TO_PREFIX):].partition(".")
    if not dot or not encoded:
        return None
    try:
        return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).decode()
    except (ValueError, UnicodeDecodeError):
        return None
