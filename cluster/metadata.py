"""The replicated metadata state machine: Raft entries applied to the broker, in log order.

Every node applies every committed entry, so all nodes hold the same
exchanges, bindings and queue records and route locally. A queue is a real
`Queue` on its home node and a `RemoteQueue` handle everywhere else. The
result of applying an entry (or the AMQP error it raised) is handed back to
the channel that proposed it, which replies to its client only then.

Its snapshots, which compact the Raft log, are cluster/metadata_snapshot.py's.
"""
from __future__ import annotations

import json
import uuid
from typing import Callable

import structlog

from haremq.node.broker import commands as C
from haremq.node.broker.message import Entry
from haremq.node.broker.metadata import bind, declare_exchange, delete_exchange, owner_node, owner_of, vhost_of
from haremq.node.broker.metadata import method_of as _method
from haremq.node.protocol.replies import AMQPError, ReplyCode

from haremq.cluster.links.remote_queue import RemoteQueue, fingerprint, hand_over
from haremq.cluster import metadata_snapshot
from haremq.cluster.mirroring.policy import EPOCH_KEY_BITS


SETTINGS = ("set_vm_memory_high_watermark", "set_disk_free_limit")   # broker calls a snapshot keeps as calls



def error_result(err: AMQPError) -> dict:
    return {"error": [int(err.code), err.text, err.class_id, err.method_id]}


def raise_result(result) -> dict:
    """Turn an applied entry's result back into the AMQP error it carried, if any."""
    if isinstance(result, dict) and "error" in result:
        code, text, class_id, method_id = result["error"]
        err = AMQPError(ReplyCode(code), text.split(" - ", 1)[-1], class_id, method_id)
        raise err
    return result


class MetadataMachine:
    def __init__(self, node_name: str, broker, peers, call_metadata, is_up=lambda _n: True, *,
                 recovered: dict[int, list] | None = None, mirroring=None, tasks=None, on_home_lost=None,
                 on_forget=None, on_add=None, on_removed=None, on_node_down=None):
        """The node's parts it acts on, all given here (cluster/node.py): `recovered`, the
        queues the store recovered (store id -> message ids), each taken by its queue once
        the log declares it again; `mirroring` (cluster.mirroring.manager.Mirroring); `tasks`,
        the cluster node's task group (remote queues' calls); and what it calls back:
        on_home_lost(name) a queue's home failed a call, on_forget(name) the membership stops
        counting that member, on_add(name, address) a new member is counted and pinged,
        on_removed(None) this node itself was forgotten, on_node_down(name) node.down applied
        (not replaying): end what its clients held here."""
        self.node = node_name
        self.broker = broker
        self.peers = peers          # a callable: name -> cluster.membership.members.Peer | None
        self.call_metadata = call_metadata
        self.is_up = is_up
        self.on_home_lost = on_home_lost
        self.on_forget = on_forget
        self.on_add = on_add
        self.on_removed = on_removed
        self.on_node_down = on_node_down
        # member -> the log index of its last return (node.restarted, node.resumed), and of the
        # return after which node.down was applied: the leader's watch (cluster/membership/node_down.py)
        # proposes node.down for a member agreed down whose last return is not yet marked down
        self.returned: dict[str, int] = {}
        self.down: dict[str, int] = {}
        self.recovered: dict[int, list] = dict(recovered or {})
        self.members: dict[str, str | None] = {}   # member.add (its address) and member.forget (None)
        # the cluster's members as the log says them (its first noop naming them, then member.add
        # and member.forget): mirrors and quorum members are placed on these, so every node, whatever
        # its own peer list or when it joined, places each queue alike. None: a log from before.
        self.placement_members: list[str] | None = None
        self.settings: dict[str, list] = {}        # the last of each SETTINGS broker call
        # Until this node applies its own node.restarted entry of this incarnation, what it
        # applies is history: the state is rebuilt, the store, the mirrors and the clients are
        # not acted on (a queue's master moving away and back again must not empty it).
        self.incarnation = uuid.uuid4().hex
        self.replaying = True
        self.mirroring = mirroring
        self.tasks = tasks
        self.log = structlog.get_logger("haremq.metadata").bind(node=node_name)

    def apply(self, index: int, command: bytes):
        c = C.from_json(json.loads(command))
        if c is None:
            return None
        try:
            return APPLY[type(c)](self, index, c)
        except AMQPError as err:
            return error_result(err)

    def _vhost(self, c):
        return vhost_of(self.broker, c["vhost"])

    def _vhost_named(self, name: str):
        return vhost_of(self.broker, name)

    def _owner(self, key: str | None):
        return owner_of(self.broker, key)

    # ---- entries ---------------------------------------------------------------------------
    def _noop(self, index, c):
        if self.placement_members is None and c.members:
            self.placement_members = sorted(c.members)
        return None

    def _exchange_declare(self, index, c):
        return declare_exchange(self.broker, c)

    def _exchange_delete(self, index, c):
        return delete_exchange(self.broker, c)

    def _bind(self, index, c):
        return bind(self.broker, c)

    def _queue_declare(self, index, c):
        """The proposer named the queue and refused a reserved name already (an `amq.gen-` name
        is its own choice): every node takes the name as it is on the log."""
        vhost = self._vhost_named(c.vhost)
        owner = self._owner(c.owner)
        name = c.name
        arguments = c.arguments
        existing = vhost.queues.get(name)
        if existing is not None:
            queue = vhost.declare_queue(name, False, c.durable, c.exclusive, c.auto_delete, arguments,
                                        owner, _method(c.method_index), server_named=True)
            return {"queue": queue.name, "home": getattr(queue, "home", self.node)}
        logged = c.durable and not c.exclusive
        if c.home == self.node:
            queue = vhost.declare_queue(name, False, c.durable, c.exclusive, c.auto_delete, arguments,
                                        owner, _method(c.method_index), server_named=True,
                                        store_id=index if logged else 0)
            if logged and index in self.recovered:
                queue.restore(self.recovered.pop(index))
            if self.replaying:
                queue.hold_expiry()      # armed when the replay is over, on the log's last word
        else:
            vhost.validate_new_queue(name, arguments, c.durable, c.exclusive, c.auto_delete, _method(c.method_index))
            queue = self._remote_queue(vhost, name, c.home, c.durable, owner if c.exclusive else None,
                                       c.auto_delete, arguments)
            vhost.queues[name] = queue
        if self.mirroring is not None:
            self.mirroring.declared(queue, c.home, index if logged else 0)
        return {"queue": name, "home": c.home}

    def _remote_queue(self, vhost, name, home, durable, owner, auto_delete, arguments) -> RemoteQueue:
        remote = RemoteQueue(name, vhost.name, home, self.peers, durable=durable, exclusive_owner=owner,
                             auto_delete=auto_delete, arguments=arguments, metadata=self.call_metadata,
                             home_up=self.is_up, on_home_lost=self.on_home_lost, tasks=self.tasks)
        remote.apply_policy(vhost.policy_definition(name))     # what of it is ours: the consumer timeout
        return remote

    def _queue_delete(self, index, c):
        vhost = self._vhost_named(c.vhost)
        queue = vhost.queues.get(c.name)
        if queue is None:
            return {"message_count": 0}
        if isinstance(queue, RemoteQueue):
            vhost.remove_queue(queue)
            count = None
        else:
            count = vhost.delete_queue(c.name, c.if_unused, c.if_empty, self._owner(c.owner),
                                       _method(c.method_index))
        if self.mirroring is not None:
            self.mirroring.deleted(vhost.name, c.name)
        return {"message_count": count}

    def _node_restarted(self, index, c):
        """A node came back: its transient queues (and exclusive ones) did not survive it, its
        mirrors start empty, and consumers still waiting for a failover of a queue homed there
        get basic.cancel."""
        for vhost in self.broker.vhosts.values():
            for queue in list(vhost.queues.values()):
                home = getattr(queue, "home", self.node)
                if home != c.node:
                    continue
                if not queue.durable or queue.exclusive_owner is not None:
                    if self.mirroring is not None:
                        self.mirroring.deleted(vhost.name, queue.name)
                    vhost.remove_queue(queue)
                elif queue.remote and c.node != self.node:
                    for consumer in queue.drop_orphans():
                        consumer.channel.consumer_cancelled_by_broker(consumer)
        if self.mirroring is not None:
            self.mirroring.node_restarted(c.node, c.incarnation)
        self.returned[c.node] = index
        if c.node == self.node and c.incarnation == self.incarnation and self.replaying:
            self._replayed(index)
        return {}

    def _node_resumed(self, index, c):
        """A node that paused (pause-minority) serves again from here: a node.down the leader
        decided before this entry, on its earlier view of the node, is void."""
        self.returned[c.node] = index
        return {}

    def _node_down(self, index, c):
        """The members agree a node is down (a majority's view; the leader proposes it): the
        connections it served are gone, and everything they owned goes, as RabbitMQ's
        on_node_down does. Every member applies this in log order:

        - their exclusive queues are deleted, and so are the node's non-durable queues that no
          mirror takes over (homed on that node: RemoteQueue handles here, the real queues on
          the node itself, when it applies the entry on its return);
        - not replaying, `on_node_down` ends what they held on queues mastered here: the queue
          links their channels opened to this node close, so their consumers are removed (a
          single-active consumer hands over, an auto-delete queue whose last consumer that was
          is deleted) and what they had not acked is requeued as redelivered. A link's stream
          usually broke already when the node went (cluster/links/home.py requeues then);
          this entry ends one that did not. On the node itself, its clients are closed (320).

        Void if the node came back since the leader decided (`since` is the log index of the
        node's last node.restarted or node.resumed the leader had applied): a node that was
        merely cut off and returns never loses what clients it serves after its return own.

        Pause-minority, as in RabbitMQ: a node in the minority closes its clients itself (320)
        and its own proposals to delete their exclusive queues cannot commit, so the majority
        deleting them is what a client reconnecting elsewhere needs (RabbitMQ 3.10 answers 404
        at once). A returning node serves only after its node.resumed entry is applied, which
        comes after any node.down decided while it was away; one that never paused (stopped by
        SIGSTOP, or the others stopped hearing it first) closes its clients when it applies its
        own node.down, since what they owned is gone cluster-wide. Clients on the majority side
        are never touched."""
        since = self.returned.get(c.node, 0)
        if since != c.since or self.down.get(c.node) == since:
            return {"down": False}
        self.down[c.node] = since
        deleted = {"exclusive_queues_deleted": 0, "transient_queues_deleted": 0}
        for vhost in self.broker.vhosts.values():
            for queue in list(vhost.queues.values()):
                if self._owned_by(queue, c.node):
                    deleted["exclusive_queues_deleted"] += 1
                elif self._transient_on(vhost, queue, c.node):
                    deleted["transient_queues_deleted"] += 1
                else:
                    continue
                if self.mirroring is not None:
                    self.mirroring.deleted(vhost.name, queue.name)
                vhost.remove_queue(queue)
        if not self.replaying:
            self.log.warning("member down: what its connections owned goes", member=c.node, **deleted)
            if self.on_node_down is not None:
                self.on_node_down(c.node)
        return {"down": True, **deleted}

    @staticmethod
    def _owned_by(queue, node: str) -> bool:
        owner = queue.exclusive_owner
        return owner is not None and owner_node(getattr(owner, "key", None)) == node

    def _transient_on(self, vhost, queue, node: str) -> bool:
        """A non-durable queue homed on `node` with no mirror to take it over goes with the node,
        as RabbitMQ's on_node_down deletes transient queues that are not replicated."""
        if queue.durable or getattr(queue, "home", self.node) != node:
            return False
        state = self.mirroring.states.get((vhost.name, queue.name)) if self.mirroring is not None else None
        return state is None or not state.mirrors

    def _replayed(self, index: int) -> None:
        """The log is replayed up to this node's return: the recovered messages of queues it does
        not master are dropped (the master has them), then it takes its part in every queue."""
        self.replaying = False
        if self.members.get(self.node, "") is None and self.on_removed is not None:
            self.on_removed(None)      # forgotten, and not added again since
            return
        for vhost in self.broker.vhosts.values():
            for queue in vhost.queues.values():
                if not queue.remote:
                    queue.touch()        # x-expires counts from here, as from a node's start
        dropped = self.discard_unclaimed()
        self.log.info("metadata log replayed", index=index, recovered_dropped=dropped)
        if self.mirroring is not None:
            self.mirroring.replayed()

    def _node_stopping(self, index, c):
        """A node is shutting down on purpose: ha-promote-on-shutdown decides for its queues."""
        if self.mirroring is not None:
            self.mirroring.stopping.add(c.node)
        return {}

    def _member_add(self, index, c):
        """A new member joined (cluster/membership/discovery.py): every member starts pinging it and counts it
        in the majority from this entry on; the leader sends it the log from the start."""
        self.members[c.node] = c.address
        if self.placement_members is not None and c.node not in self.placement_members:
            self.placement_members = sorted([*self.placement_members, c.node])
            if self.mirroring is not None:
                self.mirroring.policies_changed()    # ha-mode all (or nodes) may now take it in
        if self.on_add is not None:
            self.on_add(c.node, c.address)
        return {"added": c.node, "index": index}

    def _member_forget(self, index, c):
        """`haremq ctl forget-node`: the member leaves the cluster for good. As with RabbitMQ's
        forget_cluster_node, its queues go, except mirrored ones with a synchronised mirror,
        which fail over; mirrors it held are placed again on the members left."""
        name = c.node
        self.members[name] = None
        if self.placement_members is not None and name in self.placement_members:
            self.placement_members = [n for n in self.placement_members if n != name]
        if name == self.node:
            # in a replay, an earlier membership's: a member forgotten, wiped and added again
            # replays its old forget before its new member.add (checked once replayed)
            if self.on_removed is not None and not self.replaying:
                self.on_removed(None)
            return {"forgotten": False}
        if self.on_forget is not None:
            self.on_forget(name)
        for vhost in self.broker.vhosts.values():
            for queue in list(vhost.queues.values()):
                if getattr(queue, "home", self.node) != name:
                    continue
                state = self.mirroring.states.get((vhost.name, queue.name)) if self.mirroring else None
                if state is not None and state.synced:
                    continue
                if self.mirroring is not None:
                    self.mirroring.deleted(vhost.name, queue.name)
                vhost.remove_queue(queue)
        if self.mirroring is not None:
            self.mirroring.member_forgotten(name)
        self.log.warning("member forgotten", member=name)
        return {"forgotten": True}

    # ---- mirrored queues (cluster/mirroring/manager.py) ------------------------------------------------
    def _queue_promote(self, index, c):
        if self.mirroring is None:
            return {}
        return {"promoted": self.mirroring.promoted(c.fields(), self._become_master, self._become_remote)}

    def _queue_mirror_synced(self, index, c):
        if self.mirroring is None:
            return {"synced": False}
        return {"synced": self.mirroring.mirror_synced(c.fields())}

    def _queue_member(self, index, c):
        if self.mirroring is None:
            raise AMQPError(ReplyCode.NOT_FOUND, f"no quorum queue '{c.name}' in vhost '{c.vhost}'")
        return {"changed": self.mirroring.member_changed(c.vhost, c.name, c.node, c.add)}

    def _queue_mirror_dropped(self, index, c):
        if self.mirroring is not None:
            self.mirroring.mirror_dropped(c.fields())
        return {}

    def _become_master(self, state, old, mirror) -> None:
        """This node's mirror is the master now: a real queue taking over its copy (or, replaying
        the log after a restart, from the store), with the old handle's bindings and consumers."""
        vhost = self._vhost({"vhost": state.vhost})
        queue = vhost.add_queue(state.name, old.durable, None, old.auto_delete, old.arguments, state.store_id)
        if mirror is not None:
            self._adopt(queue, old, mirror)
        elif state.store_id in self.recovered:
            queue.restore(self.recovered.pop(state.store_id))
        # new messages get keys no earlier master can have given: another node's memory of what
        # its client acked (by key and content) must never match a new, identical message
        queue.next_seq = max(queue.next_seq, state.epoch << EPOCH_KEY_BITS)
        vhost.rebind(old, queue)
        old.replacement = queue          # calls that waited on the old handle are answered here

        def attach(consumer) -> None:
            consumer.queue = queue
            queue.add_consumer(consumer)
        hand_over(old.abandon(), attach)
        held = old.take_held()                              # publishes that waited for this master
        if held:
            self.log.info("publishes carried to the queue's master", vhost=state.vhost, queue=state.name,
                          home=self.node, epoch=state.epoch, publishes=len(held))
        for channel, seq, message in held:
            if self.mirroring is not None and self.mirroring.holds_already(queue, message):
                self.mirroring.confirm_held(queue, lambda ok, s=seq, ch=channel: ch.remote_settled((s,), ok))
            else:
                channel.republish(queue, message, seq)
        old.replay_parked()

    def _adopt(self, queue, old, mirror) -> None:
        """The mirror's copy becomes the queue's, less what this node's clients acked through the
        old master (their acks never reached the mirrors); what its clients still hold stays
        delivered to them, settled when they answer (old.successor). Everything else as the
        mirror had it."""
        backing, dedup = mirror.hand_over()
        if backing.max_priority != queue.max_priority:
            self.log.warning("the mirror's copy is reshaped for the queue's priorities", vhost=queue.vhost,
                             queue=queue.name, copy=backing.max_priority, queue_max_priority=queue.max_priority)
            backing = backing.reshaped(queue.max_priority)
        acked, held_keys, acked_ids = old.doubts()
        if self.mirroring is not None:
            self.mirroring.adopted(queue, acked_ids)
        if acked or held_keys:
            gone, hold = [], []
            for key in {*acked, *held_keys}:
                entry = backing.entry_at(key)       # a paged-out one is read, to compare
                if entry is None:
                    continue
                if acked.get(key) == fingerprint(entry.message):
                    gone.append(key)
                elif held_keys.get(key) == fingerprint(entry.message):
                    hold.append(entry)
            backing.remove_keys(gone)
            backing.remove_keys([entry.seq for entry in hold], ack=False)
            held = {}
            for entry in hold:
                held[entry.seq] = backing.outstanding[entry.seq] = Entry(entry.message, entry.seq, True,
                                                                         entry.msg_id, entry.expires)
            old.successor = (queue, held)
            self.log.info("adopted the mirror's messages", vhost=queue.vhost, queue=queue.name,
                          messages=backing.message_count, acked_here=len(acked), held_here=len(held_keys),
                          dropped=len(gone), held=len(hold))
        queue.take_over(backing, dedup)       # its next position is past every key the copy holds

    def _become_remote(self, state, queue) -> None:
        """Deposed (MIR-5): this node's copy is dropped; it is a mirror, if anything, from now on.
        Replaying, the copy goes back among the recovered messages, untouched in the store."""
        vhost = self._vhost({"vhost": state.vhost})
        remote = self._remote_queue(vhost, queue.name, state.home, queue.durable, None, queue.auto_delete,
                                    queue.arguments)
        vhost.queues[queue.name] = remote
        vhost.rebind(queue, remote)
        if self.replaying:
            ids = queue.let_go()
            if ids and queue.store is not None:
                self.recovered[state.store_id] = ids
            return
        self.log.warning("deposed: this node's copy of the queue is dropped", vhost=vhost.name, queue=queue.name,
                         messages=queue.message_count, master=state.home, epoch=state.epoch)
        for consumer in queue.mark_deleted():
            consumer.channel.consumer_cancelled_by_broker(consumer)

    def discard_unclaimed(self) -> int:
        """After replaying the log: recovered messages of queues this node no longer masters
        (it was deposed, or held them as a mirror) are dropped; the master has them."""
        store = self.broker.store
        count = 0
        for store_id, messages in self.recovered.items():
            ids = list(messages)
            count += len(ids)
            if store is not None and ids:
                store.ack(store_id, ids)
        self.recovered.clear()
        return count

    def _broker_call(self, index, c):
        method = C.admin_method(self.broker, c.method)
        if method is None:
            return {"error": [540, f"NOT_IMPLEMENTED - {c.method}", 0, 0]}
        try:
            result = {"result": _jsonable(method(*c.args))}
        except (ValueError, KeyError, LookupError) as exc:
            return {"error": [406, f"PRECONDITION_FAILED - {exc}", 0, 0]}
        if self.mirroring is not None and "polic" in c.method:
            self.mirroring.policies_changed()
        if c.method in SETTINGS:
            self.settings[c.method] = list(c.args)
        return result

    # ---- snapshots (cluster/metadata_snapshot.py) ---------------------------------------------
    def snapshot(self) -> tuple[Callable[[], bytes], int]:
        return metadata_snapshot.capture(self)

    def restore(self, index: int, state: dict) -> None:
        metadata_snapshot.restore(self, index, state)


def _jsonable(value):
    from haremq.cluster.control.server import _jsonable as convert
    return convert(value)


APPLY = {
    C.Noop: MetadataMachine._noop,
    C.ExchangeDeclare: MetadataMachine._exchange_declare,
    C.ExchangeDelete: MetadataMachine._exchange_delete,
    C.Bind: MetadataMachine._bind,
    C.Unbind: MetadataMachine._bind,
    C.QueueDeclare: MetadataMachine._queue_declare,
    C.QueueDelete: MetadataMachine._queue_delete,
    C.NodeRestarted: MetadataMachine._node_restarted,
    C.NodeResumed: MetadataMachine._node_resumed,
    C.NodeDown: MetadataMachine._node_down,
    C.NodeStopping: MetadataMachine._node_stopping,
    C.MemberForget: MetadataMachine._member_forget,
    C.MemberAdd: MetadataMachine._member_add,
    C.QueuePromote: MetadataMachine._queue_promote,
    C.QueueMirrorSynced: MetadataMachine._queue_mirror_synced,
    C.QueueMirrorDropped: MetadataMachine._queue_mirror_dropped,
    C.QueueMember: MetadataMachine._queue_member,
    C.BrokerCall: MetadataMachine._broker_call,
}
