"""A node's cluster side: the gRPC listener, membership and the control commands.

Started after the broker and before AMQP serving: a clustered node accepts
AMQP clients only while it sees a majority of the members (pause-minority).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc
import structlog

from .control import Control
from .membership import CHANNEL_OPTIONS, Membership
from .rpc import cluster_pb2_grpc as pbg
from .secret import SecretCheck
from .service import ClusterService


@dataclass
class ClusterConfig:
    port: int
    bind: str = "127.0.0.1"
    peers: dict[str, str] = field(default_factory=dict)     # name -> host:port
    secret: str = ""
    failure_timeout: float = 3.0


class ClusterNode:
    def __init__(self, name: str, config: ClusterConfig, broker, amqp):
        self.name = name
        self.config = config
        self.broker = broker
        self.amqp = amqp
        self.log = structlog.get_logger("haremq.cluster").bind(node=name)
        self.membership = Membership(name, config.peers, config.secret, config.failure_timeout,
                                     self._majority_changed)
        self.control = Control(self)
        self._server: grpc.aio.Server | None = None
        self._transition: asyncio.Task | None = None

    def leader_name(self) -> str | None:
        return None   # metadata consensus (and so a leader) comes with replicated metadata

    async def start(self) -> None:
        self._server = grpc.aio.server(interceptors=[SecretCheck(self.config.secret)], options=CHANNEL_OPTIONS)
        pbg.add_ClusterServicer_to_server(ClusterService(self), self._server)
        address = f"{self.config.bind}:{self.config.port}"
        try:
            bound = self._server.add_insecure_port(address)
        except RuntimeError:
            bound = 0
        if not bound:
            raise OSError(f"cannot listen on {address} for the cluster port")
        await self._server.start()
        self.log.info("cluster port open", address=address, peers=sorted(self.config.peers))
        await self.membership.start()

    async def stop(self) -> None:
        await self.membership.stop()
        if self._transition is not None:
            self._transition.cancel()
        if self._server is not None:
            await self._server.stop(grace=0.5)

    def _majority_changed(self, majority: bool) -> None:
        self.membership.paused = not majority
        previous = self._transition
        self._transition = asyncio.ensure_future(self._apply(majority, previous))

    async def _apply(self, majority: bool, previous) -> None:
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        if majority:
            await self.amqp.resume()
        else:
            self.log.warning("pausing: this node cannot see a majority of the cluster (pause-minority)")
            await self.amqp.pause("pause-minority: node cannot see a majority of the cluster")
