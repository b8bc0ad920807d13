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
import resource
import time
from typing import TYPE_CHECKING, Any

from ..version import __version__
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
           "partitions": [], "being_drained": False, "alarms": sorted(alarms), "paused": False,
           **process_fields(broker), **RABBITMQ_NODE_FIELDS}
    row.update(view.node_fields())
    return row


def process_fields(broker) -> dict:
    """The process's own figures under RabbitMQ's names (its file and socket descriptors, its
    data directory). `*_details` are there for the rates and samples RabbitMQ's UI charts
    (samples.py); Erlang's process counts have no HareMQ counterpart and are left out."""
    try:
        fds = len(os.listdir("/proc/self/fd"))
    except OSError:
        fds = None
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    fd_total = limit if limit != resource.RLIM_INFINITY else None
    store = getattr(broker, "store", None)
    return {"fd_used": fds, "fd_total": fd_total, "sockets_used": sum(1 for _ in client_sessions(broker)),
            "sockets_total": fd_total, "processors": os.cpu_count(),
            "db_dir": str(getattr(store, "data_dir", "")), "config_files": [], "log_files": [],
            **{f"{key}_details": {"rate": 0.0} for key in ("fd_used", "sockets_used", "mem_used", "disk_free")}}


# what RabbitMQ's UI reads of a node that is fixed for HareMQ: no plugins, its exchange types
# and SASL mechanisms, no Erlang VM
RABBITMQ_NODE_FIELDS: dict[str, Any] = {
    "rates_mode": "basic", "mem_calculation_strategy": "rss", "net_ticktime": None, "run_queue": 0,
    "applications": [{"name": "haremq", "description": "HareMQ", "version": __version__}],
    "enabled_plugins": [], "metrics_gc_queue_length": {}, "ra_open_file_metrics": {},
    "exchange_types": js.EXCHANGE_TYPES,
    "auth_mechanisms": [{"name": m, "description": f"SASL {m} authentication mechanism", "enabled": True}
                        for m in ("PLAIN", "AMQPLAIN")],
}


def close_local(broker, name: str, reason: str) -> bool:
    """Close the client connection of that name if it is connected to this node (320 CONNECTION_FORCED)."""
    from ..protocol.replies import AMQPError, ReplyCode
    for session in client_sessions(broker):
        if js.connection_name(session) == name:
            session.close(AMQPError(ReplyCode.CONNECTION_FORCED, reason))
            session.wakeup()
            return True
    return False
