"""Mirrored queues with three real nodes (MIR-1..8, CONF-4, CONF-5): placement by policy,
confirms after every in-sync mirror, failover to the oldest in-sync mirror, sync, fencing."""
from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time

import grpc
import pika
import pytest

from tests.clusters import (SECRET, HostNames, control, ctl, ctl_json, leader_and_term, named_cluster,
                            proxied_cluster, queue_row)
from tests.conftest import IS_REF, wait_until

pytestmark = pytest.mark.skipif(IS_REF, reason="starts and kills cluster node processes")

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def _chan(member, confirm=False):
    c = pika.BlockingConnection(pika.URLParameters(member.url))
    ch = c.channel()
    if confirm:
        ch.confirm_delivery()
    return c, ch


def _policy(member, pattern, definition, name="ha"):
    r = ctl(member, "set-policy", name, pattern, json.dumps(definition), "--apply-to", "queues")
    assert r.returncode == 0, r.stderr


def _publish_in_one_write(member, queue: str, body: bytes) -> socket.socket:
    """A raw publisher: connection, channel, then basic.publish with its header and body in one
    write. The socket is returned open."""
    from pamqp import body as pbody, commands as spec, frame, header
    s = socket.create_connection(("127.0.0.1", member.port))
    buf = b""

    def read():
        nonlocal buf
        while True:
            try:
                used, _ch, f = frame.unmarshal(buf)
                buf = buf[used:]
                return f
            except Exception:  # noqa: BLE001 - not a whole frame yet
                buf += s.recv(65536)

    s.sendall(b"AMQP\x00\x00\x09\x01")
    read()
    s.sendall(frame.marshal(spec.Connection.StartOk({}, "PLAIN", "\x00guest\x00guest", "en_US"), 0))
    read()
    s.sendall(frame.marshal(spec.Connection.TuneOk(2047, 131072, 0), 0) + frame.marshal(spec.Connection.Open("/"), 0))
    read()
    s.sendall(frame.marshal(spec.Channel.Open(), 1))
    read()
    s.sendall(b"".join(frame.marshal(f, 1) for f in (
        spec.Basic.Publish(exchange="", routing_key=queue),
        header.ContentHeader(0, len(body), spec.Basic.Properties()), pbody.ContentBody(body))))
    return s


def _synced(member, name, mirrors):
    """Wait until the queue's synchronised mirrors are exactly `mirrors`; the row."""
    seen = []

    def check():
        row = queue_row(member, name)
        seen[:] = [row]
        return row if row and sorted(row["synchronised_mirrors"] or []) == sorted(mirrors) else None
    try:
        return wait_until(check, timeout=20)
    except AssertionError:
        raise AssertionError(f"{name} never had synchronised mirrors {mirrors}: {seen}") from None


def _mirrored_on_all(hare1, name, via=None):
    """A durable queue mastered on hare1, mirrored on hare2 and hare3 and synchronised; its row."""
    _policy(hare1, r"^ha\.", {"ha-mode": "all", "ha-sync-mode": "automatic"})
    c, ch = _chan(hare1)
    ch.queue_declare(name, durable=True)
    c.close()
    return _synced(via or hare1, name, ["hare2", "hare3"])


def _consumer_holding(member, queue, count):
    """A manual-ack consumer on `member` with prefetch `count`, once it holds `count` deliveries:
    (connection, channel, [(method, body)]); the list goes on filling as more arrive."""
    cc, cons = _chan(member)
    cons.basic_qos(prefetch_count=count)
    got = []
    cons.basic_consume(queue, lambda _ch, m, _p, body: got.append((m, body)))
    wait_until(lambda: cc.process_data_events(0.05) or len(got) == count, timeout=10)
    return cc, cons, got


def _drain(member, queue, ack=True, limit=None):
    """Every message left in the queue (or the first `limit`), via basic.get: [(body, redelivered)]."""
    c, ch = _chan(member)
    got = []
    while limit is None or len(got) < limit:
        method, _props, body = ch.basic_get(queue, auto_ack=False)
        if method is None:
            break
        got.append((body, method.redelivered))
        if ack:
            ch.basic_ack(method.delivery_tag)
    c.close()
    return got


def _pump(connection, seconds):
    """Let a blocking connection take deliveries for `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        connection.process_data_events(0.05)


def _publish_once_confirmed(ch, queue, body, within=10.0):
    """Publish until the broker confirms it: nacked while a failover is under way."""
    deadline = time.monotonic() + within
    while True:
        try:
            ch.basic_publish("", queue, body, PERSISTENT)
            return
        except pika.exceptions.NackError:
            assert time.monotonic() < deadline, f"publishes were still nacked {within:g} s after the kill"
            time.sleep(0.05)


def _restart(member):
    member.kill9()
    member.start(timeout=60)


# ---- placement (MIR-1) --------------------------------------------------------------------------
def test_ha_modes_place_mirrors(cluster):
    members = cluster
    hare1 = members[0]
    _policy(hare1, r"^all\.", {"ha-mode": "all", "ha-sync-mode": "automatic"}, "p-all")
    _policy(hare1, r"^two\.", {"ha-mode": "exactly", "ha-params": 2}, "p-two")
    _policy(hare1, r"^named\.", {"ha-mode": "nodes", "ha-params": ["hare3"]}, "p-named")
    c, ch = _chan(hare1)
    for q in ("all.q", "two.q", "named.q", "plain.q"):
        ch.queue_declare(q, durable=True)
    c.close()
    assert _synced(hare1, "all.q", ["hare2", "hare3"])["mirrors"] == ["hare2", "hare3"]
    assert _synced(hare1, "two.q", ["hare2"])["mirrors"] == ["hare2"]
    assert _synced(hare1, "named.q", ["hare3"])["mirrors"] == ["hare3"]
    plain = queue_row(hare1, "plain.q")
    assert plain["mirrors"] == [] and plain["epoch"] is None
    row = queue_row(members[2], "all.q")     # any node lists the same master, epoch and mirrors
    assert row["node"] == "hare1" and row["master"] == "hare1" and row["epoch"] == 1


def test_policy_change_re_places_mirrors_live(cluster):
    members = cluster
    hare1 = members[0]
    c, ch = _chan(hare1)
    ch.queue_declare("live.q", durable=True)
    for i in range(50):
        ch.basic_publish("", "live.q", str(i).encode(), PERSISTENT)
    c.close()
    assert queue_row(hare1, "live.q")["mirrors"] == []
    _policy(hare1, r"^live\.", {"ha-mode": "exactly", "ha-params": 2, "ha-sync-mode": "automatic"})
    _synced(hare1, "live.q", ["hare2"])
    _policy(hare1, r"^live\.", {"ha-mode": "all", "ha-sync-mode": "automatic"})
    _synced(hare1, "live.q", ["hare2", "hare3"])
    r = ctl(hare1, "clear-policy", "ha")
    assert r.returncode == 0, r.stderr
    wait_until(lambda: queue_row(hare1, "live.q")["mirrors"] == [], timeout=10)
    assert queue_row(hare1, "live.q")["messages"] == 50


def test_bad_ha_policies_are_refused(cluster):
    members = cluster
    for definition in ({"ha-mode": "some"}, {"ha-mode": "exactly"}, {"ha-mode": "exactly", "ha-params": 0},
                       {"ha-mode": "nodes", "ha-params": "hare2"}, {"ha-sync-mode": "automatic"},
                       {"ha-mode": "all", "ha-promote-on-failure": "sometimes"}):
        r = ctl(members[0], "set-policy", "bad", ".*", json.dumps(definition))
        assert r.returncode == 65 and "ha-" in r.stderr, (definition, r.stdout, r.stderr)
    assert ctl_json(members[0], "list-policies") == []


# ---- confirms and failover (MIR-3, MIR-4, MIR-8, CONF-5) ----------------------------------------
def test_failover_keeps_every_confirmed_message_and_redelivers_unacked(cluster):
    members = cluster
    hare1, hare2, hare3 = members
    oldest = _mirrored_on_all(hare1, "ha.fail", via=hare2)["synchronised_mirrors"][0]
    pc, pub = _chan(hare2, confirm=True)     # publishing through a mirror, to the master on hare1
    for i in range(200):
        pub.basic_publish("", "ha.fail", str(i).encode(), PERSISTENT)
    # a consumer on hare3 takes 10 and does not ack them
    cc, cons, held = _consumer_holding(hare3, "ha.fail", 10)
    cons.stop_consuming()
    hare1.kill9()
    # the same publisher channel on hare2 goes on once a mirror is master
    _publish_once_confirmed(pub, "ha.fail", b"after")
    row = wait_until(lambda: (lambda r: r if r and r["master"] != "hare1" else None)(queue_row(hare2, "ha.fail")),
                     timeout=10)
    assert row["epoch"] == 2 and row["master"] == oldest        # the oldest in-sync mirror
    cc.close()
    got = _drain(hare3, "ha.fail")
    bodies = [b for b, _r in got]
    assert sorted(bodies[:200], key=int) == [str(i).encode() for i in range(200)]
    assert bodies.count(b"after") == 1
    redelivered = {b for b, r in got if r}
    assert redelivered == {body for _m, body in held}     # delivered but unacked: redelivered=true
    pc.close()


def test_a_promoted_mirror_serves_its_copy_as_the_master_had_it(cluster):
    """The new master's queue is the mirror's copy, handed over: transient messages the mirror
    held in memory and persistent ones it kept only in its store come out in publish order (a
    priority queue's by priority), acked ones gone, those delivered and not acked redelivered."""
    hare1, hare2, hare3 = cluster
    _policy(hare1, r"^ha\.", {"ha-mode": "all", "ha-sync-mode": "automatic"})
    c, ch = _chan(hare1, confirm=True)
    ch.queue_declare("ha.copy", durable=True)
    ch.queue_declare("ha.copy.prio", durable=True, arguments={"x-max-priority": 3})
    for name in ("ha.copy", "ha.copy.prio"):
        _synced(hare1, name, ["hare2", "hare3"])
    for i in range(40):
        mode = 2 if i % 3 == 2 else 1          # two transient first: held in memory on the mirrors
        ch.basic_publish("", "ha.copy", f"m{i}".encode(), pika.BasicProperties(delivery_mode=mode))
        ch.basic_publish("", "ha.copy.prio", f"p{i}".encode(), pika.BasicProperties(delivery_mode=mode,
                                                                                     priority=i % 4))
    assert [b for b, _r in _drain(hare1, "ha.copy", limit=2)] == [b"m0", b"m1"]
    assert [b for b, _r in _drain(hare1, "ha.copy.prio", limit=2)] == [b"p3", b"p7"]
    cc, _cons, held = _consumer_holding(hare3, "ha.copy", 5)
    assert [body for _m, body in held] == [f"m{i}".encode() for i in range(2, 7)]
    ch.basic_publish("", "ha.copy", b"end", PERSISTENT)     # confirmed: the mirrors have every op before it
    c.close()
    hare1.kill9()
    for name in ("ha.copy", "ha.copy.prio"):
        wait_until(lambda n=name: (lambda r: r and r["master"] != "hare1")(queue_row(hare2, n)), timeout=15)
    cc.close()
    got = _drain(hare3, "ha.copy")
    assert [b for b, _r in got] == [f"m{i}".encode() for i in range(2, 40)] + [b"end"]
    assert [b for b, r in got if r] == [f"m{i}".encode() for i in range(2, 7)]
    by_priority = sorted(range(40), key=lambda i: (-(i % 4), i))[2:]
    assert _drain(hare2, "ha.copy.prio") == [(f"p{i}".encode(), False) for i in by_priority]


def test_acks_that_never_reached_the_mirrors_do_not_deliver_twice(cluster):
    """A client acks persistent messages while the master is frozen (the acks reach the client's
    node, never the mirrors), then the master dies: what it acked is not delivered again, what it
    still held comes back to nobody else and is settled by its answer to the old delivery."""
    members = cluster
    hare1, hare2, hare3 = members
    _mirrored_on_all(hare1, "ha.acked", via=hare2)
    pc, pub = _chan(hare2, confirm=True)     # through another node: the messages carry a publish id
    for i in range(60):
        pub.basic_publish("", "ha.acked", str(i).encode(), PERSISTENT)
    cc, cons, got = _consumer_holding(hare3, "ha.acked", 60)
    os.killpg(hare1.proc.pid, signal.SIGSTOP)
    for method, _body in got[:30]:
        cons.basic_ack(method.delivery_tag)
    cc.process_data_events(0.3)
    hare1.kill9()
    wait_until(lambda: (lambda r: r if r and r["master"] != "hare1" else None)(queue_row(hare2, "ha.acked")),
               timeout=15)
    for method, _body in got[30:]:
        cons.basic_ack(method.delivery_tag)
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        cc.process_data_events(0.1)
    again = [body for _m, body in got[60:]]
    assert again == [], f"delivered twice after the failover: {again}"
    cc.close()
    assert _drain(hare2, "ha.acked") == []
    pc.close()


def test_a_surviving_mirror_is_reconciled_with_the_new_master_not_copied_again(cluster):
    """The mirror that was in sync with the dead master holds what the promoted one holds: it is
    reconciled by keys (and asks only for what it lacks), is synchronised again, and can itself
    be promoted later with every message, once each, in order."""
    members = cluster
    hare1, hare2, hare3 = members
    synced = _mirrored_on_all(hare1, "ha.keep", via=hare2)["synchronised_mirrors"]
    promoted, survivor = [m for name in synced for m in members if m.name == name]
    pc, pub = _chan(hare2, confirm=True)
    for i in range(3000):
        pub.basic_publish("", "ha.keep", str(i).encode(), PERSISTENT)
    pc.close()
    assert [int(b) for b, _r in _drain(hare3, "ha.keep", limit=500)] == list(range(500))
    hare1.kill9()
    _synced(promoted, "ha.keep", [survivor.name])
    assert "reconciled with the new master" in survivor.log_path.read_text()
    assert "reconciling mirror" in promoted.log_path.read_text()
    hare1.start(timeout=60)                  # a member back, then the new master dies too
    _synced(promoted, "ha.keep", [survivor.name, "hare1"])
    promoted.kill9()
    row = wait_until(lambda: (lambda r: r if r and r["master"] == survivor.name else None)(
        queue_row(survivor, "ha.keep")), timeout=15)
    assert row["messages"] == 2500
    assert [int(b) for b, _r in _drain(survivor, "ha.keep")] == list(range(500, 3000))


def test_a_consumer_with_its_prefetch_full_goes_on_when_its_node_becomes_master(cluster):
    """The consumer holds a full prefetch of deliveries from the old master when its own node is
    promoted: acking them frees credit on the new master, which delivers the rest."""
    members = cluster
    hare1, _hare2, _hare3 = members
    promoted_name = _mirrored_on_all(hare1, "ha.credit")["synchronised_mirrors"][0]
    promoted = next(m for m in members if m.name == promoted_name)
    pc, pub = _chan(hare1, confirm=True)
    for i in range(50):
        pub.basic_publish("", "ha.credit", str(i).encode(), PERSISTENT)
    pc.close()
    cc, cons = _chan(promoted)
    cons.basic_qos(prefetch_count=10)
    got = []

    def on_message(ch, method, _props, body):
        got.append((method, body))
        if len(got) > 10:
            ch.basic_ack(method.delivery_tag)
    cons.basic_consume("ha.credit", on_message)
    wait_until(lambda: cc.process_data_events(0.05) or len(got) == 10, timeout=10)
    hare1.kill9()
    wait_until(lambda: (lambda r: r if r and r["master"] == promoted_name else None)(
        queue_row(promoted, "ha.credit")), timeout=15)
    cons.basic_ack(got[9][0].delivery_tag, multiple=True)
    wait_until(lambda: cc.process_data_events(0.05) or len({b for _m, b in got}) == 50, timeout=15)
    assert sorted(int(b) for _m, b in got) == list(range(50))      # each once
    cc.close()


def test_messages_unacked_when_mirroring_starts_survive_a_failover(cluster):
    # a policy makes a queue mirrored while a consumer holds deliveries: the mirrors get those
    # too, so a failover after the consumer's node dies loses none of them
    members = cluster
    hare1, hare2, hare3 = members
    c, ch = _chan(hare1, confirm=True)
    ch.queue_declare("ha.late", durable=True)
    for i in range(5):
        ch.basic_publish("", "ha.late", str(i).encode(), PERSISTENT)
    held = [ch.basic_get("ha.late", auto_ack=False)[2] for _ in range(3)]
    assert held == [b"0", b"1", b"2"]
    _policy(hare1, r"^ha\.", {"ha-mode": "all", "ha-sync-mode": "automatic"})
    _synced(hare2, "ha.late", ["hare2", "hare3"])
    hare1.kill9()                                  # the consumer's node: its deliveries go back
    row = wait_until(lambda: (lambda r: r if r and r["master"] != "hare1" else None)(queue_row(hare2, "ha.late")),
                     timeout=10)
    master = hare2 if row["master"] == "hare2" else hare3
    got = _drain(master, "ha.late")
    assert sorted(got) == [(b"0", True), (b"1", True), (b"2", True), (b"3", False), (b"4", False)]


def test_consumers_on_survivors_keep_consuming_or_get_cancel(cluster):
    members = cluster
    hare1, hare2, hare3 = members
    _mirrored_on_all(hare1, "ha.consume", via=hare1)
    stay_c, stay = _chan(hare3)
    got = []
    stay.basic_consume("ha.consume", lambda ch_, m, _p, body: (got.append(body), ch_.basic_ack(m.delivery_tag)))
    leave_c, leave = _chan(hare2)
    cancelled = []
    leave.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    leave.basic_consume("ha.consume", lambda *_a: None, consumer_tag="bye",
                        arguments={"x-cancel-on-ha-failover": True})
    stay_c.process_data_events(0.2)
    leave_c.process_data_events(0.2)
    hare1.kill9()
    wait_until(lambda: (lambda r: r and r["master"] != "hare1")(queue_row(hare2, "ha.consume")), timeout=10)
    wait_until(lambda: leave_c.process_data_events(0.05) or cancelled == ["bye"], timeout=10)
    pc, pub = _chan(hare2, confirm=True)
    for i in range(20):
        pub.basic_publish("", "ha.consume", str(i).encode(), PERSISTENT)
    wait_until(lambda: stay_c.process_data_events(0.05) or len(got) == 20, timeout=10,
               message=f"the surviving consumer got {len(got)} of 20")
    assert got == [str(i).encode() for i in range(20)]
    for conn in (pc, stay_c, leave_c):
        conn.close()


def test_confirm_waits_for_a_stopped_mirror_until_it_is_dropped(cluster):
    members = cluster
    hare1, hare2, hare3 = members
    _mirrored_on_all(hare1, "ha.stop", via=hare1)
    _, pub = _chan(hare1, confirm=True)
    pub.basic_publish("", "ha.stop", b"before", PERSISTENT)
    os.killpg(hare3.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        pub.basic_publish("", "ha.stop", b"while stopped", PERSISTENT)   # blocks until confirmed
        waited = time.monotonic() - started
        # held back while hare3 was in the in-sync set (until gRPC keepalive or the 3 s failure
        # timeout gives up on it), released once the log has dropped it
        assert waited >= 1.0, f"confirmed after {waited:.2f} s: did not wait for the stopped mirror"
        row = queue_row(hare1, "ha.stop")
        assert row["synchronised_mirrors"] == ["hare2"]
    finally:
        os.killpg(hare3.proc.pid, signal.SIGCONT)
    _synced(hare1, "ha.stop", ["hare2", "hare3"])      # it comes back, syncs and rejoins
    assert [b for b, _r in _drain(hare2, "ha.stop")] == [b"before", b"while stopped"]


def test_no_synchronised_mirror_means_the_queue_waits_for_its_master(cluster):
    # ha-promote-on-failure=when-synced (the default): an unsynchronised mirror is never promoted
    members = cluster
    hare1, hare2, hare3 = members
    _policy(hare1, r"^ha\.", {"ha-mode": "exactly", "ha-params": 2})      # manual sync
    c, ch = _chan(hare1, confirm=True)
    ch.queue_declare("ha.manual", durable=True)
    c.close()
    _synced(hare1, "ha.manual", ["hare2"])
    _restart(hare2)          # comes back empty: unsynchronised, and manual sync leaves it so
    c, ch = _chan(hare1, confirm=True)
    for i in range(10):
        ch.basic_publish("", "ha.manual", str(i).encode(), PERSISTENT)
    c.close()
    time.sleep(1.0)
    # (messages published after it came back are on it; the ones before would not be)
    assert queue_row(hare1, "ha.manual")["synchronised_mirrors"] in ([], ["hare2"])
    hare1.kill9()
    time.sleep(3)
    row = queue_row(hare3, "ha.manual")
    if row["master"] == "hare1":         # hare2 was not in sync: nobody was promoted
        assert row["state"] == "down"
    else:                                # it was, and only it could be
        assert row["master"] == "hare2"
    hare1.start(timeout=60)
    got = _drain(hare3, "ha.manual")
    assert sorted(b for b, _r in got) == sorted(str(i).encode() for i in range(10))


def test_manual_sync_with_ctl_sync_queue(cluster):
    members = cluster
    hare1, hare2, _ = members
    _policy(hare1, r"^ha\.", {"ha-mode": "exactly", "ha-params": 2})      # manual sync
    c, ch = _chan(hare1)
    ch.queue_declare("ha.sync", durable=True)
    for i in range(1000):
        ch.basic_publish("", "ha.sync", str(i).encode(), PERSISTENT)
    c.close()
    _synced(hare1, "ha.sync", ["hare2"])     # there from the start: it has every message
    _restart(hare2)                          # back empty; manual sync leaves it so
    _synced(hare1, "ha.sync", [])
    time.sleep(1.0)
    assert queue_row(hare1, "ha.sync")["synchronised_mirrors"] == []
    r = ctl(members[2], "sync-queue", "ha.sync")         # asked through any node
    assert r.returncode == 0, r.stderr
    _synced(hare1, "ha.sync", ["hare2"])
    bad = ctl(hare1, "sync-queue", "no.such.queue")
    assert bad.returncode == 65 and "no mirrored queue" in bad.stderr
    hare1.kill9()                        # now hare2 may be promoted: it has them all
    wait_until(lambda: (lambda r: r and r["master"] == "hare2")(queue_row(hare2, "ha.sync")), timeout=10)
    assert len(_drain(hare2, "ha.sync")) == 1000


def test_sync_of_100k_messages_while_the_queue_keeps_serving(cluster):
    members = cluster
    hare1, hare2, hare3 = members
    _policy(hare1, r"^ha\.", {"ha-mode": "all", "ha-sync-mode": "automatic"})
    c, ch = _chan(hare1)
    ch.queue_declare("ha.big", durable=True)
    body = b"x" * 100
    for _ in range(100_000):
        ch.basic_publish("", "ha.big", body)
    c.close()
    _synced(hare1, "ha.big", ["hare2", "hare3"])
    _restart(hare3)          # comes back empty and copies 100k messages
    stop = threading.Event()
    counts = {"published": 0, "consumed": 0}

    def publish():
        pc, pub = _chan(hare2, confirm=True)
        while not stop.is_set():
            pub.basic_publish("", "ha.big", b"new", PERSISTENT)
            counts["published"] += 1
        pc.close()

    def consume():
        cc, cons = _chan(hare1)
        cons.basic_qos(prefetch_count=100)
        cons.basic_consume("ha.big", lambda ch_, m, _p, _b: (ch_.basic_ack(m.delivery_tag),
                                                               counts.__setitem__("consumed", counts["consumed"] + 1)))
        while not stop.is_set():
            cc.process_data_events(0.1)
        cc.close()

    threads = [threading.Thread(target=publish), threading.Thread(target=consume)]
    for t in threads:
        t.start()
    try:
        seen_progress = _synced(hare1, "ha.big", ["hare2", "hare3"])
        during = dict(counts)
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert seen_progress
    assert during["published"] > 0 and during["consumed"] > 0, during
    assert "syncing mirror" in hare1.log_text() and "mirror holds the snapshot" in hare1.log_text()


# ---- fencing (MIR-5) ------------------------------------------------------------------------------
def test_deposed_master_rejoins_as_a_mirror_and_drops_its_copy(cluster):
    members = cluster
    hare1, hare2, hare3 = members
    _policy(hare1, r"^ha\.", {"ha-mode": "all", "ha-sync-mode": "automatic"})
    c, ch = _chan(hare1, confirm=True)
    ch.queue_declare("ha.fence", durable=True)
    _synced(hare1, "ha.fence", ["hare2", "hare3"])
    for i in range(100):
        ch.basic_publish("", "ha.fence", str(i).encode(), PERSISTENT)
    c.close()
    hare1.kill9()
    new = wait_until(lambda: (lambda r: r["master"] if r and r["master"] != "hare1" else None)(
        queue_row(hare2, "ha.fence")), timeout=10)
    master = hare2 if new == "hare2" else hare3
    wait_until(lambda: (lambda r: r and r["master"] == new)(queue_row(master, "ha.fence")), timeout=10)
    got = _drain(master, "ha.fence", limit=60)  # consume 60 on the new master
    assert len(got) == 60
    hare1.start(timeout=60)                    # it had all 100 on disk; the new master has 40
    row = _synced(hare2, "ha.fence", [m.name for m in members if m is not master])
    assert row["master"] == new and row["epoch"] == 2 and row["messages"] == 40
    # deposed while it was down: its replay of the log drops its copy once the log is replayed
    assert "recovered_dropped=100" in hare1.log_text()
    assert len(_drain(hare1, "ha.fence")) == 40


def test_partitioned_master_is_fenced_and_nothing_confirmed_is_lost(cluster):
    members, partition = cluster, cluster.partition
    hare1, hare2, hare3 = members
    _mirrored_on_all(hare1, "ha.split", via=hare2)
    assert queue_row(hare2, "ha.split")["master"] == "hare1"
    confirmed = []
    pc, pub = _chan(hare2, confirm=True)
    for i in range(50):
        pub.basic_publish("", "ha.split", str(i).encode(), PERSISTENT)
        confirmed.append(str(i).encode())
    partition["cut"]()                  # hare1 alone: it pauses; hare2/3 promote a mirror
    wait_until(lambda: (lambda r: r and r["master"] in ("hare2", "hare3"))(queue_row(hare2, "ha.split")), timeout=15)
    deadline = time.monotonic() + 10
    for i in range(50, 100):
        while True:
            try:
                pub.basic_publish("", "ha.split", str(i).encode(), PERSISTENT)
                confirmed.append(str(i).encode())
                break
            except pika.exceptions.NackError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
    partition["heal"]()
    row = _synced(hare2, "ha.split", ["hare1", "hare3"] if queue_row(hare2, "ha.split")["master"] == "hare2"
                  else ["hare1", "hare2"])
    assert row["epoch"] >= 2
    got = [b for b, _r in _drain(hare3, "ha.split")]
    assert set(confirmed) <= set(got)
    pc.close()


def test_a_stale_epoch_is_refused_by_a_mirror(cluster):
    from haremq.cluster.rpc import cluster_pb2 as pb
    from haremq.cluster.rpc import cluster_pb2_grpc as pbg
    members = cluster
    hare1, hare2, _ = members
    _policy(hare1, r"^ha\.", {"ha-mode": "all"})
    c, ch = _chan(hare1)
    ch.queue_declare("ha.epoch", durable=True)
    c.close()
    _synced(hare1, "ha.epoch", ["hare2", "hare3"])
    with grpc.insecure_channel(f"127.0.0.1:{hare2.cluster_port}") as channel:
        stub = pbg.ClusterStub(channel)
        md = (("x-haremq-secret", SECRET),)
        for epoch, master in ((7, "hare1"), (1, "hare3")):
            batch = pb.MirrorBatch(vhost="/", queue="ha.epoch", epoch=epoch, master=master, reset=True,
                                   snapshot_done=True)
            replies = list(stub.Mirror(iter([batch]), metadata=md, timeout=5))
            assert len(replies) == 1 and "stale epoch" in replies[0].error
    assert sorted(queue_row(hare1, "ha.epoch")["synchronised_mirrors"]) == ["hare2", "hare3"]


# ---- queue features across a failover (PUB-4) and cluster-wide alarms (ERR-4) ---------------------
def _mirrored_dead_letters(hare1):
    """Every ha.* queue mirrored on all nodes, and a dead-letter exchange ha.dlx into ha.dead;
    a confirm channel on hare1."""
    _policy(hare1, r"^ha\.", {"ha-mode": "all", "ha-sync-mode": "automatic"})
    c, ch = _chan(hare1, confirm=True)
    ch.exchange_declare("ha.dlx", "fanout", durable=True)
    ch.queue_declare("ha.dead", durable=True)
    ch.queue_bind("ha.dead", "ha.dlx")
    return c, ch


def test_queue_features_survive_a_failover(cluster):
    members = cluster
    hare1, hare2, hare3 = members
    c, ch = _mirrored_dead_letters(hare1)
    queues = {
        "ha.ttl": {"x-message-ttl": 1500, "x-dead-letter-exchange": "ha.dlx"},
        "ha.maxlen": {"x-max-length": 3},
        "ha.prio": {"x-max-priority": 5},
        "ha.limit": {"x-delivery-limit": 1, "x-dead-letter-exchange": "ha.dlx"},
    }
    for name, args in queues.items():
        ch.queue_declare(name, durable=True, arguments=args)
    for name in (*queues, "ha.dead"):
        _synced(hare1, name, ["hare2", "hare3"])
    for i in range(5):
        ch.basic_publish("", "ha.maxlen", str(i).encode(), PERSISTENT)
        ch.basic_publish("", "ha.prio", str(i).encode(), pika.BasicProperties(delivery_mode=2, priority=i))
    ch.basic_publish("", "ha.ttl", b"expires", PERSISTENT)
    ch.basic_publish("", "ha.limit", b"poison", PERSISTENT)
    c.close()
    hare1.kill9()
    wait_until(lambda: all((lambda r: r and r["master"] != "hare1")(queue_row(hare2, q)) for q in queues), timeout=15)
    # max-length kept the newest 3; priorities still order deliveries
    assert [b for b, _r in _drain(hare3, "ha.maxlen")] == [b"2", b"3", b"4"]
    assert [b for b, _r in _drain(hare3, "ha.prio")] == [b"4", b"3", b"2", b"1", b"0"]
    # the TTL still expires into the dead-letter exchange
    wait_until(lambda: [b for b, _r in _drain(hare2, "ha.dead", ack=False)] == [b"expires"], timeout=10)
    # max-length is still enforced by the new master
    c, ch = _chan(hare3, confirm=True)
    for i in range(5, 10):
        ch.basic_publish("", "ha.maxlen", str(i).encode(), PERSISTENT)
    c.close()
    assert queue_row(hare2, "ha.maxlen")["messages"] == 3
    # the delivery limit: rejected with requeue twice, then dead-lettered
    c, ch = _chan(hare3)
    for _ in range(2):
        method = wait_until(lambda: ch.basic_get("ha.limit")[0], timeout=5)
        ch.basic_nack(method.delivery_tag, requeue=True)
    c.close()
    wait_until(lambda: sorted(b for b, _r in _drain(hare2, "ha.dead", ack=False)) == [b"expires", b"poison"],
               timeout=10)


def test_a_ttl_deadline_holds_across_a_failover(cluster):
    # the mirrors know when each message expires: the new master does not restart the clock
    members = cluster
    hare1, hare2, hare3 = members
    c, ch = _mirrored_dead_letters(hare1)
    ch.queue_declare("ha.deadline", durable=True, arguments={"x-message-ttl": 6000,
                                                             "x-dead-letter-exchange": "ha.dlx"})
    for name in ("ha.deadline", "ha.dead"):
        _synced(hare1, name, ["hare2", "hare3"])
    ch.basic_publish("", "ha.deadline", b"per-queue ttl", PERSISTENT)
    ch.basic_publish("", "ha.deadline", b"own expiration",
                     pika.BasicProperties(delivery_mode=2, expiration="4000"))
    published = time.monotonic()
    c.close()
    time.sleep(2.5)
    hare1.kill9()
    # Watch the dead letters arrive. Kept clocks: the first not before its 4 s deadline, both by
    # the later of the 6 s deadline and the promotion (a deadline passed meanwhile is met at once).
    # A clock restarted by the promotion would dead-letter 4 s after it at the earliest.
    first = promoted = None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            rows = {r["name"]: r for r in ctl_json(hare2, "list-queues")}     # one look at both queues
        except Exception:      # noqa: BLE001 - hare2 busy with the election: look again
            continue
        row, dead = rows.get("ha.deadline"), rows.get("ha.dead")
        now = time.monotonic() - published
        if promoted is None and row and row["master"] != "hare1":
            promoted = now
        if first is None and dead and dead["messages"]:
            first = now
        if dead and dead["messages"] == 2 and promoted is not None:
            break
        time.sleep(0.1)
    expired_after = time.monotonic() - published
    assert first is not None and first >= 3.9, f"dead-lettered {first} s after publishing: before its time"
    assert promoted is not None, "no mirror was promoted"
    assert expired_after < max(6.0, promoted) + 2.5, \
        f"dead-lettered {expired_after:.1f} s after publishing, promoted at {promoted:.1f} s: the TTL restarted"
    assert sorted(b for b, _r in _drain(hare2, "ha.dead")) == [b"own expiration", b"per-queue ttl"]


def test_an_alarm_on_one_node_blocks_publishers_on_every_node(tmp_path):
    # hare2 starts with a memory watermark it is always above: its memory alarm blocks publishers
    # connected to hare1 too; consumers keep receiving; killing hare2 lifts the block
    members, partition = proxied_cluster(tmp_path, failure_timeout=3.0,
                                         extra_args={"hare2": ["--vm-memory-high-watermark", "1MB"]})
    hare1, hare2, hare3 = members
    try:
        status = wait_until(lambda: (lambda s: s if s["alarms"] else None)(ctl_json(hare1, "cluster-status")),
                            timeout=10)
        assert status["alarms"] == ["memory"] and status["alarms_by_node"] == {"hare2": ["memory"]}
        c, ch = _chan(hare3)
        ch.queue_declare("alarm.q")
        # not blocked until it publishes: its first message is routed when its three frames come
        # in one read (pika writes them one by one, so the block may come between them)
        first = _publish_in_one_write(hare3, "alarm.q", b"queued before")
        wait_until(lambda: (queue_row(hare3, "alarm.q") or {}).get("messages") == 1, timeout=10)
        # (left open: a blocked connection's frames, connection.close too, wait unread)
        blocked, unblocked = [], []
        pub = pika.BlockingConnection(pika.URLParameters(hare1.url))
        pub.add_on_connection_blocked_callback(lambda _c, frame: blocked.append(frame.method.reason))
        pub.add_on_connection_unblocked_callback(lambda _c, _frame: unblocked.append(True))
        pch = pub.channel()
        pch.basic_publish("", "alarm.q", b"held back")
        wait_until(lambda: pub.process_data_events(0.05) or blocked, timeout=10)
        assert blocked == ["low on memory"]
        # a consumer on hare1 (a connection that never published) still gets messages
        cc, cons = _chan(hare1)
        method, _props, body = wait_until(lambda: (lambda r: r if r[0] else None)(cons.basic_get("alarm.q")),
                                          timeout=10)
        assert body == b"queued before"
        hare2.kill9()                         # its alarm goes with it
        wait_until(lambda: pub.process_data_events(0.05) or unblocked, timeout=15)
        assert wait_until(lambda: (lambda r: r if r[0] else None)(cons.basic_get("alarm.q")),
                          timeout=10)[2] == b"held back"
        assert ctl_json(hare1, "cluster-status")["alarms"] == []
        for conn in (pub, cc):
            conn.close()
        first.close()
    finally:
        for m in members:
            m.kill9()
        partition["close"]()


def test_promote_on_shutdown_always_promotes_an_unsynchronised_mirror(cluster):
    # a controlled stop (SIGTERM) follows ha-promote-on-shutdown, not ha-promote-on-failure
    members = cluster
    hare1, hare2, _ = members
    _policy(hare1, r"^ha\.", {"ha-mode": "exactly", "ha-params": 2, "ha-promote-on-shutdown": "always"})
    c, ch = _chan(hare1, confirm=True)
    ch.queue_declare("ha.shutdown", durable=True)
    c.close()
    _synced(hare1, "ha.shutdown", ["hare2"])
    c, ch = _chan(hare1, confirm=True)
    ch.basic_publish("", "ha.shutdown", b"old", PERSISTENT)
    c.close()
    _restart(hare2)                       # back empty, and manual sync leaves it unsynchronised
    _synced(hare1, "ha.shutdown", [])
    c, ch = _chan(hare1, confirm=True)
    ch.basic_publish("", "ha.shutdown", b"new", PERSISTENT)
    c.close()
    time.sleep(0.5)
    assert hare1.stop() == 0
    row = wait_until(lambda: (lambda r: r if r and r["master"] == "hare2" else None)(queue_row(hare2, "ha.shutdown")),
                     timeout=15)
    assert row["epoch"] == 2
    assert [b for b, _r in _drain(hare2, "ha.shutdown")] == [b"new"]   # what the mirror had


def _commit_while_stopped(ch, mirror):
    """tx.commit while a mirror is SIGSTOPped: commit-ok must wait (until it is dropped)."""
    os.killpg(mirror.proc.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        ch.tx_commit()
        waited = time.monotonic() - started
        assert waited >= 1.0, f"commit-ok after {waited:.2f} s: did not wait for the stopped mirror"
    finally:
        os.killpg(mirror.proc.pid, signal.SIGCONT)


def test_tx_commit_waits_for_the_mirrors(cluster):
    # CONF-8 on a mirrored queue: commit-ok only once every in-sync mirror holds the messages
    members = cluster
    hare1, hare2, hare3 = members
    _mirrored_on_all(hare1, "ha.tx")
    c, ch = _chan(hare1)
    ch.tx_select()
    ch.basic_publish("", "ha.tx", b"in a transaction", PERSISTENT)
    _commit_while_stopped(ch, hare3)
    c.close()
    hare1.kill9()       # hare3 may still be resyncing: it must not be promoted unless in sync
    new = wait_until(lambda: (lambda r: r["master"] if r and r["master"] != "hare1" else None)(
        queue_row(hare2, "ha.tx")), timeout=10)
    master = hare2 if new == "hare2" else hare3
    wait_until(lambda: (lambda r: r and r["master"] == new)(queue_row(master, "ha.tx")), timeout=10)
    assert [b for b, _r in _drain(master, "ha.tx")] == [b"in a transaction"]


def test_tx_commit_on_another_node_waits_for_the_home_and_its_mirrors(cluster):
    # CONF-8 through a node that is not the queue's home: commit-ok only once the home has the
    # messages durable and every in-sync mirror holds them
    members = cluster
    hare1, hare2, hare3 = members
    _mirrored_on_all(hare1, "ha.txr")
    c, ch = _chan(hare2)
    ch.tx_select()
    ch.basic_publish("", "ha.txr", b"first", PERSISTENT)
    ch.tx_commit()                                  # all up: no wait to speak of
    ch.basic_publish("", "ha.txr", b"second", PERSISTENT)
    ch.basic_publish("", "ha.txr", b"third", PERSISTENT)
    _commit_while_stopped(ch, hare3)
    ch.basic_publish("", "ha.txr", b"rolled back", PERSISTENT)
    ch.tx_rollback()
    c.close()
    assert [b for b, _r in _drain(hare1, "ha.txr")] == [b"first", b"second", b"third"]


def test_get_and_consume_during_a_failover_wait_for_the_new_master(cluster):
    # MIR-7: a client arriving while the master is down and not yet replaced is not refused
    members = cluster
    hare1, hare2, hare3 = members
    _mirrored_on_all(hare1, "ha.window")
    c, ch = _chan(hare1, confirm=True)
    for i in range(3):
        ch.basic_publish("", "ha.window", str(i).encode(), PERSISTENT)
    c.close()
    hare1.kill9()
    c, ch = _chan(hare3)                          # at once, before any promotion
    method, _props, body = ch.basic_get("ha.window", auto_ack=True)
    assert body == b"0"
    got = []
    ch.basic_consume("ha.window", lambda _c, _m, _p, b: got.append(b), auto_ack=True)
    wait_until(lambda: c.process_data_events(0.05) or len(got) == 2, timeout=10)
    assert got == [b"1", b"2"]
    c.close()


def test_too_few_synchronised_mirrors_for_the_policy_means_nacks(cluster):
    # ha-min-in-sync-mirrors (HareMQ's): below it a publish is nacked, never confirmed unsafely
    members = cluster
    hare1, hare2, _ = members
    _policy(hare1, r"^ha\.", {"ha-mode": "exactly", "ha-params": 2, "ha-sync-mode": "automatic",
                              "ha-min-in-sync-mirrors": 1})
    c, ch = _chan(hare1)
    ch.queue_declare("ha.min", durable=True)
    c.close()
    _synced(hare1, "ha.min", ["hare2"])
    pc, pub = _chan(hare1, confirm=True)
    pub.basic_publish("", "ha.min", b"safe", PERSISTENT)
    os.killpg(hare2.proc.pid, signal.SIGSTOP)
    try:
        with pytest.raises(pika.exceptions.NackError):
            pub.basic_publish("", "ha.min", b"while alone", PERSISTENT)
        assert queue_row(hare1, "ha.min")["synchronised_mirrors"] == []
    finally:
        os.killpg(hare2.proc.pid, signal.SIGCONT)
    _synced(hare1, "ha.min", ["hare2"])
    pub.basic_publish("", "ha.min", b"safe again", PERSISTENT)
    pc.close()
    bad = ctl(hare1, "set-policy", "bad", "^x", json.dumps({"ha-mode": "all", "ha-min-in-sync-mirrors": -1}))
    assert bad.returncode == 65 and "ha-min-in-sync-mirrors" in bad.stderr


def test_single_active_consumer_holds_across_a_failover(cluster):
    members = cluster
    hare1, hare2, hare3 = members
    _policy(hare1, r"^ha\.", {"ha-mode": "all", "ha-sync-mode": "automatic"})
    c, ch = _chan(hare1)
    ch.queue_declare("ha.sac", durable=True, arguments={"x-single-active-consumer": True})
    c.close()
    _synced(hare1, "ha.sac", ["hare2", "hare3"])
    got = {"a": [], "b": []}
    conns = []
    for who, member in (("a", hare2), ("b", hare3)):
        conn, chan = _chan(member)
        chan.basic_consume("ha.sac", lambda ch_, m, _p, body, who=who: (got[who].append(body),
                                                                        ch_.basic_ack(m.delivery_tag)))
        conn.process_data_events(0.2)
        conns.append(conn)
    hare1.kill9()
    wait_until(lambda: all((lambda r: r and r["master"] != "hare1")(queue_row(m, "ha.sac")) for m in (hare2, hare3)),
               timeout=10)
    pc, pub = _chan(hare2, confirm=True)
    for i in range(20):
        pub.basic_publish("", "ha.sac", str(i).encode(), PERSISTENT)
    wait_until(lambda: [conn.process_data_events(0.05) for conn in conns] and
               len(got["a"]) + len(got["b"]) == 20, timeout=10)
    active = [who for who in got if got[who]]
    assert len(active) == 1, {w: len(b) for w, b in got.items()}      # still one active consumer
    assert got[active[0]] == [str(i).encode() for i in range(20)]
    for conn in (pc, *conns):
        conn.close()


def test_expiry_with_a_consumer_and_dead_letter_cycles_after_a_failover(cluster):
    members = cluster
    hare1, hare2, hare3 = members
    _policy(hare1, r"^ha\.", {"ha-mode": "all", "ha-sync-mode": "automatic"})
    c, ch = _chan(hare1)
    # a queue whose expired messages dead-letter back into itself: RabbitMQ drops them (a cycle)
    ch.queue_declare("ha.cycle", durable=True, arguments={"x-message-ttl": 300, "x-dead-letter-exchange": "",
                                                         "x-dead-letter-routing-key": "ha.cycle"})
    # a queue with a TTL and a consumer that takes nothing (prefetch full): messages expire under it
    ch.queue_declare("ha.ttl.busy", durable=True, arguments={"x-message-ttl": 300})
    c.close()
    for q in ("ha.cycle", "ha.ttl.busy"):
        _synced(hare1, q, ["hare2", "hare3"])
    hare1.kill9()
    wait_until(lambda: all((lambda r: r and r["master"] != "hare1")(queue_row(m, q))
                           for m in (hare2, hare3) for q in ("ha.cycle", "ha.ttl.busy")), timeout=10)
    cc, cons = _chan(hare3)
    cons.basic_qos(prefetch_count=1)
    held = []
    cons.basic_consume("ha.ttl.busy", lambda _c, m, _p, body: held.append(body))   # never acks
    pc, pub = _chan(hare2, confirm=True)
    for body in (b"taken", b"expires while the consumer is busy"):
        pub.basic_publish("", "ha.ttl.busy", body, PERSISTENT)
    pub.basic_publish("", "ha.cycle", b"round and round", PERSISTENT)
    wait_until(lambda: cc.process_data_events(0.05) or held == [b"taken"], timeout=10)
    time.sleep(1.0)
    cc.process_data_events(0.1)
    assert held == [b"taken"]
    assert queue_row(hare2, "ha.ttl.busy")["messages"] == 0       # the second expired under the consumer
    assert queue_row(hare2, "ha.cycle")["messages"] == 0          # and the cycle was dropped, not looped
    for conn in (pc, cc):
        conn.close()


# ---- rejoin (issue 16): a member restarted with a new address -------------------------------------
def _row(member, name):
    return next(r for r in control(member, "list_queues", timeout=2.0) if r["name"] == name)


def test_a_member_restarted_with_a_new_address_is_a_synchronised_mirror_again_at_once(tmp_path):
    """What a Kubernetes pod restart looks like: the member keeps its name and comes back on a new
    IP. Its peers must find it by name again (not keep dialling the old address), the healthy Raft
    leader must stay leader in the same term, and the returning mirror must sync at once. Issue 16
    aims at 3 s; the figures are printed, not asserted on (a shared 2-core machine)."""
    hosts = HostNames()
    members = []
    try:
        members = named_cluster(tmp_path, hosts, {"hare1": "127.0.0.11", "hare2": "127.0.0.12",
                                                  "hare3": "127.0.0.13"})
        hare1 = members[0]
        _mirrored_on_all(hare1, "ha.rejoin")
        c, ch = _chan(hare1, confirm=True)
        for i in range(200):
            ch.basic_publish("", "ha.rejoin", str(i).encode(), PERSISTENT)
        c.close()
        leader, term = wait_until(lambda: leader_and_term(members), timeout=10)
        # the one restarted is neither the queue's master (hare1) nor the metadata leader
        victim = next(m for m in members[1:] if m.name != leader)
        others = [m for m in members if m is not victim]
        victim.kill9()
        wait_until(lambda: all(not next(r for r in control(m, "cluster_status")["members"]
                                        if r["name"] == victim.name)["up"] for m in others), timeout=10)
        wait_until(lambda: victim.name not in _row(hare1, "ha.rejoin")["synchronised_mirrors"], timeout=10)
        assert leader_and_term(others) == (leader, term)

        new_address = victim.host.rsplit(".", 1)[0] + "." + str(int(victim.host.rsplit(".", 1)[1]) + 10)
        victim.host = new_address
        hosts.point(hosts.name_for(victim.name), new_address)
        started = time.monotonic()
        serving = []

        def start():
            victim.start(timeout=60)
            serving.append(time.monotonic() - started)
        runner = threading.Thread(target=start, daemon=True)
        runner.start()
        in_status = synced = None
        views = set()
        deadline = started + 60
        while (synced is None or in_status is None) and time.monotonic() < deadline:
            now = time.monotonic() - started
            try:
                statuses = [control(m, "cluster_status", timeout=2.0) for m in others]
                row = _row(hare1, "ha.rejoin")
            except grpc.RpcError:
                time.sleep(0.05)
                continue
            views.update((s["node"], s["leader"], s["term"]) for s in statuses)
            if in_status is None and all(next(r for r in s["members"] if r["name"] == victim.name)["up"]
                                         for s in statuses):
                in_status = now
            if synced is None and victim.name in (row["synchronised_mirrors"] or []):
                synced = now
            time.sleep(0.05)
        runner.join(60)
        print(f"\nrejoin with a new address ({victim.name} -> {new_address}): back in cluster-status "
              f"on every peer after {in_status if in_status is None else round(in_status, 2)} s, "
              f"synchronised mirror after {synced if synced is None else round(synced, 2)} s "
              f"(its own AMQP port open after {round(serving[0], 2) if serving else None} s) "
              f"(issue 16's target: 3 s); leader {leader}, term {term} before; while it rejoined the others "
              f"saw leaders {sorted({v[1] for v in views}, key=str)}, terms {sorted({v[2] for v in views})}")
        assert synced is not None, f"{victim.name} never became a synchronised mirror again:\n{victim.log_tail()}"
        time.sleep(2.0)       # long enough for a returning node's election timeout to have fired
        assert leader_and_term(members) == (leader, term)
        assert {(v[1], v[2]) for v in views} == {(leader, term)}, "the leader changed while the member rejoined"
        assert [b for b, _r in _drain(victim, "ha.rejoin", ack=False)] == [str(i).encode() for i in range(200)]
    finally:
        for m in members:
            m.kill9()
        hosts.close()


# ---- no 404 for a live mirrored queue (issue 16) -------------------------------------------------
def _at_once(calls):
    """Run each call in its own thread, all released together; {name: result or exception}."""
    start = threading.Event()
    results = {}

    def run(name, fn):
        start.wait()
        try:
            results[name] = fn()
        except Exception as exc:  # noqa: BLE001 - what the client saw is the result
            results[name] = exc
    threads = [threading.Thread(target=run, args=item, daemon=True) for item in calls.items()]
    for t in threads:
        t.start()
    start.set()
    for t in threads:
        t.join(30)
    return results


def test_declare_bind_consume_and_get_on_survivors_wait_for_the_failover(cluster):
    # clients that answer a 404 by declaring again (kombu, Celery, Spring) must never see one for a
    # mirrored queue with an in-sync mirror, on any node, and a declare meanwhile never makes a
    # second, empty queue
    members = cluster
    hare1, hare2, hare3 = members
    _mirrored_on_all(hare1, "ha.scale")
    c, ch = _chan(hare1, confirm=True)
    for i in range(50):
        ch.basic_publish("", "ha.scale", str(i).encode(), PERSISTENT)
    c.close()
    chans = {}
    for m in (hare2, hare3):
        for op in ("passive", "declare", "bind", "get", "consume"):
            chans[m.name, op] = _chan(m)          # connected before the kill: used right after it
    got = []

    def consume(conn, ch):
        ch.basic_consume("ha.scale", lambda c_, m, _p, body: (got.append(body), c_.basic_ack(m.delivery_tag)),
                         consumer_tag="survivor")
        return "consume-ok"

    chans["hare3", "consume"][1].basic_qos(prefetch_count=5)    # leaves some for the get

    calls = {}
    for name in ("hare2", "hare3"):
        calls[name, "passive"] = lambda ch=chans[name, "passive"][1]: \
            ch.queue_declare("ha.scale", passive=True).method.message_count
        calls[name, "declare"] = lambda ch=chans[name, "declare"][1]: \
            ch.queue_declare("ha.scale", durable=True).method.message_count
        calls[name, "bind"] = lambda ch=chans[name, "bind"][1], n=name: \
            (ch.queue_bind("ha.scale", "amq.direct", routing_key=f"via-{n}"), "bind-ok")[1]
    calls["hare2", "get"] = lambda ch=chans["hare2", "get"][1]: ch.basic_get("ha.scale", auto_ack=False)[2]
    calls["hare3", "consume"] = lambda c_ch=chans["hare3", "consume"]: consume(*c_ch)
    hare1.kill9()
    results = _at_once(calls)
    errors = {k: v for k, v in results.items() if isinstance(v, Exception)}
    assert not errors, f"refused during the failover: {errors}"
    for name in ("hare2", "hare3"):
        assert results[name, "bind"] == "bind-ok" and results[name, "declare"] <= 50 \
            and results[name, "passive"] <= 50
    taken = results["hare2", "get"]
    assert taken is not None
    rows = [r for r in ctl_json(hare2, "list-queues") if r["name"] == "ha.scale"]
    assert len(rows) == 1 and rows[0]["master"] != "hare1"          # one queue, not a new one
    cons_c, _cons = chans["hare3", "consume"]
    wait_until(lambda: cons_c.process_data_events(0.05) or len(got) >= 49, timeout=20,
               message=f"the survivor's consumer got {len(got)} of 49")
    assert sorted([*got, taken], key=int) == [str(i).encode() for i in range(50)]   # all, once
    pc, pub = _chan(hare3, confirm=True)                  # the bindings made meanwhile hold
    pub.basic_publish("amq.direct", "via-hare2", b"bound-2", PERSISTENT)
    pub.basic_publish("amq.direct", "via-hare3", b"bound-3", PERSISTENT)
    wait_until(lambda: cons_c.process_data_events(0.05) or len(got) >= 51, timeout=20)
    assert got[-2:] == [b"bound-2", b"bound-3"]
    for conn, _ch in [*chans.values(), (pc, pub)]:
        if conn.is_open:
            conn.close()


def test_a_mirrored_queue_no_mirror_can_take_over_is_a_clear_404(cluster):
    # bounded: when no synchronised mirror is up, nothing will promote one, so the answer is a
    # 404 that says so rather than a wait
    members = cluster
    hare1, hare2, hare3 = members
    _policy(hare1, r"^ha\.", {"ha-mode": "exactly", "ha-params": 2})      # manual sync
    c, ch = _chan(hare1, confirm=True)
    ch.queue_declare("ha.lonely", durable=True)
    ch.basic_publish("", "ha.lonely", b"x", PERSISTENT)
    c.close()
    mirror = next(m for m in (hare2, hare3) if m.name in queue_row(hare1, "ha.lonely")["mirrors"])
    other = hare3 if mirror is hare2 else hare2
    _restart(mirror)          # back empty and, with manual sync, not synchronised
    wait_until(lambda: queue_row(hare1, "ha.lonely")["synchronised_mirrors"] == [], timeout=20)
    hare1.kill9()
    c, ch = _chan(other)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        ch.queue_declare("ha.lonely", passive=True)
    assert refused.value.reply_code == 404
    assert "no synchronised mirror can take over" in refused.value.reply_text
    c.close()
    hare1.start(timeout=60)

    def count():
        c, ch = _chan(other)
        try:
            return ch.queue_declare("ha.lonely", passive=True).method.message_count
        except pika.exceptions.ChannelClosedByBroker:
            return None        # until this node sees its master up again
        finally:
            if c.is_open:
                c.close()
    assert wait_until(lambda: count() is not None, timeout=20) and count() == 1   # still there


def test_an_identical_message_after_a_failover_reaches_a_consumer_that_acked_its_twin(cluster):
    """A consumer's node remembers what its client acked through the old master (an ack that may
    not have reached the mirrors) by key and content. A new master numbering from its own highest
    key gave a new message a key the old one had used: an identical message ("tick") was then
    taken for the acked one and acked without ever reaching the client."""
    members = cluster
    hare1, hare2, hare3 = members
    _policy(hare1, r"^ha\.", {"ha-mode": "nodes", "ha-params": ["hare1", "hare2"], "ha-sync-mode": "automatic"})
    c, ch = _chan(hare1)
    ch.queue_declare("ha.twins", durable=True)
    c.close()
    _synced(hare3, "ha.twins", ["hare2"])
    cc, cons = _chan(hare3)
    got = []
    cons.basic_consume("ha.twins", lambda ch_, m, _p, body: (got.append(body), ch_.basic_ack(m.delivery_tag)))
    pc, pub = _chan(hare3, confirm=True)
    pub.basic_publish("", "ha.twins", b"tick", PERSISTENT)
    wait_until(lambda: cc.process_data_events(0.05) or got == [b"tick"], timeout=10)
    _pump(cc, 0.5)           # the ack reaches the master, and its removal the mirror
    hare1.kill9()
    wait_until(lambda: (lambda r: r and r["master"] == "hare2" and r["state"] == "running")(
        queue_row(hare3, "ha.twins")), timeout=20)
    _publish_once_confirmed(pub, "ha.twins", b"tick")
    wait_until(lambda: cc.process_data_events(0.05) or len(got) == 2, timeout=10,
               message=f"the second tick never reached the consumer: {got}")
    assert got == [b"tick", b"tick"]
    cc.close()
    pc.close()
