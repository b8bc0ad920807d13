"""One HareMQ node: its parts, started and stopped in a known order from one place.

The parts are built by the application's assembly (cluster/assembly.py's
`build_node`) and handed to the constructor, so this module builds nothing
and imports nothing of the cluster. A test runs a node in-process
(`async with build_node(config)`) as easily as a user runs `haremq node`.
"""
from __future__ import annotations

import asyncio
import os
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

import structlog

from .broker import consumer_timeout as ack_timeouts
from .broker.broker import Broker
from .gc_pauses import GCPauses
from .management.cluster_view import ClusterView
from .server import AMQPServer
from .store.store import MessageStore
from .tasks import TaskGroup

if TYPE_CHECKING:
    from .management import Management


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
    consumer_timeout: int = ack_timeouts.DEFAULT_MS   # ms; 0 = none (node/broker/consumer_timeout.py)
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
    """What a node asks of its cluster side: a member's (cluster/node.py's ClusterNode) or a
    node on its own's (node/single_node.py's SingleNode, a cluster of one). Built before the
    management side, which reads the cluster through its view; started once the broker and
    the AMQP listener are up, and then it decides when the listener serves (a member only while
    it sees a majority: pause-minority) and may stop the node (`stop_node(reason)`, when the
    cluster forgets it or its log cannot be written); stopped before the listener and store."""

    @property
    def management_view(self) -> ClusterView: ...

    async def start(self, amqp: AMQPServer, stop_node: Callable[..., None]) -> None: ...

    async def stop(self) -> None: ...


class Node:
    def __init__(self, config: NodeConfig, store: MessageStore, broker: Broker, amqp: AMQPServer,
                 cluster: ClusterSide, management: Management | None = None):
        """Every part built and wired (cluster/assembly.py): the store opened, the broker
        holding what it recovered, the AMQP listener and management not yet listening
        (`management` None when both its ports are off)."""
        self.config = config
        self.store = store
        self.broker = broker
        self.amqp = amqp
        self.cluster = cluster
        self.management = management
        self.resources = broker.resources      # node/alarms.py's monitor, built with the broker
        self.log = structlog.get_logger("haremq.node").bind(node=config.name)
        self._stopping = False
        self._stopped = asyncio.Event()
        self.failure: str | None = None     # why the node stopped by itself, if it did
        self.restart = False                # ... and whether the process starts it again
        self.tasks = TaskGroup(f"node {config.name}")   # a stop asked for by a signal or a failure
        self.gc_pauses = GCPauses(config.name)

    async def __aenter__(self) -> "Node":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def start(self) -> None:
        self.gc_pauses.install()
        self._default_user()
        await self._load_definitions()
        await self._start_management()      # a management port in use stops the node before AMQP opens
        try:
            # bound now (a port in use fails here); the cluster side says when it serves
            await self.amqp.start(serving=False)
        except OSError as exc:
            ports = f"{self.config.amqp_port}" + (f" or {self.config.tls_port} (TLS)" if self.config.tls_port else "")
            if self.management is not None:
                await self.management.stop()
            raise NodeError(f"cannot listen on {self.config.bind}:{ports}: {exc.strerror or exc}") from None
        if self.resources is not None:
            self.resources.start()
        if self.config.consumer_timeout:
            self.tasks.spawn(self._consumer_timeouts())
        try:
            await self.cluster.start(self.amqp, self.fail)
        except OSError as exc:
            await self.amqp.stop()
            raise NodeError(str(exc)) from None
        self.log.info("node started", amqp=f"{self.config.bind}:{self.amqp.port}",
                      amqps=f"{self.config.bind}:{self.amqp.tls_port}" if self.amqp.tls_port else None,
                      data_dir=str(self.config.data_dir), pid=os.getpid(),
                      open_files=resource.getrlimit(resource.RLIMIT_NOFILE)[0])

    async def _consumer_timeouts(self) -> None:
        """Channels whose oldest delivery waits past its timeout are closed (406), now and then."""
        default = self.config.consumer_timeout
        while True:
            await asyncio.sleep(ack_timeouts.CHECK_EVERY)
            for session, channel_id, limit in ack_timeouts.check(self.broker.sessions, time.monotonic(),
                                                                     default):
                session.log.warning("consumer timed out waiting for delivery acknowledgement: channel closed",
                                    channel=channel_id, timeout_ms=limit)

    async def _start_management(self) -> None:
        """The management HTTP API and web view, and Prometheus metrics (node/management/)."""
        if self.management is None:
            return
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

    def _default_user(self) -> None:
        """--default-user: the account a deployment starts with (guest is loopback-only)."""
        name, password = self.config.default_user, self.config.default_pass
        if not name or password is None or self.broker.users.get(name) is not None:
            return
        self.broker.users.add(name, password, tags=["administrator"])
        self.broker.set_permissions(name, "/", ".*", ".*", ".*")
        self.log.info("default user created", user=name)

    def fail(self, reason: str, restart: bool = False) -> None:
        """Stop by itself, for a reason the process reports as it exits (status 1); with
        `restart`, for one it mends by starting again (cluster/cli.py re-executes itself)."""
        self.log.error("node stopping: " + reason + ("; starting again" if restart else ""))
        self.failure = reason
        self.restart = restart
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
        await self.amqp.shutdown()
        await self.cluster.stop()
        await self.store.close()
        await self.tasks.close()      # but the stop running this, if a signal or failure started it
        self.gc_pauses.remove()
        self.log.info("node stopped")
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()
