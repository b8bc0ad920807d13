"""The management API and /metrics of a three-node cluster: cluster-wide listings with each
queue's master, mirrors and counts from its home node, actions on queues homed elsewhere,
a failover as the API and the timeline show it, definitions imported through the metadata log."""
from __future__ import annotations

import time

import pika
import pytest

from haremq.node.management.stats import WATCH_INTERVAL

from tests.conftest import IS_REF, unique_name, wait_until
from tests.management import http, q

pytestmark = [pytest.mark.skipif(IS_REF, reason="starts and kills cluster node processes"),
              pytest.mark.cluster(management=True)]

NAMES = ("hare1", "hare2", "hare3")


def api(member, method, path, body=None, **kw):
    return http(method, member.management_port, path, body, **kw)


def queue_on(member, name):
    status, row, _ = api(member, "GET", f"/api/queues/%2F/{q(name)}")
    return row if status == 200 else None


def metrics(member) -> str:
    return http("GET", member.prometheus_port, "/metrics", user=None, raw=True)[1]


def publish(member, queue, count):
    c = pika.BlockingConnection(pika.URLParameters(member.url))
    ch = c.channel()
    ch.confirm_delivery()
    for i in range(count):
        ch.basic_publish("", queue, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    c.close()


def test_cluster_wide_queues_mirrors_metrics_and_a_failover(cluster):
    hare1, hare2, hare3 = (cluster[n] for n in NAMES)
    policy = {"pattern": "^ha\\.", "definition": {"ha-mode": "all", "ha-sync-mode": "automatic"},
              "apply-to": "queues"}
    assert api(hare1, "PUT", "/api/policies/%2F/ha-all", policy)[0] == 201
    mirrored, plain, lost = "ha." + unique_name("q"), unique_name("plain"), unique_name("lost")
    assert api(hare2, "PUT", f"/api/queues/%2F/{q(mirrored)}", {"durable": True})[0] == 201   # homed on hare2
    assert api(hare2, "PUT", f"/api/queues/%2F/{q(lost)}", {"durable": True})[0] == 201       # not mirrored
    assert api(hare3, "PUT", f"/api/queues/%2F/{q(plain)}", {"durable": True})[0] == 201      # homed on hare3
    publish(hare1, mirrored, 3)
    publish(hare2, plain, 2)

    def mirrored_and_synced():
        row = queue_on(hare1, mirrored)
        return row if row and sorted(row["synchronised_slave_nodes"]) == ["hare1", "hare3"] else None
    row = wait_until(mirrored_and_synced, 30)
    assert row["node"] == "hare2" and row["messages"] == 3 and row["messages_ready"] == 3
    assert sorted(row["slave_nodes"]) == ["hare1", "hare3"] and row["epoch"] == 1 and row["policy"] == "ha-all"
    assert row["message_stats"]["publish"] == 3
    other = queue_on(hare1, plain)
    assert other["node"] == "hare3" and other["messages"] == 2 and other["slave_nodes"] == []
    names = {r["name"]: r["node"] for r in api(hare3, "GET", "/api/queues")[1]}
    assert names[mirrored] == "hare2" and names[plain] == "hare3"

    status, nodes, _ = api(hare1, "GET", "/api/nodes")
    assert status == 200 and [n["name"] for n in nodes] == list(NAMES) and all(n["running"] for n in nodes)
    assert sum(1 for n in nodes if n["raft_leader"]) == 1

    # a client on hare3 shows up in hare1's listing (every member lists its own connections)
    c = pika.BlockingConnection(pika.URLParameters(hare3.url))
    c.channel()
    rows = wait_until(lambda: [r for r in api(hare1, "GET", "/api/connections")[1] if r["node"] == "hare3"], 10)
    assert rows[0]["channels"] == 1
    overview = api(hare1, "GET", "/api/overview")[1]
    assert overview["object_totals"]["connections"] >= 1 and overview["queue_totals"]["messages_ready"] >= 5
    # closed through hare1's API, by hare3
    assert api(hare1, "DELETE", f"/api/connections/{q(rows[0]['name'])}")[0] == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        c.process_data_events(time_limit=5)
        c.process_data_events(time_limit=5)
    assert closed.value.reply_code == 320

    text = metrics(hare2)     # the home node exports the queue's series
    assert f'rabbitmq_queue_messages_ready{{queue="{mirrored}",vhost="/"}} 3.0' in text
    assert f'haremq_queue_synchronised_mirrors{{queue="{mirrored}",vhost="/"}} 2.0' in text
    assert f'haremq_queue_epoch{{queue="{mirrored}",vhost="/"}} 1.0' in text
    assert 'haremq_peer_up{peer="hare1"} 1.0' in text and "\nharemq_raft_term " in text

    # kill the master: a survivor's API shows the node down and the queue's new master. The
    # timeline notes changes it sees between two looks (one a second): let hare1 look once while
    # hare2 is up and the queue is its, or a start and a kill within one second show no change.
    wait_until(lambda: {n["name"]: n for n in api(hare1, "GET", "/api/nodes")[1]}["hare2"]["running"], 10)
    time.sleep(WATCH_INTERVAL + 0.3)
    hare2.kill9()

    def moved():
        row = queue_on(hare1, mirrored)
        return row if row and row["node"] in ("hare1", "hare3") and row["state"] == "running" else None
    row = wait_until(moved, 30)
    assert row["epoch"] == 2 and row["messages"] == 3
    nodes = {n["name"]: n for n in api(hare3, "GET", "/api/nodes")[1]}
    assert nodes["hare2"]["running"] is False and nodes["hare1"]["running"] is True

    def timeline():
        events = api(hare1, "GET", "/api/haremq/events")[1]
        kinds = {(e["kind"], e.get("node") or e.get("new")) for e in events}
        return events if ("member", "hare2") in kinds and ("failover", row["node"]) in kinds else None
    events = wait_until(timeline, 15)
    failover = next(e for e in events if e["kind"] == "failover")
    assert failover["queue"] == mirrored and failover["old"] == "hare2" and failover["epoch"] == 2
    new_home = cluster[row["node"]]
    assert f'haremq_queue_epoch{{queue="{mirrored}",vhost="/"}} 2.0' in metrics(new_home)
    assert "haremq_queue_failovers_total 1.0" in metrics(new_home)
    # a queue whose home is down is listed from the metadata, with no counts
    status, down, _ = api(hare1, "GET", f"/api/queues/%2F/{q(lost)}")
    assert status == 200 and down["state"] == "down" and down["node"] == "hare2" and down["messages"] is None


def test_actions_on_queues_homed_elsewhere_and_definitions_through_the_log(cluster):
    hare1, hare2, hare3 = (cluster[n] for n in NAMES)
    name = unique_name("remote")
    assert api(hare2, "PUT", f"/api/queues/%2F/{q(name)}", {"durable": True})[0] == 201
    publish(hare2, name, 4)
    wait_until(lambda: (queue_on(hare1, name) or {}).get("messages") == 4, 10)
    # get, purge and delete asked of hare1 for a queue homed on hare2
    status, got, _ = api(hare1, "POST", f"/api/queues/%2F/{q(name)}/get",
                         {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"})
    assert status == 200 and got[0]["payload"] == "m0" and got[0]["message_count"] == 3
    wait_until(lambda: (queue_on(hare3, name) or {}).get("messages") == 3, 10)
    assert api(hare1, "DELETE", f"/api/queues/%2F/{q(name)}/contents")[0] == 204
    wait_until(lambda: (queue_on(hare3, name) or {}).get("messages") == 0, 10)
    assert api(hare1, "DELETE", f"/api/queues/%2F/{q(name)}")[0] == 204
    for member in cluster.values():
        wait_until(lambda m=member: api(m, "GET", f"/api/queues/%2F/{q(name)}")[0] == 404, 10)

    vhost, user, imported = unique_name("vh"), unique_name("user"), unique_name("imp")
    definitions = {
        "users": [{"name": user, "password_hash": "", "tags": "management"}],
        "vhosts": [{"name": vhost}],
        "permissions": [{"user": "guest", "vhost": vhost, "configure": ".*", "write": ".*", "read": ".*"}],
        "policies": [{"vhost": vhost, "name": "cap", "pattern": ".*", "apply-to": "queues",
                      "definition": {"max-length": 10}, "priority": 0}],
        "exchanges": [{"name": "fan", "vhost": vhost, "type": "fanout", "durable": True, "auto_delete": False,
                       "internal": False, "arguments": {}}],
        "queues": [{"name": imported, "vhost": vhost, "durable": True, "auto_delete": False, "arguments": {}}],
        "bindings": [{"source": "fan", "vhost": vhost, "destination": imported, "destination_type": "queue",
                      "routing_key": "", "arguments": {}}],
    }
    assert api(hare3, "POST", "/api/definitions", definitions)[0] == 204
    for member in cluster.values():
        def seen(m=member):
            row = http("GET", m.management_port, f"/api/queues/{q(vhost)}/{q(imported)}")[1]
            return row if isinstance(row, dict) and row.get("name") == imported else None
        row = wait_until(seen, 10)
        assert row["node"] == "hare3" and row["policy"] == "cap"
        users = [u["name"] for u in api(member, "GET", "/api/users")[1]]
        assert user in users
        bindings = api(member, "GET", f"/api/bindings/{q(vhost)}")[1]
        assert any(b["source"] == "fan" and b["destination"] == imported for b in bindings)


def test_definitions_from_any_member_hold_every_binding_and_restore_the_routing(cluster):
    """A backup from one member is the whole cluster's: the bindings of queues mastered on the
    other members too (they were left out), quorum queues as `type: quorum`; restored, each
    export routes a message to every queue it bound."""
    exchange = unique_name("defs.fan")
    names = [unique_name(f"defs.d{i}") for i in (1, 2, 3)] + [unique_name("defs.qq")]
    for i, member in enumerate(cluster.values()):
        ch = pika.BlockingConnection(pika.URLParameters(member.url)).channel()
        if i == 0:
            ch.exchange_declare(exchange, "fanout", durable=True)
        ch.queue_declare(names[i], durable=True)
        if i == 0:
            ch.queue_declare(names[3], durable=True, arguments={"x-queue-type": "quorum"})
        ch.connection.close()
    ch = pika.BlockingConnection(pika.URLParameters(cluster["hare1"].url)).channel()
    for name in names:
        ch.queue_bind(name, exchange)
    ch.connection.close()
    for member in cluster.values():
        def complete(m=member):
            got = api(m, "GET", "/api/definitions")[1]
            bound = {b["destination"] for b in got["bindings"] if b["source"] == exchange}
            return got if bound == set(names) else None
        exported = wait_until(complete, 10, message=f"{member.name}'s export lacks bindings")
        kinds = {r["name"]: r["type"] for r in exported["queues"]}
        assert kinds[names[3]] == "quorum" and kinds[names[0]] == "classic"
        restored = unique_name(f"restored.{member.name}")
        mine = {"vhosts": [{"name": restored}],
                "permissions": [{"user": "guest", "vhost": restored, "configure": ".*", "write": ".*", "read": ".*"}],
                **{kind: [dict(row, vhost=restored) for row in exported[kind] if row["vhost"] == "/"
                          and (row.get("name") in names or row.get("source") == exchange or row.get("name") == exchange)]
                   for kind in ("queues", "exchanges", "bindings")}}
        assert api(member, "POST", "/api/definitions", mine)[0] == 204
        url = member.url.rsplit("/", 1)[0] + "/" + q(restored)
        ch = pika.BlockingConnection(pika.URLParameters(url)).channel()
        ch.confirm_delivery()
        ch.basic_publish(exchange, "", b"routed", pika.BasicProperties(delivery_mode=2))
        for name in names:
            wait_until(lambda n=name: ch.queue_declare(n, passive=True).method.message_count == 1, 10,
                       message=f"{name} did not get the message through {member.name}'s restored export")
        ch.connection.close()
