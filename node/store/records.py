"""Log record format: every record carries its length and a CRC32, so a torn or
corrupt record is recognised on recovery instead of being read as data.

    crc32 u32 | length u32 | type u8 | payload (length bytes)

The CRC covers type and payload. Segment files are preallocated, so the
bytes after the last record are zeros: a header of all zeros ends the log.
"""
from __future__ import annotations

import re
import struct
import zlib

HEADER = struct.Struct(">IIB")
HEADER_SIZE = HEADER.size

ENQUEUE = 1     # a persistent message entered a durable queue
DELIVER = 2     # it was delivered (so it comes back redelivered after a restart)
ACK = 3         # it left the queue (acked, rejected, dropped, purged)
DEDUP_IDS = 4   # a queue's deduplication ids as they stand (see below)

# ENQUEUE payload: queue id, message id, flags, [dedup id,] exchange, routing key, properties, body.
# With FLAG_DEDUP the message's deduplication id follows the head: seen-at ms u64, length u16,
# the id. Logs written before the flag existed read the same.
_ENQ = struct.Struct(">IQB")
_DEDUP = struct.Struct(">QH")
_IDS = struct.Struct(">IQ")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")

FLAG_DELIVERED = 1
FLAG_TRANSIENT = 2   # paged out under a long queue, not meant to survive a restart
FLAG_DEDUP = 4       # carries the message's deduplication id

# DEDUP_IDS payload: queue id u32, flags u8, then (seen-at ms u64, length u16, id) oldest first.
# With IDS_REPLACE the queue's ids are these from here on (a snapshot written before the
# segments holding older ids are removed, or a mirror's reset); without it they are added.
_IDSHEAD = struct.Struct(">IB")
IDS_REPLACE = 1

CRC_SEEDS = {t: zlib.crc32(bytes((t,))) for t in (ENQUEUE, DELIVER, ACK, DEDUP_IDS)}   # the CRC of the type byte
ENQUEUE_HEAD = _ENQ                                                        # queue id, msg id, flags


def frame(rtype: int, payload: bytes) -> bytes:
    crc = zlib.crc32(payload, CRC_SEEDS[rtype])
    return HEADER.pack(crc, len(payload), rtype) + payload


def enqueue(queue_id: int, msg_id: int, flags: int, exchange: bytes, routing_key: bytes,
            props_raw: bytes, body: bytes, dedup: tuple[bytes, int] | None = None) -> bytes:
    """exchange and routing_key are AMQP shortstrs (length-prefixed); dedup is (id, seen-at ms)."""
    if dedup is None:
        payload = b"".join((_ENQ.pack(queue_id, msg_id, flags), exchange, routing_key,
                            _U32.pack(len(props_raw)), props_raw, body))
    else:
        key, at = dedup
        payload = b"".join((_ENQ.pack(queue_id, msg_id, flags | FLAG_DEDUP), _DEDUP.pack(at, len(key)), key,
                            exchange, routing_key, _U32.pack(len(props_raw)), props_raw, body))
    return frame(ENQUEUE, payload)


def _dedup_field(payload, pos: int) -> tuple[bytes, int, int]:
    """The deduplication id at `pos` of an ENQUEUE payload: (id, seen-at ms, where it ends)."""
    at, n = _DEDUP.unpack_from(payload, pos)
    pos += _DEDUP.size
    return bytes(payload[pos:pos + n]), at, pos + n


def without_dedup(record: bytes) -> bytes:
    """A framed ENQUEUE record flagged FLAG_DEDUP, framed again without its id."""
    return copied(record, False)


def copied(record: bytes, delivered: bool) -> bytes:
    """A framed ENQUEUE record as compaction copies it: without its deduplication id, and
    flagged FLAG_DELIVERED if the message has been delivered since (its DELIVER record goes
    with the old segment)."""
    payload = memoryview(record)[HEADER_SIZE:]
    queue_id, msg_id, flags = _ENQ.unpack_from(payload, 0)
    skip = _dedup_field(payload, _ENQ.size)[2] if flags & FLAG_DEDUP else _ENQ.size
    flags = flags & ~FLAG_DEDUP | (FLAG_DELIVERED if delivered else 0)
    return frame(ENQUEUE, _ENQ.pack(queue_id, msg_id, flags) + bytes(payload[skip:]))


def dedup_ids(queue_id: int, entries, replace: bool) -> bytes:
    parts = [_IDSHEAD.pack(queue_id, IDS_REPLACE if replace else 0)]
    for key, at in entries:
        parts.append(_DEDUP.pack(at, len(key)))
        parts.append(key)
    return frame(DEDUP_IDS, b"".join(parts))


def parse_dedup_ids(payload) -> tuple[int, bool, list[tuple[bytes, int]]]:
    """queue id, replace, [(id, seen-at ms)]."""
    queue_id, flags = _IDSHEAD.unpack_from(payload, 0)
    pos, end, out = _IDSHEAD.size, len(payload), []
    while pos < end:
        at, n = _DEDUP.unpack_from(payload, pos)
        pos += _DEDUP.size
        out.append((bytes(payload[pos:pos + n]), at))
        pos += n
    return queue_id, bool(flags & IDS_REPLACE), out


def parse_enqueue_dedup(payload, start: int = 0) -> tuple[bytes, int]:
    """(id, seen-at ms) of an ENQUEUE payload (at `start` in a buffer) flagged FLAG_DEDUP."""
    key, at, _end = _dedup_field(payload, start + _ENQ.size)
    return key, at


def deliver(queue_id: int, msg_id: int) -> bytes:
    return frame(DELIVER, _IDS.pack(queue_id, msg_id))


def acks(queue_id: int, msg_ids: list[int]) -> bytes:
    return frame(ACK, _U32.pack(queue_id) + b"".join(_U64.pack(m) for m in msg_ids))


def check(buf, pos: int) -> tuple[int, int, int] | None:
    """(type, payload start, payload end) of a valid record at pos, None if torn or corrupt.

    A zero header returns (0, pos, pos): the end of the log.
    """
    if pos + HEADER_SIZE > len(buf):
        return (0, pos, pos) if not any(buf[pos:]) else None
    crc, length, rtype = HEADER.unpack_from(buf, pos)
    if crc == 0 and length == 0 and rtype == 0:
        return (0, pos, pos)
    start = pos + HEADER_SIZE
    end = start + length
    seed = CRC_SEEDS.get(rtype)
    if end > len(buf) or seed is None:
        return None
    if zlib.crc32(memoryview(buf)[start:end], seed) != crc:
        return None
    return rtype, start, end


def fits(rtype: int, length: int) -> bool:
    """A payload of this length can be a record of this type (checked before its CRC)."""
    if rtype == DELIVER:
        return length == _IDS.size
    if rtype == ACK:
        return length >= _U32.size + _U64.size and (length - _U32.size) % _U64.size == 0
    if rtype == ENQUEUE:
        return length >= _ENQ.size + 2 + _U32.size       # two shortstrs, the properties' length
    return rtype == DEDUP_IDS and length >= _IDSHEAD.size


_TYPE_BYTE = re.compile(b"[" + bytes((min(CRC_SEEDS),)) + b"-" + bytes((max(CRC_SEEDS),)) + b"]")


def find_record(buf, start: int, end: int) -> int | None:
    """The first offset in [start, end) where a whole, valid record begins, None if none does.
    Tries every offset whose type byte is one of ours: slow, for recovery after a bad record."""
    for match in _TYPE_BYTE.finditer(buf, start + HEADER_SIZE - 1, end + HEADER_SIZE - 1):
        pos = match.start() - (HEADER_SIZE - 1)
        _crc, length, rtype = HEADER.unpack_from(buf, pos)
        if fits(rtype, length) and check(buf, pos) is not None:
            return pos
    return None


def parse_ids(payload) -> tuple[int, int]:
    return _IDS.unpack_from(payload, 0)


def parse_acks(payload) -> tuple[int, list[int]]:
    queue_id = _U32.unpack_from(payload, 0)[0]
    n = (len(payload) - 4) // 8
    return queue_id, list(struct.unpack_from(f">{n}Q", payload, 4))


def parse_enqueue_head(payload) -> tuple[int, int, int]:
    return _ENQ.unpack_from(payload, 0)


def parse_enqueue(payload: bytes) -> tuple[int, int, int, str, str, bytes, bytes]:
    """queue id, message id, flags, exchange, routing key, properties, body."""
    queue_id, msg_id, flags = _ENQ.unpack_from(payload, 0)
    pos = _ENQ.size
    if flags & FLAG_DEDUP:
        pos = _dedup_field(payload, pos)[2]
    n = payload[pos]
    exchange = payload[pos + 1:pos + 1 + n].decode()
    pos += 1 + n
    n = payload[pos]
    routing_key = payload[pos + 1:pos + 1 + n].decode()
    pos += 1 + n
    plen = _U32.unpack_from(payload, pos)[0]
    pos += 4
    props_raw = bytes(payload[pos:pos + plen])
    body = bytes(payload[pos + plen:])
    return queue_id, msg_id, flags, exchange, routing_key, props_raw, body
