"""pika (BlockingConnection) against the broker: the checks every client module makes."""
from __future__ import annotations

import pika
import pytest

from tests.conftest import pika_conn, unique_name


@pytest.fixture(scope="module")
def node(node_or_cluster_member):
    """A single node, then a three-node cluster's member that is not the metadata leader."""
    return node_or_cluster_member


def test_round_trip(node):
    ch = pika_conn(node).channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.basic_publish("", q, b"hello", pika.BasicProperties(content_type="text/plain", headers={"n": 1}))
    method, props, body = ch.basic_get(q, auto_ack=True)
    assert (body, props.content_type, props.headers["n"]) == (b"hello", "text/plain", 1)


def test_publisher_confirms(node):
    ch = pika_conn(node).channel()
    ch.confirm_delivery()
    q = ch.queue_declare("", exclusive=True).method.queue
    for i in range(20):
        ch.basic_publish("", q, b"%d" % i, mandatory=True)    # raises unless basic.ack
    assert ch.queue_declare(q, passive=True).method.message_count == 20


def test_consumer_cancel_notification(node):
    conn = pika_conn(node)
    ch = conn.channel()
    q = unique_name("pikacancel")
    ch.queue_declare(q, auto_delete=False)
    cancelled = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = ch.basic_consume(q, lambda *a: None)
    pika_conn(node).channel().queue_delete(q)
    while not cancelled:
        conn.process_data_events(time_limit=1)
    assert cancelled == [tag]


def test_refused_login(node):
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as ei:
        pika_conn(node, credentials=pika.PlainCredentials("guest", "wrong"))
    assert "ACCESS_REFUSED - Login was refused" in str(ei.value)


def test_message_larger_than_frame_max(node):
    ch = pika_conn(node).channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    body = b"L" * (3 * 131072 + 17)
    ch.basic_publish("", q, body)
    assert ch.basic_get(q, auto_ack=True)[2] == body


def test_queue_deleted_under_own_consumer(node):
    conn = pika_conn(node)
    ch = conn.channel()
    q = unique_name("pikadel")
    ch.queue_declare(q, auto_delete=False)
    cancelled = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = ch.basic_consume(q, lambda *a: None)
    assert ch.queue_delete(q).method.message_count == 0
    while not cancelled:
        conn.process_data_events(time_limit=1)
    assert cancelled == [tag]
    ch.queue_declare("", exclusive=True)   # the channel goes on
