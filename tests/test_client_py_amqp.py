"""py-amqp (`amqp` on PyPI, kombu's default transport) against the broker."""
from __future__ import annotations

import amqp
import pytest

from tests.conftest import HOST, unique_name


@pytest.fixture(scope="module")
def node(node_or_cluster_member):
    """A single node, then a three-node cluster's member that is not the metadata leader."""
    return node_or_cluster_member


def connect(node, password: str = "guest") -> amqp.Connection:
    conn = amqp.Connection(f"{HOST}:{node.port}", userid="guest", password=password, virtual_host="/",
                           connect_timeout=10, heartbeat=0)
    conn.connect()
    return conn


@pytest.fixture
def conn(node):
    c = connect(node)
    yield c
    if c.connected:
        c.close()


def test_round_trip(conn):
    ch = conn.channel()
    q, _, _ = ch.queue_declare("", exclusive=True)
    ch.basic_publish(amqp.Message(b"hello", content_type="text/plain", application_headers={"n": 1}),
                     routing_key=q)
    msg = ch.basic_get(q, no_ack=True)
    assert (msg.body, msg.properties["content_type"], msg.headers["n"]) == (b"hello", "text/plain", 1)


def test_publisher_confirms(conn):
    ch = conn.channel()
    ch.confirm_select()
    q, _, _ = ch.queue_declare("", exclusive=True)
    for i in range(20):
        ch.basic_publish_confirm(amqp.Message(b"%d" % i), routing_key=q)   # waits for basic.ack
    assert ch.queue_declare(q, passive=True).message_count == 20


def test_consumer_cancel_notification(node, conn):
    ch = conn.channel()
    q = unique_name("pyamqp")
    ch.queue_declare(q, auto_delete=False)
    cancelled = []
    ch.basic_consume(q, callback=lambda m: None, on_cancel=cancelled.append)
    other = connect(node)
    other.channel().queue_delete(q)
    other.close()
    while not cancelled:
        conn.drain_events(timeout=10)
    assert len(cancelled) == 1


def test_refused_login(node):
    with pytest.raises(amqp.exceptions.AccessRefused) as ei:
        connect(node, password="wrong")
    assert "ACCESS_REFUSED - Login was refused" in str(ei.value)


def test_message_larger_than_frame_max(conn):
    ch = conn.channel()
    q, _, _ = ch.queue_declare("", exclusive=True)
    body = b"L" * (3 * 131072 + 17)
    ch.basic_publish(amqp.Message(body), routing_key=q)
    assert ch.basic_get(q, no_ack=True).body == body


def test_queue_deleted_under_own_consumer(conn):
    # delete-ok first: queue_delete returns, and the cancel comes with the next read
    ch = conn.channel()
    q = unique_name("pyamqp")
    ch.queue_declare(q, auto_delete=False)
    ch.basic_publish(amqp.Message(b"one"), routing_key=q)
    ch.basic_publish(amqp.Message(b"two"), routing_key=q)
    ch.basic_qos(0, 1, False)
    tag = ch.basic_consume(q, callback=lambda m: None)
    assert ch.queue_delete(q) == 1          # one was delivered (unacked), one was ready
    with pytest.raises(amqp.exceptions.ConsumerCancelled):
        while True:
            conn.drain_events(timeout=10)
    assert tag not in ch.callbacks


def test_no_frame_follows_channel_close_ok(conn):
    # kombu's test_ack_from_another_thread: another thread's basic.ack and this thread's
    # channel.close reach the broker together. The ack frees the prefetch; a delivery sent after
    # the close-ok (py-amqp forgets the channel at close-ok) was `KeyError: 1` in drain_events
    ch = conn.channel()
    other = conn.channel()
    q = unique_name("pyamqp")
    ch.queue_declare(q, auto_delete=False)
    for body in (b"one", b"two", b"three"):
        ch.basic_publish(amqp.Message(body), routing_key=q)
    ch.basic_qos(0, 1, False)
    got = []
    ch.basic_consume(q, callback=got.append)
    while not got:
        conn.drain_events(timeout=10)
    transport, held = conn.transport, []
    transport._write = lambda data: held.append(bytes(data))      # the ack waits...
    ch.basic_ack(got[0].delivery_tag)
    transport._write = lambda data: transport.sock.sendall(b"".join(held) + bytes(data))
    try:
        ch.close()                                                   # ...and leaves with the close
    finally:
        transport._write = transport.sock.sendall
    assert other.queue_declare(q, passive=True).message_count == 2     # read on: nothing for channel 1
    other.queue_delete(q)
