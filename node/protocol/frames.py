"""Frame codec: bytes in, frames out; methods and content out, bytes back.

pamqp encodes and decodes every method. The few frames on the hot path
(basic.publish, content header and body, basic.deliver, basic.ack) are
packed and unpacked here with struct, and message properties travel as the
raw bytes the publisher sent: the broker never decodes them unless a
feature needs one (see `node.protocol.properties`).
"""
from __future__ import annotations

import struct
from pamqp import commands
from pamqp import frame as pframe
from pamqp.exceptions import UnmarshalingException

from .replies import AMQPError, ReplyCode

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_END_BYTE = b"\xce"
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
PROTOCOL_HEADERS = (PROTOCOL_HEADER, b"AMQP\x01\x01\x00\x09")   # 0-9-1 in both spellings clients use
HEARTBEAT_FRAME = b"\x08\x00\x00\x00\x00\x00\x00\xce"
FRAME_OVERHEAD = 8

PUBLISH = (60 << 16) | 40
PUBLISH_INDEX = PUBLISH.to_bytes(4, "big")     # how a basic.publish method frame's payload starts
ACK = (60 << 16) | 80
DELIVER = (60 << 16) | 60

_HEAD = struct.Struct(">BHI")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_ACK = struct.Struct(">QB")
CONTENT_HEAD = struct.Struct(">HHQ")
_DELIVER_PREFIX = struct.Struct(">BHII")
_DELIVER_TAIL = struct.Struct(">QB")
_HEADER_FRAME_PREFIX = struct.Struct(">BHIHHQ")
_END_HEADER_PREFIX = struct.Struct(">BBHIHHQ")    # a frame's end byte, then a content header's head
_END_BODY_PREFIX = struct.Struct(">BBHI")         # a frame's end byte, then a body frame's head


class FrameReader:
    """Splits a byte stream into (type, channel, payload) frames.

    A frame whose payload is larger than `frame_max` or one that does not end
    in 0xCE is a connection error (501 FRAME_ERROR); a partial frame waits for
    more bytes. The limit is on the payload, not the whole frame: RabbitMQ
    allows 8 bytes of slack (its FRAME_SIZE_FUDGE) and clients such as rabbitpy
    send body frames of exactly frame_max payload bytes.
    """

    __slots__ = ("_buf", "frame_max")

    def __init__(self, frame_max: int):
        self._buf = bytearray()
        self.frame_max = frame_max

    def feed(self, data: bytes) -> tuple[list[tuple[int, int, bytes]], AMQPError | None]:
        """Every complete frame in the buffer, and the framing error that stopped it, if any.

        Frames are sliced from immutable bytes (one copy each); only a partial frame at the
        end of a read is kept for the next."""
        if self._buf:
            self._buf += data
            buf = bytes(self._buf)
            self._buf.clear()
        else:
            buf = bytes(data)
        pos = 0
        end = len(buf)
        unpack = _HEAD.unpack_from
        frames = []
        err = None
        while end - pos >= 7:
            ftype, channel, size = unpack(buf, pos)
            total = size + FRAME_OVERHEAD
            if size > self.frame_max:
                err = AMQPError(ReplyCode.FRAME_ERROR, f"type {ftype}, all octets = <<>>: "
                                f"{{frame_too_large,{size},{self.frame_max - FRAME_OVERHEAD}}}")
                break
            if end - pos < total:
                break
            if buf[pos + total - 1] != FRAME_END:
                err = AMQPError(ReplyCode.FRAME_ERROR, f"type {ftype}, all octets = "
                                f"{erlang_binary(buf[pos + 7:pos + 7 + size])}: "
                                f"{{invalid_frame_end_marker,{buf[pos + total - 1]}}}")
                break
            frames.append((ftype, channel, buf[pos + 7:pos + 7 + size]))
            pos += total
        if err is None and pos < end:
            self._buf += buf[pos:]
        return frames, err


def erlang_binary(data) -> str:
    """Bytes as Erlang prints a binary, the way RabbitMQ's frame errors show them."""
    data = bytes(data[:64])
    if data and all(32 <= b < 127 for b in data):
        return '<<"' + data.decode().replace("\\", "\\\\").replace('"', '\\"') + '">>'
    return "<<" + ",".join(str(b) for b in data) + ">>"


class UnknownMethod(Exception):
    """An unknown class or method id: RabbitMQ drops the connection without a close frame."""


def decode_method(payload: bytes):
    """Decode a method frame payload into a pamqp command (or a fast tuple)."""
    if len(payload) < 4:
        raise AMQPError(ReplyCode.FRAME_ERROR, "method frame too short")
    index = _U32.unpack_from(payload, 0)[0]
    if index == PUBLISH:
        return decode_publish(payload)
    if index == ACK:
        tag, bits = _ACK.unpack_from(payload, 4)
        return commands.Basic.Ack(tag, bool(bits & 1))
    try:
        method = commands.INDEX_MAPPING[index]()
    except KeyError:
        raise UnknownMethod(f"{{unknown_method_id,{{{index >> 16},{index & 0xFFFF}}}}}") from None
    try:
        method.unmarshal(payload[4:])
    except (UnmarshalingException, struct.error, ValueError, IndexError, UnicodeDecodeError) as exc:
        raise AMQPError(ReplyCode.SYNTAX_ERROR, f"cannot decode {method.name}: {exc}",
                        index >> 16, index & 0xFFFF) from None
    return method


class Publish:
    """basic.publish, decoded by hand: it is the hottest inbound method."""

    __slots__ = ("exchange", "routing_key", "mandatory", "immediate", "exchange_raw", "routing_key_raw")
    name = "Basic.Publish"
    index = PUBLISH

    def __init__(self, exchange: str, routing_key: str, mandatory: bool, immediate: bool,
                 exchange_raw: bytes, routing_key_raw: bytes):
        self.exchange = exchange
        self.routing_key = routing_key
        self.mandatory = mandatory
        self.immediate = immediate
        self.exchange_raw = exchange_raw            # the names as shortstrs, kept for the store
        self.routing_key_raw = routing_key_raw


def decode_publish(payload: bytes) -> Publish:
    try:
        pos = 6  # index(4) + reserved short(2)
        n = payload[pos]
        exchange_raw = payload[pos:pos + 1 + n]
        exchange = exchange_raw[1:].decode()
        pos += 1 + n
        n = payload[pos]
        routing_key_raw = payload[pos:pos + 1 + n]
        routing_key = routing_key_raw[1:].decode()
        pos += 1 + n
        bits = payload[pos]
    except (IndexError, UnicodeDecodeError):
        raise AMQPError(ReplyCode.SYNTAX_ERROR, "cannot decode Basic.Publish", 60, 40) from None
    return Publish(exchange, routing_key, bool(bits & 1), bool(bits & 2), exchange_raw, routing_key_raw)


def decode_content_header(payload: bytes) -> tuple[int, int, bytes]:
    """Return (class_id, body_size, raw property bytes)."""
    if len(payload) < 14:
        raise AMQPError(ReplyCode.FRAME_ERROR, "content header frame too short")
    class_id, _weight, body_size = CONTENT_HEAD.unpack_from(payload, 0)
    return class_id, body_size, payload[12:]


def encode_method(channel: int, method) -> bytes:
    return pframe.marshal(method, channel)


def encode_content(channel: int, props_raw: bytes, body: bytes, frame_max: int) -> bytes:
    """Content header (class basic, raw properties) plus body frames."""
    parts = [_HEADER_FRAME_PREFIX.pack(FRAME_HEADER, channel, 12 + len(props_raw), 60, 0, len(body)),
             props_raw, FRAME_END_BYTE]
    if body:
        chunk = frame_max - FRAME_OVERHEAD
        head = _HEAD.pack
        for start in range(0, len(body), chunk):
            piece = body[start:start + chunk]
            parts.append(head(FRAME_BODY, channel, len(piece)))
            parts.append(piece)
            parts.append(FRAME_END_BYTE)
    return b"".join(parts)


def _shortstr(value: str) -> bytes:
    raw = value.encode()
    return bytes((len(raw),)) + raw


def encode_deliver(channel: int, consumer_tag_raw: bytes, delivery_tag: int, redelivered: bool,
                   exchange_raw: bytes, routing_key_raw: bytes, props_raw: bytes, body: bytes,
                   frame_max: int) -> bytes:
    """basic.deliver + content, with the string fields pre-encoded as shortstrs: one join of
    the pieces (each frame's end byte packed with the next frame's head)."""
    size = len(body)
    head = _DELIVER_PREFIX.pack(FRAME_METHOD, channel,
                                13 + len(consumer_tag_raw) + len(exchange_raw) + len(routing_key_raw), DELIVER)
    tail = _DELIVER_TAIL.pack(delivery_tag, 1 if redelivered else 0)
    if size <= frame_max - FRAME_OVERHEAD:
        content = _END_HEADER_PREFIX.pack(FRAME_END, FRAME_HEADER, channel, 12 + len(props_raw), 60, 0, size)
        if size:
            return b"".join((head, consumer_tag_raw, tail, exchange_raw, routing_key_raw, content, props_raw,
                             _END_BODY_PREFIX.pack(FRAME_END, FRAME_BODY, channel, size), body, FRAME_END_BYTE))
        return b"".join((head, consumer_tag_raw, tail, exchange_raw, routing_key_raw, content, props_raw,
                         FRAME_END_BYTE))
    args = consumer_tag_raw + tail + exchange_raw + routing_key_raw
    return head + args + FRAME_END_BYTE + encode_content(channel, props_raw, body, frame_max)


def encode_confirm(channel: int, tag: int, multiple: bool, nack: bool = False) -> bytes:
    if nack:
        return encode_method(channel, commands.Basic.Nack(tag, multiple, False))
    return b"".join((_HEAD.pack(FRAME_METHOD, channel, 13), _U32.pack(ACK),
                     _ACK.pack(tag, 1 if multiple else 0), FRAME_END_BYTE))


shortstr = _shortstr
