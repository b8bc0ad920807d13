"""Quorum-declared queues (x-queue-type quorum): replicated with no policy, on the declaring node
and the next ones (x-quorum-initial-group-size, default three), every message persisted, and
x-delivery-count on redeliveries, as an application written for RabbitMQ's quorum queues expects."""
from __future__ import annotations

import json
import threading
import time

import pika
import pytest

from tests.clusters import ctl, queue_row
from tests.conftest import pika_conn, unique_name, wait_until
from tests.management import http, q
from tests.test_management_cluster import metrics

# one cluster (with the management API) for the module: each test leaves it usable for the next
pytestmark = pytest.mark.cluster(management=True, shared=True)

QUORUM = {"x-queue-type": "quorum"}


def _synced(member, name, mirrors):
    return wait_until(lambda: (lambda r: r if r and sorted(r["synchronised_mirrors"] or []) == mirrors else None)(
        queue_row(member, name)), timeout=20, message=f"{name} never had synchronised mirrors {mirrors}")


def test_a_quorum_queue_is_replicated_with_no_policy_and_survives_its_leaders_death(cluster):
    hare1, hare2, hare3 = cluster
    name = unique_name("qq.orders")
    ch = pika_conn(hare1).channel()
    ch.queue_declare(name, durable=True, arguments=QUORUM)
    row = _synced(hare2, name, ["hare2", "hare3"])
    assert row["master"] == "hare1" and row["members"] == ["hare1", "hare2", "hare3"]
    ch.confirm_delivery()
    for i in range(100):      # transient: a quorum queue keeps them all the same
        ch.basic_publish("", name, b"%d" % i, pika.BasicProperties(delivery_mode=1))
    hare1.kill9()
    try:
        pub = pika_conn(hare2).channel()
        pub.confirm_delivery()
        deadline = time.monotonic() + 15
        while True:
            try:
                pub.basic_publish("", name, b"after", pika.BasicProperties(delivery_mode=1))
                break
            except pika.exceptions.NackError:
                assert time.monotonic() < deadline, "publishes still nacked 15 s after the leader died"
                time.sleep(0.05)
        got = []
        reader = pika_conn(hare3).channel()
        while True:
            method, _props, body = reader.basic_get(name, auto_ack=True)
            if method is None:
                break
            got.append(body)
        assert sorted(got) == sorted([b"%d" % i for i in range(100)] + [b"after"])
    finally:
        hare1.start(timeout=60)


def test_initial_group_size_sets_how_many_members(cluster):
    hare1, hare2, _hare3 = cluster
    name = unique_name("qq.two")
    pika_conn(hare2).channel().queue_declare(name, durable=True,
                                             arguments={**QUORUM, "x-quorum-initial-group-size": 2})
    row = _synced(hare1, name, ["hare3"])
    assert row["master"] == "hare2" and row["members"] == ["hare2", "hare3"]
    # Prometheus: the leader's node exports the member count and how many are online
    text = metrics(hare2)
    assert f'haremq_queue_members{{queue="{name}",vhost="/"}} 2.0' in text
    assert f'haremq_queue_members_online{{queue="{name}",vhost="/"}} 2.0' in text


def test_prometheus_counts_the_members_online(cluster):
    hare1, hare2, hare3 = cluster
    name = unique_name("qq.online")
    pika_conn(hare2).channel().queue_declare(name, durable=True, arguments=QUORUM)
    _synced(hare1, name, ["hare1", "hare3"])
    hare3.kill9()
    try:
        wait_until(lambda: f'haremq_queue_members_online{{queue="{name}",vhost="/"}} 2.0' in metrics(hare2),
                   timeout=30, message="hare3 never counted offline")
        assert f'haremq_queue_members{{queue="{name}",vhost="/"}} 3.0' in metrics(hare2)
    finally:
        hare3.start(timeout=60)
    wait_until(lambda: f'haremq_queue_members_online{{queue="{name}",vhost="/"}} 3.0' in metrics(hare2),
               timeout=30, message="hare3 never counted online again")


def test_shrink_moves_the_leadership_off_the_node_it_empties(cluster):
    """rabbitmq-queues shrink NODE removes NODE from every queue, the ones it leads too."""
    hare1, hare2, _hare3 = cluster
    name = unique_name("qq.shrunk")
    ch = pika_conn(hare1).channel()
    ch.queue_declare(name, durable=True, arguments=QUORUM)
    _synced(hare2, name, ["hare2", "hare3"])
    ch.confirm_delivery()
    for i in range(20):
        ch.basic_publish("", name, b"%d" % i)
    r = ctl(hare2, "shrink", "hare1", "--queue-pattern", name.replace(".", r"\."), "--json")
    assert r.returncode == 0, r.stderr
    assert [row["result"] for row in json.loads(r.stdout)] == ["ok"]
    row = wait_until(lambda: (lambda r: r if r and r["members"] == ["hare2", "hare3"] else None)(
        queue_row(hare2, name)), timeout=20, message="hare1 never left")
    assert row["leader"] in ("hare2", "hare3")
    assert pika_conn(hare2).channel().queue_declare(name, durable=True, passive=True,
                                                    arguments=QUORUM).method.message_count == 20
    pika_conn(hare2).channel().queue_delete(name)


def test_delete_member_of_the_leader_moves_leadership_first_and_keeps_every_confirmed_message(cluster):
    """rabbitmq-queues delete_member works on the leader too: another member takes over first. A
    publisher keeps going meanwhile; whatever was confirmed is in the queue afterwards."""
    hare1, hare2, hare3 = cluster
    name = unique_name("qq.leaderout")
    pika_conn(hare1).channel().queue_declare(name, durable=True, arguments=QUORUM)
    _synced(hare2, name, ["hare2", "hare3"])
    confirmed, stop = [], threading.Event()

    def publish():
        ch = pika_conn(hare2).channel()
        ch.confirm_delivery()
        i = 0
        while not stop.is_set() or len(confirmed) < 300:
            body = b"%d" % i
            i += 1
            try:
                ch.basic_publish("", name, body)
                confirmed.append(body)
            except pika.exceptions.NackError:
                pass        # not confirmed: the publisher may send it again; this one does not
    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    try:
        wait_until(lambda: len(confirmed) >= 100, timeout=30)
        r = ctl(hare3, "delete-member", name, "hare1")
        assert r.returncode == 0, r.stderr + r.stdout
    finally:
        stop.set()
        publisher.join(60)
    assert not publisher.is_alive()
    row = wait_until(lambda: (lambda r: r if r and r["members"] == ["hare2", "hare3"] else None)(
        queue_row(hare1, name)), timeout=20, message="hare1 never left")
    assert row["leader"] in ("hare2", "hare3") and row["master"] == row["leader"]
    reader = pika_conn(hare3).channel()
    got = set()
    while True:
        method, _props, body = reader.basic_get(name, auto_ack=True)
        if method is None:
            break
        got.add(body)
    assert not set(confirmed) - got, f"{len(set(confirmed) - got)} confirmed messages lost"
    reader.queue_delete(name)


def test_a_policy_does_not_move_a_quorum_queues_members(cluster):
    hare1, _hare2, _hare3 = cluster
    name = unique_name("qq.policy")
    r = ctl(hare1, "set-policy", "qq-nodes", r"^qq\.policy", json.dumps({"ha-mode": "nodes", "ha-params": ["hare1"]}),
            "--apply-to", "queues")
    assert r.returncode == 0, r.stderr
    try:
        pika_conn(hare1).channel().queue_declare(name, durable=True, arguments=QUORUM)
        _synced(hare1, name, ["hare2", "hare3"])
    finally:
        ctl(hare1, "clear-policy", "qq-nodes")


def test_redeliveries_carry_x_delivery_count(node):
    ch = pika_conn(node).channel()
    name = unique_name("qq.count")
    ch.queue_declare(name, durable=True, arguments=QUORUM)
    ch.basic_publish("", name, b"again")
    counts = []
    for _ in range(3):
        method, props, _body = wait_until(lambda: (lambda r: r if r[0] else None)(ch.basic_get(name)), timeout=5)
        counts.append((props.headers or {}).get("x-delivery-count"))
        ch.basic_nack(method.delivery_tag, requeue=True)
    assert counts == [0, 1, 2]       # RabbitMQ 3.10 answers basic.get with the count from 0 on
    ch.queue_delete(name)


def test_a_redelivery_after_the_leaders_death_carries_x_delivery_count(cluster):
    """A message a consumer on the leader's node held when that node died comes back on the new
    leader as returned once (x-delivery-count 1, as RabbitMQ counts a consumer's channel going
    away), and x-delivery-limit goes on counting from there."""
    hare1, hare2, _hare3 = cluster
    name, dead = unique_name("qq.held"), unique_name("qq.held.dead")
    ch = pika_conn(hare1).channel()
    ch.queue_declare(dead, durable=True, arguments=QUORUM)
    ch.queue_declare(name, durable=True, arguments={**QUORUM, "x-delivery-limit": 1, "x-dead-letter-exchange": "",
                                                    "x-dead-letter-routing-key": dead})
    _synced(hare2, name, ["hare2", "hare3"])
    ch.confirm_delivery()
    ch.basic_publish("", name, b"held")
    method, props, _body = ch.basic_get(name)
    assert method is not None and props.headers["x-delivery-count"] == 0
    ch.basic_publish("", name, b"after")   # confirmed: the mirrors have heard of the delivery before it
    hare1.kill9()
    try:
        wait_until(lambda: (lambda r: r and r["master"] != "hare1")(queue_row(hare2, name)), timeout=30,
                   message="no new leader")
        reader = pika_conn(hare2).channel()
        method, props, body = wait_until(lambda: (lambda r: r if r[0] else None)(reader.basic_get(name)), timeout=10)
        assert (body, method.redelivered, props.headers.get("x-delivery-count")) == (b"held", True, 1)
        reader.basic_nack(method.delivery_tag, requeue=True)     # the second return: over the limit
        _method, props, body = wait_until(lambda: (lambda r: r if r[0] else None)(reader.basic_get(dead, auto_ack=True)),
                                          timeout=10)
        assert (body, props.headers["x-death"][0]["reason"]) == (b"held", "delivery_limit")
        method, _props, body = reader.basic_get(name, auto_ack=True)
        assert body == b"after" and not method.redelivered
    finally:
        hare1.start(timeout=60)


def test_a_redelivery_after_a_restart_carries_x_delivery_count(own_node):
    ch = pika_conn(own_node).channel()
    ch.queue_declare("qq.restart", durable=True, arguments=QUORUM)
    ch.confirm_delivery()
    ch.basic_publish("", "qq.restart", b"held")
    assert ch.basic_get("qq.restart")[0] is not None
    ch.basic_publish("", "qq.restart", b"after")     # confirmed: the delivery is on disk before it
    own_node.kill9()
    own_node.start()
    ch = pika_conn(own_node).channel()
    method, props, body = ch.basic_get("qq.restart", auto_ack=True)
    assert (body, method.redelivered, (props.headers or {}).get("x-delivery-count")) == (b"held", True, 1)
    method, props, body = ch.basic_get("qq.restart", auto_ack=True)
    assert (body, method.redelivered, (props.headers or {}).get("x-delivery-count")) == (b"after", False, 0)


def test_a_quorum_queue_delivery_limit_dead_letters_a_poison_message(node):
    ch = pika_conn(node).channel()
    name, dead = unique_name("qq.poison"), unique_name("qq.dead")
    ch.queue_declare(dead, durable=True)
    ch.queue_declare(name, durable=True, arguments={**QUORUM, "x-delivery-limit": 2,
                                                    "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead})
    ch.basic_publish("", name, b"poison")
    for _ in range(3):
        method, _props, _body = wait_until(lambda: (lambda r: r if r[0] else None)(ch.basic_get(name)), timeout=5)
        ch.basic_nack(method.delivery_tag, requeue=True)
    method, props, body = wait_until(lambda: (lambda r: r if r[0] else None)(ch.basic_get(dead, auto_ack=True)),
                                     timeout=5)
    assert body == b"poison" and props.headers["x-death"][0]["reason"] == "delivery_limit"
    assert "x-delivery-count" not in props.headers      # the count was the consumer's, not the message's
    assert ch.queue_declare(name, passive=True).method.message_count == 0
    ch.queue_delete(name)
    ch.queue_delete(dead)


def test_transient_messages_of_a_quorum_queue_survive_a_restart(own_node):
    ch = pika_conn(own_node).channel()
    ch.confirm_delivery()
    ch.queue_declare("qq.kept", durable=True, arguments=QUORUM)
    for i in range(10):
        ch.basic_publish("", "qq.kept", b"%d" % i, pika.BasicProperties(delivery_mode=1))
    own_node.kill9()
    own_node.start()
    ch = pika_conn(own_node).channel()
    assert ch.queue_declare("qq.kept", passive=True).method.message_count == 10


def test_membership_commands_as_rabbitmq_queues_has_them(cluster):
    hare1, hare2, hare3 = cluster
    name = unique_name("qq.members")
    pika_conn(hare1).channel().queue_declare(name, durable=True,
                                             arguments={**QUORUM, "x-quorum-initial-group-size": 1})
    row = wait_until(lambda: queue_row(hare2, name), timeout=10)
    assert (row["type"], row["members"], row["leader"], row["mirrors"]) == ("quorum", ["hare1"], "hare1", [])
    assert row["online"] == ["hare1"]
    status, api_row, _ = http("GET", hare3.management_port, f"/api/queues/%2F/{q(name)}")
    assert status == 200, api_row
    assert (api_row["type"], api_row["members"], api_row["leader"], api_row["online"]) == \
        ("quorum", ["hare1"], "hare1", ["hare1"])
    # a lone member is quorum critical: its node may not stop
    r = ctl(hare1, "check-if-node-is-quorum-critical")
    assert r.returncode == 69 and name in r.stdout
    r = ctl(hare2, "add-member", name, "hare3")
    assert r.returncode == 0, r.stderr
    _synced(hare1, name, ["hare3"])
    assert ctl(hare2, "add-member", name, "hare3").returncode != 0      # already a member
    assert ctl(hare2, "add-member", name, "hare9").returncode != 0      # no such member
    r = ctl(hare1, "grow", "hare2", "all", "--queue-pattern", name.replace(".", r"\."), "--json")
    assert r.returncode == 0, r.stderr
    assert [x["result"] for x in json.loads(r.stdout)] == ["ok"]
    _synced(hare1, name, ["hare2", "hare3"])
    status = json.loads(ctl(hare3, "quorum-status", name, "--json").stdout)
    assert {(s["node"], s["raft_state"]) for s in status} == {("hare1", "leader"), ("hare2", "follower"),
                                                              ("hare3", "follower")}
    assert ctl(hare1, "check-if-node-is-quorum-critical").returncode == 0
    r = ctl(hare1, "shrink", "hare3", "--json")
    assert r.returncode == 0, r.stderr
    assert {x["name"]: x["result"] for x in json.loads(r.stdout)}[name] == "ok"
    row = _synced(hare1, name, ["hare2"])
    assert row["members"] == ["hare1", "hare2"]
    r = ctl(hare1, "delete-member", name, "hare2")
    assert r.returncode == 0, r.stderr
    row = _synced(hare1, name, [])
    assert row["members"] == ["hare1"]
    assert ctl(hare1, "delete-member", name, "hare1").returncode != 0   # the last one


def test_global_qos_on_a_channel_consuming_a_quorum_queue_is_refused_as_rabbitmq_does(node):
    """Celery's default (global_qos): RabbitMQ answers 540 NOT_IMPLEMENTED, a connection error."""
    name = unique_name("qq.global")
    pika_conn(node).channel().queue_declare(name, durable=True, arguments=QUORUM)
    conn = pika_conn(node)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=10, global_qos=True)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as ei:
        ch.basic_consume(name, lambda *_a: None)
    assert ei.value.reply_code == 540
    assert ei.value.reply_text == f"NOT_IMPLEMENTED - queue '{name}' in vhost '/' does not support global qos"
    ch = pika_conn(node).channel()
    ch.basic_qos(prefetch_count=10)          # per consumer: fine
    ch.basic_consume(name, lambda *_a: None)
    ch.queue_delete(name)


def test_kombu_declares_and_uses_a_quorum_queue(node):
    """Celery/kombu's way: Queue(..., queue_arguments={'x-queue-type': 'quorum'})."""
    import kombu
    name = unique_name("qq.kombu")
    with kombu.Connection(node.url) as conn:
        queue = kombu.Queue(name, kombu.Exchange(name, "direct"), routing_key="task", durable=True,
                            queue_arguments={"x-queue-type": "quorum"})
        producer = conn.Producer()
        producer.publish({"n": 1}, exchange=queue.exchange, routing_key="task", declare=[queue])
        got = []
        with conn.Consumer(queue, callbacks=[lambda body, message: (got.append(body), message.ack())]):
            conn.drain_events(timeout=5)
        assert got == [{"n": 1}]
        queue(conn.default_channel).delete()


REFUSALS = [
    ({**QUORUM, "x-queue-mode": "lazy"}, "invalid arg 'x-queue-mode' for {q} of queue type rabbit_quorum_queue"),
    ({**QUORUM, "x-queue-version": 2}, "invalid arg 'x-queue-version' for {q} of queue type rabbit_quorum_queue"),
    ({**QUORUM, "x-queue-master-locator": "min-masters"},
     "invalid arg 'x-queue-master-locator' for {q} of queue type rabbit_quorum_queue"),
    ({**QUORUM, "x-max-priority": 300}, "invalid arg 'x-max-priority' for {q} of queue type rabbit_quorum_queue"),
    ({**QUORUM, "x-quorum-initial-group-size": "3"},
     "invalid arg 'x-quorum-initial-group-size' for {q}: \"expected integer, got longstr\""),
    ({**QUORUM, "x-quorum-initial-group-size": -1}, "invalid arg 'x-quorum-initial-group-size' for {q}: {{value_negative,-1}}"),
    ({**QUORUM, "x-quorum-initial-group-size": 0}, "invalid arg 'x-quorum-initial-group-size' for {q}: {{value_zero,0}}"),
    ({**QUORUM, "x-queue-leader-locator": "nearest"}, "invalid arg 'x-queue-leader-locator' for {q}: invalid_queue_locator_arg"),
    ({"x-quorum-initial-group-size": 3}, "invalid arg 'x-quorum-initial-group-size' for {q} of queue type rabbit_classic_queue"),
    ({"x-max-age": "1D"}, "invalid arg 'x-max-age' for {q} of queue type rabbit_classic_queue"),
]


@pytest.mark.parametrize("arguments,text", REFUSALS, ids=[
    "queue-mode", "queue-version", "master-locator", "max-priority", "group-size-string", "group-size-negative",
    "group-size-zero", "leader-locator", "classic-group-size", "classic-max-age"])
def test_another_queue_types_arguments_are_refused_as_rabbitmq_does(node, arguments, text):
    """rabbit_amqqueue:check_declare_arguments: a queue type's own arguments are checked, the other
    types' refused, each with RabbitMQ's text (a negative group size was a 541 here before)."""
    name = unique_name("qq.refused")
    ch = pika_conn(node).channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch.queue_declare(name, durable=True, arguments=arguments)
    assert (ei.value.reply_code, ei.value.reply_text) == (
        406, "PRECONDITION_FAILED - " + text.format(q=f"queue '{name}' in vhost '/'"))


def test_a_quorum_queue_redeclared_differently_is_refused_as_rabbitmq_does(node):
    name = unique_name("qq.redeclared")
    what = f"queue '{name}' in vhost '/'"
    pika_conn(node).channel().queue_declare(name, durable=True, arguments=QUORUM)
    for arguments, text in (
            ({}, f"inequivalent arg 'x-queue-type' for {what}: received none but current is "
                 "the value 'quorum' of type 'longstr'"),
            ({**QUORUM, "x-quorum-initial-group-size": 1},
             f"inequivalent arg 'x-quorum-initial-group-size' for {what}: received the value '1' of type "
             "'signedint' but current is none"),
            ({**QUORUM, "x-delivery-limit": 3},
             f"inequivalent arg 'x-delivery-limit' for {what}: received the value '3' of type 'signedint' "
             "but current is none")):
        ch = pika_conn(node).channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
            ch.queue_declare(name, durable=True, arguments=arguments)
        assert (ei.value.reply_code, ei.value.reply_text) == (406, "PRECONDITION_FAILED - " + text)
    ch = pika_conn(node).channel()
    classic = unique_name("qq.classic")
    ch.queue_declare(classic, durable=True)
    ch.queue_declare(classic, durable=True, arguments={"x-queue-type": "classic"})   # the same queue, as RabbitMQ
    ch.queue_delete(classic)
    ch.queue_delete(name)


def test_another_queue_types_consumer_argument_is_refused_as_rabbitmq_does(node):
    name = unique_name("qq.consume")
    pika_conn(node).channel().queue_declare(name, durable=True, arguments=QUORUM)
    for key, value in (("x-cancel-on-ha-failover", True), ("x-stream-offset", "first")):
        ch = pika_conn(node).channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
            ch.basic_consume(name, lambda *_a: None, arguments={key: value})
        assert (ei.value.reply_code, ei.value.reply_text) == (
            406, f"PRECONDITION_FAILED - invalid arg '{key}' for queue '{name}' in vhost '/' of queue type "
                 "rabbit_quorum_queue")
    ch = pika_conn(node).channel()
    ch.basic_consume(name, lambda *_a: None, arguments={"x-priority": 3})      # its own: fine
    ch.queue_delete(name)
