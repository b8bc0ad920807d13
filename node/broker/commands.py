"""Every metadata command, typed: what a node proposes to the cluster's log and applies from it.

The broker speaks to the replicated metadata only in these dataclasses; the
cluster's state machine (cluster/metadata.py) applies each through an
explicit table keyed by its class. On the log a command is the JSON object
it has always been, `{"op": "queue.declare", ...fields}`, so a node
replaying a log written before these classes existed applies it unchanged;
a field an old entry lacks takes its default here. Argument tables are AMQP
field tables in a command and their wire encoding (base64) on the log: only
a command that goes to the log is encoded, so a single node applies the
client's table as it came.

Admin calls (users, vhosts, permissions, policies) reach the Broker only by
a name in `ADMIN_CHANGES` or `ADMIN_READS`, never by any attribute a request names.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from ..protocol.tables import decode_table, encode_table


@dataclass(frozen=True)
class Command:
    op: ClassVar[str] = ""      # its name on the log, given as `class X(Command, op="...")`

    def __init_subclass__(cls, op: str = "", **kwargs):
        super().__init_subclass__(**kwargs)
        if op:
            cls.op = op

    def to_json(self) -> dict:
        data = {"op": self.op, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}
        if "arguments" in data:
            data["arguments"] = encode_table(data["arguments"])
        return data

    def fields(self) -> dict:
        """The command as the mirroring code reads it: its log form."""
        return self.to_json()


@dataclass(frozen=True)
class Noop(Command, op="noop"):
    """A new Raft leader's first entry (it commits the entries of earlier terms), with the
    members as it sees them: the first one a log holds fixes the cluster's members for placement
    (cluster/metadata.py's `placement_members`); member.add and member.forget change them."""
    leader: str = ""
    members: list = dataclasses.field(default_factory=list)


@dataclass(frozen=True)
class ExchangeDeclare(Command, op="exchange.declare"):
    vhost: str
    name: str
    type: str
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: dict              # the AMQP table (encode_table'd on the log)
    method_index: int = 0        # the AMQP method that proposed it: the class/method ids of its errors


@dataclass(frozen=True)
class ExchangeDelete(Command, op="exchange.delete"):
    vhost: str
    name: str
    if_unused: bool
    method_index: int = 0


@dataclass(frozen=True)
class Bind(Command, op="bind"):
    """queue.bind or exchange.bind (kind "queue" or "exchange")."""
    vhost: str
    kind: str
    source: str
    destination: str
    routing_key: str
    arguments: dict
    owner: str | None = None     # the proposing connection's key (exclusive queues)
    method_index: int = 0


class Unbind(Bind, op="unbind"):
    """queue.unbind or exchange.unbind: unbinding nothing is fine."""


@dataclass(frozen=True)
class QueueDeclare(Command, op="queue.declare"):
    vhost: str
    name: str
    durable: bool
    exclusive: bool
    auto_delete: bool
    arguments: dict
    home: str                    # the node that masters it: the declaring client's
    owner: str | None = None
    method_index: int = 0


@dataclass(frozen=True)
class QueueDelete(Command, op="queue.delete"):
    """Unconditional once on the log: its preconditions are checked by the proposer, once."""
    vhost: str
    name: str
    owner: str | None = None
    if_unused: bool = False
    if_empty: bool = False
    method_index: int = 0


@dataclass(frozen=True)
class NodeEvent(Command):
    node: str


@dataclass(frozen=True)
class NodeRestarted(NodeEvent, op="node.restarted"):
    """A node came back: what did not survive its restart goes. The node applies its own entry
    of this incarnation as the end of its replay: what the log says before it is history."""
    incarnation: str = ""


@dataclass(frozen=True)
class NodeDown(NodeEvent, op="node.down"):
    """The members agree the node is down (the leader proposes it): the connections it served are
    gone, and what they owned goes with them on every member, as RabbitMQ's on_node_down does.
    `since` is the log index of the node's last return (node.restarted or node.resumed) as the
    leader knew it: if the node has returned since, the entry is void."""
    since: int = 0


class NodeResumed(NodeEvent, op="node.resumed"):
    """A node that paused (pause-minority) sees a majority again and serves from this entry on:
    a node.down decided before it is void. The node serves no client until it has applied it."""


class NodeStopping(NodeEvent, op="node.stopping"):
    """ha-promote-on-shutdown decides for the queues it masters."""


class MemberForget(NodeEvent, op="member.forget"):
    """`haremq ctl forget-node`."""


@dataclass(frozen=True)
class MemberAdd(Command, op="member.add"):
    """A new member found by DNS joins (cluster/membership/discovery.py): counted from this entry on."""
    node: str
    address: str


@dataclass(frozen=True)
class QueuePromote(Command, op="queue.promote"):
    """The master moves to `home`. For a quorum queue `incarnation` is the member's as it
    answered the election (cluster/mirroring/election.py): void if it restarted since."""
    vhost: str
    name: str
    home: str
    epoch: int
    from_epoch: int
    shutdown: bool = False
    incarnation: str = ""


@dataclass(frozen=True)
class QueueMirrorSynced(Command, op="queue.mirror_synced"):
    """A mirror joins the queue's in-sync set (in the queue's epoch), if the member is still the
    incarnation the master streamed to (its node.restarted entry's): a mirror that restarted
    meanwhile holds nothing."""
    vhost: str
    name: str
    node: str
    epoch: int
    incarnation: str = ""


class QueueMirrorDropped(QueueMirrorSynced, op="queue.mirror_dropped"):
    """A mirror leaves the in-sync set."""


@dataclass(frozen=True)
class QueueMember(Command, op="queue.member"):
    """A quorum-declared queue's members change (`haremq ctl add-member`, `delete-member`,
    `grow`, `shrink`): a member is added (it syncs and joins the in-sync set) or removed."""
    vhost: str
    name: str
    node: str
    add: bool


@dataclass(frozen=True)
class BrokerCall(Command, op="broker.call"):
    """An admin change applied on every member, in log order (see ADMIN_CHANGES)."""
    method: str
    args: list = dataclasses.field(default_factory=list)


COMMANDS: dict[str, type[Command]] = {cls.op: cls for cls in (
    Noop, ExchangeDeclare, ExchangeDelete, Bind, Unbind, QueueDeclare, QueueDelete, NodeRestarted,
    NodeDown, NodeResumed, NodeStopping, MemberForget, MemberAdd, QueuePromote, QueueMirrorSynced,
    QueueMirrorDropped, QueueMember, BrokerCall)}


def from_json(data: dict) -> Command | None:
    """A log entry as its command; None for an op this version does not know (it is skipped,
    as it always was). An entry naming a field the command lacks is refused loudly."""
    cls = COMMANDS.get(data.get("op"))
    if cls is None:
        return None
    fields = {k: v for k, v in data.items() if k != "op"}
    if "arguments" in fields:
        fields["arguments"] = decode_table(fields["arguments"])
    return cls(**fields)


# ---- admin calls ------------------------------------------------------------------------------
class AdminCallError(Exception):
    """An admin call a node refused (cluster.control.errors.ControlError is one), in one line."""


# The Broker methods `haremq ctl` and the management API may run, by name. A change goes
# through the metadata log (every member applies it); a read is answered by the node asked.
ADMIN_CHANGES = frozenset({
    "add_user", "delete_user", "change_password", "set_user_tags",
    "add_vhost", "delete_vhost", "set_permissions", "clear_permissions",
    "set_policy", "clear_policy", "import_definitions",
    "set_vm_memory_high_watermark", "set_disk_free_limit",
})
ADMIN_READS = frozenset({
    "list_users", "list_vhosts", "list_permissions", "list_policies", "export_definitions",
    "resource_status",
})


def admin_method(broker, name: str, read: bool = False):
    """The bound Broker method an admin call names, or None if it is no such call
    (a read names a read, a change a change)."""
    if name not in (ADMIN_READS if read else ADMIN_CHANGES):
        return None
    return getattr(broker, name, None)
