"""Dead-lettering: what a queue lets go (rejected, expired, maxlen, delivery_limit) republished to
its dead-letter exchange with `x-death` as RabbitMQ writes it (rabbit_dead_letter), in one of the
two strategies a quorum queue has (`x-dead-letter-strategy`, policy `dead-letter-strategy`):

- at-most-once (the default, and the only one for classic queues): published to the targets and
  forgotten at once; a target that is down, full or missing loses it.
- at-least-once (quorum queues with `x-overflow: reject-publish`, as RabbitMQ 3.10 requires;
  otherwise the queue falls back to at-most-once and logs why): the message stays in the source
  queue, set aside from its consumers, until every target queue has confirmed it as a publisher
  confirm would; a refused, unroutable or unanswered one is sent again. This is RabbitMQ's
  rabbit_fifo_dlx_worker, run by the `DeadLetterWorker` of each such queue on its master's node.

While it waits, the message is held in the source queue as a delivery that nobody has settled
yet: its store and its mirrors keep it, so when the source's node dies in between it is not
lost. Unlike RabbitMQ (which logs the decision in the queue's Raft log), the choice to
dead-letter it is not kept: after a restart or a failover the message is back in the queue as a
redelivery and is dead-lettered again the next time it is rejected, expires or returns once too
often.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Callable

import structlog

from ..protocol.properties import decode_properties, encode_properties
from .expiry import call_later, monotonic
from .message import Entry, Message
from .node_itself import NodeItself

AT_MOST_ONCE = "at-most-once"
AT_LEAST_ONCE = "at-least-once"
STRATEGIES = (AT_MOST_ONCE, AT_LEAST_ONCE)
RETRY_INTERVAL = 1.0       # seconds between tries of dead letters refused, unroutable or lost
CONFIRM_TIMEOUT = 180.0    # RabbitMQ's dead_letter_worker_publisher_confirm_timeout: then sent again

log = structlog.get_logger("haremq.deadletter")


def _text(value):
    return value.decode() if isinstance(value, bytes) else value


def dead_message(queue, exchange_name: str, message: Message, reason: str) -> tuple[Message, dict, list]:
    """The message as its dead-letter exchange receives it, its headers and its x-death array."""
    dl_key = _text(queue.dlx_routing_key)
    routing_key = dl_key if dl_key is not None else message.routing_key
    props = decode_properties(message.props_raw)
    headers = dict(props.headers or {})
    if queue.persist_all:      # a quorum queue's count is for its consumers, not kept in the message
        headers.pop("x-delivery-count", None)
    deaths = _deaths(headers)
    for i, death in enumerate(deaths):
        if not isinstance(death, dict):
            continue
        if _text(death.get("queue")) == queue.name and _text(death.get("reason")) == reason:
            count = death.get("count", 1)
            death = dict(death, count=(count if isinstance(count, int) else 1) + 1,
                         time=datetime.now(timezone.utc).replace(microsecond=0))
            deaths.pop(i)
            break
    else:
        death = {"count": 1, "reason": reason, "queue": queue.name,
                 "time": datetime.now(timezone.utc).replace(microsecond=0),
                 "exchange": message.exchange, "routing-keys": [message.routing_key]}
        if props.expiration:
            death["original-expiration"] = props.expiration
    deaths.insert(0, death)
    headers["x-death"] = deaths
    if "x-first-death-reason" not in headers:
        headers.update({"x-first-death-reason": reason, "x-first-death-queue": queue.name,
                        "x-first-death-exchange": message.exchange})
    props.headers = headers
    props.expiration = None
    dead = Message(exchange_name, routing_key, encode_properties(props), message.body,
                   message.persistent, message.priority, None)
    return dead, headers, deaths


def targets(vhost, exchange, dead: Message, headers: dict, deaths: list, reason: str) -> list:
    """The queues a dead letter goes to: its exchange's routes, less those that would make a
    fully automatic cycle (RabbitMQ drops it for those)."""
    return [target for target in vhost.route(exchange, dead.routing_key, headers)
            if reason == "rejected" or not _is_cycle(target.name, deaths)]


def at_most_once(vhost, queue, messages: list, reason: str) -> None:
    """Publish and forget (rabbit_dead_letter:publish)."""
    exchange = vhost.exchanges.get(_text(queue.dlx))
    if exchange is None:
        return
    for message in messages:
        dead, headers, deaths = dead_message(queue, exchange.name, message, reason)
        for target in targets(vhost, exchange, dead, headers, deaths, reason):
            target.publish(dead)


class _Letter:
    """One message being dead-lettered at least once."""

    __slots__ = ("entry", "reason", "dead", "headers", "deaths", "waiting", "done", "refused", "sent_at")

    def __init__(self, entry: Entry, reason: str):
        self.entry = entry
        self.reason = reason
        self.dead: Message | None = None      # made once, when the exchange is first found
        self.headers: dict = {}
        self.deaths: list = []
        self.waiting: dict[int, str] = {}     # publish seq -> target queue, not answered yet
        self.done: set[str] = set()           # target queues that confirmed it
        self.refused = False                  # some target refused it (or was lost): send again
        self.sent_at = 0.0


class DeadLetterWorker(NodeItself):
    """Forwards one source queue's dead letters at least once (rabbit_fifo_dlx_worker).

    It publishes to each target queue as a channel in confirm mode would, so it is the
    RemoteCaller of the queues it publishes to (node/broker/ports.py), local or homed on
    another node; each target's confirm settles that target, and once all have, the source
    queue lets the message go (`Queue.dead_lettered`)."""

    def __init__(self, vhost, queue, on_idle: Callable[["DeadLetterWorker"], None]):
        self.vhost = vhost
        self.queue = queue
        self.on_idle = on_idle
        self.closed = False
        self.letters: dict[int, _Letter] = {}     # source queue seq -> letter
        self.sent: dict[int, _Letter] = {}        # publish seq -> letter
        self.next_seq = 1
        self.remote_queues: set = set()
        self._timer = None
        self._warned = False
        self._busy = 0        # inside take/_retry: a target answering at once must not stop it midway

    # ---- the source queue hands over ------------------------------------------------------
    def take(self, entries: list[Entry], reason: str) -> None:
        self._busy += 1
        try:
            for entry in entries:
                letter = _Letter(entry, reason)
                self.letters[entry.seq] = letter
                self._send(letter)
        finally:
            self._busy -= 1
        self._arm()
        self._idle()

    @property
    def pending(self) -> int:
        return len(self.letters)

    def _send(self, letter: _Letter) -> None:
        queue = self.queue
        exchange = self.vhost.exchanges.get(_text(queue.dlx))
        if exchange is None:
            self._warn("its dead-letter exchange does not exist")
            return
        if letter.dead is None:
            letter.dead, letter.headers, letter.deaths = dead_message(queue, exchange.name, letter.entry.message,
                                                                       letter.reason)
        found = [t for t in targets(self.vhost, exchange, letter.dead, letter.headers, letter.deaths, letter.reason)
                 if t.name not in letter.done]
        if not found:
            if letter.done:       # routes changed, but some target has it: done, as RabbitMQ
                self._finish(letter)
            else:
                self._warn("no queue is bound to its dead-letter exchange for the message")
            return
        letter.refused = False
        letter.sent_at = monotonic()
        for target in found:
            if target.name in letter.waiting.values():
                continue
            seq = self.next_seq
            self.next_seq += 1
            letter.waiting[seq] = target.name
            self.sent[seq] = letter
            target.publish_from(self, letter.dead, seq)

    def _warn(self, why: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning("cannot forward dead letters yet; they stay in the source queue and are tried again",
                        vhost=self.queue.vhost, queue=self.queue.name, why=why,
                        dead_letter_exchange=_text(self.queue.dlx))

    # ---- answers from the targets (the RemoteCaller port) ------------------------------------
    def publish_settled(self, ok: bool, seq: int) -> None:
        letter = self.sent.pop(seq, None)
        if letter is None:
            return
        target = letter.waiting.pop(seq, None)
        if ok and target is not None:
            letter.done.add(target)
        elif not ok:
            letter.refused = True
        if not letter.waiting:
            if letter.refused:
                self._arm()
            else:
                self._finish(letter)
        self._idle()

    def remote_settled(self, seqs, ok: bool) -> None:
        for seq in seqs:
            self.publish_settled(ok, seq)

    def republish(self, queue, message: Message, seq: int) -> None:
        if not self.closed:
            queue.publish_from(self, message, seq)

    def linked_to(self, queue) -> None:
        self.remote_queues.add(queue)

    # ---- done, retried, stopped -----------------------------------------------------------------
    def _finish(self, letter: _Letter) -> None:
        for seq in letter.waiting:
            self.sent.pop(seq, None)
        if self.letters.get(letter.entry.seq) is letter:
            del self.letters[letter.entry.seq]
            self.queue.dead_lettered(letter.entry)

    def _idle(self) -> None:
        if not self.letters and not self._busy:
            self.stop()

    def _arm(self) -> None:
        if self._timer is None and self.letters and not self.closed:
            self._timer = call_later(RETRY_INTERVAL, self._retry)

    def _retry(self) -> None:
        self._timer = None
        if self.closed:
            return
        if self.queue.deleted:       # deleted, or no longer mastered here: nothing to forward
            self.stop()
            return
        now = monotonic()
        self._busy += 1
        try:
            for letter in list(self.letters.values()):
                if not letter.waiting or now - letter.sent_at >= CONFIRM_TIMEOUT:
                    for seq in letter.waiting:
                        self.sent.pop(seq, None)
                    letter.waiting.clear()
                    self._send(letter)
        finally:
            self._busy -= 1
        self._arm()
        self._idle()

    def stop(self) -> None:
        """Nothing left to forward (or the source queue is gone): unlink from the targets."""
        if self.closed:
            return
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for queue in self.remote_queues:
            queue.unlink(self)
        self.remote_queues.clear()
        self.on_idle(self)


def _deaths(headers: dict) -> list:
    """The message's x-death array (copied). A client may have set x-death to anything: as
    RabbitMQ does (rabbit_basic:prepend_table_header), a value that is not an array moves to
    the x-invalid-headers table and a new array starts."""
    value = headers.get("x-death")
    if value is None:
        return []
    if isinstance(value, list):
        return list(value)
    invalid = headers.get("x-invalid-headers")
    if not isinstance(invalid, dict):
        invalid = {} if invalid is None else {"x-invalid-headers": [invalid]}
    invalid = dict(invalid)
    earlier = invalid.get("x-death")
    invalid["x-death"] = [value, *(earlier if isinstance(earlier, list) else [])]
    headers["x-invalid-headers"] = invalid
    return []


def _is_cycle(queue_name: str, deaths: list) -> bool:
    """rabbit_dead_letter:is_cycle/2: the queue is already in the message's x-death and no
    death since then (itself included) was a reject, so the loop is fully automatic."""
    for death in deaths:
        if not isinstance(death, dict):
            continue
        if _text(death.get("reason")) == "rejected":
            return False
        if _text(death.get("queue")) == queue_name:
            return True
    return False
