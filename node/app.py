"""One HareMQ node: its components, started and stopped in a known order from one place.

A test can run a node in-process (`async with Node(config)`) as easily as a
user runs `haremq node`. A clustered node's cluster side is handed in, built
by the application's assembly (node/cli.py), so the broker's side never
imports the cluster.
"""
from __future__ import annotations

import asyncio
import os
import resource
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

import structlog

from .broker.broker import Broker
from .management.cluster_view import ClusterView
from .management.single_node import SingleNodeView
from .server import AMQPServer
from .store.store import MessageStore, StoreError
from .tasks import TaskGroup


class NodeError(Exception):
    """A reason the node cannot start, in one line for the operator."""


@dataclass
class NodeConfig:
    name: str = "hare"
    data_dir: Path = Path("./haremq-data")
    amqp_port: int = 5672
    bind: str = "127.0.0.1"
    skip_corrupt: bool = False
    segment_size: int = 64 << 20
    cluster_port: int | None = None           # clustered when set
    peers: dict = field(default_factory=dict)   # name -> host:port of the other members
    cluster_secret: str = ""
    failure_timeout: float = 3.0
    cluster_tls: object = None                  # cluster.transport.TLSFiles: mutual TLS between members
    default_user: str | None = None
    default_pass: str | None = None
    definitions: Path | None = None             # RabbitMQ definitions JSON imported at start
    tls_port: int | None = None                 # amqps listener when set (with tls_cert, tls_key)
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    tls_verify_peer: bool = False
    vm_memory_high_watermark: str = "0.4"       # fraction of RAM or a size (ERR-4)
    disk_free_limit: str = "50MB"
    management_port: int | None = None          # HTTP API and web view (haremq node: 15672); None/0 = off
    prometheus_port: int | None = None          # /metrics (haremq node: 15692); None/0 = off
    prometheus_per_queue: bool = True           # one series per queue in /metrics
    management_tls: bool = False                # serve the API over TLS with --tls-cert/--tls-key
    advertise: str | None = None                # HOST:CLUSTER_PORT the members reach us at (--peers-dns):
                                                # a fresh node asks to be added (scale-out)
    optional_ports: tuple = ()                  # "management", "prometheus": on a default port, skip
                                                # it with a warning if taken (several nodes on one host)


class ClusterSide(Protocol):
    """What a node asks of its cluster side (cluster/node.py's ClusterNode): built before the
    management side (which reads the cluster through its view), started once the broker and
    the AMQP listener are up, stopped before them."""

    @property
    def management_view(self) -> ClusterView: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class Node:
    def __init__(self, config: NodeConfig, cluster_side: Callable[["Node"], ClusterSide] | None = None):
        """cluster_side(node) builds the node's cluster side once its broker and AMQP server
        exist, before the management and AMQP listeners open; a node with a cluster port needs
        it (node/cli.py's `cluster_side`)."""
        self.config = config
        self._cluster_side = cluster_side
        self.log = structlog.get_logger("haremq.node").bind(node=config.name)
        self.broker: Broker | None = None
        self.store: MessageStore | None = None
        self.amqp: AMQPServer | None = None
        self.cluster: ClusterSide | None = None
        self.recovered_queues: dict = {}   # clustered: the store's queues, to rejoin theirs once the log replays
        self.resources = None
        self.management = None
        self._stopping = False
        self._stopped = asyncio.Event()
        self.failure: str | None = None     # why the node stopped by itself, if it did
        self.tasks = TaskGroup(f"node {config.name}")   # a stop asked for by a signal or a failure

    async def __aenter__(self) -> "Node":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def start(self) -> None:
        if self.config.cluster_port is not None and self._cluster_side is None:
            raise NodeError("a cluster port needs a node built with its cluster side (node/cli.py)")
        self._prepare_data_dir()
        tls = self._tls_context()          # bad certificate files stop the node before anything starts
        self.store = MessageStore(self.config.data_dir, self.config.name, segment_size=self.config.segment_size,
                                  skip_corrupt=self.config.skip_corrupt)
        try:
            recovered = self.store.open()
        except StoreError as exc:
            raise NodeError(str(exc)) from None
        self.broker = Broker(self.config.name, self.store)
        if self.config.cluster_port is None:
            self.broker.restore(recovered)
        else:   # clustered: metadata comes back by replaying the cluster's log; messages join their queues then
            self.recovered_queues = dict(recovered.queues)
        self._default_user()
        await self._load_definitions()
        self._resource_monitor()
        self.amqp = AMQPServer(self.broker, self.config.bind, self.config.amqp_port, self.config.tls_port, tls)
        clustered = self.config.cluster_port is not None
        # The cluster side is built (not started) before the management side, which reads the
        # cluster through its view; a node on its own is a cluster of one.
        cluster_side = self._cluster_side(self) if clustered else None
        view = cluster_side.management_view if clustered else SingleNodeView(self.broker)
        await self._start_management(view)     # a management port in use stops the node before AMQP opens
        try:
            # A clustered node serves AMQP only once it sees a majority (pause-minority).
            await self.amqp.start(serving=not clustered)
        except OSError as exc:
            ports = f"{self.config.amqp_port}" + (f" or {self.config.tls_port} (TLS)" if self.config.tls_port else "")
            if self.management is not None:
                await self.management.stop()
            raise NodeError(f"cannot listen on {self.config.bind}:{ports}: {exc.strerror or exc}") from None
        self.resources.start()
        if clustered:
            self.cluster = cluster_side
            try:
                await self.cluster.start()
            except OSError as exc:
                await self.amqp.stop()
                raise NodeError(str(exc)) from None
        self.log.info("node started", amqp=f"{self.config.bind}:{self.amqp.port}",
                      amqps=f"{self.config.bind}:{self.amqp.tls_port}" if self.amqp.tls_port else None,
                      data_dir=str(self.config.data_dir), pid=os.getpid(),
                      open_files=resource.getrlimit(resource.RLIMIT_NOFILE)[0])

    async def _start_management(self, view: ClusterView) -> None:
        """The management HTTP API and web view, and Prometheus metrics (node/management/),
        reading the cluster through `view`."""
        if not self.config.management_port and not self.config.prometheus_port:
            return
        from .management import Management
        ssl = None
        if self.config.management_tls:
            from .tls import TLSConfigError, server_context
            if self.config.tls_cert is None or self.config.tls_key is None:
                raise NodeError("--management-tls needs --tls-cert and --tls-key")
            try:
                ssl = server_context(self.config.tls_cert, self.config.tls_key, self.config.tls_ca,
                                     self.config.tls_verify_peer)
            except TLSConfigError as exc:
                raise NodeError(str(exc)) from None
        self.management = Management(self.broker, view, self.config.bind, self.config.management_port,
                                     self.config.prometheus_port, self.config.prometheus_per_queue, ssl,
                                     optional=self.config.optional_ports)
        try:
            await self.management.start()
        except OSError as exc:
            await self.management.stop()
            raise NodeError(str(exc)) from None

    async def _load_definitions(self) -> None:
        """--definitions FILE: RabbitMQ's definitions JSON, imported at every start."""
        if self.config.definitions is None:
            return
        from .broker.definitions import read_file
        try:
            self.broker.import_definitions(await read_file(self.config.definitions))
        except (ValueError, KeyError, TypeError) as exc:
            raise NodeError(f"cannot import definitions {self.config.definitions}: {exc}") from None
        self.log.info("definitions imported", file=str(self.config.definitions))

    def _tls_context(self):
        if self.config.tls_port is None:
            return None
        from .tls import TLSConfigError, server_context
        if self.config.tls_cert is None or self.config.tls_key is None:
            raise NodeError("--tls-port needs --tls-cert and --tls-key")
        try:
            return server_context(self.config.tls_cert, self.config.tls_key, self.config.tls_ca,
                                  self.config.tls_verify_peer)
        except TLSConfigError as exc:
            raise NodeError(str(exc)) from None

    def _resource_monitor(self) -> None:
        """Memory and disk-free alarms (ERR-4), checked every second once AMQP is up."""
        from .alarms import ResourceMonitor
        try:
            self.resources = ResourceMonitor(self.broker, self.config.data_dir, self.config.vm_memory_high_watermark,
                                             self.config.disk_free_limit)
        except ValueError as exc:
            raise NodeError(str(exc)) from None
        self.broker.resources = self.resources

    def _default_user(self) -> None:
        """--default-user: the account a deployment starts with (guest is loopback-only)."""
        name, password = self.config.default_user, self.config.default_pass
        if not name or password is None or self.broker.users.get(name) is not None:
            return
        self.broker.users.add(name, password, tags=["administrator"])
        set_permissions = getattr(self.broker, "set_permissions", None)
        if set_permissions is not None:
            set_permissions(name, "/", ".*", ".*", ".*")
        self.log.info("default user created", user=name)

    def _prepare_data_dir(self) -> None:
        path = Path(self.config.data_dir)
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / ".haremq-write-test"
            probe.write_bytes(b"ok")
            probe.unlink()
        except OSError as exc:
            raise NodeError(f"data dir {path} is not writable: {exc.strerror or exc}") from None

    def fail(self, reason: str) -> None:
        """Stop by itself, for a reason the process reports as it exits (status 1)."""
        self.log.error("node stopping: " + reason)
        self.failure = reason
        self.stop_soon()

    def stop_soon(self) -> None:
        """Stop in the background (a signal, a failure): the node's task group keeps the stop
        until it has ended."""
        self.tasks.spawn(self.stop())

    async def stop(self) -> None:
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        self.log.info("node stopping")
        if self.management is not None:
            await self.management.stop()
        if self.resources is not None:
            await self.resources.stop()
        if self.amqp is not None:
            await self.amqp.shutdown()
        if self.cluster is not None:
            await self.cluster.stop()
        if self.store is not None:
            await self.store.close()
        await self.tasks.close()      # but the stop running this, if a signal or failure started it
        self.log.info("node stopped")
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()
