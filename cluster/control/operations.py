"""Day-2 `haremq ctl` commands, as rabbitmqctl, rabbitmq-queues and rabbitmq-upgrade have them.

Served by every node like the rest of cluster/control/server.py, whose COMMANDS table
takes in this module's. Changes go through the metadata log, so every
member applies them in one order; queue contents change where the queue's
master lives.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

import structlog

from haremq.node.protocol.replies import AMQPError
from haremq.node.broker import commands as C

from haremq.cluster.control.errors import ControlError
from haremq.cluster.rpc import cluster_pb2 as pb

if TYPE_CHECKING:
    from haremq.cluster.control.server import Control

log = structlog.get_logger("haremq.ctl")
MAINTENANCE_REASON = "Node was put into maintenance mode"


def _queue(control: Control, vhost: str, name: str):
    v = control.broker.vhosts.get(vhost)
    if v is None:
        raise ControlError(f"NOT_FOUND - vhost '{vhost}' does not exist")
    queue = v.queues.get(name)
    if queue is None:
        raise ControlError(f"NOT_FOUND - no queue '{name}' in vhost '{vhost}'")
    return queue


async def _propose(control: Control, command: C.Command):
    try:
        return await control.node.propose(command)
    except AMQPError as exc:
        raise ControlError(exc.text) from None


async def _at(control: Control, member: str, command: str, args: dict):
    peer = control.node.membership.peers.get(member)
    if peer is None or not control.node.membership.is_up(member):
        raise ControlError(f"the node holding that queue ({member}) is down")
    reply = await peer.stub.Control(pb.ControlRequest(command=command, arguments=json.dumps(args).encode()),
                                    timeout=10.0, metadata=control.node.membership.metadata())
    if not reply.ok:
        raise ControlError(reply.error)
    return json.loads(reply.result) if reply.result else None


async def purge_queue_any(control: Control, args: dict) -> dict:
    """rabbitmqctl purge_queue: the queue's master purges (mirrors follow it)."""
    queue = _queue(control, args["vhost"], args["name"])
    if queue.remote:
        return await _at(control, queue.home, "purge_queue", {"vhost": args["vhost"], "name": args["name"]})
    return {"message_count": queue.purge()}


async def delete_queue(control: Control, args: dict) -> dict:
    """rabbitmqctl delete_queue [--if-unused] [--if-empty], through the metadata log."""
    _queue(control, args["vhost"], args["name"])
    result = await _propose(control, C.QueueDelete(args["vhost"], args["name"], None, bool(args.get("if_unused")),
                                                   bool(args.get("if_empty"))))
    return result if isinstance(result, dict) else {"message_count": None}


async def close_connection(control: Control, args: dict) -> dict:
    """rabbitmqctl close_connection NAME REASON: whichever member holds it closes it (320)."""
    closed = await control.management_close({"name": args["name"], "reason": args["reason"]})
    if not closed:
        raise ControlError(f"NOT_FOUND - no connection '{args['name']}'")
    return {"closed": args["name"]}


async def import_definitions(control: Control, args: dict) -> dict:
    """rabbitmqctl import_definitions, live: every change is a metadata-log entry, so every member
    applies it, and a queue gets this node as its home as if a client had declared it here."""
    data = args["definitions"]
    if not isinstance(data, dict):
        raise ControlError("PRECONDITION_FAILED - definitions must be a JSON object")
    accounts = {k: data.get(k, []) for k in ("users", "vhosts", "permissions")}
    if any(accounts.values()):
        await control.broker_call({"method": "import_definitions", "args": [accounts]})
    for p in data.get("policies", []):
        await control.broker_call({"method": "set_policy", "args": [
            p.get("vhost", "/"), p["name"], p["pattern"], p.get("definition", {}), p.get("apply-to", "all"),
            int(p.get("priority", 0))]})
    for x in data.get("exchanges", []):
        await _propose(control, C.ExchangeDeclare(x.get("vhost", "/"), x["name"], x.get("type", "direct"),
                                                  x.get("durable", True), x.get("auto_delete", False),
                                                  x.get("internal", False), x.get("arguments") or {}))
    for q in data.get("queues", []):
        await _propose(control, C.QueueDeclare(q.get("vhost", "/"), q["name"], q.get("durable", True), False,
                                               q.get("auto_delete", False), q.get("arguments") or {},
                                               control.node.name))
    for b in data.get("bindings", []):
        if not b.get("source"):
            continue      # the default exchange binds every queue by itself
        await _propose(control, C.Bind(b.get("vhost", "/"), b.get("destination_type", "queue"), b["source"],
                                       b["destination"], b.get("routing_key", ""), b.get("arguments") or {}))
    counts = {k: len(data.get(k, [])) for k in ("users", "vhosts", "permissions", "policies", "exchanges",
                                                   "queues", "bindings")}
    log.info("definitions imported through haremq ctl", node=control.node.name, **counts)
    return counts


async def sync_critical_queues(control: Control, args: dict) -> list:
    """rabbitmq-queues check_if_node_is_mirror_sync_critical: the mirrored queues whose only
    synchronised copy is on this node (its master with no synchronised mirror on a member that is
    up, or its last synchronised mirror while the master is down). Stopping this node now would
    leave them unavailable (ha-promote-on-shutdown: when-synced) or lose messages."""
    membership = control.node.membership
    here = control.node.name
    critical = []
    for (vhost, name), state in control.node.mirroring.states.items():
        if not state.mirrors:
            continue
        copies = [m for m in [state.home, *state.synced] if m == here or membership.is_up(m)]
        if here in copies and len(copies) == 1:
            critical.append({"vhost": vhost, "name": name, "node": here})
    return critical


async def drain(control: Control, args: dict) -> dict:
    """rabbitmq-upgrade drain: maintenance mode. The node stops accepting client connections and
    closes the ones it has (320 CONNECTION_FORCED), so clients reconnect to the other members;
    it stays a member and keeps its queues' mirrors in sync."""
    node = control.node
    node.draining = True
    await node.amqp.pause(MAINTENANCE_REASON)
    log.warning("maintenance mode: client listeners suspended", node=node.name)
    return {"node": node.name, "maintenance": True}


async def revive(control: Control, args: dict) -> dict:
    """rabbitmq-upgrade revive: leave maintenance mode and accept clients again."""
    node = control.node
    node.draining = False
    if node.membership.has_majority is not False:
        await node.amqp.resume()
    log.info("maintenance mode left: client listeners resumed", node=node.name)
    return {"node": node.name, "maintenance": False}


COMMANDS = {
    "purge_queue_any": purge_queue_any,
    "delete_queue": delete_queue,
    "close_connection": close_connection,
    "import_definitions": import_definitions,
    "sync_critical_queues": sync_critical_queues,
    "drain": drain,
    "revive": revive,
}


async def member_join(control: Control, args: dict) -> dict:
    """A fresh member found by DNS (a StatefulSet scaled out) asks to be added; through the
    metadata log, so every member counts it from the same entry on."""
    name, address = args["node"], args["address"]
    if control.node.membership.peers.get(name) is not None and \
            control.node.membership.peers[name].address != address:
        raise ControlError(f"PRECONDITION_FAILED - member '{name}' is known at another address")
    return await _propose(control, C.MemberAdd(name, address))


COMMANDS["member_join"] = member_join
