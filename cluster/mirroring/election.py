"""A quorum queue's failover, by Raft's election rule rather than "the oldest synchronised".

A quorum queue confirms once a majority of its members hold a message
(Replicator.majority_upto), so a member the log calls synchronised may lack the
newest confirmed messages: the member that counted for them may be another. A
new leader must hold every confirmed message, so the metadata leader asks every
member that is up for its position in the queue's stream (`queue_position`:
whether its copy is whole, the epoch it follows and the last sequence it wrote
durably) and, once a majority of the members have answered, promotes the whole
copy that is furthest on. Any majority shares a member with the majority that
confirmed a message, so the furthest copy among them holds it. With fewer
answers the queue waits, as a Raft group below a majority does.

The answer names the member's incarnation: the promotion is refused, in log
order, if that member restarted since (its copy is gone with its process).
"""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from haremq.cluster.rpc import cluster_pb2 as pb

ASK_TIMEOUT = 1.0      # seconds a member has to answer; an up member answers in milliseconds


@dataclass(frozen=True)
class Position:
    node: str
    incarnation: str
    whole: bool
    epoch: int
    seq: int


def position_of(mirroring, vhost: str, name: str) -> dict:
    """This node's answer about its copy of the queue (nothing whole if it holds none)."""
    mirror = mirroring.mirrors.get((vhost, name))
    epoch, seq = mirror.position if mirror is not None else (0, 0)
    return {"node": mirroring.node, "incarnation": mirroring.cluster.metadata.incarnation,
            "whole": bool(mirror is not None and mirror.whole), "epoch": epoch, "seq": seq}


async def _ask(mirroring, node: str, vhost: str, name: str) -> Position | None:
    if node == mirroring.node:
        return Position(**position_of(mirroring, vhost, name))
    peer = mirroring.peer(node)
    if peer is None or not mirroring.is_up(node):
        return None
    try:
        reply = await peer.stub.Control(
            pb.ControlRequest(command="queue_position", arguments=json.dumps({"vhost": vhost, "name": name}).encode()),
            timeout=ASK_TIMEOUT, metadata=mirroring.call_metadata())
    except Exception:  # noqa: BLE001 - a member that cannot answer is not counted
        return None
    if not reply.ok:
        return None
    return Position(**json.loads(reply.result))


def choose(positions: list[Position | None], group_size: int, epoch: int, synced: list[str],
           group: list[str]) -> Position | None:
    """The member to promote, or None while fewer than a majority of the members answered or
    none of them holds a whole copy of this epoch's stream. Ties go to the oldest synchronised
    member, then to the group's order."""
    answered = [p for p in positions if p is not None]
    if len(answered) < group_size // 2 + 1:
        return None
    whole = [p for p in answered if p.whole and p.epoch == epoch]
    if not whole:
        return None

    def rank(p: Position) -> tuple:
        order = synced.index(p.node) if p.node in synced else len(synced) + group.index(p.node)
        return (p.seq, -order)
    return max(whole, key=rank)


async def elect(mirroring, state) -> Position | None:
    """The member of `state`'s group to take over from its leader (down, or leaving the group)."""
    group = list(state.group or ())
    candidates = [n for n in group if n != state.home]
    positions = await asyncio.gather(*(_ask(mirroring, n, state.vhost, state.name) for n in candidates))
    return choose(list(positions), len(group), state.epoch, list(state.synced), group)
