"""One HareMQ node: its components, started and stopped in a known order from one place.

A test can run a node in-process (`async with Node(config)`) as easily as a
user runs `haremq node`.
"""
from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from .broker.broker import Broker
from .server import AMQPServer
from .store.store import MessageStore, StoreError


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
    default_user: str | None = None
    default_pass: str | None = None


class Node:
    def __init__(self, config: NodeConfig):
        self.config = config
        self.log = structlog.get_logger("haremq.node").bind(node=config.name)
        self.broker: Broker | None = None
        self.store: MessageStore | None = None
        self.amqp: AMQPServer | None = None
        self.cluster = None
        self._stopping = False
        self._stopped = asyncio.Event()

    async def __aenter__(self) -> "Node":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def start(self) -> None:
        self._prepare_data_dir()
        self.store = MessageStore(self.config.data_dir, self.config.name, segment_size=self.config.segment_size,
                                  skip_corrupt=self.config.skip_corrupt)
        try:
            recovered = self.store.open()
        except StoreError as exc:
            raise NodeError(str(exc)) from None
        self.broker = Broker(self.config.name, self.store)
        self.broker.restore(recovered)
        self._default_user()
        self.amqp = AMQPServer(self.broker, self.config.bind, self.config.amqp_port)
        clustered = self.config.cluster_port is not None
        try:
            # A clustered node serves AMQP only once it sees a majority (pause-minority).
            await self.amqp.start(serving=not clustered)
        except OSError as exc:
            raise NodeError(f"cannot listen on {self.config.bind}:{self.config.amqp_port}: "
                            f"{exc.strerror or exc}") from None
        if clustered:
            from cluster.node import ClusterConfig, ClusterNode
            self.cluster = ClusterNode(self.config.name, ClusterConfig(
                port=self.config.cluster_port, bind=self.config.bind, peers=dict(self.config.peers),
                secret=self.config.cluster_secret, failure_timeout=self.config.failure_timeout),
                self.broker, self.amqp)
            try:
                await self.cluster.start()
            except OSError as exc:
                await self.amqp.stop()
                raise NodeError(str(exc)) from None
        self.log.info("node started", amqp=f"{self.config.bind}:{self.amqp.port}",
                      data_dir=str(self.config.data_dir), pid=os.getpid())

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

    async def stop(self) -> None:
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        self.log.info("node stopping")
        if self.cluster is not None:
            await self.cluster.stop()
        if self.amqp is not None:
            await self.amqp.stop()
        if self.store is not None:
            await self.store.close()
        self.log.info("node stopped")
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()
