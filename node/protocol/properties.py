"""Read the few message properties the broker acts on, straight from raw bytes.

Messages keep the property bytes their publisher sent and are delivered with
them unchanged. Routing and queue features need only delivery_mode,
priority, expiration, reply_to, user_id and (for the headers exchange) the
headers table; a single pass over the flag word finds them without building
a pamqp Properties object per message.
"""
from __future__ import annotations

import struct

from pamqp import commands, decode

from .replies import AMQPError, ReplyCode

# Property flag bits, most significant first, as AMQP 0-9-1 orders them.
_SHORTSTR, _TABLE, _OCTET, _LONGLONG = 0, 1, 2, 3
_LAYOUT = (
    ("content_type", _SHORTSTR), ("content_encoding", _SHORTSTR), ("headers", _TABLE),
    ("delivery_mode", _OCTET), ("priority", _OCTET), ("correlation_id", _SHORTSTR),
    ("reply_to", _SHORTSTR), ("expiration", _SHORTSTR), ("message_id", _SHORTSTR),
    ("timestamp", _LONGLONG), ("type", _SHORTSTR), ("user_id", _SHORTSTR),
    ("app_id", _SHORTSTR), ("cluster_id", _SHORTSTR),
)
_WANTED = {"delivery_mode", "priority", "expiration", "reply_to", "user_id", "headers"}
_U32 = struct.Struct(">I")


class PropertyView:
    """The properties a broker needs, found in one pass over the raw bytes."""

    __slots__ = ("delivery_mode", "priority", "expiration", "reply_to", "user_id", "_headers_span",
                 "_raw")

    def __init__(self, raw: bytes):
        self._raw = raw
        self.delivery_mode = None
        self.priority = None
        self.expiration = None
        self.reply_to = None
        self.user_id = None
        self._headers_span = None
        if len(raw) < 2:
            raise AMQPError(ReplyCode.FRAME_ERROR, "content header without property flags")
        flags = (raw[0] << 8) | raw[1]
        if not flags:
            return
        pos = 2
        try:
            for bit, (name, kind) in zip(range(15, 1, -1), _LAYOUT):
                if not flags & (1 << bit):
                    continue
                if kind == _SHORTSTR:
                    n = raw[pos]
                    if name in _WANTED:
                        setattr(self, name, raw[pos + 1:pos + 1 + n].decode())
                    pos += 1 + n
                elif kind == _OCTET:
                    setattr(self, name, raw[pos])
                    pos += 1
                elif kind == _TABLE:
                    n = _U32.unpack_from(raw, pos)[0]
                    self._headers_span = (pos, pos + 4 + n)
                    pos += 4 + n
                else:
                    pos += 8
            if pos > len(raw):
                raise IndexError
        except (IndexError, struct.error, UnicodeDecodeError):
            raise AMQPError(ReplyCode.FRAME_ERROR, "malformed content header properties") from None

    @property
    def persistent(self) -> bool:
        return self.delivery_mode == 2

    def headers(self) -> dict:
        if self._headers_span is None:
            return {}
        start, end = self._headers_span
        try:
            return decode.field_table(self._raw[start:end])[1]
        except Exception:  # noqa: BLE001 - a bad table is the publisher's syntax error
            raise AMQPError(ReplyCode.SYNTAX_ERROR, "malformed headers table") from None


def decode_properties(raw: bytes) -> commands.Basic.Properties:
    props = commands.Basic.Properties()
    flags = (raw[0] << 8) | raw[1]
    props.unmarshal(flags, raw[2:])
    return props


def encode_properties(props: commands.Basic.Properties) -> bytes:
    return props.marshal()


def with_reply_to(raw: bytes, reply_to: str) -> bytes:
    """The same properties with reply_to replaced (direct reply-to)."""
    props = decode_properties(raw)
    props.reply_to = reply_to
    return encode_properties(props)
