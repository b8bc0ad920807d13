"""Direct reply-to across nodes: a reply published on this node for a requester connected to
another goes to that node, in publish order, in batches.

Like RabbitMQ's, a direct reply is not stored or confirmed end to end: if the requester's
channel or node is gone by the time it arrives, or its connection is not reading, it is
dropped. What waits here for one node is bounded (MAX_WAITING_BYTES of bodies): while that
node does not take our calls, a reply past the bound is refused at once (`forward` says
False, so a mandatory one goes back to its publisher).
"""
from __future__ import annotations

import asyncio
from collections import defaultdict

import grpc
import structlog

from haremq.node.tasks import TaskGroup

from haremq.cluster.links.codec import message_to_pb
from haremq.cluster.rpc import cluster_pb2 as pb

MAX_BATCH = 500
MAX_WAITING_BYTES = 16 << 20     # reply bodies waiting for one node


class ReplyForwarder:
    """One sender per destination node; replies waiting for it go together in the next call."""

    def __init__(self, membership):
        self.membership = membership
        self._waiting: dict[str, list] = defaultdict(list)
        self._waiting_bytes: dict[str, int] = defaultdict(int)
        self._senders: dict[str, asyncio.Task] = {}
        self.tasks = TaskGroup(f"direct replies {membership.name}")   # the senders
        self.log = structlog.get_logger("haremq.cluster").bind(node=membership.name)

    def forward(self, node: str, token: str, message) -> bool:
        """Send a reply to `node`; False if that node is not a member that is up."""
        peer = self.membership.peers.get(node)
        if peer is None or peer.stub is None or not self.membership.is_up(node):
            return False
        size = len(message.body) + len(message.props_raw)
        if self._waiting_bytes[node] + size > MAX_WAITING_BYTES and self._waiting[node]:
            return False
        self._waiting[node].append(pb.ReplyBatch.Reply(token=token, message=message_to_pb(message)))
        self._waiting_bytes[node] += size
        if node not in self._senders:
            self._senders[node] = self.tasks.spawn(self._send(node, peer))
        return True

    async def _send(self, node: str, peer) -> None:
        try:
            while self._waiting.get(node):
                waiting = self._waiting[node]
                batch, self._waiting[node] = waiting[:MAX_BATCH], waiting[MAX_BATCH:]
                # the batch's bytes count until its call ends: they are held meanwhile
                batch_bytes = sum(len(r.message.body) + len(r.message.properties) for r in batch)
                try:
                    await peer.stub.Replies(pb.ReplyBatch(replies=batch), timeout=5.0,
                                            metadata=self.membership.metadata())
                except grpc.aio.AioRpcError as exc:
                    self.log.info("direct replies dropped: their node did not take them",
                                  member=node, replies=len(batch), code=exc.code().name)
                finally:
                    self._waiting_bytes[node] -= batch_bytes
        finally:
            self._senders.pop(node, None)

    async def stop(self) -> None:
        await self.tasks.close()
        self._senders.clear()
        self._waiting.clear()
        self._waiting_bytes.clear()
