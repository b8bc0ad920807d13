"""Consumer timeouts (RabbitMQ 3.10-3.12's consumer_timeout, x-consumer-timeout, the
consumer-timeout policy key): a delivery left unacked past its timeout closes its channel with
406 PRECONDITION_FAILED, the connection stays, and what the channel held is redelivered to
another consumer. On a cluster the check is the consumer's node's, for a queue mastered elsewhere."""
from __future__ import annotations

import json
import re
import time

import pika
import pika.exceptions
import pytest

from tests.clusters import ctl
from tests.conftest import IS_REF, Node, pika_conn, unique_name, wait_until

pytestmark = pytest.mark.skipif(IS_REF, reason="sets the node's consumer timeout")

TEXT = re.compile(r"PRECONDITION_FAILED - delivery acknowledgement on channel (\d+) timed out\. "
                  r"Timeout value used: (\d+) ms\. This timeout value can be configured, "
                  r"see consumers doc guide to learn more")


@pytest.fixture
def timeout_node(tmp_path):
    """A node whose consumer timeout is 1.5 s."""
    n = Node("hare-timeout", tmp_path)
    n.env["HAREMQ_CONSUMER_TIMEOUT"] = "1500"
    yield n.start()
    n.kill9()


def _consume_without_acks(ch, queue: str, want: int) -> list:
    got = []
    ch.basic_qos(prefetch_count=100)
    ch.basic_consume(queue, lambda _c, method, _p, body: got.append((method.delivery_tag, body)))
    deadline = time.monotonic() + 10
    while len(got) < want and time.monotonic() < deadline:
        ch.connection.process_data_events(time_limit=0.1)
    assert len(got) == want
    return got


def _closed_by_timeout(ch, within: float) -> pika.exceptions.ChannelClosedByBroker:
    """Let the connection run until the broker closes `ch`; the close (pika keeps it as the
    channel's closing reason when it comes while consuming)."""
    deadline = time.monotonic() + within
    try:
        while time.monotonic() < deadline and ch.is_open:
            ch.connection.process_data_events(time_limit=0.1)
        if ch.is_open:
            ch.basic_qos(prefetch_count=1)    # a close that came in the meantime is raised here
    except pika.exceptions.ChannelClosedByBroker as closed:
        return closed
    reason = getattr(ch, "_closing_reason", None)
    assert isinstance(reason, pika.exceptions.ChannelClosedByBroker), f"open after {within} s ({reason!r})"
    return reason


def _drain(node, queue: str, want: int, timeout: float = 10.0) -> list:
    ch = pika_conn(node).channel()
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            time.sleep(0.05)
            continue
        got.append((body, method.redelivered))
    return got


def test_a_consumer_that_never_acks_is_closed_with_406_and_its_deliveries_go_to_another(timeout_node):
    queue = unique_name("ct")
    conn = pika_conn(timeout_node)
    ch = conn.channel()
    ch.queue_declare(queue, durable=True)
    for i in range(3):
        ch.basic_publish("", queue, f"m{i}".encode(), pika.BasicProperties(delivery_mode=2))
    _consume_without_acks(ch, queue, 3)
    closed = _closed_by_timeout(ch, within=6.0)
    assert closed.reply_code == 406
    match = TEXT.fullmatch(closed.reply_text)
    assert match and match.group(1) == str(ch.channel_number) and match.group(2) == "1500", closed.reply_text
    assert conn.is_open                               # a channel error: the connection stays
    other = conn.channel()
    other.queue_declare(queue, passive=True)
    assert sorted(_drain(timeout_node, queue, 3)) == [(b"m0", True), (b"m1", True), (b"m2", True)]


def test_a_consumer_that_acks_in_time_keeps_its_channel_and_a_get_counts_too(timeout_node):
    queue = unique_name("ct.ok")
    ch = pika_conn(timeout_node).channel()
    ch.queue_declare(queue)
    for i in range(6):
        ch.basic_publish("", queue, f"m{i}".encode())
    ch.basic_qos(prefetch_count=1)
    got = []
    ch.basic_consume(queue, lambda c, method, _p, body: (got.append(body), c.basic_ack(method.delivery_tag)))
    deadline = time.monotonic() + 3.0                 # twice the timeout, every delivery acked at once
    while time.monotonic() < deadline:
        ch.connection.process_data_events(time_limit=0.1)
    assert ch.is_open and len(got) == 6
    gotten = unique_name("ct.get")
    getter = pika_conn(timeout_node).channel()
    getter.queue_declare(gotten)
    getter.basic_publish("", gotten, b"got")
    wait_until(lambda: getter.basic_get(gotten)[0] is not None, timeout=5)   # held, never acked
    closed = _closed_by_timeout(getter, within=6.0)
    assert closed.reply_code == 406 and TEXT.fullmatch(closed.reply_text)
    assert _drain(timeout_node, gotten, 1) == [(b"got", True)]


def test_the_queue_argument_sets_the_timeout_and_zero_is_none(fresh_node):
    """On a node with the default (30 minutes): x-consumer-timeout 1000 closes in seconds, a
    queue without it does not; a value that is not a whole number >= 0 is refused (406)."""
    quick, slow = unique_name("ct.quick"), unique_name("ct.slow")
    conn = pika_conn(fresh_node)
    ch = conn.channel()
    ch.queue_declare(quick, arguments={"x-consumer-timeout": 1000})
    ch.queue_declare(slow)
    for queue in (quick, slow):
        ch.basic_publish("", queue, b"x")
    held_slow = conn.channel()
    _consume_without_acks(held_slow, slow, 1)
    _consume_without_acks(ch, quick, 1)
    closed = _closed_by_timeout(ch, within=6.0)
    assert closed.reply_code == 406 and TEXT.fullmatch(closed.reply_text).group(2) == "1000"
    conn.process_data_events(time_limit=1.0)
    assert held_slow.is_open                          # the node's 30 minutes for this one
    bad = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        bad.queue_declare(unique_name("ct.bad"), arguments={"x-consumer-timeout": "soon"})
    assert refused.value.reply_code == 406 and "x-consumer-timeout" in refused.value.reply_text


@pytest.mark.cluster(failure_timeout=3.0)
def test_a_remote_consumer_times_out_on_its_own_node_by_policy(cluster):
    """The queue is mastered on hare1 with a consumer-timeout policy; the consumer on hare2 never
    acks: hare2 closes its channel, and a consumer on hare3 gets the deliveries again."""
    hare1, hare2, hare3 = cluster
    queue = unique_name("ct.remote")
    r = ctl(hare1, "set-policy", "ct", r"^ct\.remote", json.dumps({"consumer-timeout": 1000}), "--apply-to", "queues")
    assert r.returncode == 0, r.stderr
    ch = pika_conn(hare1).channel()
    ch.queue_declare(queue, durable=True)
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", queue, f"r{i}".encode(), pika.BasicProperties(delivery_mode=2))
    consumer = pika_conn(hare2).channel()
    wait_until(lambda: consumer.queue_declare(queue, passive=True) is not None, timeout=10)
    _consume_without_acks(consumer, queue, 3)
    closed = _closed_by_timeout(consumer, within=8.0)
    assert closed.reply_code == 406 and TEXT.fullmatch(closed.reply_text).group(2) == "1000"
    assert sorted(_drain(hare3, queue, 3)) == [(b"r0", True), (b"r1", True), (b"r2", True)]
