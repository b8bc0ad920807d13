"""One HareMQ node: its components, started and stopped in a known order from one place.

A test can run a node in-process (`async with Node(config)`) as easily as a
user runs `haremq node`.
"""
from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
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


class Node:
    def __init__(self, config: NodeConfig):
        self.config = config
        self.log = structlog.get_logger("haremq.node").bind(node=config.name)
        self.broker: Broker | None = None
        self.store: MessageStore | None = None
        self.amqp: AMQPServer | None = None
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
        self.amqp = AMQPServer(self.broker, self.config.bind, self.config.amqp_port)
        try:
            await self.amqp.start()
        except OSError as exc:
            raise NodeError(f"cannot listen on {self.config.bind}:{self.config.amqp_port}: "
                            f"{exc.strerror or exc}") from None
        self.log.info("node started", amqp=f"{self.config.bind}:{self.amqp.port}",
                      data_dir=str(self.config.data_dir), pid=os.getpid())

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
        if self.amqp is not None:
            await self.amqp.stop()
        if self.store is not None:
            await self.store.close()
        self.log.info("node stopped")
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()
