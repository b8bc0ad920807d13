"""Exchanges, bindings and routing (PUB-1).

Pure data structures: no I/O and no asyncio, so the channel layer can route a
publish synchronously and the unit tests need no broker. Semantics follow
RabbitMQ 3.x (rabbit_exchange:route/2 and the rabbit_exchange_type_* modules).
"""

from __future__ import annotations

import enum
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from decimal import Decimal
from itertools import count
from typing import Callable, Iterable, Optional

__all__ = [
    "ExchangeType",
    "Exchange",
    "BindingArgumentError",
    "route",
    "TOPIC_CACHE_SIZE",
]

#: Routing keys whose topic match result is remembered per exchange. Bounded
#: so that a publisher using unique keys cannot grow memory without limit.
TOPIC_CACHE_SIZE = 4096

_X_MATCH_MODES = ("all", "any", "all-with-x", "any-with-x")


class ExchangeType(str, enum.Enum):
    DIRECT = "direct"
    FANOUT = "fanout"
    TOPIC = "topic"
    HEADERS = "headers"


class BindingArgumentError(ValueError):
    """Invalid binding arguments; RabbitMQ answers with 406 PRECONDITION_FAILED."""


# --------------------------------------------------------------------------
# helpers


def _freeze(value):
    """Hashable, type-aware form of an AMQP field value, so that binding
    identity distinguishes 1 from True from "1" like RabbitMQ's typed tables."""
    if isinstance(value, dict):
        return ("table", tuple(sorted(((str(k), _freeze(v)) for k, v in value.items()),
                                      key=lambda kv: kv[0])))
    if isinstance(value, (list, tuple)):
        return ("array", tuple(_freeze(v) for v in value))
    if isinstance(value, bytearray):
        value = bytes(value)
    try:
        hash(value)
    except TypeError:
        return (type(value).__name__, repr(value))
    return (type(value).__name__, value)


def _as_bytes(value) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _values_equal(pattern, data) -> bool:
    """Header value equality as Erlang's == on typed field values: numbers
    compare numerically, strings compare as bytes, booleans only with booleans."""
    if pattern is data:
        return True
    tp, td = type(pattern), type(data)
    if tp is bool or td is bool:
        return tp is td and pattern == data
    p_str = isinstance(pattern, (str, bytes, bytearray))
    d_str = isinstance(data, (str, bytes, bytearray))
    if p_str or d_str:
        return p_str and d_str and _as_bytes(pattern) == _as_bytes(data)
    if isinstance(pattern, Decimal) or isinstance(data, Decimal):
        return isinstance(pattern, Decimal) and isinstance(data, Decimal) and pattern == data
    try:
        return bool(pattern == data)
    except Exception:  # exotic values that refuse comparison never match
        return False


def _split_topic(key: str) -> tuple[str, ...]:
    """RabbitMQ splits "" into zero words (not one empty word), "a." into
    ["a", ""] and "a..b" into ["a", "", "b"]."""
    if not key:
        return ()
    return tuple(key.split("."))


def _parse_x_match(arguments: dict) -> str:
    """Validate x-match like rabbit_exchange_type_headers:validate_binding/2."""
    if "x-match" not in arguments:
        return "all"
    raw = arguments["x-match"]
    if isinstance(raw, (bytes, bytearray)):
        try:
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            raw = repr(bytes(raw))
    elif not isinstance(raw, str):
        raise BindingArgumentError(
            f"Invalid x-match field type {type(raw).__name__} (value {raw!r}); "
            "expected longstr")
    if raw not in _X_MATCH_MODES:
        raise BindingArgumentError(
            f"Invalid x-match field value {raw!r}; "
            "expected all, any, all-with-x, or any-with-x")
    return raw


def _headers_spec(arguments: dict) -> tuple[bool, bool, tuple]:
    """Pre-digest a headers binding once at bind time so that a publish only
    walks the relevant (key, value) pairs. Returns (is_all, with_x, pairs)."""
    mode = _parse_x_match(arguments)
    with_x = mode.endswith("-with-x")
    pairs = tuple(
        (k, v) for k, v in arguments.items()
        if k != "x-match" and (with_x or not str(k).startswith("x-"))
    )
    return mode.startswith("all"), with_x, pairs


def _headers_match(is_all: bool, pairs: tuple, headers: dict) -> bool:
    """None (AMQP void) in a binding means "header present with any value"."""
    if is_all:
        for key, want in pairs:
            if key not in headers:
                return False
            if want is not None and not _values_equal(want, headers[key]):
                return False
        return True
    for key, want in pairs:
        if key in headers and (want is None or _values_equal(want, headers[key])):
            return True
    return False


class _TrieNode:
    __slots__ = ("children", "dests")

    def __init__(self) -> None:
        self.children: dict[str, _TrieNode] = {}
        # id(dest) -> [dest, number of bindings ending here for that dest]
        self.dests: dict[int, list] = {}


def _trie_match(root: _TrieNode, words: tuple[str, ...]) -> dict[int, object]:
    """Walk the topic trie; memoises (node, position) so patterns with many
    '#' stay polynomial instead of exponential in the key length."""
    found: dict[int, object] = {}
    n = len(words)
    visited: set[tuple[int, int]] = set()
    stack = [(root, 0)]
    while stack:
        node, i = stack.pop()
        state = (id(node), i)
        if state in visited:
            continue
        visited.add(state)
        children = node.children
        hash_child = children.get("#")
        if hash_child is not None:
            # '#' swallows zero or more words.
            for j in range(i, n + 1):
                stack.append((hash_child, j))
        if i == n:
            for ident, ref in node.dests.items():
                found[ident] = ref[0]
            continue
        child = children.get(words[i])
        if child is not None:
            stack.append((child, i + 1))
        star = children.get("*")
        if star is not None:
            stack.append((star, i + 1))
    return found


class _DestRef:
    __slots__ = ("dest", "seq", "bkeys")

    def __init__(self, dest, seq: int) -> None:
        self.dest = dest
        self.seq = seq  # gives match() a stable, bind-ordered result
        self.bkeys: dict[tuple, None] = {}


_seq = count()


# --------------------------------------------------------------------------
# exchange


@dataclass(eq=False)
class Exchange:
    """An exchange and the bindings whose source it is.

    Identity-hashed (eq=False) because it is also used as a binding
    destination for exchange-to-exchange bindings. Destinations that are not
    Exchange instances are opaque final destinations (queues), compared by
    identity.
    """

    name: str
    type: ExchangeType
    durable: bool = False
    auto_delete: bool = False
    internal: bool = False
    arguments: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.type = ExchangeType(self.type)
        if self.arguments is None:
            self.arguments = {}
        # (id(dest), routing_key, frozen args) -> (dest, routing_key, args)
        self._bindings: dict[tuple, tuple] = {}
        self._dests: dict[int, _DestRef] = {}
        self._direct: dict[str, dict[int, list]] = {}
        self._fanout: Optional[tuple] = None
        self._topic_root = _TrieNode()
        self._topic_cache: OrderedDict[str, tuple] = OrderedDict()
        # bkey -> (dest, is_all, pairs)
        self._headers: dict[tuple, tuple] = {}

    # ---------------------------------------------------------------- props

    @property
    def alternate_exchange(self) -> Optional[str]:
        name = self.arguments.get("alternate-exchange")
        if isinstance(name, (bytes, bytearray)):
            name = bytes(name).decode("utf-8", "replace")
        return name

    # ------------------------------------------------------------- bindings

    def bind(self, destination, routing_key: str, arguments: dict | None = None) -> bool:
        """Add a binding. Idempotent like RabbitMQ: binding the same
        (destination, key, arguments) twice is one binding. Raises
        BindingArgumentError for an invalid x-match on a headers exchange."""
        args = dict(arguments) if arguments else {}
        spec = _headers_spec(args) if self.type is ExchangeType.HEADERS else None
        ident = id(destination)
        bkey = (ident, routing_key, _freeze(args))
        if bkey in self._bindings:
            return False
        self._bindings[bkey] = (destination, routing_key, args)
        ref = self._dests.get(ident)
        new_dest = ref is None
        if new_dest:
            ref = self._dests[ident] = _DestRef(destination, next(_seq))
        ref.bkeys[bkey] = None

        kind = self.type
        if kind is ExchangeType.DIRECT:
            bucket = self._direct.setdefault(routing_key, {})
            entry = bucket.get(ident)
            if entry is not None:
                entry[1] += 1
            else:
                bucket[ident] = [destination, 1]
                if not new_dest and len(bucket) > 1:
                    self._direct[routing_key] = self._sorted_bucket(bucket)
        elif kind is ExchangeType.FANOUT:
            self._fanout = None
        elif kind is ExchangeType.TOPIC:
            node = self._topic_root
            for word in _split_topic(routing_key):
                nxt = node.children.get(word)
                if nxt is None:
                    nxt = node.children[word] = _TrieNode()
                node = nxt
            entry = node.dests.get(ident)
            if entry is not None:
                entry[1] += 1
            else:
                node.dests[ident] = [destination, 1]
            self._topic_cache.clear()
        else:
            is_all, _with_x, pairs = spec
            self._headers[bkey] = (destination, is_all, pairs)
        return True

    def unbind(self, destination, routing_key: str, arguments: dict | None = None) -> bool:
        """Remove one binding; False if it did not exist."""
        args = arguments or {}
        bkey = (id(destination), routing_key, _freeze(args))
        if bkey not in self._bindings:
            return False
        self._remove(bkey)
        return True

    def unbind_all(self, destination) -> int:
        """Drop every binding to `destination` (it was deleted); returns how many."""
        ref = self._dests.get(id(destination))
        if ref is None:
            return 0
        bkeys = list(ref.bkeys)
        for bkey in bkeys:
            self._remove(bkey)
        return len(bkeys)

    def has_bindings(self) -> bool:
        return bool(self._bindings)

    def bindings(self) -> list[tuple[object, str, dict]]:
        """(destination, routing_key, arguments) in bind order."""
        return [(d, k, dict(a)) for d, k, a in self._bindings.values()]

    def _remove(self, bkey: tuple) -> None:
        destination, routing_key, _args = self._bindings.pop(bkey)
        ident = bkey[0]
        ref = self._dests[ident]
        del ref.bkeys[bkey]
        if not ref.bkeys:
            del self._dests[ident]

        kind = self.type
        if kind is ExchangeType.DIRECT:
            bucket = self._direct[routing_key]
            entry = bucket[ident]
            entry[1] -= 1
            if entry[1] == 0:
                del bucket[ident]
                if not bucket:
                    del self._direct[routing_key]
        elif kind is ExchangeType.FANOUT:
            self._fanout = None
        elif kind is ExchangeType.TOPIC:
            path = [self._topic_root]
            words = _split_topic(routing_key)
            for word in words:
                path.append(path[-1].children[word])
            leaf = path[-1]
            entry = leaf.dests[ident]
            entry[1] -= 1
            if entry[1] == 0:
                del leaf.dests[ident]
            # Prune empty branches so the trie does not keep dead paths.
            for depth in range(len(words), 0, -1):
                node = path[depth]
                if node.dests or node.children:
                    break
                del path[depth - 1].children[words[depth - 1]]
            self._topic_cache.clear()
        else:
            del self._headers[bkey]

    def _sorted_bucket(self, bucket: dict[int, list]) -> dict[int, list]:
        dests = self._dests
        return dict(sorted(bucket.items(), key=lambda kv: dests[kv[0]].seq))

    # -------------------------------------------------------------- routing

    def match(self, routing_key, headers: dict | None = None) -> list:
        """Destinations directly bound to this exchange that match, each at
        most once, ordered by when the destination was first bound here.

        `routing_key` may also be a list of keys (CC/BCC sender-selected
        distribution): the result is the union over the keys.
        """
        kind = self.type
        if kind is ExchangeType.DIRECT:
            if isinstance(routing_key, str):
                bucket = self._direct.get(routing_key)
                return [e[0] for e in bucket.values()] if bucket else []
            return self._union(self._direct.get(k) for k in routing_key)
        if kind is ExchangeType.FANOUT:
            cached = self._fanout
            if cached is None:
                cached = self._fanout = tuple(r.dest for r in self._dests.values())
            return list(cached)
        if kind is ExchangeType.TOPIC:
            if isinstance(routing_key, str):
                return list(self._topic_lookup(routing_key))
            found: dict[int, object] = {}
            for key in routing_key:
                for d in self._topic_lookup(key):
                    found.setdefault(id(d), d)
            return self._ordered(found)
        # headers: the routing key is ignored
        hdrs = headers or {}
        found = {}
        for dest, is_all, pairs in self._headers.values():
            ident = id(dest)
            if ident not in found and _headers_match(is_all, pairs, hdrs):
                found[ident] = dest
        return self._ordered(found)

    def _topic_lookup(self, routing_key: str) -> tuple:
        """Hot path: repeated keys are answered from a bounded LRU cache that
        every bind/unbind clears, so the trie is walked once per distinct key."""
        cache = self._topic_cache
        hit = cache.get(routing_key)
        if hit is not None:
            cache.move_to_end(routing_key)
            return hit
        result = tuple(self._ordered(_trie_match(self._topic_root, _split_topic(routing_key))))
        cache[routing_key] = result
        if len(cache) > TOPIC_CACHE_SIZE:
            cache.popitem(last=False)
        return result

    def _ordered(self, found: dict[int, object]) -> list:
        if len(found) <= 1:
            return list(found.values())
        dests = self._dests
        return [found[i] for i in sorted(found, key=lambda i: dests[i].seq)]

    def _union(self, buckets: Iterable[Optional[dict]]) -> list:
        found: dict[int, object] = {}
        for bucket in buckets:
            if bucket:
                for ident, entry in bucket.items():
                    found.setdefault(ident, entry[0])
        return self._ordered(found)


# --------------------------------------------------------------------------
# routing across exchanges


def route(exchange: Exchange, routing_key, headers: dict | None,
          lookup_exchange: Callable[[str], Optional[Exchange]]) -> list:
    """All final (non-exchange) destinations reached from `exchange`.

    Mirrors rabbit_exchange:route/2: exchange-to-exchange bindings are
    followed breadth-first with each exchange visited once (cycles are safe);
    a destination reached several ways is returned once; an exchange whose
    own match() is empty (the published-to one or any reached through e2e
    bindings or as an alternate) hands the message to its alternate exchange,
    looked up by name, a missing one being ignored. An exchange that matched
    only other exchanges did route, so its alternate is not used even if those
    exchanges reach no queue. Order is deterministic (bind order, breadth-first).
    """
    results: dict[int, object] = {}
    seen = {id(exchange)}
    work = deque((exchange,))
    while work:
        x = work.popleft()
        dests = x.match(routing_key, headers)
        if not dests:
            ae_name = x.alternate_exchange
            if ae_name is not None:
                ae = lookup_exchange(ae_name)
                if ae is not None and id(ae) not in seen:
                    seen.add(id(ae))
                    work.append(ae)
            continue
        for dest in dests:
            ident = id(dest)
            if isinstance(dest, Exchange):
                if ident not in seen:
                    seen.add(ident)
                    work.append(dest)
            elif ident not in results:
                results[ident] = dest
    return list(results.values())
