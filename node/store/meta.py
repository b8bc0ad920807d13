"""The metadata snapshot: durable exchanges, queues (with their store ids) and bindings.

Small and rarely changed, so it is rewritten whole (write, fsync, rename) by
the store's writer, in order with the message records. AMQP argument tables
are kept in their wire encoding (node.protocol.tables) so every field type
round-trips.
"""
from __future__ import annotations

import json

VERSION = 1


def dumps(snapshot: dict) -> bytes:
    return json.dumps({"version": VERSION, **snapshot}, separators=(",", ":")).encode()


def loads(blob: bytes | None) -> dict:
    if not blob:
        return {"vhosts": {}, "next_queue_id": 1}
    data = json.loads(blob)
    if data.get("version") != VERSION:
        raise ValueError(f"unknown metadata version {data.get('version')}")
    return data
