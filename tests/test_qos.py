"""QOS-1..5: prefetch limits and back pressure on slow consumers."""
import time

import pytest
from pamqp import body as pbody
from pamqp import commands as spec
from pamqp import header as pheader

from tests.conftest import (assert_node_healthy, message_count, pika_conn, raw_socket,
                            unique_name, wait_until)

SETTLE = 0.3  # time allowed for deliveries beyond a limit to (wrongly) show up


def fill(node, n, size=0):
    c = pika_conn(node)
    ch = c.channel()
    ch.confirm_delivery()
    q = unique_name("qosq")
    ch.queue_declare(q)
    for i in range(n):
        ch.basic_publish("", q, f"m{i}".encode() + b"." * size)
    c.close()
    return q


class Consumer:
    """A pika consumer recording deliveries; ``pump()`` processes I/O."""

    def __init__(self, conn, ch, q, auto_ack=False):
        self.conn, self.ch, self.q = conn, ch, q
        self.tags = []
        self.tag = ch.basic_consume(q, self._on, auto_ack=auto_ack)

    def _on(self, ch, method, props, body):
        self.tags.append(method.delivery_tag)

    def pump(self, seconds=SETTLE):
        self.conn.process_data_events(time_limit=seconds)
        return len(self.tags)

    def wait_for(self, n, timeout=5):
        wait_until(lambda: self.pump(0.05) >= n, timeout,
                   message=f"consumer got {len(self.tags)} deliveries, expected {n}")
        return self.pump()


def cleanup(node, *queues):
    ch = pika_conn(node).channel()
    for q in queues:
        ch.queue_delete(q)


# ------------------------------------------------------------------ QOS-1 / QOS-2

def test_prefetch_caps_unacked_deliveries(node):
    # QOS-1, QOS-2
    q = fill(node, 10)
    conn = pika_conn(node)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=3)
    c = Consumer(conn, ch, q)
    assert c.wait_for(3) == 3
    ch.basic_ack(c.tags[0])
    assert c.wait_for(4) == 4
    cleanup(node, q)


def test_multiple_ack_frees_several_places(node):
    # QOS-2
    q = fill(node, 10)
    conn = pika_conn(node)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=3)
    c = Consumer(conn, ch, q)
    assert c.wait_for(3) == 3
    ch.basic_ack(c.tags[-1], multiple=True)
    assert c.wait_for(6) == 6
    assert c.tags == [1, 2, 3, 4, 5, 6]
    cleanup(node, q)


@pytest.mark.parametrize("how", ["nack", "reject"])
def test_nack_and_reject_free_a_place(node, how):
    # QOS-2
    q = fill(node, 10)
    conn = pika_conn(node)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=2)
    c = Consumer(conn, ch, q)
    assert c.wait_for(2) == 2
    if how == "nack":
        ch.basic_nack(c.tags[0], requeue=False)
    else:
        ch.basic_reject(c.tags[0], requeue=False)
    assert c.wait_for(3) == 3
    cleanup(node, q)


def test_prefetch_zero_is_unlimited(node):
    # QOS-1
    q = fill(node, 50)
    conn = pika_conn(node)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=0)
    c = Consumer(conn, ch, q)
    assert c.wait_for(50) == 50
    cleanup(node, q)


def test_no_qos_is_unlimited(node):
    # QOS-1
    q = fill(node, 30)
    conn = pika_conn(node)
    c = Consumer(conn, conn.channel(), q)
    assert c.wait_for(30) == 30
    cleanup(node, q)


def test_global_false_applies_to_consumers_created_afterwards(node):
    # QOS-1: per-consumer limit is fixed when the consumer is created
    qa, qb = fill(node, 10), fill(node, 10)
    conn = pika_conn(node)
    ch = conn.channel()
    a = Consumer(conn, ch, qa)  # created before basic.qos: unlimited
    ch.basic_qos(prefetch_count=2, global_qos=False)
    b = Consumer(conn, ch, qb)
    a.wait_for(10)
    b.wait_for(2)
    assert (a.pump(), len(b.tags)) == (10, 2)
    cleanup(node, qa, qb)


def test_global_false_limits_each_consumer_separately(node):
    # QOS-1
    qa, qb = fill(node, 10), fill(node, 10)
    conn = pika_conn(node)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=2, global_qos=False)
    a, b = Consumer(conn, ch, qa), Consumer(conn, ch, qb)
    a.wait_for(2)
    b.wait_for(2)
    assert (a.pump(), len(b.tags)) == (2, 2)
    cleanup(node, qa, qb)


def test_global_true_shared_across_consumers_on_channel(node):
    # QOS-1, QOS-2
    qa, qb = fill(node, 10), fill(node, 10)
    conn = pika_conn(node)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=3, global_qos=True)
    a, b = Consumer(conn, ch, qa), Consumer(conn, ch, qb)
    wait_until(lambda: a.pump(0.05) + len(b.tags) >= 3, 5)
    a.pump()
    assert len(a.tags) + len(b.tags) == 3, (a.tags, b.tags)
    # freeing one place lets exactly one more through, to either consumer
    ch.basic_ack((a.tags + b.tags)[0])
    wait_until(lambda: a.pump(0.05) + len(b.tags) >= 4, 5)
    a.pump()
    assert len(a.tags) + len(b.tags) == 4
    cleanup(node, qa, qb)


def test_global_and_per_consumer_limits_both_apply(node):
    # QOS-1
    qa, qb = fill(node, 10), fill(node, 10)
    conn = pika_conn(node)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=5, global_qos=True)
    ch.basic_qos(prefetch_count=2, global_qos=False)
    a, b = Consumer(conn, ch, qa), Consumer(conn, ch, qb)
    a.wait_for(2)
    b.wait_for(2)
    assert (a.pump(), len(b.tags)) == (2, 2)  # per-consumer 2 binds before global 5
    cleanup(node, qa, qb)


def test_prefetch_not_applied_to_autoack_consumers(node):
    # QOS-1
    q = fill(node, 20)
    conn = pika_conn(node)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1)
    c = Consumer(conn, ch, q, auto_ack=True)
    assert c.wait_for(20) == 20
    cleanup(node, q)


# ------------------------------------------------------------------ QOS-3

def test_prefetch_has_no_effect_on_basic_get(node):
    # QOS-3
    q = fill(node, 5)
    ch = pika_conn(node).channel()
    ch.basic_qos(prefetch_count=1)
    got = [ch.basic_get(q)[0] for _ in range(5)]
    assert all(m is not None for m in got)
    assert [m.delivery_tag for m in got] == [1, 2, 3, 4, 5]
    cleanup(node, q)


def test_basic_get_unacked_do_not_count_against_consumer_prefetch(node):
    # QOS-3
    q = fill(node, 10)
    conn = pika_conn(node)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=2)
    for _ in range(3):
        ch.basic_get(q)
    c = Consumer(conn, ch, q)
    assert c.wait_for(2) == 2
    cleanup(node, q)


# ------------------------------------------------------------------ QOS-4

def test_lowering_global_prefetch_while_in_flight(node):
    # QOS-4
    q = fill(node, 10)
    conn = pika_conn(node)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=3, global_qos=True)
    c = Consumer(conn, ch, q)
    assert c.wait_for(3) == 3
    ch.basic_qos(prefetch_count=1, global_qos=True)  # allowed with 3 in flight
    ch.basic_ack(c.tags[0])
    assert c.pump() == 3  # still 2 unacked > 1: nothing new
    ch.basic_ack(c.tags[2], multiple=True)
    assert c.wait_for(4) == 4
    assert c.pump() == 4
    cleanup(node, q)


def test_raising_global_prefetch_releases_more_at_once(node):
    # QOS-4
    q = fill(node, 10)
    conn = pika_conn(node)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=2, global_qos=True)
    c = Consumer(conn, ch, q)
    assert c.wait_for(2) == 2
    ch.basic_qos(prefetch_count=5, global_qos=True)
    assert c.wait_for(5) == 5
    assert c.pump() == 5
    cleanup(node, q)


def test_changing_per_consumer_prefetch_keeps_existing_consumer_limit(node):
    # QOS-1/4: global=false only affects consumers created after the change
    qa, qb = fill(node, 10), fill(node, 10)
    conn = pika_conn(node)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=3)
    a = Consumer(conn, ch, qa)
    assert a.wait_for(3) == 3
    ch.basic_qos(prefetch_count=1)
    ch.basic_ack(a.tags[0])
    assert a.wait_for(4) == 4  # a still has room for 3
    assert a.pump() == 4
    b = Consumer(conn, ch, qb)
    assert b.wait_for(1) == 1
    assert b.pump() == 1
    cleanup(node, qa, qb)


# ------------------------------------------------------------------ QOS-5

def test_autoack_slow_reader_gets_tcp_back_pressure(fresh_node):
    # QOS-5: an auto-ack consumer without prefetch that stops reading must not make
    # the broker buffer everything: messages stay in the queue, the node serves others,
    # and once the reader resumes it gets every message, in order.
    node = fresh_node  # 50 MB through one node: keep it away from the other tests
    n, size = 5000, 10 * 1024  # 50 MB
    q = unique_name("slow")
    setup = pika_conn(node).channel()
    setup.queue_declare(q, auto_delete=False)

    reader = raw_socket(node, rcvbuf=4096)
    reader.record = False
    reader.open_channel(1)
    reader.rpc(spec.Basic.Consume(queue=q, no_ack=True, consumer_tag="slow"), 1,
               spec.Basic.ConsumeOk)

    pub_conn = pika_conn(node)
    pub = pub_conn.channel()
    payload = b"x" * (size - 8)
    for i in range(n):
        pub.basic_publish("", q, b"%08d" % i + payload)
    t0 = time.monotonic()
    queued = message_count(pub, q)  # synchronous: all publishes before it were handled
    assert time.monotonic() - t0 < 10, "node unresponsive while a consumer is stalled"
    assert queued >= n // 2, (f"only {queued} of {n} messages still queued: the broker "
                              "pushed the rest into buffers for a consumer that is not reading")
    assert_node_healthy(node)

    # the reader wakes up and must receive everything exactly once, in order
    seen = 0
    deadline = time.monotonic() + 90
    while seen < n:
        assert time.monotonic() < deadline, f"reader got {seen} of {n}"
        ch, frame = reader.recv_frame(timeout=10)
        if isinstance(frame, spec.Basic.Deliver):
            hdr = reader.expect(pheader.ContentHeader, 1)
            assert hdr.body_size == size
            data = b""
            while len(data) < hdr.body_size:
                data += reader.expect(pbody.ContentBody, 1).value
            assert data[:8] == b"%08d" % seen, f"delivery {seen} out of order: {data[:8]!r}"
            assert frame.delivery_tag == seen + 1
            seen += 1
    assert message_count(pub, q) == 0
    pub.queue_delete(q)
