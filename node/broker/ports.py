"""The seams between the broker and the cluster, as typing.Protocol interfaces.

The broker (node/) is written against these and never imports the cluster;
the cluster (cluster/) implements them. Each port names its implementations;
`make lint` has mypy check (strictly, for this module) that each
implementation is its port, and tests/test_ports.py checks at run time that
each still has every member.

- MetadataPort: what the broker needs of the replicated metadata. Implemented
  by cluster.node.ClusterNode, and on a single node by
  node.broker.metadata.LocalMetadata, which applies a command at once.
- QueuePort: what a channel, a vhost and the management API do with a queue,
  local or not. Implemented by node.broker.queue.Queue (a master here) and
  cluster.links.remote_queue.RemoteQueue (a handle on a master elsewhere; the
  mirrored layer fails it over).
- ConsumerChannel: what a local queue asks of the channel a consumer is on.
  Implemented by node.broker.channel.Channel (a client's) and
  cluster.links.home.LinkChannel (another node's client, over gRPC).
- RemoteCaller: what a queue asks of the channel it works for (a publish
  settled, a link opened, a basic.get asked again). Implemented by Channel and
  node_itself.NodeItself (the node dead-lettering on its own
  behalf).

Attributes a caller only reads are read-only properties here, so that an
implementation may hold a narrower type (a RemoteQueue's `store` is always
None) or a plain attribute.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol

if TYPE_CHECKING:
    from ..protocol.replies import AMQPError
    from ..store.store import MessageStore
    from .commands import Command
    from .message import Entry, Message
    from .queue import Consumer


class MetadataPort(Protocol):
    @property
    def name(self) -> str: ...

    def submit(self, command: Command, callback: Callable[..., None], *args: Any) -> None:
        """Propose `command`; callback(result, error, *args) once it is applied here (or failed)."""

    def forward_reply(self, node: str, token: str, message: Any) -> bool:
        """The one other thing the broker asks of the cluster: a direct reply-to message for a
        requester connected to `node`; False if there is no such node to send it to."""


class QueuePort(Protocol):
    # ---- what it is ------------------------------------------------------------------------
    @property
    def name(self) -> str: ...

    @property
    def vhost(self) -> str: ...

    @property
    def remote(self) -> bool:
        """Homed on another node: a handle, not the messages."""

    @property
    def durable(self) -> bool: ...

    @property
    def auto_delete(self) -> bool: ...

    @property
    def exclusive_owner(self) -> object: ...

    @property
    def arguments(self) -> dict[str, Any]: ...

    @property
    def single_active(self) -> bool: ...

    @property
    def store(self) -> MessageStore | None:
        """Where a durable local queue logs its messages (a delivery's DELIVER record gates the
        socket write on it); None for a transient queue and for a queue homed elsewhere."""

    def describe(self) -> str:
        """"queue 'q' in vhost 'v'", as reply texts name it."""

    # ---- statistics: management, /metrics, queue.declare-ok -------------------------------
    @property
    def message_count(self) -> int: ...

    @property
    def consumer_count(self) -> int: ...

    @property
    def unacked(self) -> int:
        """Delivered to a consumer with manual acks and not settled yet."""

    @property
    def published_total(self) -> int:
        """Counters since the queue was made here, never reset (rates are their deltas); a queue
        homed elsewhere counts nothing here (its home does)."""

    @property
    def delivered_total(self) -> int: ...

    @property
    def acked_total(self) -> int: ...

    @property
    def message_bytes(self) -> int:
        """Bodies of the ready messages, in memory and paged out."""

    @property
    def paged_out(self) -> int:
        """Ready messages waiting on disk as ids only."""

    @property
    def dedup_stats(self) -> dict[str, int | None]:
        """x-message-deduplication's fields for list-queues and the management API (empty for a
        queue homed elsewhere)."""

    # ---- what a channel does with it ------------------------------------------------------
    def publish_from(self, channel: RemoteCaller, message: Message, seq: int) -> None:
        """A channel's publish; with `seq` (a confirm or a tx.commit waits for it) the channel
        hears publish_settled(ok, seq) once the queue holds it safely (or refused it)."""

    def get_from(self, channel: RemoteCaller, no_ack: bool, answer: Callable[[Entry | None, int], None]) -> None:
        """basic.get: answer(entry or None, messages left), at once or when the master answers."""

    def add_consumer(self, consumer: Consumer, consumed: Callable[[], None] | None = None) -> None:
        """basic.consume; `consumed` is called once the consumer is in place (at once, or when the
        home node says so), before anything is delivered to it."""

    def prefetch_changed(self, consumer: Consumer) -> None:
        """basic.qos changed the consumer's cap (a home node elsewhere keeps it)."""

    def remove_consumer(self, consumer: Consumer) -> None: ...

    def settle(self, entries: list[Entry]) -> None:
        """Acked: the entries are done with."""

    def requeue(self, entries: list[Entry]) -> None:
        """Back to the queue, marked redelivered."""

    def reject(self, entries: list[Entry]) -> None:
        """Discarded (dead-lettered if the queue says so)."""

    def dispatch(self) -> None:
        """Deliver what consumers have room for."""

    def touch(self) -> None:
        """Used: an x-expires clock starts again."""

    def purge_from(self, answer: Callable[[int | None, AMQPError | None], None]) -> None:
        """queue.purge: answer(count, error), at once or when the master answers."""

    def stats_from(self, answer: Callable[[tuple[int, int] | None, AMQPError | None], None]) -> None:
        """queue.declare-ok's counts: answer((messages, consumers), error)."""

    def unlink(self, channel: RemoteCaller, carry: bool = False) -> None:
        """The channel is done with the queue: a link to a home node elsewhere closes (the home
        requeues what is still out; with `carry`, what the link held goes to a new master)."""

    # ---- what its vhost does with it -------------------------------------------------------
    def apply_policy(self, definition: dict[str, Any] | None) -> None: ...

    def mark_deleted(self) -> list[Consumer]:
        """Deleted: the consumers to tell with basic.cancel."""


class ConsumerChannel(Protocol):
    @property
    def closed(self) -> bool: ...

    def can_deliver(self) -> bool: ...

    def deliver(self, consumer: Consumer, entry: Entry) -> None: ...

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None: ...


class RemoteCaller(Protocol):
    @property
    def id(self) -> int: ...

    @property
    def closed(self) -> bool: ...

    @property
    def session(self) -> Any:
        """fail_channel(id, error), wakeup(), note_confirms(channel)."""

    def publish_settled(self, ok: bool, seq: int) -> None:
        """A queue holds publish `seq` safely (or refused it): a local queue says so this way."""

    def remote_settled(self, seqs: Iterable[int], ok: bool) -> None:
        """Publishes forwarded to a queue's home are safe there (or refused, or lost)."""

    def linked_to(self, queue: QueuePort) -> None:
        """A queue homed elsewhere opened a link for this channel (unlinked when the channel ends)."""

    def republish(self, queue: QueuePort, message: Message, seq: int) -> None:
        """A publish held while its queue failed over, placed on the new master."""

    def get_again(self, name: str, no_ack: bool) -> None:
        """A basic.get held while its queue failed over, asked again of the new master."""

    def deliver_from_home(self, consumer: Consumer, entry: Entry) -> None: ...

    def consumer_cancelled_by_broker(self, consumer: Consumer) -> None: ...
