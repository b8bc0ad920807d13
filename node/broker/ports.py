"""The seams between the broker and the cluster, as typing.Protocol interfaces.

The broker (node/) is written against these and never imports the cluster;
the cluster (cluster/) implements them. Each port names its implementations,
and tests/test_ports.py checks that each still has every member.

- MetadataPort: what the broker needs of the replicated metadata. Implemented
  by cluster.node.ClusterNode, and on a single node by
  node.broker.metadata.LocalMetadata, which applies a command at once.
- QueuePort: what a channel does with a queue, local or not. Implemented by
  node.broker.queue.Queue (a master here) and cluster.remote_queue.RemoteQueue
  (a handle on a master elsewhere; the mirrored layer fails it over).
- ConsumerChannel: what a local queue asks of the channel a consumer is on.
  Implemented by node.broker.channel.Channel (a client's) and
  cluster.queue_service.LinkChannel (another node's client, over gRPC).
- RemoteCaller: what a queue asks of the channel it works for (a publish
  settled, a link opened). Implemented by Channel and
  cluster.remote_queue._NodeItself (the node dead-lettering on its own
  behalf).
"""
from __future__ import annotations

from typing import Callable, Protocol

from .commands import Command


class MetadataPort(Protocol):
    name: str

    def submit(self, command: Command, callback: Callable[..., None], *args) -> None:
        """Propose `command`; callback(result, error, *args) once it is applied here (or failed)."""

    def forward_reply(self, node: str, token: str, message) -> bool:
        """The one other thing the broker asks of the cluster: a direct reply-to message for a
        requester connected to `node`; False if there is no such node to send it to."""


class QueuePort(Protocol):
    name: str
    vhost: str
    remote: bool
    durable: bool
    auto_delete: bool
    exclusive_owner: object
    arguments: dict
    single_active: bool

    @property
    def message_count(self) -> int: ...

    @property
    def consumer_count(self) -> int: ...

    def publish_from(self, channel, message, seq: int) -> None:
        """A channel's publish; with `seq` (a confirm or a tx.commit waits for it) the channel
        hears publish_settled(ok, seq) once the queue holds it safely (or refused it)."""

    def get_from(self, channel, no_ack: bool, answer) -> None:
        """basic.get: answer(entry or None, messages left), at once or when the master answers."""

    def add_consumer(self, consumer) -> None: ...

    def remove_consumer(self, consumer) -> None: ...

    def settle(self, entries) -> None:
        """Acked: the entries are done with."""

    def requeue(self, entries) -> None:
        """Back to the queue, marked redelivered."""

    def reject(self, entries) -> None:
        """Discarded (dead-lettered if the queue says so)."""

    def dispatch(self) -> None:
        """Deliver what consumers have room for."""

    def touch(self) -> None:
        """Used: an x-expires clock starts again."""

    def apply_policy(self, definition) -> None: ...


class ConsumerChannel(Protocol):
    closed: bool

    def can_deliver(self) -> bool: ...

    def deliver(self, consumer, entry) -> None: ...

    def consumer_cancelled_by_broker(self, consumer) -> None: ...


class RemoteCaller(Protocol):
    id: int
    closed: bool
    session: object      # fail_channel(id, error), wakeup(), note_confirms(channel)

    def publish_settled(self, ok: bool, seq: int) -> None:
        """A queue holds publish `seq` safely (or refused it): a local queue says so this way."""

    def remote_settled(self, seqs, ok: bool) -> None:
        """Publishes forwarded to a queue's home are safe there (or refused, or lost)."""

    def linked_to(self, queue) -> None:
        """A queue homed elsewhere opened a link for this channel (closed when the channel ends)."""

    def republish(self, queue, message, seq: int) -> None:
        """A publish held while its queue failed over, placed on the new master."""

    def deliver_from_home(self, consumer, entry) -> None: ...

    def consumer_cancelled_by_broker(self, consumer) -> None: ...
