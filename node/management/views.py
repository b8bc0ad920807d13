"""What one node contributes to the management API's cluster-wide listings.

Queues are listed by their home node (where their messages and counters
are), connections, channels and consumers by the node the client is connected
to, and each node describes itself. In a cluster `haremq ctl`'s control call
`management_rows` asks every member that is up for its part (see
cluster/control/server.py) and the API merges them; a single node answers alone.
What the cluster adds (a queue's mirrors, a member's links) comes from the
node's ClusterView (cluster_view.py).
"""
from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING

from . import serializers as js
from .stats import local_queues

if TYPE_CHECKING:
    from .cluster_view import ClusterView

KINDS = ("queues", "connections", "channels", "consumers", "nodes")
STARTED = time.time()


def client_sessions(broker):
    """Open client connections (the management API's own direct ones are not listed)."""
    for session in list(broker.sessions):
        if session.vhost is None or session.closed or getattr(session, "direct", False):
            continue
        yield session


def local_rows(broker, view: ClusterView, kind: str) -> list[dict]:
    node = broker.node_name
    if kind == "queues":
        sampler = getattr(broker, "sampler", None)
        return [js.queue_row(vname, queue, node, sampler, view.queue_status(vname, queue.name))
                for vname, queue in local_queues(broker)]
    if kind == "connections":
        return [js.connection_json(s, node) for s in client_sessions(broker)]
    if kind == "channels":
        return [js.channel_json(s, c, node) for s in client_sessions(broker) for c in list(s.channels.values())]
    if kind == "consumers":
        return [js.consumer_json(s, c, consumer, node) for s in client_sessions(broker)
                for c in list(s.channels.values()) for consumer in list(c.consumers.values())]
    if kind == "nodes":
        return [node_json(broker, view)]
    raise ValueError(f"unknown kind '{kind}'")


def node_json(broker, view: ClusterView) -> dict:
    """This node as /api/nodes describes one (RabbitMQ's names for memory, disk and alarms)."""
    status = broker.resource_status()
    alarms = set(broker.alarms)
    row = {"name": broker.node_name, "type": "disc", "running": True, "os_pid": str(os.getpid()),
           "uptime": int((time.time() - STARTED) * 1000),
           "mem_used": status.get("memory_used"), "mem_limit": status.get("memory_limit"),
           "mem_alarm": "memory" in alarms,
           "disk_free": status.get("disk_free"), "disk_free_limit": status.get("disk_free_limit"),
           "disk_free_alarm": any(a.startswith("disk") for a in alarms),
           "partitions": [], "being_drained": False, "alarms": sorted(alarms), "paused": False}
    row.update(view.node_fields())
    return row


def close_local(broker, name: str, reason: str) -> bool:
    """Close the client connection of that name if it is connected to this node (320 CONNECTION_FORCED)."""
    from ..protocol.replies import AMQPError, ReplyCode
    for session in client_sessions(broker):
        if js.connection_name(session) == name:
            session.close(AMQPError(ReplyCode.CONNECTION_FORCED, reason))
            session.wakeup()
            return True
    return False
