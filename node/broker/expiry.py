"""Time for queue features: message expiry (`x-message-ttl`, `expiration`) and
queue expiry (`x-expires`), PUB-4.

Deadlines are `time.monotonic()` seconds. Timers run on the node's event
loop, one per queue at most for messages and one for the queue itself; a
queue built outside a running loop (an in-process test) simply has none and
expires messages when it is next touched.
"""
from __future__ import annotations

import asyncio
import re
import time
from typing import Callable

from ..protocol.replies import AMQPError, ReplyCode

MAX_TTL_MS = 0xFFFFFFFF     # RabbitMQ's limit for x-message-ttl / x-expires (32 bits of milliseconds)

monotonic = time.monotonic
_INTEGER = re.compile(r"[+-]?[0-9]+")   # what Erlang's string:to_integer/1 reads


def parse_expiration(value: str) -> int:
    """The `expiration` property in milliseconds, or RabbitMQ's 406 for a bad one."""
    found = _INTEGER.match(value)
    if found is None:
        raise AMQPError(ReplyCode.PRECONDITION_FAILED, f"invalid expiration '{value}': no_integer", 60, 40)
    number, rest = int(found.group(0)), value[found.end():]
    if rest:
        raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                        f"invalid expiration '{value}': {{leftover_string,\"{rest}\"}}", 60, 40)
    if number < 0:
        raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                        f"invalid expiration '{value}': {{value_negative,{number}}}", 60, 40)
    return number


def expiration_ms(value) -> int | None:
    """A stored message's `expiration` (already checked at publish), None if absent or unreadable."""
    if value is None:
        return None
    try:
        return parse_expiration(value)
    except AMQPError:
        return None


def call_later(delay: float, fn: Callable[[], None]):
    """A loop timer handle, or None outside a running loop."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return None
    return loop.call_later(max(0.0, delay), fn)


def deadline(ttl: int | None, expiration: int | None, start: float) -> float:
    """When a message expires: the shorter of the queue's TTL and its own `expiration`, counted
    from `start` (0: neither applies)."""
    if expiration is not None and (ttl is None or expiration < ttl):
        ttl = expiration
    return 0.0 if ttl is None else start + ttl / 1000.0
