"""AMQP field tables as text: the wire encoding, base64'd, for JSON records.

Exchange, queue and binding arguments are kept in their AMQP encoding
wherever they are written down (the metadata snapshot, the cluster's log) so
every field type round-trips exactly; JSON then carries them as base64.
"""
from __future__ import annotations

import base64

from pamqp import decode, encode


def encode_table(table: dict) -> str:
    return base64.b64encode(encode.field_table(table or {})).decode()


def decode_table(text: str) -> dict:
    if text == _EMPTY:
        return {}           # most queues and exchanges: a restart reads 100,000 of them
    return decode.field_table(base64.b64decode(text))[1]


_EMPTY = encode_table({})
