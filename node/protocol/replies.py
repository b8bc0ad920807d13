"""AMQP 0-9-1 reply codes and the errors that carry them.

A channel error closes one channel; a connection error closes the whole
connection. Which one a code means is fixed by the spec, so the exception
class is chosen from the code and callers only name the code and the text
(RabbitMQ's wording, so users can search for it).
"""
from __future__ import annotations

import enum


class ReplyCode(enum.IntEnum):
    REPLY_SUCCESS = 200
    CONTENT_TOO_LARGE = 311
    NO_ROUTE = 312
    NO_CONSUMERS = 313
    CONNECTION_FORCED = 320
    INVALID_PATH = 402
    ACCESS_REFUSED = 403
    NOT_FOUND = 404
    RESOURCE_LOCKED = 405
    PRECONDITION_FAILED = 406
    FRAME_ERROR = 501
    SYNTAX_ERROR = 502
    COMMAND_INVALID = 503
    CHANNEL_ERROR = 504
    UNEXPECTED_FRAME = 505
    RESOURCE_ERROR = 506
    NOT_ALLOWED = 530
    NOT_IMPLEMENTED = 540
    INTERNAL_ERROR = 541


CHANNEL_CODES = frozenset({
    ReplyCode.CONTENT_TOO_LARGE, ReplyCode.NO_ROUTE, ReplyCode.NO_CONSUMERS,
    ReplyCode.ACCESS_REFUSED, ReplyCode.NOT_FOUND, ReplyCode.RESOURCE_LOCKED,
    ReplyCode.PRECONDITION_FAILED,
})


class AMQPError(Exception):
    """A protocol-level failure with the reply code and text to send."""

    def __init__(self, code: ReplyCode, text: str, class_id: int = 0, method_id: int = 0):
        self.code = ReplyCode(code)
        self.text = f"{self.code.name} - {text}"[:255]
        self.class_id = class_id
        self.method_id = method_id
        super().__init__(self.text)

    @property
    def is_channel_error(self) -> bool:
        return self.code in CHANNEL_CODES


def error(code: ReplyCode, text: str, method: object = None) -> AMQPError:
    """Build an AMQPError naming the method that caused it (for close frames)."""
    index = getattr(method, "index", 0) or 0
    return AMQPError(code, text, index >> 16, index & 0xFFFF)


def vhost_text(kind: str, name: str, vhost: str) -> str:
    return f"{kind} '{name}' in vhost '{vhost}'"
