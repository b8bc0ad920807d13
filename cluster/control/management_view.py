"""The cluster view of a member (node/management/cluster_view.py's ClusterView).

What the management API, the web view's timeline and /metrics read of the
cluster, from the member's ClusterNode: membership (who is up, whether this
node pauses), the metadata log (term, role, leader), mirroring (where each
mirrored queue's master is, its mirrors and their sync), and the control
calls that ask every member that is up for its part of a listing or apply a
change through the log (cluster/control/server.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from haremq.node.broker.commands import AdminCallError
from haremq.node.management.cluster_view import AdminRefused, Member, Placement

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from haremq.node.broker.ports import QueuePort
    from haremq.node.management.cluster_view import ClusterView

    from haremq.cluster.node import ClusterNode


class ClusterManagementView:
    def __init__(self, node: ClusterNode) -> None:
        self.node = node

    # ---- members --------------------------------------------------------------------------------
    def members(self) -> list[Member]:
        return [Member(str(row["name"]), up=bool(row["up"]), paused=row.get("paused"), is_self=bool(row["self"]))
                for row in self.node.membership.status()]

    @property
    def paused(self) -> bool:
        return bool(self.node.membership.paused)

    def node_fields(self) -> dict[str, Any]:
        raft = self.node.raft
        return {"paused": self.paused,
                "cluster_links": [{"name": m.name, "up": m.up} for m in self.members() if not m.is_self],
                "raft": {"term": raft.term, "role": raft.role, "leader": raft.leader}}

    # ---- queues ---------------------------------------------------------------------------------
    def placements(self) -> list[Placement]:
        return [Placement(state.vhost, state.name, state.home, state.epoch)
                for state in list(self.node.mirroring.states.values())]

    def queue_status(self, vhost: str, name: str) -> dict[str, Any]:
        status: dict[str, Any] = self.node.mirroring.status(vhost, name)
        return status

    # ---- listings and changes across the cluster ------------------------------------------------
    async def rows(self, kind: str) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = await self.node.control.handle("management_rows", {"kind": kind})
        return rows

    async def node_rows(self) -> list[dict[str, Any]]:
        rows = {r["name"]: r for r in await self.rows("nodes")}
        for member in self.members():
            if member.name not in rows:
                rows[member.name] = {"name": member.name, "type": "disc", "running": False,
                                     "partitions": [], "alarms": [], "paused": None}
            if member.up and member.paused:
                rows[member.name]["paused"] = True
        leader = self.node.leader_name()
        for row in rows.values():
            row["raft_leader"] = row["name"] == leader
        return sorted(rows.values(), key=lambda r: str(r["name"]))

    async def close_connection(self, name: str, reason: str) -> bool:
        return bool(await self.node.control.handle("management_close", {"name": name, "reason": reason}))

    async def admin_call(self, method: str, *args: Any) -> Any:
        try:
            return await self.node.control.broker_call({"method": method, "args": list(args)})
        except AdminCallError as exc:
            raise AdminRefused(str(exc).split(" - ", 1)[-1]) from None

    # ---- /metrics -------------------------------------------------------------------------------
    def metric_families(self, queues: Sequence[tuple[str, QueuePort]], per_queue: bool) -> Iterable[Metric]:
        membership = self.node.membership
        up = GaugeMetricFamily("haremq_peer_up", "1 if this node sees the member up", labels=["peer"])
        for member in self.members():
            if not member.is_self:
                up.add_metric([member.name], int(member.up))
        yield up
        yield GaugeMetricFamily("haremq_node_paused", "1 while this node pauses (it cannot see a majority)",
                                value=int(self.paused))
        yield GaugeMetricFamily("haremq_cluster_members", "Members of the cluster", value=membership.size)
        raft = self.node.raft
        yield GaugeMetricFamily("haremq_raft_term", "Current Raft term of the metadata log", value=raft.term)
        yield GaugeMetricFamily("haremq_raft_commit_index", "Raft commit index of the metadata log",
                                value=raft.commit_index)
        yield GaugeMetricFamily("haremq_raft_is_leader", "1 if this node leads the metadata log",
                                value=int(raft.role == "leader"))
        leader = GaugeMetricFamily("haremq_raft_leader", "The metadata leader as this node sees it",
                                   labels=["leader"])
        leader.add_metric([raft.leader or ""], 1)
        yield leader
        yield from self._queue_families(queues, per_queue)

    def _queue_families(self, queues: Sequence[tuple[str, QueuePort]], per_queue: bool) -> Iterable[Metric]:
        mirroring = self.node.mirroring
        states = list(mirroring.states.values())
        yield CounterMetricFamily("haremq_queue_failovers",
                                  "Promotions of a mirror to master (sum of epochs above 1 of mirrored queues)",
                                  value=sum(max(0, s.epoch - 1) for s in states))
        labels = ["vhost", "queue"] if per_queue else []
        mirrors = GaugeMetricFamily("haremq_queue_mirrors", "Mirrors a queue's policy places", labels=labels)
        synced = GaugeMetricFamily("haremq_queue_synchronised_mirrors", "Synchronised mirrors of a queue",
                                   labels=labels)
        epoch = GaugeMetricFamily("haremq_queue_epoch", "Epoch of a mirrored queue (bumped by each failover)",
                                  labels=["vhost", "queue"])
        progress = GaugeMetricFamily("haremq_queue_sync_progress_ratio",
                                     "Share of the master's contents a syncing mirror has copied",
                                     labels=["vhost", "queue", "mirror"])
        members = GaugeMetricFamily("haremq_queue_members", "Members of a quorum queue (its leader and followers)",
                                    labels=labels)
        online = GaugeMetricFamily("haremq_queue_members_online",
                                   "Members of a quorum queue on nodes this node sees up", labels=labels)
        up = set(self.node.membership.up_members())
        total_mirrors = total_synced = total_members = total_online = 0
        for vname, queue in queues:
            state = mirroring.states.get((vname, queue.name))
            if state is not None and state.group is not None:
                count, count_online = len(state.group), sum(1 for n in state.group if n in up)
                total_members += count
                total_online += count_online
                if per_queue:
                    members.add_metric([vname, queue.name], count)
                    online.add_metric([vname, queue.name], count_online)
            if state is None or not state.mirrors:
                continue
            total_mirrors += len(state.mirrors)
            total_synced += len(state.synced)
            if per_queue:
                mirrors.add_metric([vname, queue.name], len(state.mirrors))
                synced.add_metric([vname, queue.name], len(state.synced))
            epoch.add_metric([vname, queue.name], state.epoch)
            for mirror, text in (self.queue_status(vname, queue.name).get("sync_progress") or {}).items():
                sent, _, total = str(text).partition("/")
                if total and total.isdigit() and int(total):
                    progress.add_metric([vname, queue.name, mirror], int(sent) / int(total))
        if not per_queue:
            mirrors.add_metric([], total_mirrors)
            synced.add_metric([], total_synced)
            members.add_metric([], total_members)
            online.add_metric([], total_online)
        yield members
        yield online
        yield mirrors
        yield synced
        yield epoch
        yield progress


if TYPE_CHECKING:
    def _is_a_cluster_view(view: ClusterManagementView) -> ClusterView:
        return view     # mypy (`make lint`) fails here unless ClusterManagementView is a ClusterView
