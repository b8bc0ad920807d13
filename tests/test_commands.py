"""Metadata commands: a Raft log written before the typed commands still applies, entry by entry,
to a real broker (no sockets: the state machine is fed log entries as a replaying node is)."""
from __future__ import annotations

import json

import pytest

from haremq.cluster.metadata import APPLY, MetadataMachine
from haremq.node.broker import commands as C
from haremq.node.broker.broker import Broker
from haremq.node.protocol.tables import encode_table

# Entries exactly as nodes wrote them before the commands were typed.
OLD_LOG = [
    {"op": "noop", "leader": "hare1"},
    {"op": "exchange.declare", "name": "ex", "type": "topic", "durable": True, "auto_delete": False,
     "internal": False, "arguments": encode_table({"x-note": "kept"}), "vhost": "/", "method_index": 0x0028000A},
    {"op": "queue.declare", "name": "q", "durable": True, "exclusive": False, "auto_delete": False,
     "arguments": encode_table({}), "owner": None, "home": "hare1", "vhost": "/", "method_index": 0x0032000A},
    {"op": "bind", "kind": "queue", "source": "ex", "destination": "q", "routing_key": "a.#",
     "arguments": encode_table({}), "owner": "conn-1", "vhost": "/", "method_index": 0x00320014},
    {"op": "broker.call", "method": "add_vhost", "args": ["v2"]},
    {"op": "node.stopping", "node": "hare2"},
    {"op": "unbind", "kind": "queue", "source": "ex", "destination": "q", "routing_key": "a.#",
     "arguments": encode_table({}), "owner": "conn-1", "vhost": "/", "method_index": 0x00320032},
    {"op": "queue.delete", "vhost": "/", "name": "q", "if_unused": False, "if_empty": False, "owner": None},
    {"op": "exchange.delete", "name": "ex", "if_unused": False, "vhost": "/", "method_index": 0x00280014},
    {"op": "queue.promote", "vhost": "/", "name": "q", "home": "hare2", "epoch": 2, "from_epoch": 1,
     "shutdown": False},
    {"op": "queue.mirror_synced", "vhost": "/", "name": "q", "node": "hare3", "epoch": 1},
    {"op": "queue.mirror_dropped", "vhost": "/", "name": "q", "node": "hare3", "epoch": 1},
    {"op": "member.forget", "node": "hare9"},
    {"op": "node.restarted", "node": "hare2"},
]


@pytest.mark.parametrize("entry", OLD_LOG, ids=[e["op"] for e in OLD_LOG])
def test_an_old_entry_decodes_and_encodes_back_the_same(entry):
    command = C.from_json(entry)
    assert type(command) in APPLY
    again = command.to_json()
    assert {k: v for k, v in again.items() if k in entry} == entry
    assert C.from_json(json.loads(json.dumps(again))) == command


def test_an_old_log_applies_to_a_broker():
    broker = Broker("hare1")
    machine = MetadataMachine("hare1", broker, lambda _n: None, lambda: ())
    results = {}
    for index, entry in enumerate(OLD_LOG[:5], 1):
        results[entry["op"]] = machine.apply(index, json.dumps(entry).encode())
    vhost = broker.vhosts["/"]
    assert vhost.exchanges["ex"].arguments == {"x-note": "kept"}
    assert results["queue.declare"] == {"queue": "q", "home": "hare1"}
    assert [(d.name, key) for d, key, _a in vhost.exchanges["ex"].bindings()] == [("q", "a.#")]
    assert "v2" in broker.vhosts
    for index, entry in enumerate(OLD_LOG[5:9], 6):
        machine.apply(index, json.dumps(entry).encode())
    assert "q" not in vhost.queues and "ex" not in vhost.exchanges


def test_an_unknown_op_is_skipped_and_an_error_comes_back_as_a_result():
    machine = MetadataMachine("hare1", Broker("hare1"), lambda _n: None, lambda: ())
    assert machine.apply(1, b'{"op": "from.the.future", "x": 1}') is None
    result = machine.apply(2, json.dumps({"op": "exchange.delete", "name": "nope", "if_unused": False,
                                          "vhost": "nowhere"}).encode())
    assert result["error"][0] == 404


def test_admin_calls_are_named_in_an_allow_list():
    broker = Broker("hare1")
    assert C.admin_method(broker, "add_user") == broker.add_user
    assert C.admin_method(broker, "list_users", read=True) == broker.list_users
    for name in ("restore", "_snapshot", "changed", "__class__", "list_users"):
        assert C.admin_method(broker, name) is None
    assert C.admin_method(broker, "add_user", read=True) is None


def test_node_down_deletes_the_exclusive_queues_of_that_nodes_connections_unless_it_returned_since():
    """node.down, as every member applies it: void once the node has returned (node.restarted or
    node.resumed) after the return the leader's decision followed, and applied once per return."""
    machine = MetadataMachine("hare1", Broker("hare1"), lambda _n: None, lambda: ())
    machine.replaying = False
    ended = []
    machine.on_node_down = ended.append
    vhost = machine.broker.vhosts["/"]

    def declare(index, name, owner, exclusive=True, durable=False):
        entry = C.QueueDeclare("/", name, durable, exclusive, False, {}, home=owner.split("/")[0], owner=owner)
        machine.apply(index, json.dumps(entry.to_json()).encode())

    def apply(index, command):
        return machine.apply(index, json.dumps(command.to_json()).encode())
    apply(1, C.NodeRestarted("hare2", "first"))
    declare(2, "replies.2", "hare2/a1")
    declare(3, "replies.3", "hare3/b1")
    declare(4, "shared", "hare2/a1", exclusive=False, durable=True)     # durable, not exclusive: it stays
    declare(5, "transient", "hare2/a1", exclusive=False)                # non-durable, unmirrored: it goes
    assert apply(5, C.NodeDown("hare2", 0)) == {"down": False}          # decided before it returned
    assert apply(6, C.NodeDown("hare2", 1)) == {"down": True, "exclusive_queues_deleted": 1,
                                                "transient_queues_deleted": 1}
    assert sorted(vhost.queues) == ["replies.3", "shared"] and ended == ["hare2"]
    assert apply(7, C.NodeDown("hare2", 1)) == {"down": False}          # once per return
    apply(8, C.NodeResumed("hare2"))                                    # back from a pause
    declare(9, "replies.2", "hare2/a2")
    assert apply(10, C.NodeDown("hare2", 1)) == {"down": False}         # on the view before it
    assert "replies.2" in vhost.queues and ended == ["hare2"]
    assert apply(11, C.NodeDown("hare2", 8)) == {"down": True, "exclusive_queues_deleted": 1,
                                                 "transient_queues_deleted": 0}
    assert sorted(vhost.queues) == ["replies.3", "shared"] and ended == ["hare2", "hare2"]
    replaying = MetadataMachine("hare1", Broker("hare1"), lambda _n: None, lambda: ())   # history only
    replaying.on_node_down = ended.append
    for index, command in enumerate([C.NodeRestarted("hare2", "first"),
                                     C.QueueDeclare("/", "r", False, True, False, {}, "hare2", "hare2/a1"),
                                     C.NodeDown("hare2", 1)], 1):
        replaying.apply(index, json.dumps(command.to_json()).encode())
    assert "r" not in replaying.broker.vhosts["/"].queues and ended == ["hare2", "hare2"]
