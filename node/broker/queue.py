"""A queue master: ready messages in position order, consumers, limits.

Entries leave `ready` when delivered and come back (redelivered) in their
original position when requeued, so order survives nacks and channel loss.
Delivery is round-robin over the consumers that can take a message now:
a consumer is skipped while its prefetch is full, its channel is flowed off
or its connection's socket is not draining (TCP back pressure, QOS-5).
"""
from __future__ import annotations

import bisect
import heapq
import sys
from collections import deque
from typing import Callable

import structlog

from ..protocol.frames import shortstr
from ..protocol.replies import AMQPError, ReplyCode, vhost_text
from ..protocol.properties import PropertyView, decode_properties, encode_properties
from . import deduplication as dd
from . import policy as pol
from .expiry import call_later, expiration_ms, monotonic
from .message import Entry, Message
from .priority import PriorityReady

OVERFLOW_DROP_HEAD = "drop-head"
OVERFLOW_REJECT_PUBLISH = "reject-publish"
OVERFLOW_REJECT_PUBLISH_DLX = "reject-publish-dlx"
OVERFLOWS = (OVERFLOW_DROP_HEAD, OVERFLOW_REJECT_PUBLISH, OVERFLOW_REJECT_PUBLISH_DLX)

# Queue.publish outcomes
REFUSED = 0      # x-overflow=reject-publish: nack
SAFE = 1         # in memory, nothing more to wait for
LOGGED = 2       # safe once the store says the write is durable

HEAD_LIMIT = 8192    # entries a durable queue keeps in memory; the rest wait on disk as ids

log = structlog.get_logger("haremq.queue")


class Consumer:
    """One basic.consume: where deliveries go and how many it may hold unacked."""

    __slots__ = ("tag", "tag_raw", "channel", "queue", "no_ack", "exclusive", "prefetch", "unacked",
                 "arguments", "priority")

    def __init__(self, tag: str, channel, queue: "Queue", no_ack: bool, exclusive: bool,
                 prefetch: int, arguments: dict):
        self.tag = tag
        self.tag_raw = shortstr(tag)
        self.channel = channel
        self.queue = queue
        self.no_ack = no_ack
        self.exclusive = exclusive
        self.prefetch = prefetch
        self.unacked = 0
        self.arguments = arguments
        self.priority = arguments.get("x-priority", 0) if arguments else 0   # checked by consumer_priority()

    def can_take(self) -> bool:
        if self.prefetch and self.unacked >= self.prefetch:
            return False
        return self.channel.can_deliver()


class Queue:
    remote = False      # a RemoteQueue (homed on another node) says True

    def __init__(self, name: str, vhost: str, durable: bool = False, exclusive_owner=None,
                 auto_delete: bool = False, arguments: dict | None = None,
                 on_unused: Callable[["Queue"], None] | None = None, store=None, store_id: int = 0):
        self.name = name
        self.vhost = vhost
        self.durable = durable
        self.exclusive_owner = exclusive_owner
        self.auto_delete = auto_delete
        self.arguments = dict(arguments or {})
        self.ready: deque[Entry] = deque()
        self.ready_bytes = 0
        # Paged out: ids of logged messages, all newer than every entry in `ready`, and their
        # positions (seqs, rising): a mirror knows a message by its position.
        self.tail: deque[int] = deque()
        self.tail_keys: deque[int] = deque()
        self.tail_bytes = 0
        self.store = store if durable and exclusive_owner is None else None
        self.store_id = store_id
        self.dead_letter: Callable[["Queue", list, str], None] | None = None   # set when it has a DLX
        self._dead_letter_handler: Callable[["Queue", list, str], None] | None = None
        self.consumers: deque[Consumer] = deque()
        # delivered and not yet settled, by seq: a mirror started now must hold these too
        self.outstanding: dict[int, Entry] = {}
        self.deleted = False
        self._had_consumers = False
        self.next_seq = 1                         # the position the next message gets
        self._on_unused = on_unused
        self._dispatching = False
        self._head_limit = HEAD_LIMIT
        # PUB-4 features; a queue without them pays one None test per message at most.
        self.policy: dict = {}
        self.max_priority = _int_arg(self.arguments, "x-max-priority")
        if self.max_priority is not None:
            self.ready = PriorityReady(self.max_priority)
            self._head_limit = sys.maxsize      # priority queues stay in memory, never paged out
        self.single_active = self.arguments.get("x-single-active-consumer") is True
        self.persist_all = is_quorum(self.arguments)   # a quorum queue logs transient messages too
        self._groups: list[deque] | None = None   # consumers by x-priority, highest first
        self.expiring = False                    # some message may carry a deadline
        self._tail_expiry: dict[int, float] = {}  # paged-out message id -> deadline
        self._restored_upto = 0                  # ids up to here were recovered at start
        self._restored_at = 0.0
        self._fresh: Message | None = None       # being published: not expired by this dispatch
        self._expiry_timer = None
        self._expiry_at = 0.0
        self._unused_timer = None
        self._returns: dict[Entry, int] = {}     # x-delivery-limit: times each entry came back
        # at-least-once dead-lettering: entries set aside (kept in `outstanding`, so the store and
        # the mirrors keep them) until every dead-letter target has them (node/broker/deadletter.py)
        self.discards: dict[int, Entry] = {}
        self.replica = None                      # cluster.replicator.Replicator while mirrored
        self.dedup: dd.IdCache | None = None     # x-message-deduplication: the ids seen lately
        # counters read by the management API and /metrics (never reset; rates are their deltas)
        self.published_total = self.delivered_total = self.acked_total = 0
        self._resolve()

    # ---- settings: x- arguments and policy ---------------------------------------------
    def _resolve(self) -> None:
        """Effective limits from the queue's arguments and its policy (see policy.py)."""
        args, policy = self.arguments, self.policy
        self.max_length = _int_arg({"x-max-length": pol.effective(args, policy, "max-length")}, "x-max-length")
        self.max_length_bytes = _int_arg({"x-max-length-bytes": pol.effective(args, policy, "max-length-bytes")},
                                         "x-max-length-bytes")
        self.overflow = pol.effective(args, policy, "overflow") or OVERFLOW_DROP_HEAD
        self.ttl = pol.effective(args, policy, "message-ttl")
        self.expires = pol.effective(args, policy, "expires")
        self.delivery_limit = pol.effective(args, policy, "delivery-limit")
        self.dlx = pol.effective(args, policy, "dead-letter-exchange")
        self.dlx_routing_key = pol.effective(args, policy, "dead-letter-routing-key")
        self.dead_letter = self._dead_letter_handler if self.dlx is not None else None
        self.at_least_once = self._dead_letter_strategy(pol.effective(args, policy, "dead-letter-strategy"))
        if self.ttl is not None:
            self.expiring = True
        self._resolve_dedup(dd.settings(pol.effective(args, policy, "message-deduplication"),
                                        pol.effective(args, policy, "cache-size"),
                                        pol.effective(args, policy, "cache-ttl")))

    def _resolve_dedup(self, conf) -> None:
        """Deduplication on, off or resized; a durable queue's ids are kept in (and were
        recovered from) its store."""
        cache = self.dedup
        if conf is None:
            if cache is not None:
                self.dedup = None
                if self.store is not None:
                    self.store.forget_ids(self.store_id, cache)
        elif cache is None:
            cache = self.dedup = dd.IdCache(*conf)
            if self.store is not None:
                cache.replace(self.store.keep_ids(self.store_id, cache))
        else:
            cache.configure(*conf)

    def _dead_letter_strategy(self, strategy) -> bool:
        """x-dead-letter-strategy at-least-once, as RabbitMQ 3.10 honours it: on a quorum queue with
        a dead-letter exchange and x-overflow reject-publish; else at-most-once, and it says why."""
        if strategy != "at-least-once" or not self.persist_all:
            return False
        if self.dlx is None:
            log.warning(f"Disabling dead-lettering for {self.describe()} despite configured "
                        f"dead-letter-strategy '{strategy}' because dead-letter-exchange is not configured.")
            return False
        if self.overflow != OVERFLOW_REJECT_PUBLISH:
            log.warning(f"Falling back to dead-letter-strategy at-most-once for {self.describe()} because "
                        "configured dead-letter-strategy at-least-once is incompatible with effective overflow "
                        "strategy drop-head. To enable dead-letter-strategy at-least-once, set overflow "
                        "strategy to reject-publish.")
            return False
        return True

    def _let_go_dead(self, entries: list, reason: str, acked: bool = False) -> None:
        """Entries leave for the dead-letter exchange (or, without one, for good). At least once:
        set aside until the targets confirm them (dead_lettered)."""
        if self.dead_letter is not None and self.at_least_once and not self.deleted:
            outstanding, returns = self.outstanding, self._returns
            for entry in entries:
                if entry.seq not in outstanding:    # from the ready list: taken, as a delivery is
                    outstanding[entry.seq] = entry
                    if self.replica is not None:
                        self.replica.deliver(entry)
                    if entry.msg_id and not entry.redelivered:
                        self.store.deliver(self.store_id, entry.msg_id)
                returns.pop(entry, None)
                self.discards[entry.seq] = entry
            self.dead_letter(self, [e.message for e in entries], reason, held=entries)
            return
        if self.dead_letter is not None:
            self.dead_letter(self, [e.message for e in entries], reason)
        if acked:
            self.settle(entries)
        else:
            self._forget(entries)

    def dead_lettered(self, entry: Entry) -> None:
        """At least once: every target of the dead-letter exchange has confirmed this entry."""
        if self.discards.get(entry.seq) is entry:
            del self.discards[entry.seq]
            if not self.deleted:
                self._forget((entry,))

    def set_dead_letter_handler(self, handler: Callable[["Queue", list, str], None]) -> None:
        """The vhost's dead-lettering; used whenever the queue has a dead-letter exchange."""
        self._dead_letter_handler = handler
        self.dead_letter = handler if self.dlx is not None else None

    def apply_policy(self, definition: dict | None) -> None:
        """Apply a policy definition (RabbitMQ's keys: message-ttl, expires, max-length,
        max-length-bytes, overflow, dead-letter-exchange, dead-letter-routing-key,
        delivery-limit); None or {} clears it. Takes effect at once, as in RabbitMQ."""
        self.policy = {k: v for k, v in (definition or {}).items() if k in pol.QUEUE_KEYS}
        before = (self.ttl, self.expires)
        self._resolve()
        if self.deleted:
            return
        if self.max_length is not None or self.max_length_bytes is not None:
            self._drop_head_to_limits()
        if self.ttl != before[0] and self.ttl is not None:
            self._restamp_ttl()
        if self.expiring:
            self.drop_expired()
        if self.expires != before[1]:
            self.touch()

    def __repr__(self) -> str:
        return f"<Queue {self.vhost}/{self.name}>"

    @property
    def message_count(self) -> int:
        return len(self.ready) + len(self.tail)

    @property
    def unacked(self) -> int:
        return len(self.outstanding) - len(self.discards)

    @property
    def message_bytes(self) -> int:
        return self.ready_bytes + self.tail_bytes

    @property
    def paged_out(self) -> int:
        return len(self.tail)

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def describe(self) -> str:
        return vhost_text("queue", self.name, self.vhost)

    # ---- messages in ----------------------------------------------------------
    def publish(self, message: Message) -> int:
        """Enqueue: SAFE, LOGGED (safe once the store syncs) or REFUSED (reject-publish)."""
        if (self.max_length is not None or self.max_length_bytes is not None) \
                and self._would_overflow(message) and self.overflow in (OVERFLOW_REJECT_PUBLISH,
                                                                        OVERFLOW_REJECT_PUBLISH_DLX):
            return REFUSED
        seen = None
        if self.dedup is not None:
            key = dd.message_key(message.props_raw)
            if key is not None:
                now = dd.now_ms()
                if self.dedup.contains(key, now):
                    # A duplicate: confirmed once everything before it (its first copy) is safe.
                    self.dedup.dropped += 1
                    return LOGGED if self.replica is not None or self.store is not None else SAFE
                self.dedup.add(key, now)
                seen = (key, now)
        self.published_total += 1
        store = self.store
        outcome = SAFE
        expires = 0.0
        if self.ttl is not None or message.expiration is not None:
            expires = self._deadline(message)
        seq = self.next_seq
        self.next_seq = seq + 1
        if store is None:
            self.ready.append(Entry(message, seq, False, 0, expires))
            self.ready_bytes += len(message.body)
        else:
            paging = bool(self.tail) or len(self.ready) >= self._head_limit
            persistent = message.persistent or self.persist_all
            if persistent or paging:
                msg_id = store.enqueue(self.store_id, message.exchange_raw, message.routing_key_raw,
                                       message.props_raw, message.body, transient=not persistent,
                                       dedup=seen)
                outcome = LOGGED if persistent else SAFE
            else:
                msg_id = 0
            if paging:
                self.tail.append(msg_id)
                self.tail_keys.append(seq)
                self.tail_bytes += len(message.body)
                if expires:
                    self._tail_expiry[msg_id] = expires
            else:
                self.ready.append(Entry(message, seq, False, msg_id, expires))
                self.ready_bytes += len(message.body)
        if self.replica is not None:
            # safe only once every synchronised mirror has it too (see when_safe)
            self.replica.enqueue(seq, message, False, expires, seen)
            outcome = LOGGED
        if self.max_length is not None or self.max_length_bytes is not None:
            self._drop_head_to_limits()
        if expires:
            self.expiring = True
            if self.consumers:
                self._fresh = message      # deliverable now even with ttl 0, as in RabbitMQ
                self.dispatch()
                self._fresh = None
            self.drop_expired()            # ttl 0: what no consumer took at once is gone
        elif self.consumers:
            self.dispatch()
        return outcome

    def publish_from(self, channel, message: Message, seq: int) -> None:
        """A channel's publish (the queue port's vocabulary, as a queue homed elsewhere has it):
        with `seq`, the channel hears channel.publish_settled(ok, seq) once it is safe."""
        outcome = self.publish(message)
        if seq:
            if outcome == LOGGED:
                self.when_safe(channel.publish_settled, seq)
            else:
                channel.publish_settled(outcome == SAFE, seq)

    def when_safe(self, fn: Callable, *args) -> None:
        """After a LOGGED publish: fn(ok, *args) once that message is durable here and, for a
        mirrored queue, held (and durable) on every synchronised mirror (CONF-4, MIR-3)."""
        replica = self.replica
        if replica is None:
            self.store.when_durable(fn, *args)
        elif self.store is None:
            replica.when_replicated(replica.seq, True, fn, args)
        else:
            self.store.when_durable_meanwhile(replica.when_replicated_after, replica.seq, fn, args)

    def attach_replica(self, replica) -> None:
        """Become a mirrored queue's master: every later change goes to `replica` too. The queue
        pages as before: mirroring wraps it, it does not change how messages are kept."""
        self.replica = replica
        replica.start(self)

    def detach_replica(self):
        replica, self.replica = self.replica, None
        return replica

    # ---- what a mirror's sync reads ------------------------------------------------------------
    @property
    def oldest_seq(self) -> int:
        """The position of the oldest message still in the queue (next_seq when empty)."""
        oldest = self.next_seq
        if self.outstanding:
            oldest = min(oldest, min(self.outstanding))
        if self.ready:
            oldest = min(oldest, self.ready[0].seq if self.max_priority is None else min(e.seq for e in self.ready))
        if self.tail:
            oldest = min(oldest, self.tail_keys[0])
        return oldest

    def keys_upto(self, upto: int) -> tuple[list[int], list[int]]:
        """(every key up to `upto` still in the queue, those of them delivered), ascending: what a
        promoted master reconciles a surviving mirror with, without reading a message."""
        outstanding = self.outstanding
        in_memory = [e for e in outstanding.values() if e.seq <= upto] + [e for e in self.ready if e.seq <= upto]
        keys = [e.seq for e in in_memory]
        keys += [key for key in self.tail_keys if key <= upto]
        keys.sort()
        delivered = sorted(e.seq for e in in_memory if e.redelivered or e.seq in outstanding)
        return keys, delivered

    def entries_at(self, keys: list[int]) -> list | None:
        """(seq, message, delivered, expires) of those keys still in the queue, ascending; None
        if a paged-out one has not reached the file yet (ask again after the store's next write)."""
        want = set(keys)
        outstanding = self.outstanding
        out = [(e.seq, e.message, True, e.expires) for e in outstanding.values() if e.seq in want]
        out += [(e.seq, e.message, e.redelivered, e.expires) for e in self.ready if e.seq in want]
        tail, tail_keys = self.tail, self.tail_keys
        for key in sorted(want):
            i = bisect.bisect_left(tail_keys, key)
            if i < len(tail_keys) and tail_keys[i] == key:
                msg_id = tail[i]
                if not self.store.is_written(msg_id):
                    return None
                message, delivered = self._read(msg_id)
                out.append((key, message, delivered, self._tail_expiry.get(msg_id, 0.0)))
        out.sort(key=_first)
        return out

    def adopt(self, contents) -> None:
        """A promoted mirror's messages (MIR-4), a cluster.mirroring.mirror.MirrorContents: keys ascending,
        kept (the positions the old master gave them). Those delivered on the old master come
        back redelivered; a TTL deadline the old master had set holds (one unknown to it counts
        from now). The head is read into memory and the rest stays paged out, as on the mirror:
        taken over by columns, since a promotion must not hold the loop for a long queue."""
        if self.dedup is not None:     # the mirror's ids (in this node's store already: it wrote them)
            self.dedup.replace(getattr(contents, "dedup", ()))
        keys = contents.keys
        if not keys:
            return
        store = self.store
        ready = self.ready
        self.next_seq = max(self.next_seq, keys[-1] + 1)
        head = len(keys) if store is None else 0 if self.tail else max(0, self._head_limit - len(ready))
        held, ids, delivered_keys, deadlines = contents.held, contents.ids, contents.delivered, contents.expires
        for key in keys[:head]:
            message, msg_id, expires = held.get(key), ids.get(key, 0), deadlines.get(key, 0.0)
            delivered = key in delivered_keys
            if message is None:
                message, delivered = self._read(msg_id)
            if not expires and (self.ttl is not None or message.expiration is not None):
                expires = self._deadline(message)
            if expires:
                self.expiring = True
            if delivered and self.persist_all:
                message = _returned(message)
            ready.append(Entry(message, key, delivered, msg_id, expires))
            self.ready_bytes += len(message.body)
        rest = keys[head:]
        if rest:
            if held:         # held in memory on the mirror: paged out here
                def stored(key):
                    msg_id = ids.get(key)
                    if msg_id is None:
                        message = held[key]
                        msg_id = store.enqueue(self.store_id, message.exchange_raw, message.routing_key_raw,
                                               message.props_raw, message.body, delivered=key in delivered_keys,
                                               transient=True)
                        ids_here[key] = msg_id
                    return msg_id
                ids_here: dict[int, int] = {}
                self.tail.extend(map(stored, rest))
            else:
                ids_here = {}
                self.tail.extend(map(ids.__getitem__, rest))
            self.tail_keys.extend(rest)
            if deadlines:
                in_rest = set(rest)
                for key, expires in deadlines.items():
                    if expires and key in in_rest:
                        self._tail_expiry[ids_here.get(key) or ids[key]] = expires
                        self.expiring = True
        if self.expiring:
            self.drop_expired()

    # ---- message expiry (x-message-ttl, expiration) ------------------------------------------
    def _deadline(self, message: Message) -> float:
        ttl = self.ttl
        per_message = message.expiration
        if per_message is not None and (ttl is None or per_message < ttl):
            ttl = per_message
        return monotonic() + ttl / 1000.0

    def _restamp_ttl(self) -> None:
        """A policy brought or shortened message-ttl: messages already queued get it as well
        (counted from now, as their arrival time is not kept)."""
        deadline = monotonic() + self.ttl / 1000.0
        for entry in self.ready:
            if not entry.expires or entry.expires > deadline:
                entry.expires = deadline
        for msg_id in self.tail:
            if self._tail_expiry.get(msg_id, deadline + 1) > deadline:
                self._tail_expiry[msg_id] = deadline

    def drop_expired(self) -> None:
        """Drop (or dead-letter as "expired") the expired messages at the head, as RabbitMQ does,
        and arm the timer for the next deadline at the head."""
        if self.deleted:
            return
        now = monotonic()
        if self.max_priority is not None:
            dropped = self.ready.drop_while_expired(now)
            for entry in dropped:
                self.ready_bytes -= len(entry.message.body)
        else:
            dropped = []
            while True:
                ready = self.ready
                if not ready and not (self.tail and self._page_in()):
                    break
                head = self.ready[0]
                if not head.expires or head.expires > now:
                    break
                self.ready.popleft()
                self.ready_bytes -= len(head.message.body)
                dropped.append(head)
        if dropped:
            self._expired(dropped)
        self._arm_expiry(now)

    def _expired(self, entries: list[Entry]) -> None:
        self._let_go_dead(entries, "expired")

    def _next_expiry(self) -> float:
        if self.max_priority is not None:
            return self.ready.next_expiry()
        if self.ready:
            return self.ready[0].expires
        if self.tail:
            deadline = self._tail_expiry.get(self.tail[0], 0.0)
            if deadline and not self.store.is_durable(self.tail[0]):
                return max(deadline, monotonic() + 0.05)   # readable once its write lands
            return deadline
        return 0.0

    def _arm_expiry(self, now: float) -> None:
        deadline = self._next_expiry()
        timer = self._expiry_timer
        if not deadline:
            if timer is not None:
                timer.cancel()
                self._expiry_timer = None
            return
        if timer is not None:
            if self._expiry_at <= deadline:
                return          # fires first; it re-arms for whatever is at the head then
            timer.cancel()
        self._expiry_at = deadline
        self._expiry_timer = call_later(deadline - now, self._on_expiry_timer)

    def _on_expiry_timer(self) -> None:
        self._expiry_timer = None
        self.drop_expired()

    # ---- queue expiry (x-expires) --------------------------------------------------------------
    def touch(self) -> None:
        """The queue was used (declared, basic.get, its last consumer left): restart x-expires."""
        if self._unused_timer is not None:
            self._unused_timer.cancel()
            self._unused_timer = None
        if self.expires is None or self.consumers or self.deleted:
            return
        self._unused_timer = call_later(self.expires / 1000.0, self._on_unused_timer)

    def _on_unused_timer(self) -> None:
        self._unused_timer = None
        if self.deleted or self.consumers:
            return
        if self._on_unused is not None:
            self._on_unused(self)

    def _would_overflow(self, message: Message) -> bool:
        held = self.discards       # dead letters waiting count, as in a RabbitMQ quorum queue
        if self.max_length is not None and self.message_count + len(held) >= self.max_length:
            return True
        if self.max_length_bytes is not None and self.ready_bytes + self.tail_bytes + len(message.body) + \
                (sum(len(e.message.body) for e in held.values()) if held else 0) > self.max_length_bytes:
            return True
        return False

    def _drop_head_to_limits(self) -> None:
        while (self.max_length is not None and self.message_count > self.max_length) or \
                (self.max_length_bytes is not None and self.ready_bytes + self.tail_bytes > self.max_length_bytes):
            if not self.ready and not self._page_in():
                return
            dropped = self.ready.popleft()
            self.ready_bytes -= len(dropped.message.body)
            if self.dead_letter is not None:
                self.dead_letter(self, [dropped.message], "maxlen")
            self._forget([dropped])

    def _forget(self, entries) -> None:
        """These entries leave the queue for good: tell the store."""
        outstanding = self.outstanding
        if outstanding:
            for entry in entries:
                outstanding.pop(entry.seq, None)
        if self._returns:
            for entry in entries:
                self._returns.pop(entry, None)
        if self.replica is not None:
            self.replica.remove(entries)
        if self.store is not None:
            ids = [e.msg_id for e in entries if e.msg_id]
            if ids:
                self.store.ack(self.store_id, ids)

    def _page_in(self) -> bool:
        """Bring paged-out messages back into memory, oldest first; False if none could be."""
        store = self.store
        tail = self.tail
        moved = 0
        room = self._head_limit - len(self.ready)
        while tail and moved < room:
            msg_id = tail[0]
            if not store.is_durable(msg_id):
                break
            tail.popleft()
            entry = self._load(msg_id, self.tail_keys.popleft())
            self.tail_bytes -= len(entry.message.body)
            self.ready.append(entry)
            self.ready_bytes += len(entry.message.body)
            moved += 1
        return moved > 0

    def _read(self, msg_id: int) -> tuple[Message, bool]:
        """A logged message read back from the store, and whether it was delivered before."""
        exchange, routing_key, props_raw, body, delivered = self.store.read(msg_id)
        props = PropertyView(props_raw)
        message = Message(exchange, routing_key, props_raw, body, props.delivery_mode == 2,
                          props.priority, expiration_ms(props.expiration))
        return message, delivered

    def read_message(self, msg_id: int) -> Message:
        """A paged-out message, read from the store."""
        return self._read(msg_id)[0]

    def _load(self, msg_id: int, seq: int) -> Entry:
        """A logged message read back from the store, at position `seq`."""
        message, delivered = self._read(msg_id)
        expires = 0.0
        if self._tail_expiry:
            expires = self._tail_expiry.pop(msg_id, 0.0)
        if msg_id <= self._restored_upto and (self.ttl is not None or message.expiration is not None):
            # Recovered after a restart: the time it arrived is not in the log, so its
            # TTL counts from when the node started.
            ttl = self.ttl
            if message.expiration is not None and (ttl is None or message.expiration < ttl):
                ttl = message.expiration
            expires = self._restored_at + ttl / 1000.0
            self.expiring = True
        if delivered and self.persist_all:
            message = _returned(message)
        return Entry(message, seq, delivered, msg_id, expires)

    def restore(self, messages) -> None:
        """Recovered messages (a sequence of ids, in order): they start paged out and are read on demand
        (a priority queue reads them all now: it keeps everything in memory)."""
        if messages:
            self._restored_upto = messages[-1]
            self._restored_at = monotonic()
        if self.max_priority is None:
            if messages:
                self.tail_keys.extend(range(self.next_seq, self.next_seq + len(messages)))
                self.next_seq += len(messages)
                self.tail.extend(messages)
        else:
            for msg_id in messages:
                entry = self._load(msg_id, self.next_seq)
                self.next_seq += 1
                self.ready.append(entry)
                self.ready_bytes += len(entry.message.body)
        if self.expiring:
            self.drop_expired()
        self.touch()

    def requeue(self, entries: list[Entry]) -> None:
        """Put delivered entries back at their original positions, flagged redelivered."""
        if not entries:
            return
        if self.deleted:
            self._forget(entries)
            return
        if self.delivery_limit is not None or self.persist_all:
            entries = self._within_delivery_limit(entries)
            if not entries:
                return
        outstanding = self.outstanding
        for entry in entries:
            entry.redelivered = True
            self.ready_bytes += len(entry.message.body)
            outstanding.pop(entry.seq, None)
        if self.replica is not None:
            self.replica.requeue(entries)
        entries.sort()
        ready = self.ready
        if self.max_priority is not None:
            ready.put_back(entries)
        elif not ready or entries[-1].seq < ready[0].seq:
            ready.extendleft(reversed(entries))
        else:
            self.ready = deque(heapq.merge(entries, ready))
        if self.expiring:
            self.drop_expired()
        if self.consumers:
            self.dispatch()

    def _within_delivery_limit(self, entries: list[Entry]) -> list[Entry]:
        """x-delivery-limit: a message returned more than `limit` times is dead-lettered
        ("delivery_limit") or dropped instead of requeued, as a quorum queue does."""
        limit = self.delivery_limit
        returns = self._returns
        keep, over = [], []
        for entry in entries:
            count = returns.get(entry)
            if count is None:      # a quorum queue's count survives a failover in the header
                count = _delivery_count(entry.message) if self.persist_all else 0
            count += 1
            if limit is not None and count > limit:
                over.append(entry)
            else:
                returns[entry] = count
                if self.persist_all:     # a quorum queue tells the consumer, as RabbitMQ's do
                    entry.message = _with_delivery_count(entry.message, count)
                keep.append(entry)
        if over:
            self._let_go_dead(over, "delivery_limit")
        return keep

    # ---- messages out ---------------------------------------------------------
    def take(self, no_ack: bool) -> Entry | None:
        """Pop the head for basic.get (prefetch does not apply, QOS-3)."""
        if self._unused_timer is not None:
            self.touch()
        if self.expiring:
            self.drop_expired()
        if not self.ready and not (self.tail and self._page_in()):
            return None
        entry = self.ready.popleft()
        self.ready_bytes -= len(entry.message.body)
        if self.persist_all and not entry.redelivered and not _delivery_count(entry.message):
            # RabbitMQ's quorum queues answer basic.get with the count even when it is 0
            entry.message = _with_delivery_count(entry.message, 0)
        self._delivered(entry, no_ack)
        return entry

    def get_from(self, channel, no_ack: bool, answer: Callable) -> None:
        """basic.get for a channel: answer(entry or None, messages left), here at once."""
        answer(self.take(no_ack), self.message_count)

    def _delivered(self, entry: Entry, no_ack: bool) -> None:
        self.delivered_total += 1
        if no_ack:
            if entry.msg_id or self.replica is not None:
                self._forget((entry,))
        else:
            self.outstanding[entry.seq] = entry
            if self.replica is not None:
                self.replica.deliver(entry)
            if entry.msg_id and not entry.redelivered:
                self.store.deliver(self.store_id, entry.msg_id)

    def reject(self, entries: list[Entry]) -> None:
        """Delivered entries were rejected or nacked without requeue: dead-letter them if we can."""
        if self.deleted:
            self.settle(entries)
        else:
            self._let_go_dead(entries, "rejected", acked=True)

    def settle(self, entries: list[Entry]) -> None:
        """Delivered entries were acked (or rejected without requeue)."""
        self.acked_total += len(entries)
        self._forget(entries)

    def dispatch(self) -> None:
        """Push ready messages to consumers that can take them, round-robin."""
        if self._dispatching:
            return
        if self.single_active or self._groups is not None:
            self._dispatch_selected()
            return
        ready = self.ready
        consumers = self.consumers
        if len(ready) == 1 and len(consumers) == 1 and not self.tail and not ready[0].expires:
            # the commonest case, without the loop: one message ready (just published), one consumer
            consumer = consumers[0]
            if consumer.can_take():
                entry = ready.popleft()
                self.ready_bytes -= len(entry.message.body)
                self._delivered(entry, consumer.no_ack)
                consumer.channel.deliver(consumer, entry)
            return
        self._dispatching = True
        try:
            if self.tail and len(self.ready) < HEAD_LIMIT // 2:
                self._page_in()
            ready = self.ready
            expiring = self.expiring
            while consumers and (ready or (self.tail and self._page_in())):
                for _ in range(len(consumers)):
                    consumer = consumers[0]
                    if consumer.can_take():
                        break
                    consumers.rotate(-1)
                else:
                    return
                ready = self.ready   # requeue may have replaced the deque
                entry = ready.popleft()
                self.ready_bytes -= len(entry.message.body)
                if expiring and entry.expires and entry.expires <= monotonic() \
                        and entry.message is not self._fresh:
                    self._expired([entry])
                    ready = self.ready
                    continue
                if len(consumers) > 1:
                    consumers.rotate(-1)
                self._delivered(entry, consumer.no_ack)
                consumer.channel.deliver(consumer, entry)
                ready = self.ready
        finally:
            self._dispatching = False

    def _dispatch_selected(self) -> None:
        """dispatch() for x-single-active-consumer and consumer priorities (x-priority)."""
        self._dispatching = True
        try:
            if self.tail and len(self.ready) < HEAD_LIMIT // 2:
                self._page_in()
            while self.consumers and (self.ready or (self.tail and self._page_in())):
                consumer = self._next_consumer()
                if consumer is None:
                    return
                entry = self.ready.popleft()
                self.ready_bytes -= len(entry.message.body)
                if entry.expires and entry.expires <= monotonic() and entry.message is not self._fresh:
                    self._expired([entry])
                    continue
                self._delivered(entry, consumer.no_ack)
                consumer.channel.deliver(consumer, entry)
        finally:
            self._dispatching = False

    def _next_consumer(self) -> Consumer | None:
        if self.single_active:
            # RabbitMQ 3.10 classic queues: the earliest consumer is the active one
            active = self.consumers[0]
            return active if active.can_take() else None
        # highest priority first; round-robin among equals; lower ones only while those are full
        for group in self._groups:
            for _ in range(len(group)):
                consumer = group[0]
                group.rotate(-1)
                if consumer.can_take():
                    return consumer
        return None

    def _regroup(self) -> None:
        if not any(c.priority for c in self.consumers):
            self._groups = None
            return
        by_priority: dict[int, deque] = {}
        for consumer in self.consumers:
            by_priority.setdefault(consumer.priority, deque()).append(consumer)
        self._groups = [by_priority[p] for p in sorted(by_priority, reverse=True)]

    # ---- consumers --------------------------------------------------------------
    def add_consumer(self, consumer: Consumer, consumed: Callable[[], None] | None = None) -> None:
        """basic.consume; consumed() (consume-ok) before the first delivery goes out."""
        if self.consumers and consumer.exclusive:
            raise AMQPError(ReplyCode.ACCESS_REFUSED,
                            f"queue '{self.name}' in vhost '{self.vhost}' in exclusive use", 60, 20)
        if any(c.exclusive for c in self.consumers):
            raise AMQPError(ReplyCode.ACCESS_REFUSED,
                            f"queue '{self.name}' in vhost '{self.vhost}' in exclusive use", 60, 20)
        self.consumers.append(consumer)
        self._had_consumers = True
        if consumer.priority or self._groups is not None:
            self._regroup()
        if self._unused_timer is not None:
            self.touch()
        if consumed is not None:
            consumed()
        self.dispatch()

    def prefetch_changed(self, consumer: Consumer) -> None:
        """basic.qos on the consumer's channel: nothing to tell, the channel's cap is read here."""

    def unlink(self, channel, carry: bool = False) -> None:
        """A channel is done with the queue: a local queue holds no link for it."""

    def remove_consumer(self, consumer: Consumer) -> None:
        try:
            self.consumers.remove(consumer)
        except ValueError:
            return
        if self._groups is not None:
            self._regroup()
        if not self.consumers and self.auto_delete and self._had_consumers and self._on_unused:
            self._on_unused(self)
            return
        if not self.consumers and self.expires is not None:
            self.touch()
        if self.single_active and self.consumers:
            self.dispatch()     # hand over to the next consumer

    # ---- whole queue --------------------------------------------------------------
    def purge(self) -> int:
        count = self.message_count
        self._forget(self.ready)
        if self.tail and self.replica is not None:
            self.replica.remove_keys(list(self.tail_keys))
        if self.tail and self.store is not None:
            self.store.ack(self.store_id, list(self.tail))
        self._clear_contents()
        return count

    def _clear_contents(self) -> None:
        self.ready.clear()
        self.tail.clear()
        self.tail_keys.clear()
        self._tail_expiry.clear()
        self.ready_bytes = self.tail_bytes = 0

    def purge_from(self, answer: Callable) -> None:
        """queue.purge for a channel: answer(count, error), here at once."""
        answer(self.purge(), None)

    @property
    def dedup_stats(self) -> dict:
        """What list-queues and the management API show of deduplication (None when off)."""
        cache = self.dedup
        return {"dedup_cache_size": len(cache) if cache is not None else None,
                "dedup_dropped": cache.dropped if cache is not None else None}

    def stats_from(self, answer: Callable) -> None:
        """answer((messages, consumers), error), here at once."""
        answer((self.message_count, self.consumer_count), None)

    def let_go(self) -> list[int]:
        """Deposed while its node replays the metadata log after a restart: forget the messages
        here but leave them (and the deduplication ids) in the store, and return their store ids
        in position order. Replaying history must not act on the store: a later entry of the log
        may give this node the queue back, and only the end of the log decides."""
        entries = sorted([*self.ready, *self.outstanding.values()], key=_entry_seq)
        ids = [entry.msg_id for entry in entries if entry.msg_id]
        ids.extend(self.tail)
        self._retire()
        if self.store is not None and self.dedup is not None:
            self.store.give_back_ids(self.store_id, self.dedup)
        self.outstanding.clear()
        self._clear_contents()
        return ids

    def mark_deleted(self) -> list[Consumer]:
        """Forget every message; return the consumers to notify with basic.cancel."""
        if self.dedup is not None and self.store is not None:
            self.store.forget_ids(self.store_id, self.dedup)
        consumers = self._retire()
        self.purge()
        return consumers

    def _retire(self) -> list[Consumer]:
        """The queue stops here: its timers stop, its consumers (returned) and return counts go."""
        self.deleted = True
        for timer in (self._expiry_timer, self._unused_timer):
            if timer is not None:
                timer.cancel()
        self._expiry_timer = self._unused_timer = None
        consumers = list(self.consumers)
        self.consumers.clear()
        self._groups = None
        self._returns.clear()
        return consumers


def _with_delivery_count(message: Message, count: int) -> Message:
    """A copy of the message with the x-delivery-count header (this queue's copy only: the
    message is shared by every queue the publish reached)."""
    props = decode_properties(message.props_raw)
    props.headers = {**(props.headers or {}), "x-delivery-count": count}
    copy = Message(message.exchange, message.routing_key, encode_properties(props), message.body,
                   message.persistent, message.priority, message.expiration, message.exchange_raw,
                   message.routing_key_raw)
    copy.publish_id = message.publish_id
    return copy


def _delivery_count(message: Message) -> int:
    """The x-delivery-count a quorum queue gave the message (0 if none)."""
    try:
        count = PropertyView(message.props_raw).headers().get("x-delivery-count")
    except AMQPError:
        return 0
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0


def _returned(message: Message) -> Message:
    """A quorum queue's message that was out when its master died or its node restarted: back in
    the queue as a redelivery, it counts as returned once more (x-delivery-count), as RabbitMQ's
    count grows when a consumer's channel goes away with it."""
    return _with_delivery_count(message, _delivery_count(message) + 1)


def is_quorum(arguments: dict | None) -> bool:
    """Declared with x-queue-type quorum: replicated with no policy, every message persisted."""
    kind = (arguments or {}).get("x-queue-type")
    return (kind.decode() if isinstance(kind, bytes) else kind) == "quorum"


def _entry_seq(entry: Entry) -> int:
    return entry.seq


def _first(item):
    return item[0]


class ContentsReader:
    """A queue's messages as of when the reader was made, read in chunks while the queue keeps
    serving: what a new mirror's sync sends. Paged-out messages are read from the store a chunk
    at a time, so neither side ever holds the whole queue in memory. A message that has left the
    queue since is skipped: its removal follows in the replication log anyway."""

    def __init__(self, queue: "Queue"):
        self.queue = queue
        self.cut = queue.next_seq               # positions from here on come with the live log
        self.cursor = 0
        self.tail_ids = list(queue.tail)        # ids and positions only, not the messages
        self.tail_keys = list(queue.tail_keys)
        self.tail_at = 0                        # how far into them the reading is
        self.total = queue.message_count + len(queue.outstanding)
        self.sent = 0

    def read(self, limit: int) -> list | None:
        """The next chunk, oldest first, as (seq, message, delivered, expires); [] once done;
        None if a paged-out message has not reached the file yet (try again after a write)."""
        while True:
            out = self._in_memory(limit)
            if len(out) < limit and self.queue.tail:
                more = self._paged_out(limit - len(out), bool(out))
                if more is None:
                    return None
                out += more
            if out:
                self.cursor = out[-1][0] + 1
                self.sent += len(out)
                return out
            if self.queue.tail and self.tail_at < len(self.tail_keys):
                continue        # a whole chunk of them had left the queue: the reading moved on
            return out

    def _in_memory(self, limit: int) -> list:
        queue, cursor, cut = self.queue, self.cursor, self.cut
        outstanding = queue.outstanding
        found = [e for e in outstanding.values() if cursor <= e.seq < cut]
        ready = queue.ready
        if queue.max_priority is not None:
            found += [e for e in ready if cursor <= e.seq < cut]
        elif ready and ready[-1].seq >= cursor:
            i = bisect.bisect_left(ready, cursor, key=_entry_seq)
            while i < len(ready) and len(found) < 2 * limit and ready[i].seq < cut:
                found.append(ready[i])
                i += 1
        found.sort()
        del found[limit:]
        return [(e.seq, e.message, e.redelivered or e.seq in outstanding, e.expires) for e in found]

    def _paged_out(self, limit: int, partial: bool) -> list | None:
        """Still paged out: from the queue's oldest paged-out position now (older ones were read
        in since, and come from memory)."""
        queue = self.queue
        store = queue.store
        keys, ids = self.tail_keys, self.tail_ids
        i = bisect.bisect_left(keys, max(self.cursor, queue.tail_keys[0]), lo=self.tail_at)
        out = []
        while i < len(keys) and len(out) < limit and keys[i] < self.cut:
            msg_id = ids[i]
            if msg_id in store.index:           # else it has left the queue since
                if not store.is_written(msg_id):
                    if not out and not partial:
                        self.tail_at = i
                        return None
                    break
                message, delivered = queue._read(msg_id)
                out.append((keys[i], message, delivered, queue._tail_expiry.get(msg_id, 0.0)))
            i += 1
        self.tail_at = i if i < len(keys) and keys[i] < self.cut else len(keys)
        if not out and not partial and self.tail_at < len(keys):
            self.cursor = max(self.cursor, keys[self.tail_at])
        return out


def consumer_priority(arguments: dict | None, queue: "Queue") -> int:
    """basic.consume's x-priority argument, or RabbitMQ's 406 for a bad one (and for another queue
    type's consumer argument: x-cancel-on-ha-failover on a quorum queue, x-stream-offset)."""
    for key in ("x-cancel-on-ha-failover", "x-stream-offset"):
        if key in (arguments or {}) and (key == "x-stream-offset" or is_quorum(queue.arguments)):
            kind = "quorum" if is_quorum(queue.arguments) else "classic"
            raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                            f"invalid arg '{key}' for {queue.describe()} of queue type rabbit_{kind}_queue", 60, 20)
    value = (arguments or {}).get("x-priority")
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                        f"invalid arg 'x-priority' for {queue.describe()}: "
                        f"\"expected integer, got {_field_type(value)}\"", 60, 20)
    return value


def _field_type(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint"
    if isinstance(value, (str, bytes)):
        return "longstr"
    if isinstance(value, float):
        return "double"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    return "void" if value is None else type(value).__name__


def _int_arg(arguments: dict, name: str) -> int | None:
    value = arguments.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                        f"invalid arg '{name}' for queue: {value!r}", 50, 10)
    return value
