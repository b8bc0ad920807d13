"""A node built from its settings: the one place that wires one.

`build_node` makes every part of a node (its store, broker, AMQP listener,
management side and cluster side) and hands each the parts it needs through
its constructor; no part is given another by setting an attribute afterwards.
It sits at the top of cluster/, above node/ and the rest of cluster/, so no
import runs back up: node/ never imports the cluster, and the cluster's parts
never import this module. `haremq node` (cluster/cli.py) and in-process tests
and benchmarks build their nodes here.
"""
from __future__ import annotations

import ssl
from pathlib import Path
from typing import Callable

from haremq.node.alarms import ResourceMonitor
from haremq.node.app import ClusterSide, Node, NodeConfig, NodeError
from haremq.node.broker.broker import Broker
from haremq.node.broker.ports import MetadataPort
from haremq.node.management import Management
from haremq.node.management.cluster_view import ClusterView
from haremq.node.server import AMQPServer
from haremq.node.single_node import SingleNode
from haremq.node.store.store import MessageStore, StoreError
from haremq.node.tls import TLSConfigError, server_context

from .node import ClusterConfig, ClusterNode
from .raft.storage import RaftStorageError


def build_node(config: NodeConfig) -> Node:
    """The node `config` describes, built and not started; NodeError (one line for the
    operator) if its settings or files cannot make one. Call it on the event loop the node
    will run on."""
    _prepare_data_dir(Path(config.data_dir))
    tls = _tls_context(config)          # bad certificate files stop the node before anything starts
    store = MessageStore(config.data_dir, config.name, segment_size=config.segment_size,
                         skip_corrupt=config.skip_corrupt)
    try:
        recovered = store.open()
    except StoreError as exc:
        raise NodeError(str(exc)) from None
    cluster: ClusterSide
    if config.cluster_port is None:
        broker = _broker(config, store)(None)
        broker.restore(recovered)
        cluster = SingleNode(broker)
    else:   # metadata comes back by replaying the cluster's log; messages join their queues then
        member = _member(config, config.cluster_port, dict(recovered.queues), _broker(config, store))
        broker, cluster = member.broker, member
    amqp = AMQPServer(broker, config.bind, config.amqp_port, config.tls_port, tls)
    return Node(config, store, broker, amqp, cluster, _management(config, broker, cluster.management_view))


def _broker(config: NodeConfig, store: MessageStore) -> Callable[[MetadataPort | None], Broker]:
    """How the node's broker is built, given its metadata port (a member's cluster side, or
    None: a node on its own applies its metadata itself), with the monitor of its memory and
    disk (node/alarms.py), which sets its alarms."""
    def monitor(broker: Broker) -> ResourceMonitor:
        try:
            return ResourceMonitor(broker, config.data_dir, config.vm_memory_high_watermark,
                                   config.disk_free_limit)
        except ValueError as exc:
            raise NodeError(str(exc)) from None

    def build(metadata: MetadataPort | None) -> Broker:
        return Broker(config.name, store, metadata, resources=monitor)
    return build


def _member(config: NodeConfig, port: int, recovered: dict[int, list[int]],
            broker: Callable[[MetadataPort], Broker]) -> ClusterNode:
    """A member's cluster side (cluster/node.py), which builds the broker it is the metadata
    port of, and takes the queues the store recovered once the log replays them."""
    try:
        return ClusterNode(config.name, ClusterConfig(
            port=port, bind=config.bind, peers=dict(config.peers), secret=config.cluster_secret,
            failure_timeout=config.failure_timeout, tls=config.cluster_tls, advertise=config.advertise),
            config.data_dir, recovered, broker)
    except RaftStorageError as exc:     # the cluster's log on disk is damaged: say so, in one line
        raise NodeError(str(exc)) from None


def _management(config: NodeConfig, broker: Broker, view: ClusterView) -> Management | None:
    """The management HTTP API and web view, and Prometheus metrics (node/management/), reading
    the cluster through `view`; None with both ports off."""
    if not config.management_port and not config.prometheus_port:
        return None
    ssl = None
    if config.management_tls:
        if config.tls_cert is None or config.tls_key is None:
            raise NodeError("--management-tls needs --tls-cert and --tls-key")
        try:
            ssl = server_context(config.tls_cert, config.tls_key, config.tls_ca, config.tls_verify_peer)
        except TLSConfigError as exc:
            raise NodeError(str(exc)) from None
    return Management(broker, view, config.bind, config.management_port, config.prometheus_port,
                      config.prometheus_per_queue, ssl, optional=config.optional_ports)


def _tls_context(config: NodeConfig) -> ssl.SSLContext | None:
    """The amqps listener's TLS context (--tls-port), or None without one."""
    if config.tls_port is None:
        return None
    if config.tls_cert is None or config.tls_key is None:
        raise NodeError("--tls-port needs --tls-cert and --tls-key")
    try:
        return server_context(config.tls_cert, config.tls_key, config.tls_ca, config.tls_verify_peer)
    except TLSConfigError as exc:
        raise NodeError(str(exc)) from None


def _prepare_data_dir(path: Path) -> None:
    """The data dir exists and is writable, or the node does not start."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".haremq-write-test"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise NodeError(f"data dir {path} is not writable: {exc.strerror or exc}") from None
