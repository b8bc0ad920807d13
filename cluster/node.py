"""A node's cluster side: the gRPC listener, membership and the control commands.

Built by the assembly (cluster/assembly.py) with the store's recovered queues,
it builds the node's broker, whose metadata port it is, and hands each of its
parts their callbacks in their constructors. Started after the broker and the
AMQP listener are up, it is handed that listener: a clustered node accepts
AMQP clients only while it sees a majority of the members (pause-minority).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Callable

import grpc
import structlog

from pathlib import Path

from haremq.node.broker.broker import Broker
from haremq.node.broker.commands import Command, NodeRestarted, NodeResumed, NodeStopping
from haremq.node.protocol.replies import AMQPError, ReplyCode
from haremq.node.server import AMQPServer
from haremq.node.tasks import TaskGroup

from haremq.cluster import transport
from haremq.cluster.control.management_view import ClusterManagementView
from haremq.cluster.control.server import Control
from haremq.cluster.links.home import Links
from haremq.cluster.links.reply_to import ReplyForwarder
from haremq.cluster.membership.members import SERVER_OPTIONS, Membership
from haremq.cluster.membership.node_down import DownWatch
from haremq.cluster.metadata import MetadataMachine, raise_result
from haremq.cluster.mirroring.manager import Mirroring
from haremq.cluster.raft.shell import NotLeader, Raft
from haremq.cluster.raft.storage import RaftStorage
from haremq.cluster.rpc import cluster_pb2_grpc as pbg
from haremq.cluster.secret import SecretCheck
from haremq.cluster.service import ClusterService


@dataclass
class ClusterConfig:
    port: int
    bind: str = "127.0.0.1"
    peers: dict[str, str] = field(default_factory=dict)     # name -> host:port
    secret: str = ""
    failure_timeout: float = 3.0
    tls: object = None                                       # transport.TLSFiles for mutual TLS
    advertise: str | None = None     # HOST:PORT the others reach us at; with it, a fresh node joins
                                     # the running cluster (scale-out: cluster/membership/discovery.py)


class ClusterNode:
    def __init__(self, name: str, config: ClusterConfig, data_dir, recovered: dict[int, list[int]],
                 broker: Callable[[ClusterNode], Broker]):
        """A member's cluster side. `broker(self)` builds the node's broker with this node as its
        metadata port (nothing is proposed before start); `recovered` is what the store recovered
        (store id -> message ids), taken by each queue once the log declares it again. The AMQP
        listener it pauses and resumes, and how it stops the node, come with `start`."""
        self.name = name
        self.config = config
        self.log = structlog.get_logger("haremq.cluster").bind(node=name)
        self.broker = broker(self)
        self.amqp: AMQPServer | None = None              # from start(): served only with a majority
        self._stop_node_with: Callable[..., None] | None = None   # from start(): stop with this reason
        self.tasks = TaskGroup(f"cluster node {name}")   # proposals in flight, pause/resume transitions
        self.joining = False           # a fresh member asking to be added: "not a member" is expected
        self.added_at = 0              # the log index of our own member.add, as applied here
        self.join_index = 0            # ... and of the one our join asked for (a replay may hold older ones)
        self._join: asyncio.Future | None = None
        self.membership = Membership(name, config.peers, config.secret, config.failure_timeout,
                                     self._majority_changed, config.tls, on_alarms=self.broker.set_peer_alarms,
                                     on_removed=self._removed)
        self.control = Control(self)
        self.mirroring = Mirroring(self)
        self.metadata = MetadataMachine(name, self.broker, lambda n: self.membership.peers.get(n),
                                        self.membership.metadata, self.membership.is_up, recovered=recovered,
                                        mirroring=self.mirroring, tasks=self.tasks,
                                        on_home_lost=self.membership.probe, on_forget=self.membership.forget,
                                        on_add=self._member_added, on_removed=self._removed,
                                        on_node_down=self._node_down)
        self.raft = Raft(name, self.membership, RaftStorage(Path(data_dir) / "raft", name), self.metadata.apply,
                         self.metadata, on_failure=self._raft_failed)
        self.links = Links()             # queue links open here, by their clients' node
        self.down_watch = DownWatch(self)
        self.replies = ReplyForwarder(self.membership)
        self._server: grpc.aio.Server | None = None
        self._transition: asyncio.Task | None = None
        self._announced = False
        self._returning = False        # paused after announcing: node.resumed before serving again
        self.draining = False
        self.management_view = ClusterManagementView(self)    # what the management side reads of the cluster

    def leader_name(self) -> str | None:
        return self.raft.leader

    def submit(self, command: Command, callback, *args, forward_if_deposed: bool = True) -> None:
        """propose() for callers without a loop of their own: callback(result, error, *args).
        The command is encoded here, at once: one that cannot be is the caller's error."""
        entry = command.to_json()

        async def run():
            try:
                result = await self._propose(entry, forward_if_deposed)
            except AMQPError as err:
                callback(None, err, *args)
            else:
                callback(result, None, *args)
        self.tasks.spawn(run())

    async def propose(self, command: Command, forward_if_deposed: bool = True):
        """Commit a metadata change cluster-wide; the result of applying it here (or its AMQP error).
        forward_if_deposed=False: a decision this node took as the leader is dropped if it stops
        being the leader before the entry commits (its view may be stale)."""
        return await self._propose(command.to_json(), forward_if_deposed)

    async def _propose(self, entry: dict, forward_if_deposed: bool):
        try:
            result = await self.raft.propose(entry, forward_if_deposed)
        except (NotLeader, asyncio.TimeoutError, grpc.aio.AioRpcError) as exc:
            raise AMQPError(ReplyCode.CONNECTION_FORCED,
                            f"cluster metadata not available: {exc or 'timeout'}") from None
        return raise_result(result)

    async def start(self, amqp: AMQPServer, stop_node: Callable[..., None]) -> None:
        """Open the cluster port and take part: `amqp` serves only while this node sees a
        majority (pause-minority); `stop_node(reason)` stops the node when the cluster forgets
        it or its log cannot be written, `stop_node(reason, restart=True)` and starts it again
        (a snapshot it must load)."""
        self.amqp = amqp
        self._stop_node_with = stop_node
        self._server = grpc.aio.server(interceptors=[SecretCheck(self.config.secret)], options=SERVER_OPTIONS)
        pbg.add_ClusterServicer_to_server(ClusterService(self), self._server)
        address = f"{self.config.bind}:{self.config.port}"
        try:
            bound = transport.listen(self._server, address, self.config.tls)
        except RuntimeError:
            bound = 0
        if not bound:
            raise OSError(f"cannot listen on {address} for the cluster port")
        await self._server.start()
        self.log.info("cluster port open", address=address, peers=sorted(self.config.peers))
        # a fresh member asking to be added: set before the first ping, whose answer may be "not a member"
        self.joining = bool(self.config.advertise and self.raft.storage.last_index == 0 and self.membership.peers)
        await self.membership.start()
        await self.raft.start()
        await self.mirroring.start()
        await self.down_watch.start()
        if self.joining:
            from haremq.cluster.membership.discovery import join
            self._join = self.tasks.spawn(join(self, self.config.advertise))

    async def stop(self) -> None:
        if self._announced and self.membership.has_majority:
            try:     # ha-promote-on-shutdown applies to the queues this node masters
                await asyncio.wait_for(self.raft.propose(NodeStopping(self.name).to_json()), 1.0)
            except Exception as exc:  # noqa: BLE001 - shutting down regardless
                self.log.info("stopping without announcing it to the cluster", reason=repr(exc))
        await self.down_watch.stop()
        await self.mirroring.stop()
        await self.replies.stop()
        await self.raft.stop()
        await self.membership.stop()
        await self.tasks.close()
        if self._server is not None:
            await self._server.stop(grace=0.5)

    def _member_added(self, name: str, address: str) -> None:
        """member.add applied: count, ping and (as the leader) replicate to the new member, and
        place mirrors on it as the policies say."""
        if name == self.name:
            self.added_at = self.raft.last_applied
            self._joined()
        elif self.membership.add(name, address):
            self.raft.member_added(name)
            self.mirroring.policies_changed()

    def joined_at(self, index: int) -> None:
        """Our join's member.add committed at `index`."""
        self.join_index = index
        self._joined()

    def _joined(self) -> None:
        """Joining ends once the member.add our join asked for is applied here: every member
        counts us once it applies it too. (A name forgotten and joining again replays its
        earlier member.add and forget first.)"""
        if self.joining and self.join_index and self.added_at >= self.join_index:
            self.joining = False

    def _removed(self, told_by: str | None, told_applied: int = 0) -> None:
        """This node was forgotten (haremq ctl forget-node): it must not take part any more.
        A member that says so (its ping answer) counts only once it has applied our member.add:
        one behind it does not know us yet."""
        if told_by is not None and (self.joining or told_applied < self.added_at):
            return
        self._stop_node("this node was removed from the cluster (haremq ctl forget-node"
                        + (f", as {told_by} says" if told_by else "") + "); start it on an empty data dir to join again")

    def _raft_failed(self, reason: str, restart: bool = False) -> None:
        """Raft could not write its log or vote (fail-stop, cluster/raft/shell.py): the node
        stops; or it must load a snapshot: the node starts again."""
        self._stop_node(reason, restart)

    def _stop_node(self, reason: str, restart: bool = False) -> None:
        """The node stops with `reason` (once), and starts again if `restart`."""
        if self._stop_node_with is not None:
            self._stop_node_with(reason, restart=restart)
            self._stop_node_with = None

    def forward_reply(self, node: str, token: str, message) -> bool:
        """A direct reply for a requester connected to `node` (see cluster.links.reply_to)."""
        return self.replies.forward(node, token, message)

    def _majority_changed(self, majority: bool) -> None:
        previous = self._transition
        self._transition = self.tasks.spawn(self._apply(majority, previous))

    async def _apply(self, majority: bool, previous) -> None:
        if previous is not None:
            await asyncio.gather(previous, return_exceptions=True)
        if majority:
            if not self._announced:
                await self._announce_restart()
            elif self._returning and not await self._announce_return():
                return                 # the majority went again meanwhile: still paused
            if not self.draining:      # `haremq ctl drain` keeps clients away until `revive`
                await self.amqp.resume()
        else:
            self.log.warning("pausing: this node cannot see a majority of the cluster (pause-minority)")
            self._returning = self._announced
            await self.amqp.pause("pause-minority: node cannot see a majority of the cluster")

    async def _announce_return(self) -> bool:
        """Back from a pause, before serving: node.resumed, so that a node.down the leader decided
        while this node was away applies (here too) before any client it serves now owns
        anything, and one decided on that old view after this entry is void. False if the
        majority went again before the entry could be committed."""
        while self.membership.has_majority:
            try:
                await self.raft.propose(NodeResumed(self.name).to_json())
                self._returning = False
                self.log.info("back from a pause: serving again")
                return True
            except (NotLeader, asyncio.TimeoutError, grpc.aio.AioRpcError) as exc:
                self.log.info("waiting for the metadata leader", reason=str(exc) or "timeout")
                await asyncio.sleep(0.3)
        return False

    def _node_down(self, name: str) -> None:
        """node.down applied (not replaying): the links that member's clients opened to queues
        mastered here end (consumers removed, what they had not acked requeued). If it is this
        node, the cluster has counted its clients gone and deleted what they owned: they are
        closed (320), as a paused node's are."""
        ended = self.links.end_from(name)
        if ended:
            self.log.info("queue links of a member that is down ended", member=name, links=ended)
        if name != self.name:
            return
        err = AMQPError(ReplyCode.CONNECTION_FORCED,
                        "broker forced connection closure with reason 'the cluster counted this node down'")
        for session in list(self.broker.sessions):
            if session.vhost is not None and not session.closed:
                session.close(err)
                session.wakeup()

    async def _announce_restart(self) -> None:
        """Before serving: the cluster drops what did not survive this node's restart
        (its transient and exclusive queues), and this node has caught up with the log."""
        while True:
            try:
                await self.raft.propose(NodeRestarted(self.name, self.metadata.incarnation).to_json())
                self._announced = True
                return
            except (NotLeader, asyncio.TimeoutError, grpc.aio.AioRpcError) as exc:
                self.log.info("waiting for the metadata leader", reason=str(exc) or "timeout")
                await asyncio.sleep(0.3)
