"""The gRPC servicer of a node: thin handlers that hand each call to its component."""
from __future__ import annotations

import json

import grpc

from haremq.cluster.control.errors import ControlError
from haremq.cluster.links.codec import message_from_pb
from haremq.cluster.links.home import serve_link
from haremq.cluster.mirroring.mirror import serve_mirror
from haremq.cluster.raft.shell import RELAY_KEY, StorageFailed
from haremq.cluster.rpc import cluster_pb2 as pb
from haremq.cluster.rpc import cluster_pb2_grpc as pbg


async def _first(request_iterator):
    """A stream's first message, or None: a caller may go before it sends one (a member killed
    as it opens a link or a mirror stream)."""
    try:
        return await request_iterator.__anext__()
    except StopAsyncIteration:
        return None


async def _raft_call(handle, request, context):
    """A member whose Raft storage failed is stopping (fail-stop, logged once where it failed):
    it answers its peers UNAVAILABLE, as a stopped one would, not with an exception per call."""
    try:
        return await handle(request)
    except StorageFailed as exc:
        await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))


class ClusterService(pbg.ClusterServicer):
    def __init__(self, node):
        self.node = node   # cluster.node.ClusterNode

    async def Ping(self, request, context):
        self.node.membership.heard_from(request.node)
        return pb.PingReply(node=self.node.name, leader=self.node.leader_name() or "",
                            down=self.node.membership.down_members(), alarms=sorted(self.node.broker.alarms),
                            paused=self.node.membership.paused, commit_index=self.node.raft.last_applied,
                            # a member still replaying its log may not have applied the caller's member.add yet
                            not_member=request.node not in self.node.membership.peers
                            and not self.node.metadata.replaying)

    async def RequestVote(self, request, context):
        return await _raft_call(self.node.raft.on_request_vote, request, context)

    async def AppendEntries(self, request, context):
        return await _raft_call(self.node.raft.on_append_entries, request, context)

    async def InstallSnapshot(self, request, context):
        return await _raft_call(self.node.raft.on_install_snapshot, request, context)

    async def Propose(self, request, context):
        relay = any(key == RELAY_KEY for key, _value in context.invocation_metadata() or ())
        return await _raft_call(lambda r: self.node.raft.on_propose(r, relay), request, context)

    async def QueueSession(self, request_iterator, context):
        node = self.node
        first = await _first(request_iterator)
        if first is None:
            return
        async for event in serve_link(node.broker, first, request_iterator, context, node.links, node.mirroring):
            yield event

    async def Mirror(self, request_iterator, context):
        first = await _first(request_iterator)
        if first is None:
            return
        # a returning node may hear from the master before the leader: let its log catch up first
        await self.node.mirroring.admit_stream(first.vhost, first.queue, first.epoch, first.master)
        async for ack in serve_mirror(self.node.mirroring, first, request_iterator, context):
            yield ack

    async def Replies(self, request, context):
        broker = self.node.broker
        delivered = sum(broker.deliver_reply_here(reply.token, message_from_pb(reply.message))
                        for reply in request.replies)
        return pb.RepliesAck(delivered=delivered)

    async def Control(self, request, context):
        try:
            args = json.loads(request.arguments) if request.arguments else {}
            result = await self.node.control.handle(request.command, args)
        except ControlError as exc:
            return pb.ControlReply(ok=False, error=str(exc))
        except (KeyError, TypeError, ValueError) as exc:
            return pb.ControlReply(ok=False, error=f"bad arguments for {request.command}: {exc}")
        return pb.ControlReply(ok=True, result=json.dumps(result).encode())
