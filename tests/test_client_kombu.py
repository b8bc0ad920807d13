"""kombu (over py-amqp) against the broker: it found that queue.delete must answer delete-ok
before it cancels the channel's own consumers, or ConsumerCancelled escapes from queue_delete."""
from __future__ import annotations

import amqp
import kombu
import pytest

from tests.conftest import unique_name


@pytest.fixture(scope="module")
def node(node_or_cluster_member):
    """A single node, then a three-node cluster's member that is not the metadata leader."""
    return node_or_cluster_member


@pytest.fixture
def conn(node):
    with kombu.Connection(node.url, connect_timeout=10, heartbeat=0) as c:
        c.ensure_connection(max_retries=1)
        yield c


def test_round_trip(conn):
    q = kombu.Queue(unique_name("kombu"), exchange=kombu.Exchange("amq.direct", passive=True),
                    routing_key=unique_name("k"), exclusive=True)
    with conn.SimpleQueue(q) as sq:
        sq.put({"hello": "world"}, serializer="json")
        msg = sq.get(timeout=10)
        msg.ack()
        assert msg.payload == {"hello": "world"}


def test_publisher_confirms(node):
    # confirm_publish: kombu puts the channel in confirm mode and waits for each basic.ack
    with kombu.Connection(node.url, transport_options={"confirm_publish": True}) as c:
        ch = c.channel()
        q = kombu.Queue(unique_name("kombu"), exclusive=True, channel=ch)
        q.declare()
        producer = kombu.Producer(ch)
        for i in range(20):
            producer.publish({"i": i}, routing_key=q.name, serializer="json")
        assert ch._confirm_selected     # py-amqp's flag: the publishes went with confirms
        assert q.queue_declare(passive=True).message_count == 20


def test_consumer_cancel_notification(node, conn):
    q = kombu.Queue(unique_name("kombu"), auto_delete=False)
    with conn.channel() as ch:
        q(ch).declare()
        with kombu.Consumer(ch, [q], callbacks=[lambda body, m: None]):
            with kombu.Connection(node.url) as other:
                q(other.default_channel).delete()
            with pytest.raises(amqp.exceptions.ConsumerCancelled):
                conn.drain_events(timeout=10)


def test_refused_login(node):
    with kombu.Connection(node.url.replace("guest:guest@", "guest:wrong@"), connect_timeout=10) as bad:
        with pytest.raises(amqp.exceptions.AccessRefused):
            bad.ensure_connection(max_retries=1)


def test_message_larger_than_frame_max(conn):
    body = "L" * (3 * 131072 + 17)
    name = unique_name("kombu")
    with conn.SimpleQueue(kombu.Queue(name, routing_key=name, exclusive=True)) as sq:
        sq.put(body, serializer="json")
        msg = sq.get(timeout=10)
        msg.ack()
        assert msg.payload == body


def test_queue_deleted_under_own_consumer(conn):
    # the case: queue_delete on the channel that consumes returns delete-ok
    q = kombu.Queue(unique_name("kombu"), auto_delete=False)
    with conn.channel() as ch:
        bound = q(ch)
        bound.declare()
        kombu.Producer(ch).publish("x", routing_key=q.name)
        got = []
        with kombu.Consumer(ch, [bound], callbacks=[lambda body, m: (got.append(body), m.ack())]):
            conn.drain_events(timeout=10)
            assert got == ["x"]
            assert bound.delete() == 0
            with pytest.raises(amqp.exceptions.ConsumerCancelled):
                conn.drain_events(timeout=10)
