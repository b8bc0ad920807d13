"""Direct reply-to across nodes: a reply published on this node for a requester connected to
another goes to that node, in publish order, in batches.

Like RabbitMQ's, a direct reply is not stored or confirmed end to end: if the requester's
channel or node is gone by the time it arrives, it is dropped.
"""
from __future__ import annotations

import asyncio
from collections import defaultdict

import grpc
import structlog

from haremq.node.tasks import TaskGroup

from .codec import message_to_pb
from .rpc import cluster_pb2 as pb

MAX_BATCH = 500


class ReplyForwarder:
    """One sender per destination node; replies waiting for it go together in the next call."""

    def __init__(self, membership):
        self.membership = membership
        self._waiting: dict[str, list] = defaultdict(list)
        self._senders: dict[str, asyncio.Task] = {}
        self.tasks = TaskGroup(f"direct replies {membership.name}")   # the senders
        self.log = structlog.get_logger("haremq.cluster").bind(node=membership.name)

    def forward(self, node: str, token: str, message) -> bool:
        """Send a reply to `node`; False if that node is not a member that is up."""
        peer = self.membership.peers.get(node)
        if peer is None or peer.stub is None or not self.membership.is_up(node):
            return False
        self._waiting[node].append(pb.ReplyBatch.Reply(token=token, message=message_to_pb(message)))
        if node not in self._senders:
            self._senders[node] = self.tasks.spawn(self._send(node, peer))
        return True

    async def _send(self, node: str, peer) -> None:
        try:
            while self._waiting.get(node):
                waiting = self._waiting[node]
                batch, self._waiting[node] = waiting[:MAX_BATCH], waiting[MAX_BATCH:]
                try:
                    await peer.stub.Replies(pb.ReplyBatch(replies=batch), timeout=5.0,
                                            metadata=self.membership.metadata())
                except grpc.aio.AioRpcError as exc:
                    self.log.info("direct replies dropped: their node did not take them",
                                  member=node, replies=len(batch), code=exc.code().name)
        finally:
            self._senders.pop(node, None)

    async def stop(self) -> None:
        await self.tasks.close()
        self._senders.clear()
        self._waiting.clear()
