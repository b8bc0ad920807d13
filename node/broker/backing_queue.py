"""The backing-queue port: what a `Queue` keeps its messages in.

A `Queue` (node/broker/queue.py) owns consumers, dispatch and policies; its
messages, their positions and what the store holds of them are its backing
queue's. `paged_queue.PagedQueue` is the one that holds them (in memory, and
paged out to the store); a mirrored queue's master wraps it in
`cluster.mirroring.mirrored_queue.MirroredQueue`, which reports every change to
the mirrors and holds confirms until they have it, as RabbitMQ's
`rabbit_mirror_queue_master` wraps another `backing_queue`. A mirror keeps its
copy in a `PagedQueue` too, so a promotion hands that copy to the queue and
wraps it; demotion unwraps. The Queue never asks which it has.
`make lint` checks strictly that each implementation is this port.
"""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol

if TYPE_CHECKING:
    from ..store.store import MessageStore
    from .deduplication import IdCache
    from .message import Entry, Message
    from .priority import PriorityReady


class BackingQueue(Protocol):
    # ---- what it holds (read by the queue, and by a mirror's sync) ---------------------------
    @property
    def store(self) -> MessageStore | None:
        """Where its messages are logged; None for a transient queue."""

    @property
    def store_id(self) -> int: ...

    @property
    def ready(self) -> deque[Entry] | PriorityReady:
        """The head, in memory: in position order (by level for a priority queue)."""

    @property
    def ordered(self) -> bool:
        """`ready` is in position order (not a priority queue's levels)."""

    @property
    def tail(self) -> deque[int]:
        """Store ids of the paged-out messages, oldest first, all newer than `ready` (but for a
        priority queue's copy taken over from a mirror, read in at its positions as it lands)."""

    @property
    def tail_keys(self) -> deque[int]:
        """The positions of the paged-out messages."""

    @property
    def outstanding(self) -> dict[int, Entry]:
        """Delivered and not settled yet, by position."""

    next_seq: int
    """The position the next message gets (raised past a promoted master's keys)."""

    @property
    def message_count(self) -> int: ...

    @property
    def message_bytes(self) -> int: ...

    @property
    def paged_out(self) -> int: ...

    @property
    def logs(self) -> bool:
        """A publish waits for something (an fsync, the mirrors) before it is confirmed."""

    # ---- messages in --------------------------------------------------------------------------
    def publish(self, message: Message, expires: float, seen: tuple[bytes, int] | None) -> int:
        """Append at the next position: SAFE, or LOGGED (then when_safe says when)."""

    def when_safe(self, fn: Callable[..., None], *args: Any) -> None:
        """fn(ok, *args) once everything published so far is as safe as a confirm promises."""

    def restore(self, messages: list[int]) -> None:
        """Store ids recovered at start, in order."""

    # ---- messages out -------------------------------------------------------------------------
    def has_ready(self) -> bool: ...

    def pop(self) -> Entry: ...

    def top_up(self) -> None: ...

    def delivered(self, entry: Entry, no_ack: bool) -> None: ...

    def forget(self, entries: Iterable[Entry]) -> None: ...

    def requeue(self, entries: list[Entry]) -> None: ...

    def purge(self) -> None: ...

    def let_go(self) -> list[int]: ...

    # ---- deadlines ----------------------------------------------------------------------------
    def drop_expired_heads(self, now: float) -> list[Entry]: ...

    def next_expiry(self) -> float: ...

    def tail_deadline(self, msg_id: int) -> float: ...

    def restamp(self, deadline: float) -> None: ...

    # ---- the store ----------------------------------------------------------------------------
    def read(self, msg_id: int) -> tuple[Message, bool]: ...

    def keep_ids(self, cache: IdCache) -> list[tuple[bytes, int]]: ...

    def forget_ids(self, cache: IdCache) -> None: ...

    def give_back_ids(self, cache: IdCache) -> None: ...
