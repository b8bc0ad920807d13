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

An id keeps its AMQP type, as in the plugin (which keys its cache by the
header's value, so 1 and <<"1">> differ): the integer 1 and the string "1"
are two ids. Strings of every kind (longstr, the shortstr message_id, a byte
array) are one type, integers of every width another, and floats, booleans,
decimals, timestamps, tables and arrays one each (`message_key`). An empty
id is no id: a header that is void, an empty string or an empty table or
array counts as absent (the message_id then decides), and a message with
neither is enqueued without deduplication.

The cache holds ids only, never bodies: id -> the millisecond it was first
enqueued, oldest first. Over `x-cache-size` the oldest id goes; an id older
than `x-cache-ttl` no longer counts. How the cache is kept durable and
replicated is in docs/architecture.md.

Time. The stamps travel (in the store, to mirrors, to a promoted mirror), so
they are milliseconds of wall-clock time; but a node measures them with
`now_ms`, the wall clock read once and then advanced by the monotonic clock,
so stepping a node's clock (NTP, an operator) moves no TTL on that node. A
stamp that comes from elsewhere (a recovered log written before a restart, a
master whose clock is ahead of this one) and lies in this node's future is
taken as seen now: an id never counts for longer than the TTL after it
reached this node. A stamp from a clock behind this one makes the id expire
early by that difference, and never more. The plugin stamps each entry with
the system time of the node that inserts it and expires it by the system time
of the node that reads it, so a clock stepped back keeps its ids for the step
on top of the TTL; HareMQ bounds that to the TTL.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from datetime import datetime
from decimal import Decimal

from ..protocol.properties import decode_properties
from ..protocol.replies import AMQPError, ReplyCode

HEADER = "x-deduplication-header"


_anchor: float | None = None      # wall-clock seconds minus monotonic seconds, fixed at first use


def now_ms() -> int:
    """This node's millisecond for the id caches: wall-clock time as of the first call, from
    then on advanced by the monotonic clock (a step of the wall clock moves no TTL here)."""
    global _anchor
    mono = time.monotonic()
    if _anchor is None:
        _anchor = time.time() - mono
    return int((_anchor + mono) * 1000)


def message_key(props_raw: bytes) -> bytes | None:
    """The id of a message from its raw properties: the header, else message_id, else None.
    Read here, for deduplicating queues only, not on every publish's path."""
    try:
        props = decode_properties(props_raw)
    except Exception:  # noqa: BLE001 - the publish path parsed all but the table: a bad table
        raise AMQPError(ReplyCode.SYNTAX_ERROR, "malformed headers table") from None
    key = typed_key((props.headers or {}).get(HEADER))
    if key is not None:
        return key
    return typed_key(props.message_id)


# A string id is its UTF-8 bytes, as logs and mirrors have always held it. Any other type is
# 0xFF (never a byte of UTF-8), a letter for the type and the value's text; a string that is
# not UTF-8 and starts with 0xFF gets the prefix too (0xFF "S"), so no two ids of different
# types or values share a key.
_TYPED = 0xFF


def typed_key(value) -> bytes | None:
    """The cache key of one id value as pamqp decodes it, keeping its AMQP type; None for no
    id (absent, void, or empty)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = value.encode()
    if isinstance(value, (bytes, bytearray)):     # longstr, shortstr, byte array: one type
        if not value:
            return None
        value = bytes(value)
        return value if value[0] != _TYPED else b"\xffS" + value
    if isinstance(value, bool):                   # before int: a bool is an int in Python
        return b"\xfft1" if value else b"\xfft0"
    if isinstance(value, int):                    # every integer width, signed or not
        return b"\xffi" + str(value).encode()
    if isinstance(value, float):                  # float and double
        return b"\xfff" + repr(value).encode()
    if isinstance(value, Decimal):
        return b"\xffD" + str(value).encode()
    if isinstance(value, datetime):               # timestamp: seconds
        return b"\xffT" + str(int(value.timestamp())).encode()
    if isinstance(value, (dict, list)):
        if not value:
            return None
        return (b"\xffF" if isinstance(value, dict) else b"\xffA") + repr(value).encode()
    return b"\xff?" + repr(value).encode()


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
    do not count. `dropped` counts the duplicates the queue let go. Every stamp held is at
    most `now_ms()` as of when it came in: one from another clock's future counts as now."""

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
        """Remember key as seen at `at` (the newest entry now); a stamp in this node's future
        (a master's clock ahead of this one) counts as now."""
        now = now_ms()
        if at > now:
            at = now
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
        now = now_ms()
        self._trim(now)
        if self.ttl is None:
            return list(self.seen.items())
        horizon = now - self.ttl       # stamps from several clocks need not be in order
        return [(key, at) for key, at in self.seen.items() if at > horizon]

    def replace(self, entries) -> None:
        """Start over from (id, ms) pairs, oldest first (a recovered log, a promoted mirror);
        a stamp in this node's future counts as now."""
        self.seen.clear()
        for key, at in entries:
            self.add(key, at)
        self._trim(now_ms())
