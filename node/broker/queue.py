"""A queue master: consumers, dispatch, limits and policies over its backing queue.

The messages themselves are the backing queue's (node/broker/backing_queue.py):
entries leave it when delivered and come back (redelivered) in their original
position when requeued, so order survives nacks and channel loss.
Delivery is round-robin over the consumers that can take a message now:
a consumer is skipped while its prefetch is full, its channel is flowed off
or its connection's socket is not draining (TCP back pressure, QOS-5).
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Iterable

from ..protocol.replies import AMQPError, ReplyCode, vhost_text
from . import deduplication as dd
from . import policy as pol
from .backing_queue import BackingQueue
from .consumer import Consumer, consumer_priority
from .delivery_count import count_returns, delivery_count, with_delivery_count
from .expiry import call_later, deadline, monotonic
from .message import Entry, Message
from .paged_queue import HEAD_LIMIT, LOGGED, REFUSED, SAFE, PagedQueue
from .queue_arguments import OVERFLOW_REJECT_PUBLISH, OVERFLOW_REJECT_PUBLISH_DLX, OVERFLOWS, \
    at_least_once, int_arg, is_quorum, limits
from .queue_arguments import field_type as _field_type

# what the broker and the cluster import from here
__all__ = ["HEAD_LIMIT", "LOGGED", "REFUSED", "SAFE", "OVERFLOWS", "Consumer", "Queue", "consumer_priority",
           "is_quorum", "_field_type"]

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
        self.dead_letter: Callable[["Queue", list, str], None] | None = None   # set when it has a DLX
        self._dead_letter_handler: Callable[["Queue", list, str], None] | None = None
        self.consumers: deque[Consumer] = deque()
        self.deleted = False
        self._had_consumers = False
        self._on_unused = on_unused
        self._dispatching = False
        # PUB-4 features; a queue without them pays one None test per message at most.
        self.policy: dict = {}
        self.max_priority = int_arg(self.arguments, "x-max-priority")
        self.single_active = self.arguments.get("x-single-active-consumer") is True
        self.persist_all = is_quorum(self.arguments)   # a quorum queue logs transient messages too
        # the messages: paged to the store (a durable queue's); a mirrored queue's master wraps them
        # (cluster/mirroring/mirrored_queue.py), and the queue never asks which it has
        self.backing: BackingQueue = PagedQueue(store if durable and exclusive_owner is None else None, store_id,
                                                self.max_priority, self.persist_all, self._recovered_deadline)
        self._groups: list[deque] | None = None   # consumers by x-priority, highest first
        self.expiring = False                    # some message may carry a deadline
        self._fresh: Message | None = None       # being published: not expired by this dispatch
        self._expiry_timer = None
        self._expiry_at = 0.0
        self._unused_timer = None
        self._returns: dict[Entry, int] = {}     # x-delivery-limit: times each entry came back
        # at-least-once dead-lettering: entries set aside (kept in `outstanding`, so the store and
        # the mirrors keep them) until every dead-letter target has them (node/broker/deadletter.py)
        self.discards: dict[int, Entry] = {}
        self.dedup: dd.IdCache | None = None     # x-message-deduplication: the ids seen lately
        # counters read by the management API and /metrics (never reset; rates are their deltas)
        self.published_total = self.delivered_total = self.acked_total = 0
        self._resolve()

    # ---- settings: x- arguments and policy ---------------------------------------------
    def _resolve(self) -> None:
        """Effective limits from the queue's arguments and its policy (see policy.py)."""
        settings = limits(self.arguments, self.policy)
        (self.max_length, self.max_length_bytes, self.overflow, self.ttl, self.expires, self.delivery_limit,
         self.dlx, self.dlx_routing_key) = settings[:8]
        self.dead_letter = self._dead_letter_handler if self.dlx is not None else None
        self.at_least_once = at_least_once(settings.dead_letter_strategy, self.persist_all, self.dlx, self.overflow,
                                           self.describe)
        if self.ttl is not None:
            self.expiring = True
        self._resolve_dedup(dd.settings(*settings.deduplication))
        self.consumer_timeout = settings.consumer_timeout

    def _resolve_dedup(self, conf) -> None:
        """Deduplication on, off or resized; a durable queue's ids are kept in (and were
        recovered from) its store."""
        cache = self.dedup
        if conf is None:
            if cache is not None:
                self.dedup = None
                self.backing.forget_ids(cache)
        elif cache is None:
            cache = self.dedup = dd.IdCache(*conf)
            cache.replace(self.backing.keep_ids(cache))
        else:
            cache.configure(*conf)

    def _let_go_dead(self, entries: list, reason: str, acked: bool = False) -> None:
        """Entries leave for the dead-letter exchange (or, without one, for good). At least once:
        set aside until the targets confirm them (dead_lettered)."""
        if self.dead_letter is not None and self.at_least_once and not self.deleted:
            backing, returns = self.backing, self._returns
            for entry in entries:
                if entry.seq not in backing.outstanding:    # from the ready list: taken, as a delivery is
                    backing.delivered(entry, False)
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
            # messages already queued get it as well (counted from now: their arrival is not kept)
            self.backing.restamp(monotonic() + self.ttl / 1000.0)
        if self.expiring:
            self.drop_expired()
        if self.expires != before[1]:
            self.touch()

    def __repr__(self) -> str:
        return f"<Queue {self.vhost}/{self.name}>"

    # ---- what the backing queue holds --------------------------------------------------------
    @property
    def store(self):
        return self.backing.store

    @property
    def store_id(self) -> int:
        return self.backing.store_id

    @property
    def outstanding(self) -> dict[int, Entry]:
        return self.backing.outstanding

    @property
    def next_seq(self) -> int:
        return self.backing.next_seq

    @next_seq.setter
    def next_seq(self, seq: int) -> None:
        self.backing.next_seq = seq

    @property
    def message_count(self) -> int:
        return self.backing.message_count

    @property
    def unacked(self) -> int:
        return len(self.backing.outstanding) - len(self.discards)

    @property
    def message_bytes(self) -> int:
        return self.backing.message_bytes

    @property
    def paged_out(self) -> int:
        return self.backing.paged_out

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def describe(self) -> str:
        return vhost_text("queue", self.name, self.vhost)

    def read_message(self, msg_id: int) -> Message:
        """A paged-out message, read from the store."""
        return self.backing.read(msg_id)[0]

    # ---- messages in ----------------------------------------------------------
    def publish(self, message: Message) -> int:
        """Enqueue: SAFE, LOGGED (safe once the store syncs) or REFUSED (reject-publish)."""
        if (self.max_length is not None or self.max_length_bytes is not None) \
                and self._would_overflow(message) and self.overflow in (OVERFLOW_REJECT_PUBLISH,
                                                                        OVERFLOW_REJECT_PUBLISH_DLX):
            return REFUSED
        backing = self.backing
        seen = None
        if self.dedup is not None:
            key = dd.message_key(message.props_raw)
            if key is not None:
                now = dd.now_ms()
                if self.dedup.contains(key, now):
                    # A duplicate: confirmed once everything before it (its first copy) is safe.
                    self.dedup.dropped += 1
                    return LOGGED if backing.logs else SAFE
                self.dedup.add(key, now)
                seen = (key, now)
        self.published_total += 1
        expires = 0.0
        if self.ttl is not None or message.expiration is not None:
            expires = self._deadline(message)
        outcome = backing.publish(message, expires, seen)
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
        """fn(ok, *args) once what the queue holds now is safe: durable here and, for a
        mirrored queue, held (and durable) on every synchronised mirror (CONF-4, MIR-3)."""
        self.backing.when_safe(fn, *args)

    def take_over(self, backing: PagedQueue, dedup: Iterable[tuple[bytes, int]] = ()) -> None:
        """A promoted mirror's copy (MIR-4) becomes this new queue's messages as it is: the mirror
        kept it in a PagedQueue like this queue's own, by position, so nothing is copied; and its
        deduplication ids (in this node's store already: the mirror wrote them)."""
        if self.dedup is not None:
            self.dedup.replace(dedup)
        self.expiring = backing.taken_over(self._recovered_deadline) or self.expiring
        self.backing = backing
        if self.ttl is not None:    # as a policy's: a deadline the old master never told counts from now
            backing.restamp(monotonic() + self.ttl / 1000.0)
        if backing.paged_out and backing.store is not None:
            backing.store.when_durable(self._copy_durable)     # what is not durable yet is read in then
        self._copy_durable(True)

    def _copy_durable(self, _ok: bool) -> None:
        """Only durable messages are read in: the copy's last writes may have just landed."""
        if not self.deleted:
            if self.expiring:
                self.drop_expired()
            self.dispatch()

    def restore(self, messages) -> None:
        """Recovered messages (a sequence of store ids, in order)."""
        self.backing.restore(messages)
        if self.expiring:
            self.drop_expired()
        self.touch()

    # ---- message expiry (x-message-ttl, expiration) ------------------------------------------
    def _deadline(self, message: Message) -> float:
        """A message's deadline counted from now (0: no TTL applies to it)."""
        return deadline(self.ttl, message.expiration, monotonic())

    def _recovered_deadline(self, message: Message, restored_at: float) -> float:
        """A message recovered after a restart: the time it arrived is not in the log, so its
        TTL counts from when the node started (0: no TTL applies to it)."""
        expires = deadline(self.ttl, message.expiration, restored_at)
        if expires:
            self.expiring = True
        return expires

    def drop_expired(self) -> None:
        """Drop (or dead-letter as "expired") the expired messages at the head, as RabbitMQ does,
        and arm the timer for the next deadline at the head."""
        if self.deleted:
            return
        now = monotonic()
        dropped = self.backing.drop_expired_heads(now)
        if dropped:
            self._expired(dropped)
        self._arm_expiry(now)

    def _expired(self, entries: list[Entry]) -> None:
        self._let_go_dead(entries, "expired")

    def _arm_expiry(self, now: float) -> None:
        due = self.backing.next_expiry()
        timer = self._expiry_timer
        if not due:
            if timer is not None:
                timer.cancel()
                self._expiry_timer = None
            return
        if timer is not None:
            if self._expiry_at <= due:
                return          # fires first; it re-arms for whatever is at the head then
            timer.cancel()
        self._expiry_at = due
        self._expiry_timer = call_later(due - now, self._on_expiry_timer)

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

    def hold_expiry(self) -> None:
        """No x-expires timer while the metadata log is replayed: touch() arms it afresh after."""
        if self._unused_timer is not None:
            self._unused_timer.cancel()
            self._unused_timer = None

    def _on_unused_timer(self) -> None:
        self._unused_timer = None
        if self.deleted or self.consumers:
            return
        if self._on_unused is not None:
            self._on_unused(self)

    # ---- length limits (x-max-length, x-max-length-bytes) --------------------------------------
    def _would_overflow(self, message: Message) -> bool:
        held = self.discards       # dead letters waiting count, as in a RabbitMQ quorum queue
        if self.max_length is not None and self.message_count + len(held) >= self.max_length:
            return True
        if self.max_length_bytes is not None and self.backing.message_bytes + len(message.body) + \
                (sum(len(e.message.body) for e in held.values()) if held else 0) > self.max_length_bytes:
            return True
        return False

    def _drop_head_to_limits(self) -> None:
        backing = self.backing
        while (self.max_length is not None and backing.message_count > self.max_length) or \
                (self.max_length_bytes is not None and backing.message_bytes > self.max_length_bytes):
            if not backing.has_ready():
                return
            dropped = backing.pop()
            if self.dead_letter is not None:
                self.dead_letter(self, [dropped.message], "maxlen")
            self._forget([dropped])

    def _forget(self, entries) -> None:
        """These entries leave the queue for good."""
        if self._returns:
            for entry in entries:
                self._returns.pop(entry, None)
        self.backing.forget(entries)

    # ---- messages back ---------------------------------------------------------------------
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
        self.backing.requeue(entries)
        if self.expiring:
            self.drop_expired()
        if self.consumers:
            self.dispatch()

    def _within_delivery_limit(self, entries: list[Entry]) -> list[Entry]:
        """x-delivery-limit: a message returned more than `limit` times is dead-lettered
        ("delivery_limit") or dropped instead of requeued, as a quorum queue does."""
        keep, over = count_returns(entries, self.delivery_limit, self._returns, self.persist_all)
        if over:
            self._let_go_dead(over, "delivery_limit")
        return keep

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

    # ---- messages out ---------------------------------------------------------
    def take(self, no_ack: bool) -> Entry | None:
        """Pop the head for basic.get (prefetch does not apply, QOS-3)."""
        if self._unused_timer is not None:
            self.touch()
        if self.expiring:
            self.drop_expired()
        if not self.backing.has_ready():
            return None
        entry = self.backing.pop()
        if self.persist_all and not entry.redelivered and not delivery_count(entry.message):
            # RabbitMQ's quorum queues answer basic.get with the count even when it is 0
            entry.message = with_delivery_count(entry.message, 0)
        self._delivered(entry, no_ack)
        return entry

    def get_from(self, channel, no_ack: bool, answer: Callable) -> None:
        """basic.get for a channel: answer(entry or None, messages left), here at once."""
        answer(self.take(no_ack), self.message_count)

    def _delivered(self, entry: Entry, no_ack: bool) -> None:
        self.delivered_total += 1
        if no_ack and self._returns:
            self._returns.pop(entry, None)
        self.backing.delivered(entry, no_ack)

    def dispatch(self) -> None:
        """Push ready messages to consumers that can take them: round-robin, or to the single
        active consumer, or by consumer priority (x-priority)."""
        if self._dispatching:
            return
        backing = self.backing
        consumers = self.consumers
        selected = self.single_active or self._groups is not None
        if not selected:
            ready = backing.ready
            if len(ready) == 1 and len(consumers) == 1 and not backing.paged_out and not ready[0].expires:
                # the commonest case, without the loop: one message ready (just published), one consumer
                consumer = consumers[0]
                if consumer.can_take():
                    entry = backing.pop()
                    self._delivered(entry, consumer.no_ack)
                    consumer.channel.deliver(consumer, entry)
                return
        self._dispatching = True
        try:
            backing.top_up()
            while consumers and backing.has_ready():
                consumer = self._next_consumer() if selected else self._round_robin()
                if consumer is None:
                    return
                entry = backing.pop()
                if entry.expires and entry.expires <= monotonic() and entry.message is not self._fresh:
                    self._expired([entry])
                    continue
                if not selected and len(consumers) > 1:
                    consumers.rotate(-1)
                self._delivered(entry, consumer.no_ack)
                consumer.channel.deliver(consumer, entry)
        finally:
            self._dispatching = False

    def _round_robin(self) -> Consumer | None:
        """The next consumer in turn that can take a message (it moves back once it has)."""
        consumers = self.consumers
        for _ in range(len(consumers)):
            consumer = consumers[0]
            if consumer.can_take():
                return consumer
            consumers.rotate(-1)
        return None

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
        if (self.consumers and consumer.exclusive) or any(c.exclusive for c in self.consumers):
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
        backing = self.backing
        count = backing.message_count
        if self._returns:
            for entry in backing.ready:
                self._returns.pop(entry, None)
        backing.purge()
        return count

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
        ids = self.backing.let_go()
        self._retire()
        if self.dedup is not None:
            self.backing.give_back_ids(self.dedup)
        return ids

    def mark_deleted(self) -> list[Consumer]:
        """Forget every message; return the consumers to notify with basic.cancel."""
        if self.dedup is not None:
            self.backing.forget_ids(self.dedup)
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
