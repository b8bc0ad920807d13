"""A member that dies, left down: what its client connections held on other nodes' queues goes,
as in RabbitMQ (its consumers, and their unacked deliveries, requeued as redelivered)."""
from __future__ import annotations

import time

import pika
import pytest

from tests.clusters import proxied_cluster, stop_cluster
from tests.conftest import IS_REF, wait_until

pytestmark = pytest.mark.skipif(IS_REF, reason="starts and kills cluster node processes")

FAILURE_TIMEOUT = 3.0      # a killed member's port refuses connections: it is down at once


@pytest.fixture
def cluster(tmp_path):
    members, partition = proxied_cluster(tmp_path, failure_timeout=FAILURE_TIMEOUT)
    yield members, partition
    stop_cluster(list(members), partition)


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


# ---- consumers on queues mastered elsewhere ------------------------------------------------------
def test_unacked_deliveries_of_a_dead_nodes_consumer_come_back_redelivered(cluster):
    members, _ = cluster
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
    members, _ = cluster
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
    members, _ = cluster
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
    _gone_everywhere((hare2, hare3), ["nd.auto"], timeout=FAILURE_TIMEOUT + 2)
    assert ch2.queue_declare("nd.kept", passive=True).method.consumer_count == 1
    for c in (c2, c3):
        c.close()
