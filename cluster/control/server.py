"""`haremq ctl` commands, served by every node over the cluster's gRPC port.

Each command takes a JSON object of arguments and answers JSON. Listings that
span the cluster (queues, connections) ask every member that is up for its
own part and merge the answers; changes to users, vhosts, permissions and
policies are applied on every member that is up.
"""
from __future__ import annotations

import asyncio
import json

from haremq.node.broker.commands import BrokerCall, MemberForget, admin_method
from haremq.node.management.serializers import jsonable
from haremq.node.protocol.replies import AMQPError

from haremq.cluster.control import operations, quorum
from haremq.cluster.control.errors import ControlError
from haremq.cluster.mirroring.election import position_of
from haremq.cluster.rpc import cluster_pb2 as pb


# What this version's cluster does, for tools that must not compare unlike things.
FEATURES = ["replicated-metadata", "remote-queues", "pause-minority", "mirrored-queues"]


class Control:
    def __init__(self, node):
        self.node = node   # cluster.node.ClusterNode

    @property
    def broker(self):
        return self.node.broker

    async def handle(self, command: str, args: dict):
        handler = COMMANDS.get(command)
        if handler is None:
            raise ControlError(f"unknown command '{command}'")
        return await handler(self, args)

    # ---- fan-out ----------------------------------------------------------------------
    async def _on_members(self, command: str, args: dict) -> list:
        """Run `command` with local=True here and on every member that is up; merge the lists."""
        local = dict(args, local=True)
        results = [await self.handle(command, local)]
        membership = self.node.membership
        up = set(membership.up_members())
        calls = []
        for peer in membership.peers.values():
            if peer.name in up:
                calls.append(peer.stub.Control(
                    pb.ControlRequest(command=command, arguments=json.dumps(local).encode()),
                    timeout=5.0, metadata=membership.metadata()))
        for reply in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(reply, BaseException):
                continue
            if reply.ok:
                results.append(json.loads(reply.result))
        merged = []
        for part in results:
            merged.extend(part)
        return merged

    # ---- commands -----------------------------------------------------------------------
    async def cluster_status(self, args: dict) -> dict:
        membership = self.node.membership
        return {
            "node": self.node.name,
            "members": membership.status(),
            "running": membership.up_members(),
            "majority": bool(membership.has_majority),
            "paused": membership.paused,
            "leader": self.node.leader_name(),
            "term": self.node.raft.term,     # a term that keeps rising means elections keep being called
            "alarms": sorted(self.broker.alarms_in_force),
            "alarms_by_node": {n: sorted(a) for n, a in
                               {self.node.name: self.broker.alarms, **self.broker.peer_alarms}.items() if a},
            "features": FEATURES,
        }

    async def list_queues(self, args: dict) -> list:
        if not args.get("local"):
            rows = await self._on_members("list_queues", args)
            seen = {(r["vhost"], r["name"]) for r in rows}
            for vname, vhost in self.broker.vhosts.items():   # homes that did not answer
                for queue in vhost.queues.values():
                    if (vname, queue.name) not in seen and queue.remote:
                        rows.append({"name": queue.name, "vhost": vname, "messages": None,
                                     "messages_unacknowledged": None, "consumers": None, "durable": queue.durable,
                                     "auto_delete": queue.auto_delete, "exclusive": queue.exclusive_owner is not None,
                                     "node": queue.home, "state": "down", "arguments": jsonable(queue.arguments),
                                     **self._mirroring(vname, queue.name)})
            return sorted(rows, key=lambda r: (r["vhost"], r["name"]))
        rows = []
        for vname, vhost in self.broker.vhosts.items():
            for queue in vhost.queues.values():
                if queue.remote:
                    continue     # a record of a queue mastered elsewhere: its home lists it
                rows.append({"name": queue.name, "vhost": vname, "messages": queue.message_count,
                             "messages_unacknowledged": queue.unacked, "consumers": queue.consumer_count,
                             "durable": queue.durable, "auto_delete": queue.auto_delete,
                             "exclusive": queue.exclusive_owner is not None, "node": self.node.name,
                             "state": "running", "arguments": jsonable(queue.arguments),
                             **queue.dedup_stats, **self._mirroring(vname, queue.name)})
        return rows

    def _mirroring(self, vhost: str, name: str) -> dict:
        """Master, mirrors, synchronised mirrors, epoch and sync progress of a mirrored queue."""
        status = self.node.mirroring.status(vhost, name)
        if not status:
            return {"mirrors": [], "synchronised_mirrors": [], "epoch": None, "sync": None, "type": "classic"}
        progress = status.get("sync_progress") or {}
        status["sync"] = ", ".join(f"{n} {p}" for n, p in sorted(progress.items())) or None
        status.setdefault("type", "classic")
        return status

    async def queue_position(self, args: dict) -> dict:
        """A quorum queue's election asks each member how far its copy goes."""
        return position_of(self.node.mirroring, args["vhost"], args["name"])

    async def queue_records(self, args: dict) -> list:
        """What this member's log says of every replicated queue: master, epoch, mirrors, members."""
        return [dict(st.as_json(), vhost=st.vhost, name=st.name)
                for st in self.node.mirroring.states.values() if st.mirrors or st.group is not None]

    async def sync_queue(self, args: dict) -> dict:
        return await self._at_master("sync_queue", args, cancel=False)

    async def cancel_sync_queue(self, args: dict) -> dict:
        return await self._at_master("cancel_sync_queue", args, cancel=True)

    async def _at_master(self, command: str, args: dict, cancel: bool) -> dict:
        mirroring = self.node.mirroring
        state = mirroring.states.get((args["vhost"], args["name"]))
        if state is None or not state.mirrors:
            raise ControlError(f"no mirrored queue '{args['name']}' in vhost '{args['vhost']}'")
        if state.home == self.node.name:
            try:
                return mirroring.sync(args["vhost"], args["name"], cancel)
            except LookupError as exc:
                raise ControlError(str(exc)) from None
        peer = self.node.membership.peers.get(state.home)
        if peer is None or not self.node.membership.is_up(state.home):
            raise ControlError(f"the master of queue '{args['name']}' ({state.home}) is down")
        reply = await peer.stub.Control(pb.ControlRequest(command=command, arguments=json.dumps(args).encode()),
                                        timeout=10.0, metadata=self.node.membership.metadata())
        if not reply.ok:
            raise ControlError(reply.error)
        return json.loads(reply.result)

    async def list_exchanges(self, args: dict) -> list:
        rows = []
        for vname, vhost in self.broker.vhosts.items():
            for exchange in vhost.exchanges.values():
                rows.append({"name": exchange.name, "vhost": vname, "type": exchange.type.value,
                             "durable": exchange.durable, "auto_delete": exchange.auto_delete,
                             "internal": exchange.internal, "arguments": jsonable(exchange.arguments)})
        return rows

    async def list_bindings(self, args: dict) -> list:
        from haremq.node.broker.exchange import Exchange
        rows = []
        for vname, vhost in self.broker.vhosts.items():
            for queue in vhost.queues.values():
                rows.append({"source": "", "vhost": vname, "destination": queue.name,
                             "destination_type": "queue", "routing_key": queue.name, "arguments": {}})
            for exchange in vhost.exchanges.values():
                for destination, key, arguments in exchange.bindings():
                    rows.append({"source": exchange.name, "vhost": vname, "destination": destination.name,
                                 "destination_type": "exchange" if isinstance(destination, Exchange) else "queue",
                                 "routing_key": key, "arguments": jsonable(arguments)})
        return rows

    async def list_connections(self, args: dict) -> list:
        if not args.get("local"):
            return await self._on_members("list_connections", args)
        rows = []
        for session in list(self.broker.sessions):
            if session.vhost is None:
                continue
            rows.append({"node": self.node.name, "peer": f"{session.peer[0]}:{session.peer[1]}",
                         "user": session.user, "vhost": session.vhost.name, "channels": len(session.channels),
                         "blocked": session.blocked})
        return rows

    def _homed_here(self, args: dict):
        vhost = self.broker.vhosts.get(args["vhost"])
        queue = vhost.queues.get(args["name"]) if vhost is not None else None
        if queue is None or queue.remote:
            raise ControlError(f"no queue '{args['name']}' homed on {self.node.name}")
        return queue

    async def purge_queue(self, args: dict) -> dict:
        """queue.purge asked by another node for a queue homed here."""
        return {"message_count": self._homed_here(args).purge()}

    async def queue_stats(self, args: dict) -> dict:
        queue = self._homed_here(args)
        return {"message_count": queue.message_count, "consumer_count": queue.consumer_count}

    async def management_rows(self, args: dict) -> list:
        """The management API's queues, connections, channels, consumers or nodes (args["kind"]):
        every member that is up lists what lives on it (node/management/views.py)."""
        if not args.get("local"):
            return await self._on_members("management_rows", args)
        from haremq.node.management.views import local_rows
        return local_rows(self.broker, self.node.management_view, args["kind"])

    async def management_close(self, args: dict) -> list:
        """The management API's DELETE /api/connections/{name}: the member the client is
        connected to closes it; the answer lists True for each one that did."""
        if not args.get("local"):
            return await self._on_members("management_close", args)
        from haremq.node.management.views import close_local
        return [True] if close_local(self.broker, args["name"], args["reason"]) else []

    async def forget_node(self, args: dict) -> dict:
        name = args["node"]
        if name == self.node.name:
            raise ControlError("a node cannot forget itself")
        if name not in self.node.membership.peers:
            raise ControlError(f"'{name}' is not a member of this cluster")
        if self.node.membership.is_up(name):
            raise ControlError(f"'{name}' is up: stop it before it is forgotten")
        try:   # through the metadata log: every member, and any that restarts, forgets it
            return await self.node.propose(MemberForget(name))
        except AMQPError as exc:
            raise ControlError(exc.text) from None

    async def broker_call(self, args: dict):
        """users, vhosts, permissions, policies: a Broker method applied on every member."""
        method = admin_method(self.broker, args["method"], bool(args.get("read")))
        if method is None:
            raise ControlError(f"this node does not support '{args['method']}'")
        if args.get("read"):
            return jsonable(method(*args.get("args", [])))
        # a change: through the metadata log, so every member applies it in the same order
        try:
            result = await self.node.propose(BrokerCall(args["method"], list(args.get("args", []))))
        except AMQPError as exc:
            raise ControlError(exc.text) from None
        return result.get("result") if isinstance(result, dict) else result


COMMANDS = {
    "cluster_status": Control.cluster_status,
    "list_queues": Control.list_queues,
    "list_exchanges": Control.list_exchanges,
    "list_bindings": Control.list_bindings,
    "list_connections": Control.list_connections,
    "forget_node": Control.forget_node,
    "purge_queue": Control.purge_queue,
    "queue_stats": Control.queue_stats,
    "broker_call": Control.broker_call,
    "management_rows": Control.management_rows,
    "management_close": Control.management_close,
    "sync_queue": Control.sync_queue,
    "queue_position": Control.queue_position,
    "queue_records": Control.queue_records,
    "cancel_sync_queue": Control.cancel_sync_queue,
    **operations.COMMANDS,   # the day-2 commands
    **quorum.COMMANDS,       # the quorum-queue membership commands
}


_jsonable = jsonable      # the name cluster/metadata.py imports it by
