"""What management reads of the cluster (node/management/cluster_view.py's ClusterView), without
sockets: a single node answers as a cluster of one and adds nothing of a cluster's to any
answer; a member's view (cluster/control/management_view.py) reads membership, Raft, mirroring and the
control calls of the ClusterNode it is given (stood in for here by plain objects)."""
from __future__ import annotations

import asyncio
import inspect
from types import SimpleNamespace
from typing import Any

import pytest

from haremq.cluster.control.errors import ControlError
from haremq.cluster.control.management_view import ClusterManagementView
from haremq.cluster.mirroring.policy import HAState
from haremq.node.broker.broker import Broker
from haremq.node.management.cluster_view import AdminRefused, ClusterView, Member, Placement
from haremq.node.management.single_node import SingleNodeView
from haremq.node.management.views import node_json


def run(coro):
    return asyncio.run(coro)


# ---- both are the port ----------------------------------------------------------------------------
def port_members() -> dict[str, Any]:
    return {name: value for name, value in vars(ClusterView).items()
            if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))}


@pytest.mark.parametrize("cls", [SingleNodeView, ClusterManagementView])
def test_each_view_has_every_member_of_the_port(cls):
    assert port_members(), "the port names its members"
    for name, wanted in port_members().items():
        found = inspect.getattr_static(cls, name, None)
        assert found is not None, f"{cls.__name__} has no {name}"
        if isinstance(wanted, property):
            assert isinstance(found, property), f"{cls.__name__}.{name} is not a property"
            continue
        assert inspect.iscoroutinefunction(found) == inspect.iscoroutinefunction(wanted), name
        assert list(inspect.signature(found).parameters) == list(inspect.signature(wanted).parameters), name


# ---- a node on its own ------------------------------------------------------------------------------
def test_a_single_node_is_a_cluster_of_one():
    view = SingleNodeView(Broker("solo"))
    assert view.members() == [Member("solo", up=True, paused=False, is_self=True)]
    assert view.members()[0].state == "up"
    assert view.paused is False
    assert view.placements() == []
    assert view.queue_status("/", "q") == {}
    assert view.node_fields() == {}
    assert list(view.metric_families([], per_queue=True)) == []


def test_a_single_node_lists_itself_with_nothing_of_a_cluster():
    broker = Broker("solo")
    view = SingleNodeView(broker)
    rows = run(view.node_rows())
    assert [r["name"] for r in rows] == ["solo"]
    assert rows[0]["paused"] is False and rows[0]["running"] is True
    assert not {"raft", "raft_leader", "cluster_links"} & set(rows[0])
    assert run(view.rows("nodes"))[0].keys() == rows[0].keys()
    assert run(view.rows("connections")) == [] and run(view.rows("queues")) == []
    assert run(view.close_connection("nobody", "test")) is False


def test_a_single_node_applies_admin_calls_here_and_words_a_refusal():
    broker = Broker("solo")
    view = SingleNodeView(broker)
    run(view.admin_call("add_vhost", "v1"))
    assert "v1" in broker.vhosts
    with pytest.raises(AdminRefused, match="^vhost 'v1' already exists$"):
        run(view.admin_call("add_vhost", "v1"))
    with pytest.raises(AdminRefused, match="^this node does not support 'shutdown'$"):
        run(view.admin_call("shutdown"))


# ---- a member of a cluster --------------------------------------------------------------------------
class FakeControl:
    def __init__(self, rows: dict[str, list[dict]]):
        self.rows, self.calls = rows, []

    async def handle(self, command: str, args: dict):
        self.calls.append((command, args))
        if command == "management_rows":
            return [dict(r) for r in self.rows.get(args["kind"], [])]
        if command == "management_close":
            return [True] if args["name"] == "known" else []
        raise AssertionError(command)

    async def broker_call(self, args: dict):
        if args["method"] == "add_vhost" and args["args"] == ["taken"]:
            raise ControlError("add_vhost - vhost 'taken' already exists")
        return {"done": args}


def member_node(*, paused=False, peers=(("hare2", True, False), ("hare3", False, None)), states=(), rows=None,
                leader="hare2"):
    status = [{"name": "hare1", "address": "self", "up": True, "paused": paused, "self": True}]
    status += [{"name": n, "address": "x", "up": up, "paused": p, "self": False} for n, up, p in peers]
    membership = SimpleNamespace(status=lambda: status, paused=paused, size=len(status),
                                 up_members=lambda: [r["name"] for r in status if r["up"]])
    raft = SimpleNamespace(term=7, role="follower", leader=leader, commit_index=41)
    by_key = {(s.vhost, s.name): s for s in states}
    mirroring = SimpleNamespace(states=by_key, status=lambda v, n: (
        {"master": by_key[(v, n)].home, "mirrors": list(by_key[(v, n)].mirrors), "sync_progress": {"hare3": "5/10"}}
        if (v, n) in by_key else {}))
    return SimpleNamespace(membership=membership, raft=raft, mirroring=mirroring, control=FakeControl(rows or {}),
                           leader_name=lambda: leader)


def test_a_member_reads_membership():
    view = ClusterManagementView(member_node())
    assert [(m.name, m.state, m.is_self) for m in view.members()] == [
        ("hare1", "up", True), ("hare2", "up", False), ("hare3", "down", False)]
    assert view.paused is False
    assert ClusterManagementView(member_node(paused=True)).paused is True


def test_a_members_own_row_has_its_pause_links_and_raft_state_in_that_order():
    view = ClusterManagementView(member_node())
    assert list(view.node_fields()) == ["paused", "cluster_links", "raft"]
    assert view.node_fields() == {"paused": False,
                                  "cluster_links": [{"name": "hare2", "up": True}, {"name": "hare3", "up": False}],
                                  "raft": {"term": 7, "role": "follower", "leader": "hare2"}}
    row = node_json(Broker("hare1"), view)
    assert list(row)[-2:] == ["cluster_links", "raft"] and row["paused"] is False


def test_the_nodes_listing_has_every_member_and_the_metadata_leader():
    answered = [{"name": "hare2", "running": True, "paused": False}, {"name": "hare1", "running": True, "paused": False}]
    view = ClusterManagementView(member_node(rows={"nodes": answered}))
    rows = run(view.node_rows())
    assert [r["name"] for r in rows] == ["hare1", "hare2", "hare3"]
    assert [r["raft_leader"] for r in rows] == [False, True, False]
    assert rows[2] == {"name": "hare3", "type": "disc", "running": False, "partitions": [], "alarms": [],
                       "paused": None, "raft_leader": False}


def test_a_member_seen_paused_is_listed_paused():
    answered = [{"name": n, "running": True, "paused": False} for n in ("hare1", "hare2")]
    view = ClusterManagementView(member_node(peers=(("hare2", True, True),), rows={"nodes": answered}))
    assert {r["name"]: r["paused"] for r in run(view.node_rows())} == {"hare1": False, "hare2": True}


def test_a_member_asks_the_control_calls_and_words_a_refusal():
    node = member_node(rows={"queues": [{"name": "q"}]})
    view = ClusterManagementView(node)
    assert run(view.rows("queues")) == [{"name": "q"}]
    assert run(view.close_connection("known", "bye")) is True
    assert run(view.close_connection("other", "bye")) is False
    assert node.control.calls[-1] == ("management_close", {"name": "other", "reason": "bye"})
    assert run(view.admin_call("add_vhost", "v")) == {"done": {"method": "add_vhost", "args": ["v"]}}
    with pytest.raises(AdminRefused, match="^vhost 'taken' already exists$"):
        run(view.admin_call("add_vhost", "taken"))


def test_a_member_reads_placements_and_queue_status_from_mirroring():
    states = [HAState("/", "a", "hare2", epoch=3, mirrors=["hare1", "hare3"], synced=["hare1"]),
              HAState("/", "b", "hare1")]
    view = ClusterManagementView(member_node(states=states))
    assert view.placements() == [Placement("/", "a", "hare2", 3), Placement("/", "b", "hare1", 1)]
    assert view.placements()[0].key == ("/", "a")
    assert view.queue_status("/", "a")["master"] == "hare2"
    assert view.queue_status("/", "nope") == {}


def test_a_members_metric_series():
    states = [HAState("/", "a", "hare1", epoch=3, mirrors=["hare2", "hare3"], synced=["hare2"])]
    view = ClusterManagementView(member_node(states=states))
    queue = SimpleNamespace(name="a")
    families = {f.name: f for f in view.metric_families([("/", queue)], per_queue=True)}
    assert list(families) == ["haremq_peer_up", "haremq_node_paused", "haremq_cluster_members", "haremq_raft_term",
                              "haremq_raft_commit_index", "haremq_raft_is_leader", "haremq_raft_leader",
                              "haremq_queue_failovers", "haremq_queue_members", "haremq_queue_members_online",
                              "haremq_queue_mirrors", "haremq_queue_synchronised_mirrors", "haremq_queue_epoch",
                              "haremq_queue_sync_progress_ratio"]
    assert [(s.labels, s.value) for s in families["haremq_peer_up"].samples] == [
        ({"peer": "hare2"}, 1), ({"peer": "hare3"}, 0)]
    assert families["haremq_queue_failovers"].samples[0].value == 2
    assert families["haremq_queue_mirrors"].samples[0].value == 2
    assert families["haremq_queue_synchronised_mirrors"].samples[0].value == 1
    assert families["haremq_queue_sync_progress_ratio"].samples[0].value == 0.5
    summed = {f.name: f for f in view.metric_families([("/", queue)], per_queue=False)}
    assert [(s.labels, s.value) for s in summed["haremq_queue_mirrors"].samples] == [({}, 2)]
