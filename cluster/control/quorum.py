"""`haremq ctl` for quorum-declared queues, as `rabbitmq-queues` has them: add-member,
delete-member, grow, shrink, quorum-status, check-if-node-is-quorum-critical.

A quorum-declared queue's members are fixed when it is declared (cluster/mirroring/policy.py `quorum_group`)
and change only through these commands, each a `queue.member` entry on the metadata log, so a
member joining the cluster does not silently move existing groups. Served through
cluster/control/server.py's COMMANDS like the day-2 commands.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from haremq.node.broker import commands as C

from haremq.cluster.control.errors import ControlError
from haremq.cluster.control.operations import _propose
from haremq.cluster.mirroring.election import elect

if TYPE_CHECKING:
    from haremq.cluster.control.server import Control


def _quorum_state(control: Control, vhost: str, name: str):
    state = control.node.mirroring.states.get((vhost, name))
    if state is None or state.group is None:
        raise ControlError(f"NOT_FOUND - no quorum queue '{name}' in vhost '{vhost}'")
    return state


def _member_of_cluster(control: Control, node: str) -> None:
    if node != control.node.name and node not in control.node.membership.peers:
        raise ControlError(f"'{node}' is not a member of this cluster")


async def add_member(control: Control, args: dict) -> dict:
    state = _quorum_state(control, args["vhost"], args["name"])
    _member_of_cluster(control, args["node"])
    if args["node"] in state.group:
        raise ControlError(f"{args['node']} is already a member of quorum queue '{args['name']}'")
    return await _propose(control, C.QueueMember(args["vhost"], args["name"], args["node"], True))


async def delete_member(control: Control, args: dict) -> dict:
    state = _quorum_state(control, args["vhost"], args["name"])
    if args["node"] not in state.group:
        raise ControlError(f"{args['node']} is not a member of quorum queue '{args['name']}'")
    if len(state.group) == 1:
        raise ControlError(f"{args['node']} is the last member of quorum queue '{args['name']}'")
    return await _remove(control, state, args["node"])


async def _remove(control: Control, state, node: str) -> dict:
    """One member leaves the group. The leader may leave too, as with `rabbitmq-queues
    delete_member`: first it hands the queue to the follower an election finds holding the most
    (cluster/mirroring/election.py; a queue.promote while it still runs: it confirms nothing
    more, its waiting confirms are nacked for the publishers to send again, and consumers on its
    node get basic.cancel), then it goes."""
    if node == state.home:
        chosen = await elect(control.node.mirroring, state)
        if chosen is None:
            raise ControlError(f"{node} leads quorum queue '{state.name}' and no majority of its other "
                               "members is up with a whole copy to take over")
        result = await _propose(control, C.QueuePromote(state.vhost, state.name, chosen.node, state.epoch + 1,
                                                        state.epoch, incarnation=chosen.incarnation))
        if not (result or {}).get("promoted") or state.home == node:
            raise ControlError(f"leadership of quorum queue '{state.name}' did not move from {node}; try again")
    return await _propose(control, C.QueueMember(state.vhost, state.name, node, False))


def _matching(control: Control, args: dict):
    vhosts = re.compile(args.get("vhost_pattern") or ".*")
    queues = re.compile(args.get("queue_pattern") or ".*")
    for state in list(control.node.mirroring.states.values()):
        if state.group is not None and vhosts.fullmatch(state.vhost) and queues.fullmatch(state.name):
            yield state


async def grow(control: Control, args: dict) -> list:
    """Add `node` to every matching quorum queue (`all`), or to those with an even number of
    members (`even`), as `rabbitmq-queues grow`."""
    node = args["node"]
    _member_of_cluster(control, node)
    rows = []
    for state in _matching(control, args):
        if node in state.group or (args.get("which") == "even" and len(state.group) % 2):
            continue
        rows.append(await _change(control, state, node, True))
    return rows


async def shrink(control: Control, args: dict) -> list:
    """Remove `node` from every quorum queue it is a member of, but where it is the last member
    (`rabbitmq-queues shrink`; reported, not changed). Where it leads, leadership moves first."""
    node = args["node"]
    rows = []
    for state in _matching(control, args):
        if node not in state.group:
            continue
        if len(state.group) == 1:
            rows.append(_row(state, "error: last member"))
            continue
        try:
            result = await _remove(control, state, node)
        except ControlError as exc:
            rows.append(_row(state, f"error: {exc}"))
            continue
        rows.append(_row(state, "ok" if result.get("changed") else "unchanged"))
    return rows


async def _change(control: Control, state, node: str, add: bool) -> dict:
    """One queue.member entry for grow, and its row."""
    result = await _propose(control, C.QueueMember(state.vhost, state.name, node, add))
    return _row(state, "ok" if result.get("changed") else "unchanged")


def _row(state, result: str) -> dict:
    return {"vhost": state.vhost, "name": state.name, "size": len(state.group), "result": result}


async def quorum_status(control: Control, args: dict) -> list:
    state = _quorum_state(control, args["vhost"], args["name"])
    up = set(control.node.membership.up_members())
    return [{"node": node, "raft_state": "leader" if node == state.home else
             ("follower" if node in state.synced else "syncing"),
             "online": node in up, "synchronised": node == state.home or node in state.synced}
            for node in state.group]


def quorum_critical_queues(control: Control, node: str) -> list:
    """Quorum queues that would lose their majority of online members if `node` stopped."""
    up = set(control.node.membership.up_members())
    critical = []
    for state in control.node.mirroring.states.values():
        if state.group is None or node not in state.group:
            continue
        online = [n for n in state.group if n in up and n != node]
        if len(online) < len(state.group) // 2 + 1:
            critical.append({"vhost": state.vhost, "name": state.name, "members": list(state.group),
                             "online": online})
    return critical


async def quorum_critical(control: Control, args: dict) -> list:
    return quorum_critical_queues(control, args.get("node") or control.node.name)


COMMANDS = {
    "add_member": add_member,
    "delete_member": delete_member,
    "grow": grow,
    "shrink": shrink,
    "quorum_status": quorum_status,
    "quorum_critical": quorum_critical,
}
