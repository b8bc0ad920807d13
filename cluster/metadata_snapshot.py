"""A snapshot of the replicated metadata: cluster/raft/shell.py compacts the Raft log with it.

`capture` takes the state every member holds after the last entry applied
(vhosts, users, permissions, policies, exchanges, queues with their home and
store id, bindings, each mirrored queue's record, the members added and
forgotten, who restarted and was marked down when) as plain values on the
loop, and encodes it in a thread; `restore` builds it again as replaying the
entries would, acting on nothing: it is history until this node applies its
own node.restarted, as a replay is. A queue that no longer exists (an
exclusive or server-named queue gone with its connection) is in no snapshot,
so once compacted it leaves nothing on disk.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from haremq.node.broker import commands as C
from haremq.node.broker import policy as policies
from haremq.node.broker.exchange import Exchange, ExchangeType
from haremq.node.broker.permissions import Permission
from haremq.node.broker.vhost import VHost
from haremq.node.protocol.tables import decode_table, encode_table

from haremq.cluster.mirroring.policy import EPOCH_KEY_BITS, HAState
from haremq.cluster.raft.json_slices import Rows, dumps_in_slices
from haremq.cluster.raft.shell import SnapshotRefused

if TYPE_CHECKING:
    from haremq.cluster.metadata import MetadataMachine

SNAPSHOT_VERSION = 1


def capture(machine: MetadataMachine) -> tuple[Callable[[], bytes], int]:
    """The state after the last entry applied, captured now (on the loop) as plain values:
    (encode, records), encode() giving the JSON bytes (it runs in a thread, so nothing it
    reads may change meanwhile: every list and dict here is a copy), records its size.
    Queues, bindings and mirrored-queue records are copied as columns, a few lists of
    strings and numbers, and made into rows only as encode() writes them (json_slices.Rows):
    one tuple per queue held here outlives two garbage collections and, at 100,000 queues,
    brings on a full one, which stops the node for a second."""
    broker = machine.broker
    states = machine.mirroring.states if machine.mirroring is not None else {}
    vhosts = []
    records = 0
    for vname, vhost in broker.vhosts.items():
        exchanges = [(x.name, x.type.value, x.durable, x.auto_delete, x.internal,
                      dict(x.arguments) if x.arguments else None) for x in vhost.exchanges.values()]
        queues = _queue_columns(machine, vname, vhost, states)
        bindings = _binding_columns(vhost)
        policy_rows = [p.as_json(vname) for p in vhost.policies.values()]
        vhosts.append((vname, policy_rows, exchanges, queues, bindings))
        records += 1 + len(policy_rows) + len(exchanges) + len(queues[0]) + len(bindings[0])
    ha = _ha_columns(states)
    users = [(u.name, u.password_hash, u.algorithm, list(u.tags)) for u in broker.users.all()]
    permissions = broker.list_permissions()
    records += len(ha[0]) + len(users) + len(permissions)
    rest = {"returned": dict(machine.returned), "down": dict(machine.down), "members": dict(machine.members),
            "placement_members": machine.placement_members,
            "settings": {k: list(v) for k, v in machine.settings.items()},
            "incarnations": dict(machine.mirroring.incarnations) if machine.mirroring is not None else {},
            "stopping": sorted(machine.mirroring.stopping) if machine.mirroring is not None else []}

    def table(args) -> str | None:
        return encode_table(args) if args else None

    def queue_row(name, durable, auto_delete, args, owner, home, store_id) -> tuple:
        return name, durable, auto_delete, table(args), owner, home, store_id

    def binding_row(source, kind, destination, key, args) -> tuple:
        return source, kind, destination, key, table(args)

    def ha_row(vname, name, home, epoch, definition, mirrors, synced, durable, store_id, group) -> tuple:
        return (vname, name, home, epoch, definition or {}, list(mirrors), list(synced), durable, store_id,
                list(group) if group is not None else None)

    def encode() -> bytes:
        doc = {"version": SNAPSHOT_VERSION, "records": records, **rest, "users": users,
               "permissions": permissions, "ha": Rows.of(ha, ha_row),
               "vhosts": [{"name": vname, "policies": policy_rows,
                           "exchanges": [(*x[:5], table(x[5])) for x in exchanges],
                           "queues": Rows.of(queues, queue_row),
                           "bindings": Rows.of(bindings, binding_row)}
                          for vname, policy_rows, exchanges, queues, bindings in vhosts]}
        return dumps_in_slices(doc)      # in a thread: the loop gets the GIL between slices
    return encode, records


def _queue_columns(machine: MetadataMachine, vname: str, vhost: Any, states: dict) -> tuple[list, ...]:
    """name, durable, auto_delete, arguments (a copy, or None), exclusive owner's key, home,
    store id: one list each."""
    names: list = []
    durables: list = []
    auto_deletes: list = []
    arguments: list = []
    owners: list = []
    homes: list = []
    store_ids: list = []
    node = machine.node
    for q in vhost.queues.values():
        names.append(q.name)
        durables.append(q.durable)
        auto_deletes.append(q.auto_delete)
        arguments.append(dict(q.arguments) if q.arguments else None)
        owners.append(getattr(q.exclusive_owner, "key", None))
        if q.remote:
            state = states.get((vname, q.name))
            homes.append(q.home)
            store_ids.append(state.store_id if state is not None else 0)
        else:
            homes.append(node)
            store_ids.append(q.store_id)
    return names, durables, auto_deletes, arguments, owners, homes, store_ids


def _binding_columns(vhost: Any) -> tuple[list, ...]:
    """source, "exchange" or "queue", destination, routing key, arguments (or None)."""
    sources: list = []
    kinds: list = []
    destinations: list = []
    keys: list = []
    arguments: list = []
    for x in vhost.exchanges.values():
        for d, key, args in x.bindings():
            sources.append(x.name)
            kinds.append("exchange" if isinstance(d, Exchange) else "queue")
            destinations.append(d.name)
            keys.append(key)
            arguments.append(args or None)
    return sources, kinds, destinations, keys, arguments


def _ha_columns(states: dict) -> tuple[list, ...]:
    """Each mirrored queue's record, a column per field; a list field as a tuple (an empty one
    is no new object)."""
    columns: tuple[list, ...] = tuple([] for _ in range(10))
    (vhosts, names, homes, epochs, definitions, mirrors, synced, durables, store_ids, groups) = columns
    for st in states.values():
        vhosts.append(st.vhost)
        names.append(st.name)
        homes.append(st.home)
        epochs.append(st.epoch)
        definitions.append(dict(st.definition) if st.definition else None)
        mirrors.append(tuple(st.mirrors))
        synced.append(tuple(st.synced))
        durables.append(st.durable)
        store_ids.append(st.store_id)
        groups.append(tuple(st.group) if st.group is not None else None)
    return columns


def restore(machine: MetadataMachine, index: int, state: dict) -> None:
    """Build the state a snapshot holds (decoded), as replaying the entries up to `index`
    would, acting on nothing (SnapshotRefused once this node serves clients: its state is
    live). What the state held before goes, the messages of queues mastered here back among
    the recovered ones, as `_become_remote` leaves them while replaying. A snapshot that
    holds this node's node.restarted of this incarnation ends the replay, as the entry would."""
    if not machine.replaying:
        raise SnapshotRefused(f"a snapshot up to entry {index} arrived while this node serves clients")
    if state.get("version") != SNAPSHOT_VERSION:
        raise ValueError(f"unknown metadata snapshot version {state.get('version')}")
    broker = machine.broker
    for vhost in broker.vhosts.values():
        for queue in vhost.queues.values():
            if not queue.remote and queue.store_id:
                ids = queue.let_go()
                if ids:
                    machine.recovered[queue.store_id] = ids
    # the members as of the snapshot, first: placement reads them
    machine.members = dict(state["members"])
    machine.placement_members = state.get("placement_members")
    for name, address in machine.members.items():
        if address is not None:
            if machine.on_add is not None:
                machine.on_add(name, address)
        elif name == machine.node:
            # replaying, it may be an earlier membership's forget: a member forgotten, wiped and
            # joining again (its new member.add follows; checked once replayed, as for the log)
            if machine.on_removed is not None and not machine.replaying:
                machine.on_removed(None)
        elif machine.on_forget is not None:
            machine.on_forget(name)
    broker.users.clear()
    for name, password_hash, algorithm, tags in state["users"]:
        broker.users.add_hashed(name, password_hash, algorithm, tags)
    broker.permissions = {(p["user"], p["vhost"]): Permission(p["configure"], p["write"], p["read"])
                          for p in state["permissions"]}
    broker.vhosts.clear()
    for v in state["vhosts"]:
        vhost = broker.vhosts[v["name"]] = VHost(v["name"], broker)
        for p in v["policies"]:
            vhost.policies[p["name"]] = policies.validate(p["name"], p["pattern"], p["definition"],
                                                          p["priority"], p["apply-to"])
        for name, kind, durable, auto_delete, internal, args in v["exchanges"]:
            if name not in vhost.exchanges:
                vhost._add_exchange(Exchange(name, ExchangeType(kind), durable=durable, auto_delete=auto_delete,
                                             internal=internal, arguments=decode_table(args) if args else {}))
        for name, durable, auto_delete, args, owner_key, home, store_id in v["queues"]:
            arguments = decode_table(args) if args else {}
            owner = machine._owner(owner_key)
            if home == machine.node:
                queue = vhost.add_queue(name, durable, owner, auto_delete, arguments, store_id)
                if store_id in machine.recovered:
                    queue.restore(machine.recovered.pop(store_id))
            else:
                # a vhost's queues are typed as Queue; a RemoteQueue stands in them (QueuePort)
                vhost.queues[name] = machine._remote_queue(  # type: ignore[assignment]
                    vhost, name, home, durable, owner, auto_delete, arguments)
        for source, kind, destination, key, args in v["bindings"]:
            exchange = vhost.exchanges.get(source)
            target = (vhost.queues if kind == "queue" else vhost.exchanges).get(destination)
            if exchange is not None and target is not None:
                exchange.bind(target, key, decode_table(args) if args else {})
    machine.returned = dict(state["returned"])
    machine.down = dict(state["down"])
    for method, args in state.get("settings", {}).items():
        call = C.admin_method(broker, method)
        machine.settings[method] = list(args)
        if call is not None and broker.resources is not None:
            try:
                call(*args)
            except (ValueError, KeyError, LookupError) as exc:
                machine.log.warning("a setting in the snapshot does not apply", method=method, error=str(exc))
    mirroring = machine.mirroring
    if mirroring is not None:
        mirroring.states.clear()
        for vname, name, home, epoch, definition, mirrors, synced, durable, store_id, group in state["ha"]:
            mirroring.states[(vname, name)] = HAState(vname, name, home, epoch, definition, mirrors, synced,
                                                      durable, store_id, group)
        mirroring.incarnations = dict(state["incarnations"])
        mirroring.stopping = set(state["stopping"])
        for st in list(mirroring.states.values()):
            vhost = broker.vhosts.get(st.vhost)
            queue = vhost.queues.get(st.name) if vhost is not None else None
            if queue is not None and not queue.remote and st.epoch > 1:
                # it became master here by a promotion, as _become_master numbers its messages
                queue.next_seq = max(queue.next_seq, st.epoch << EPOCH_KEY_BITS)
            mirroring._take_part(st)
    machine.log.info("metadata snapshot loaded", index=index, records=state.get("records", 0),
                  queues=sum(len(v.queues) for v in broker.vhosts.values()))
    if mirroring is not None and mirroring.incarnations.get(machine.node) == machine.incarnation:
        machine._replayed(index)
