"""A member the others agree is down, left down: what its client connections owned goes, as in
RabbitMQ (its exclusive queues, its consumers and their unacked deliveries on other nodes'
queues), within the failure-detection time; when it comes back nothing of it returns."""
from __future__ import annotations

import os
import signal
import time

import pika
import pytest

from tests.clusters import ctl_json
from tests.conftest import IS_REF, port_open, wait_until

FAILURE_TIMEOUT = 3.0      # a killed member's port refuses connections: it is down at once

pytestmark = [pytest.mark.skipif(IS_REF, reason="starts and kills cluster node processes"),
              pytest.mark.cluster(failure_timeout=FAILURE_TIMEOUT)]


def _chan(member):
    c = pika.BlockingConnection(pika.URLParameters(member.url))
    return c, c.channel()


def _passive(member, name):
    """A passive declare of `name` on `member`: 'ok', or the reply code it was refused with."""
    c, ch = _chan(member)
    try:
        ch.queue_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        return exc.reply_code
    finally:
        if c.is_open:
            c.close()
    return "ok"


def _gone_everywhere(members, names, timeout):
    """Wait until a passive declare of each name answers 404 on every member; seconds it took."""
    started = time.monotonic()
    seen = {}

    def gone():
        seen.update({(m.name, n): _passive(m, n) for m in members for n in names})
        return all(code == 404 for code in seen.values())
    try:
        wait_until(gone, timeout=timeout, interval=0.1)
    except AssertionError:
        raise AssertionError(f"still there after {timeout} s: {seen}") from None
    return time.monotonic() - started


def _pump(connections, until, timeout=10.0, message=""):
    wait_until(lambda: [c.process_data_events(0.05) for c in connections] and until(), timeout=timeout,
               message=message)


# ---- exclusive queues --------------------------------------------------------------------------
def test_exclusive_queues_of_a_killed_node_are_gone_on_the_survivors_at_once(cluster):
    """RabbitMQ answers 404 at once; the name is free for a client that reconnects elsewhere."""
    members = cluster
    hare1, hare2, hare3 = members
    c1, ch1 = _chan(hare1)
    ch1.queue_declare("nd.replies", exclusive=True)
    server_named = ch1.queue_declare("", exclusive=True).method.queue
    ch1.queue_bind("nd.replies", "amq.direct", "nd.replies")
    assert _passive(hare2, "nd.replies") == 405           # locked while its connection lives
    hare1.kill9()
    # gone while the node is still down (on a quiet machine within about a second: a killed
    # member's port refuses connections at once); the bound only says "not when it returns"
    _gone_everywhere((hare2, hare3), ["nd.replies", server_named], timeout=4 * FAILURE_TIMEOUT)
    # a client that reconnects to a survivor declares its reply queue again and uses it
    c2, ch2 = _chan(hare2)
    ch2.queue_declare("nd.replies", exclusive=True)
    ch2.queue_bind("nd.replies", "amq.direct", "nd.replies")
    c3, ch3 = _chan(hare3)
    ch3.confirm_delivery()
    ch3.basic_publish("amq.direct", "nd.replies", b"answer", mandatory=True)
    method, _props, body = wait_until(lambda: (lambda g: g if g[0] else None)(ch2.basic_get("nd.replies")), timeout=5)
    assert body == b"answer" and not method.redelivered
    assert _passive(hare3, "nd.replies") == 405            # exclusive to hare2's client now
    for c in (c2, c3):
        c.close()


def test_non_durable_queues_of_a_killed_node_go_unless_a_mirror_takes_over(cluster):
    """RabbitMQ's on_node_down deletes a dead node's transient queues that are not replicated:
    their messages died with it, and the name is free to declare again elsewhere."""
    hare1, hare2, hare3 = cluster
    assert ctl_json(hare2, "cluster-status")["majority"]
    _c, ch2 = _chan(hare2)
    ch2.queue_declare("nd.transient")                       # homed on hare2, not mirrored
    ch2.queue_declare("nd.kept", durable=True)              # durable: comes back with its node
    hare2.kill9()
    for member in (hare1, hare3):
        wait_until(lambda m=member: "nd.transient" not in {r["name"] for r in ctl_json(m, "list-queues")},
                   timeout=4 * FAILURE_TIMEOUT, message=f"{member.name} still lists the dead node's transient queue")
    assert "nd.kept" in {r["name"] for r in ctl_json(hare1, "list-queues")}

    def declare(name):
        c, ch = _chan(hare3)
        try:
            ch.queue_declare(name, durable=name == "nd.kept")
            return c, ch
        except pika.exceptions.ChannelClosedByBroker as exc:
            return exc.reply_code, exc.reply_text
    _c, ch3 = declare("nd.transient")                       # declared afresh, homed on hare3
    code, text = declare("nd.kept")     # a durable queue of a down node is refused, as RabbitMQ does
    assert code == 404 and "down" in text
    ch3.basic_publish("", "nd.transient", b"new home")
    assert wait_until(lambda: ch3.basic_get("nd.transient", auto_ack=True)[2], timeout=5) == b"new home"


def test_a_node_cut_off_closes_its_clients_and_the_majority_drops_their_exclusive_queues(cluster):
    """Pause-minority: the node in the minority closes its clients itself (320), so their
    exclusive queues are dead and the majority deletes them; exclusive queues of clients on the
    majority side are untouched; after healing, the node serves new clients whose exclusive
    queues stay."""
    members, partition = cluster, cluster.partition
    hare1, hare2, hare3 = members
    c1, ch1 = _chan(hare1)
    ch1.queue_declare("nd.minority", exclusive=True)
    c2, ch2 = _chan(hare2)
    ch2.queue_declare("nd.majority", exclusive=True)
    partition["cut"]()
    try:
        wait_until(lambda: not port_open(hare1.port, 0.2), timeout=10, message="hare1 never paused")
        _gone_everywhere((hare2, hare3), ["nd.minority"], timeout=4 * FAILURE_TIMEOUT)
        assert _passive(hare3, "nd.majority") == 405
    finally:
        partition["heal"]()
    wait_until(lambda: port_open(hare1.port, 0.2), timeout=20, message="hare1 did not resume after healing")
    c1, ch1 = wait_until(lambda: _try_chan(hare1), timeout=10)
    ch1.queue_declare("nd.after", exclusive=True)
    time.sleep(FAILURE_TIMEOUT)                              # long enough for any late decision
    assert _passive(hare1, "nd.minority") == 404
    for m in members:
        assert _passive(m, "nd.after") == 405
        assert _passive(m, "nd.majority") == 405
    ch1.queue_declare("nd.after", passive=True)              # hare1's new client still has it
    ch2.queue_declare("nd.majority", passive=True)
    for c in (c1, c2):
        c.close()


def test_a_node_stopped_past_the_failure_timeout_closes_the_clients_whose_queues_went(cluster):
    """SIGSTOP: the others count the node down and delete its clients' exclusive queues; when it
    runs again it never paused (a stall is not counted against the others), so it applies its own
    node.down and closes those clients (320): what they owned is gone cluster-wide."""
    members = cluster
    hare1, hare2, hare3 = members
    c1, ch1 = _chan(hare1)
    ch1.queue_declare("nd.stopped", exclusive=True)
    os.killpg(hare1.proc.pid, signal.SIGSTOP)
    try:
        _gone_everywhere((hare2, hare3), ["nd.stopped"], timeout=4 * FAILURE_TIMEOUT)
    finally:
        os.killpg(hare1.proc.pid, signal.SIGCONT)
    closed = []

    def closed_by_broker():
        try:
            c1.process_data_events(0.1)
        except pika.exceptions.ConnectionClosedByBroker as exc:
            closed.append(exc.reply_code)
        return closed
    wait_until(closed_by_broker, timeout=10, message="hare1's client was not closed")
    assert closed == [320]
    c1, ch1 = wait_until(lambda: _try_chan(hare1), timeout=10)
    assert _passive(hare1, "nd.stopped") == 404
    ch1.queue_declare("nd.stopped", exclusive=True)           # a new client of hare1 takes the name
    time.sleep(1)
    assert _passive(hare2, "nd.stopped") == 405
    ch1.queue_declare("nd.stopped", passive=True)
    c1.close()


def _try_chan(member):
    try:
        return _chan(member)
    except pika.exceptions.AMQPConnectionError:
        return None


# ---- consumers on queues mastered elsewhere ------------------------------------------------------
def test_unacked_deliveries_of_a_dead_nodes_consumer_come_back_redelivered(cluster):
    members = cluster
    hare1, hare2, hare3 = members
    c2, ch2 = _chan(hare2)
    ch2.confirm_delivery()
    ch2.queue_declare("nd.work", durable=True)               # mastered on hare2
    for i in range(10):
        ch2.basic_publish("", "nd.work", str(i).encode(), pika.BasicProperties(delivery_mode=2))
    c1, ch1 = _chan(hare1)
    ch1.basic_qos(prefetch_count=4)
    held = []
    ch1.basic_consume("nd.work", lambda _c, m, _p, body: held.append(body))
    _pump([c1], lambda: len(held) == 4)
    hare1.kill9()
    c3, ch3 = _chan(hare3)
    got = []
    ch3.basic_consume("nd.work", lambda c, m, _p, body: (got.append((body, m.redelivered)), c.basic_ack(m.delivery_tag)))
    _pump([c3], lambda: len(got) == 10, message=f"the survivor's consumer got {got}")
    assert sorted(got) == sorted([(str(i).encode(), i < 4) for i in range(10)])
    assert [b for b, redelivered in got if redelivered] == held
    assert ch3.queue_declare("nd.work", passive=True).method.consumer_count == 1
    for c in (c2, c3):
        c.close()


def test_a_single_active_consumer_on_a_dead_node_hands_over(cluster):
    members = cluster
    hare1, hare2, hare3 = members
    c2, ch2 = _chan(hare2)
    ch2.confirm_delivery()
    ch2.queue_declare("nd.sac", durable=True, arguments={"x-single-active-consumer": True})
    c1, ch1 = _chan(hare1)
    ch1.basic_qos(prefetch_count=3)
    held = []
    ch1.basic_consume("nd.sac", lambda _c, m, _p, body: held.append(body))    # the active one
    c1.process_data_events(0.3)
    c3, ch3 = _chan(hare3)
    got = []
    ch3.basic_consume("nd.sac", lambda c, m, _p, body: (got.append((body, m.redelivered)), c.basic_ack(m.delivery_tag)))
    c3.process_data_events(0.3)
    for i in range(6):
        ch2.basic_publish("", "nd.sac", str(i).encode(), pika.BasicProperties(delivery_mode=2))
    _pump([c1, c3], lambda: len(held) == 3)
    c3.process_data_events(0.5)
    assert got == []                                         # hare1's consumer is the active one
    hare1.kill9()
    _pump([c3], lambda: len(got) == 6, message=f"the next consumer got {got}")
    assert got == [(str(i).encode(), i < 3) for i in range(6)]     # in order, hare1's first
    for c in (c2, c3):
        c.close()


def test_an_auto_delete_queue_whose_last_consumer_was_on_the_dead_node_is_deleted(cluster):
    members = cluster
    hare1, hare2, hare3 = members
    c2, ch2 = _chan(hare2)
    ch2.queue_declare("nd.auto", auto_delete=True)           # mastered on hare2
    ch2.queue_declare("nd.kept", auto_delete=True)           # its consumer is on hare3
    c1, ch1 = _chan(hare1)
    ch1.basic_consume("nd.auto", lambda *_a: None)
    c3, ch3 = _chan(hare3)
    ch3.basic_consume("nd.kept", lambda *_a: None)
    c1.process_data_events(0.3)
    assert ch2.queue_declare("nd.auto", passive=True).method.consumer_count == 1
    hare1.kill9()
    _gone_everywhere((hare2, hare3), ["nd.auto"], timeout=4 * FAILURE_TIMEOUT)
    assert ch2.queue_declare("nd.kept", passive=True).method.consumer_count == 1
    for c in (c2, c3):
        c.close()


# ---- the node comes back -----------------------------------------------------------------------
def test_a_node_that_comes_back_does_not_resurrect_what_went(cluster):
    members = cluster
    hare1, hare2, hare3 = members
    c2, ch2 = _chan(hare2)
    ch2.queue_declare("nd.shared", durable=True)              # mastered on hare2
    ch2.confirm_delivery()
    for i in range(3):
        ch2.basic_publish("", "nd.shared", str(i).encode(), pika.BasicProperties(delivery_mode=2))
    c1, ch1 = _chan(hare1)
    ch1.queue_declare("nd.mine", exclusive=True)
    server_named = ch1.queue_declare("", exclusive=True).method.queue
    ch1.basic_qos(prefetch_count=3)
    held = []
    ch1.basic_consume("nd.shared", lambda _c, m, _p, body: held.append(body))
    _pump([c1], lambda: len(held) == 3)
    hare1.kill9()
    _gone_everywhere((hare2, hare3), ["nd.mine", server_named], timeout=4 * FAILURE_TIMEOUT)
    ch2.queue_declare("nd.mine", exclusive=True)              # the name, taken on a survivor
    ch2.queue_bind("nd.mine", "amq.fanout")
    hare1.start(timeout=60)
    wait_until(lambda: _try_chan(hare1), timeout=10)
    for m in members:
        assert _passive(m, server_named) == 404
        assert _passive(m, "nd.mine") == 405
    rows = [r for r in ctl_json(hare1, "list-queues") if r["name"] in ("nd.mine", server_named)]
    assert [(r["name"], r["node"]) for r in rows] == [("nd.mine", "hare2")]
    # hare2's client still owns and uses it; hare1's consumer of nd.shared is gone for good
    c1, ch1 = _chan(hare1)
    ch1.confirm_delivery()
    ch1.basic_publish("amq.fanout", "", b"after")
    method, _props, body = wait_until(lambda: (lambda g: g if g[0] else None)(ch2.basic_get("nd.mine")), timeout=5)
    assert body == b"after"
    shared = ch2.queue_declare("nd.shared", passive=True).method
    assert (shared.message_count, shared.consumer_count) == (3, 0)
    redelivered = [ch2.basic_get("nd.shared", auto_ack=True) for _ in range(3)]
    assert [(m.redelivered, b) for m, _p, b in redelivered] == [(True, str(i).encode()) for i in range(3)]
    for c in (c1, c2):
        c.close()
