"""A mirrored queue's master: its backing queue, wrapped so that every change reaches the mirrors.

`MirroredQueue` is a `BackingQueue` (node/broker/backing_queue.py) around the
queue's own one (the paged, store-backed `PagedQueue`), as RabbitMQ's
`rabbit_mirror_queue_master` is a backing queue around another. The `Queue`
above it is unchanged: each change it makes (an enqueue, a delivery, a removal,
a requeue) is made to the inner queue and reported to the `Replicator`, which
numbers it and streams it to the mirrors (cluster/mirroring/replicator.py); a
publish is LOGGED and confirmed once it is durable here and held on every
in-sync mirror (MIR-3). Becoming a master wraps the queue's backing queue
(`mirror_queue`), ceasing to be one unwraps it (`unmirror_queue`): the messages stay where
they are, paged as before.
"""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable

from haremq.node.broker.paged_queue import LOGGED

if TYPE_CHECKING:
    from haremq.node.broker.backing_queue import BackingQueue
    from haremq.node.broker.deduplication import IdCache
    from haremq.node.broker.message import Entry, Message
    from haremq.node.broker.priority import PriorityReady
    from haremq.node.broker.queue import Queue
    from haremq.node.store.store import MessageStore

    from haremq.cluster.mirroring.replicator import Replicator


class MirroredQueue:
    """The inner backing queue, with each change also sent to the mirrors."""

    def __init__(self, inner: BackingQueue, replicator: Replicator):
        self.inner = inner
        self.replicator = replicator

    # ---- what it holds: the inner queue's ----------------------------------------------------
    @property
    def store(self) -> MessageStore | None:
        return self.inner.store

    @property
    def store_id(self) -> int:
        return self.inner.store_id

    @property
    def ready(self) -> deque[Entry] | PriorityReady:
        return self.inner.ready

    @property
    def ordered(self) -> bool:
        return self.inner.ordered

    @property
    def tail(self) -> deque[int]:
        return self.inner.tail

    @property
    def tail_keys(self) -> deque[int]:
        return self.inner.tail_keys

    @property
    def outstanding(self) -> dict[int, Entry]:
        return self.inner.outstanding

    @property
    def next_seq(self) -> int:
        return self.inner.next_seq

    @next_seq.setter
    def next_seq(self, seq: int) -> None:
        self.inner.next_seq = seq

    @property
    def message_count(self) -> int:
        return self.inner.message_count

    @property
    def message_bytes(self) -> int:
        return self.inner.message_bytes

    @property
    def paged_out(self) -> int:
        return self.inner.paged_out

    @property
    def logs(self) -> bool:
        """Every publish waits for the mirrors, transient or not."""
        return True

    # ---- messages in --------------------------------------------------------------------------
    def publish(self, message: Message, expires: float, seen: tuple[bytes, int] | None) -> int:
        """Safe only once every synchronised mirror has it too (when_safe)."""
        seq = self.inner.next_seq
        self.inner.publish(message, expires, seen)
        self.replicator.enqueue(seq, message, False, expires, seen)
        return LOGGED

    def when_safe(self, fn: Callable[..., None], *args: Any) -> None:
        """fn(ok, *args) once this node's write is durable (its fsync runs while the copies
        travel) and every in-sync mirror holds everything published so far (CONF-4, MIR-3)."""
        replicator = self.replicator
        store = self.inner.store
        if store is None:
            replicator.when_replicated(replicator.seq, True, fn, args)
        else:
            store.when_durable_meanwhile(replicator.when_replicated_after, replicator.seq, fn, args)

    def restore(self, messages: list[int]) -> None:
        self.inner.restore(messages)

    # ---- messages out -------------------------------------------------------------------------
    def has_ready(self) -> bool:
        return self.inner.has_ready()

    def pop(self) -> Entry:
        return self.inner.pop()

    def top_up(self) -> None:
        self.inner.top_up()

    def delivered(self, entry: Entry, no_ack: bool) -> None:
        self.inner.delivered(entry, no_ack)
        if no_ack:
            self.replicator.remove((entry,))
        else:
            self.replicator.deliver(entry)

    def forget(self, entries: Iterable[Entry]) -> None:
        self.replicator.remove(entries)
        self.inner.forget(entries)

    def requeue(self, entries: list[Entry]) -> None:
        self.replicator.requeue(entries)
        self.inner.requeue(entries)

    def purge(self) -> None:
        """The ready messages leave; those paged out are known to the mirrors by position only."""
        inner = self.inner
        self.replicator.remove(list(inner.ready))
        if inner.paged_out:
            self.replicator.remove_keys(list(inner.tail_keys))
        inner.purge()

    def let_go(self) -> list[int]:
        return self.inner.let_go()

    # ---- deadlines and the store: the inner queue's --------------------------------------------
    def drop_expired_heads(self, now: float) -> list[Entry]:
        return self.inner.drop_expired_heads(now)

    def next_expiry(self) -> float:
        return self.inner.next_expiry()

    def tail_deadline(self, msg_id: int) -> float:
        return self.inner.tail_deadline(msg_id)

    def restamp(self, deadline: float) -> None:
        self.inner.restamp(deadline)

    def read(self, msg_id: int) -> tuple[Message, bool]:
        return self.inner.read(msg_id)

    def keep_ids(self, cache: IdCache) -> list[tuple[bytes, int]]:
        return self.inner.keep_ids(cache)

    def forget_ids(self, cache: IdCache) -> None:
        self.inner.forget_ids(cache)

    def give_back_ids(self, cache: IdCache) -> None:
        self.inner.give_back_ids(cache)


def mirror_queue(queue: Queue, replicator: Replicator) -> None:
    """Become a mirrored queue's master: every later change goes to the replicator too (and to
    it alone: a wrapper left from an earlier replicator goes)."""
    backing = queue.backing
    if isinstance(backing, MirroredQueue):
        backing = backing.inner
    queue.backing = MirroredQueue(backing, replicator)
    replicator.start(queue)


def unmirror_queue(queue: Queue, replicator: Replicator) -> None:
    """No longer this replicator's master (deposed, unmirrored): the queue keeps its messages."""
    backing = getattr(queue, "backing", None)      # a queue homed elsewhere has none
    if isinstance(backing, MirroredQueue) and backing.replicator is replicator:
        queue.backing = backing.inner


if TYPE_CHECKING:
    def _is_a_backing_queue(queue: MirroredQueue) -> BackingQueue:
        return queue      # mypy (`make lint`) fails here unless MirroredQueue has every member of the port
