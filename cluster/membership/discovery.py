"""Members from DNS, as a StatefulSet names them: PREFIX-0.SERVICE, PREFIX-1.SERVICE, ...

The chart's headless Service publishes every pod's name before it is ready, so
the members are the ordinals whose names resolve. Nothing is baked in: after
`kubectl scale --replicas 5` the new pods resolve and a starting member finds
them; a replica-count hint only says how many to expect when DNS is not yet
answering for the others (every pod starts at once, podManagementPolicy:
Parallel), never a limit.
"""
from __future__ import annotations

import socket
from typing import Callable

MISSES = 2      # ordinals past the last known member probed before the search stops


def resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return False
    return True


def ordinal(name: str) -> tuple[str, int | None]:
    prefix, _, number = name.rpartition("-")
    return (prefix, int(number)) if prefix and number.isdigit() else (name, None)


def dns_members(name: str, service: str, port: int, replicas: int | None = None,
                resolve: Callable[[str], bool] = resolves) -> dict[str, str]:
    """name -> HOST:PORT of every member: ordinals below the hint and this node's own, and
    any further ordinal whose name resolves, up to MISSES ordinals past the last that does."""
    prefix, own = ordinal(name)
    known = max(replicas or 0, (own or 0) + 1)
    members, i, misses = {}, 0, 0
    while i < known or misses < MISSES:
        host = f"{prefix}-{i}.{service}"
        if i < known or resolve(host):
            members[f"{prefix}-{i}"] = f"{host}:{port}"
            misses = 0 if i >= known else misses
        else:
            misses += 1
        i += 1
    return members


async def join(node, advertise: str, interval: float = 1.0) -> None:
    """A fresh member found by DNS asks the running members to add it (`member_join`, which goes
    through the metadata log) until one of them has; at a first start of the whole StatefulSet
    the entry only confirms what every member already knew."""
    import asyncio
    import json

    import grpc
    import structlog

    from haremq.cluster.rpc import cluster_pb2 as pb
    log = structlog.get_logger("haremq.cluster").bind(node=node.name)
    request = pb.ControlRequest(command="member_join",
                                arguments=json.dumps({"node": node.name, "address": advertise}).encode())
    while node.joining:
        for peer in sorted(node.membership.peers.values(), key=lambda p: p.name):
            if not node.joining:
                return
            try:
                reply = await peer.stub.Control(request, timeout=10.0, metadata=node.membership.metadata())
            except grpc.aio.AioRpcError:
                continue
            if reply.ok:
                result = json.loads(reply.result) if reply.result else {}
                log.info("joined the cluster", via=peer.name, address=advertise, index=result.get("index"))
                node.joined_at(int(result.get("index") or 1))
                return
        await asyncio.sleep(interval)
