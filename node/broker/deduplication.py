"""Queue-level message deduplication, with the queue arguments of RabbitMQ's
rabbitmq-message-deduplication plugin (`x-message-deduplication`, `x-cache-size`,
`x-cache-ttl`; policy keys `message-deduplication`, `cache-size`, `cache-ttl`).

A message's deduplication id is its `x-deduplication-header` header, or when
that is absent its `message_id` property. A queue remembers the ids it has
enqueued lately in an `IdCache`; a message whose id is there is confirmed to
its publisher (the first copy is safe, or will be before this confirm goes
out) and not enqueued again. Unlike the plugin, the id outlives the message:
a copy published again after the first was consumed is still dropped, which
is what a replaying producer (a Spark job restarted from its checkpoint)
needs.

The cache holds ids only, never bodies: id -> the wall-clock millisecond it
was first enqueued, oldest first. Wall-clock, because the same entry is read
back after a restart and on a promoted mirror. Over `x-cache-size` the oldest
id goes; an id older than `x-cache-ttl` no longer counts. How the cache is
kept durable and replicated is in docs/architecture.md.
"""
from __future__ import annotations

import time
from collections import OrderedDict

from ..protocol.properties import decode_properties
from ..protocol.replies import AMQPError, ReplyCode

HEADER = "x-deduplication-header"


def now_ms() -> int:
    return int(time.time() * 1000)


def message_key(props_raw: bytes) -> bytes | None:
    """The id of a message from its raw properties: the header, else message_id, else None.
    Read here, for deduplicating queues only, not on every publish's path."""
    try:
        props = decode_properties(props_raw)
    except Exception:  # noqa: BLE001 - the publish path parsed all but the table: a bad table
        raise AMQPError(ReplyCode.SYNTAX_ERROR, "malformed headers table") from None
    value = (props.headers or {}).get(HEADER)
    if value is not None:
        if isinstance(value, bytes):
            return value
        return (value if isinstance(value, str) else repr(value)).encode()
    return props.message_id.encode() if props.message_id else None


def settings(enabled, size, ttl) -> tuple[int, int | None] | None:
    """(cache size, ttl ms or None) when deduplication is on and its settings hold, else None
    (a policy with a bad value is ignored, as RabbitMQ ignores it)."""
    if enabled is not True and enabled not in ("true", b"true"):
        return None
    if not _positive(size):
        return None
    return size, ttl if _positive(ttl) else None


def _positive(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_args(arguments: dict) -> tuple[str, str] | None:
    """(argument, problem) if a queue.declare's deduplication arguments are refused (406)."""
    enabled = arguments.get("x-message-deduplication")
    size = arguments.get("x-cache-size")
    ttl = arguments.get("x-cache-ttl")
    if enabled is not None and not isinstance(enabled, bool):
        return "x-message-deduplication", "expected boolean"
    if enabled and size is None:
        return "x-cache-size", "required with x-message-deduplication"
    if size is not None and not _positive(size):
        return "x-cache-size", f"expected a positive integer, got {size!r}"
    if ttl is not None and not _positive(ttl):
        return "x-cache-ttl", f"expected a positive integer, got {ttl!r}"
    return None


class IdCache:
    """id -> first-seen ms, oldest first, at most `size` of them; ids older than `ttl` ms
    do not count. `dropped` counts the duplicates the queue let go."""

    __slots__ = ("size", "ttl", "seen", "dropped")

    def __init__(self, size: int, ttl: int | None = None):
        self.size = size
        self.ttl = ttl
        self.seen: OrderedDict[bytes, int] = OrderedDict()
        self.dropped = 0

    def __len__(self) -> int:
        return len(self.seen)

    def configure(self, size: int, ttl: int | None) -> None:
        self.size, self.ttl = size, ttl
        self._trim(now_ms())

    def contains(self, key: bytes, now: int) -> bool:
        at = self.seen.get(key)
        if at is None:
            return False
        if self.ttl is not None and at + self.ttl <= now:
            del self.seen[key]
            return False
        return True

    def add(self, key: bytes, at: int) -> None:
        """Remember key as seen at `at` (the newest entry now)."""
        seen = self.seen
        if key in seen:
            seen.move_to_end(key)
        seen[key] = at
        self._trim(at)

    def _trim(self, now: int) -> None:
        seen = self.seen
        while len(seen) > self.size:
            seen.popitem(last=False)
        if self.ttl is not None:
            horizon = now - self.ttl
            while seen:
                key, at = next(iter(seen.items()))
                if at > horizon:
                    break
                del seen[key]

    def entries(self) -> list[tuple[bytes, int]]:
        """Every id still counted, oldest first: what a snapshot or a new mirror gets."""
        self._trim(now_ms())
        return list(self.seen.items())

    def replace(self, entries) -> None:
        """Start over from (id, ms) pairs, oldest first (a recovered log, a promoted mirror)."""
        self.seen.clear()
        for key, at in entries:
            self.add(key, at)
        self._trim(now_ms())
