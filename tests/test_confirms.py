"""CONF-1,2,3,5,7,8: publisher confirms and transactions.

Confirm sequence numbers and multiple flags are checked on raw frames.
"""
import pytest
from pamqp import commands as spec
from pika.exceptions import ChannelClosedByBroker, NackError, UnroutableError

from tests.conftest import message_count, pika_conn, raw_socket, unique_name, wait_until


class Confirms:
    """Tracks confirms on one channel: each sequence number exactly once (CONF-3)."""

    def __init__(self):
        self.next_seq = 1
        self.outstanding = set()
        self.acked, self.nacked = set(), set()
        self.frames = []

    def published(self, count=1):
        for _ in range(count):
            self.outstanding.add(self.next_seq)
            self.next_seq += 1

    def on_frame(self, frame):
        assert isinstance(frame, (spec.Basic.Ack, spec.Basic.Nack)), f"unexpected {frame!r}"
        self.frames.append(frame)
        tag = frame.delivery_tag
        assert tag in self.outstanding, (
            f"confirm for tag {tag} (multiple={frame.multiple}) that is not outstanding: "
            f"confirmed twice or never published")
        covered = {t for t in self.outstanding if t <= tag} if frame.multiple else {tag}
        self.outstanding -= covered
        (self.acked if isinstance(frame, spec.Basic.Ack) else self.nacked).update(covered)

    def wait_all(self, client, channel=1, timeout=30):
        while self.outstanding:
            ch, frame = client.recv_frame(timeout)
            assert ch == channel, f"frame {frame!r} on channel {ch}"
            self.on_frame(frame)


def confirm_channel(node, nowait=False):
    c = raw_socket(node)
    c.open_channel(1)
    if nowait:
        c.send_frame(spec.Confirm.Select(nowait=True), 1)
    else:
        c.rpc(spec.Confirm.Select(), 1, spec.Confirm.SelectOk)
    return c


def raw_queue(c, **kw):
    q = unique_name("cq")
    c.rpc(spec.Queue.Declare(queue=q, **kw), 1, spec.Queue.DeclareOk)
    return q


# ------------------------------------------------------------------ CONF-1 / CONF-2

def test_confirm_select_ok_then_first_ack_is_tag_1(node):
    # CONF-1, CONF-2
    c = confirm_channel(node)
    q = raw_queue(c, exclusive=True)
    c.publish(1, "", q, b"x")
    ack = c.expect(spec.Basic.Ack, 1)
    assert (ack.delivery_tag, ack.multiple) == (1, False)


def test_confirm_select_nowait_sends_no_select_ok(node):
    # CONF-1
    c = confirm_channel(node, nowait=True)
    c.publish(1, "amq.direct", "nowhere", b"x")
    _, frame = c.recv_frame(5)
    assert isinstance(frame, spec.Basic.Ack), f"expected basic.ack only, got {frame!r}"
    assert frame.delivery_tag == 1


def test_confirm_select_nowait_with_pika_style_flow(node):
    # CONF-1
    c = confirm_channel(node, nowait=True)
    q = raw_queue(c, exclusive=True)  # declare-ok arrives normally; no select-ok before it
    assert q
    c.publish(1, "", q, b"x")
    assert c.expect(spec.Basic.Ack, 1).delivery_tag == 1


def test_publishes_before_confirm_select_are_not_counted(node):
    # CONF-2
    c = raw_socket(node)
    c.open_channel(1)
    q = raw_queue(c, exclusive=True)
    c.publish(1, "", q, b"before-1")
    c.publish(1, "", q, b"before-2")
    c.rpc(spec.Confirm.Select(), 1, spec.Confirm.SelectOk)
    c.publish(1, "", q, b"after")
    assert c.expect(spec.Basic.Ack, 1).delivery_tag == 1


def test_second_confirm_select_does_not_reset_sequence(node):
    # CONF-2
    c = confirm_channel(node)
    q = raw_queue(c, exclusive=True)
    c.publish(1, "", q, b"1")
    assert c.expect(spec.Basic.Ack, 1).delivery_tag == 1
    c.rpc(spec.Confirm.Select(), 1, spec.Confirm.SelectOk)
    c.publish(1, "", q, b"2")
    assert c.expect(spec.Basic.Ack, 1).delivery_tag == 2


def test_sequence_is_per_channel(node):
    # CONF-2
    c = raw_socket(node)
    for chan in (1, 2):
        c.open_channel(chan)
        c.rpc(spec.Confirm.Select(), chan, spec.Confirm.SelectOk)
    c.publish(1, "amq.direct", "nowhere", b"a")
    c.publish(1, "amq.direct", "nowhere", b"b")
    c.publish(2, "amq.direct", "nowhere", b"c")
    got = {1: set(), 2: set()}
    while sum(map(len, got.values())) < 3:
        chan, frame = c.recv_frame(5)
        assert isinstance(frame, spec.Basic.Ack)
        top = frame.delivery_tag
        got[chan].update(range(1, top + 1) if frame.multiple else {top})
    assert got == {1: {1, 2}, 2: {1}}


# ------------------------------------------------------------------ CONF-3 / CONF-7

def test_every_publish_confirmed_exactly_once(node):
    # CONF-2, CONF-3, CONF-7
    c = confirm_channel(node)
    q = raw_queue(c, exclusive=True)
    tracker = Confirms()
    n = 1000
    batch = b"".join(
        c.publish_bytes(1, "", q if i % 10 else unique_name("nowhere"), b"%d" % i)
        for i in range(n))  # every 10th is unroutable: confirmed too
    c.send_bytes(batch)
    tracker.published(n)
    tracker.wait_all(c)
    assert tracker.acked == set(range(1, n + 1)) and tracker.nacked == set()
    c.send_frame(spec.Queue.Declare(queue=q, passive=True), 1)
    assert c.expect(spec.Queue.DeclareOk, 1).message_count == n - n // 10


def test_confirms_with_pika_many_publishes(node):
    # CONF-3
    ch = pika_conn(node).channel()
    ch.confirm_delivery()
    q = unique_name("pk")
    ch.queue_declare(q, exclusive=True)
    for i in range(200):
        ch.basic_publish("", q, str(i).encode())  # raises on nack/return
    assert message_count(ch, q) == 200


def test_publish_routed_to_several_queues_confirmed_once(node):
    # CONF-3
    c = confirm_channel(node)
    qs = [raw_queue(c, exclusive=True) for _ in range(3)]
    for q in qs:
        c.rpc(spec.Queue.Bind(queue=q, exchange="amq.fanout"), 1, spec.Queue.BindOk)
    tracker = Confirms()
    c.publish(1, "amq.fanout", "", b"x")
    tracker.published()
    tracker.wait_all(c)
    assert tracker.acked == {1}
    c.publish(1, "amq.direct", "nowhere", b"y")  # next ack must be for 2, not another 1
    assert c.expect(spec.Basic.Ack, 1).delivery_tag == 2


# ------------------------------------------------------------------ CONF-4 unroutable

def test_unroutable_publish_is_confirmed(node):
    # CONF-4
    c = confirm_channel(node)
    c.publish(1, "amq.direct", unique_name("nowhere"), b"x")
    ack = c.expect(spec.Basic.Ack, 1)
    assert (ack.delivery_tag, ack.multiple) == (1, False)


def test_mandatory_unroutable_return_arrives_before_ack(node):
    c = confirm_channel(node)
    key = unique_name("nowhere")
    c.publish(1, "amq.direct", key, b"bounce", mandatory=True,
              properties=spec.Basic.Properties(message_id="mid-1"))
    ret = c.expect(spec.Basic.Return, 1)
    assert (ret.reply_code, ret.reply_text, ret.exchange, ret.routing_key) == (
        312, "NO_ROUTE", "amq.direct", key)
    hdr, body = c.read_message()
    assert body == b"bounce" and hdr.properties.message_id == "mid-1"
    ack = c.expect(spec.Basic.Ack, 1)
    assert (ack.delivery_tag, ack.multiple) == (1, False)


def test_mandatory_routable_no_return(node):
    # PUB-2
    c = confirm_channel(node)
    q = raw_queue(c, exclusive=True)
    c.publish(1, "", q, b"ok", mandatory=True)
    assert c.expect(spec.Basic.Ack, 1).delivery_tag == 1


def test_pika_mandatory_unroutable_raises_unroutable(node):
    # PUB-2
    ch = pika_conn(node).channel()
    ch.confirm_delivery()
    with pytest.raises(UnroutableError) as ei:
        ch.basic_publish("amq.direct", unique_name("nowhere"), b"x", mandatory=True)
    assert ei.value.messages[0].method.reply_code == 312


# ------------------------------------------------------------------ CONF-5 nack

def test_reject_publish_overflow_nacks(node):
    # CONF-5: a full queue with x-overflow=reject-publish nacks the publish
    c = confirm_channel(node)
    q = raw_queue(c, exclusive=True,
                  arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    tracker = Confirms()
    c.publish(1, "", q, b"first")
    c.publish(1, "", q, b"second")
    tracker.published(2)
    tracker.wait_all(c)
    assert (tracker.acked, tracker.nacked) == ({1}, {2})
    c.send_frame(spec.Queue.Declare(queue=q, passive=True), 1)
    assert c.expect(spec.Queue.DeclareOk, 1).message_count == 1
    # room again after the first message is consumed
    c.send_frame(spec.Basic.Get(queue=q, no_ack=True), 1)
    c.expect(spec.Basic.GetOk, 1)
    assert c.read_message()[1] == b"first"
    c.publish(1, "", q, b"third")
    ack = c.expect(spec.Basic.Ack, 1)
    assert (ack.delivery_tag, ack.multiple) == (3, False)


def test_reject_publish_overflow_with_pika_raises_nack(node):
    # CONF-5
    ch = pika_conn(node).channel()
    ch.confirm_delivery()
    q = unique_name("full")
    ch.queue_declare(q, exclusive=True,
                     arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.basic_publish("", q, b"1")
    with pytest.raises(NackError):
        ch.basic_publish("", q, b"2")
    assert message_count(ch, q) == 1


def test_drop_head_overflow_acks_and_keeps_newest(node):
    # CONF-5 (drop-head is not a nack case)
    c = confirm_channel(node)
    q = raw_queue(c, exclusive=True, arguments={"x-max-length": 1})
    tracker = Confirms()
    for b in (b"old", b"new"):
        c.publish(1, "", q, b)
    tracker.published(2)
    tracker.wait_all(c)
    assert (tracker.acked, tracker.nacked) == ({1, 2}, set())
    c.send_frame(spec.Basic.Get(queue=q, no_ack=True), 1)
    assert c.expect(spec.Basic.GetOk, 1).message_count == 0
    assert c.read_message()[1] == b"new"


# ------------------------------------------------------------------ CONF-8 transactions

@pytest.fixture
def tx(node):
    conn = pika_conn(node)
    ch = conn.channel()
    q = unique_name("txq")
    ch.queue_declare(q)
    ch.tx_select()
    observer = conn.channel()
    yield ch, observer, q
    if observer.is_open:
        observer.queue_delete(q)


def put(observer, q, body):
    """Publish outside the transaction and wait until the message is ready."""
    observer.basic_publish("", q, body)
    wait_until(lambda: message_count(observer, q) >= 1, 5)


def test_tx_publishes_invisible_until_commit(tx):
    # CONF-8
    ch, observer, q = tx
    ch.basic_publish("", q, b"a")
    ch.basic_publish("", q, b"b")
    assert message_count(observer, q) == 0
    ch.tx_commit()
    assert message_count(observer, q) == 2


def test_tx_rollback_discards_publishes(tx):
    # CONF-8
    ch, observer, q = tx
    ch.basic_publish("", q, b"a")
    ch.tx_rollback()
    assert message_count(observer, q) == 0
    ch.basic_publish("", q, b"b")  # channel stays transactional
    ch.tx_commit()
    assert message_count(observer, q) == 1
    assert observer.basic_get(q, auto_ack=True)[2] == b"b"


def test_tx_ack_only_takes_effect_at_commit(tx):
    # CONF-8
    ch, observer, q = tx
    put(observer, q, b"m")
    m, _, _ = ch.basic_get(q)
    ch.basic_ack(m.delivery_tag)
    ch.tx_commit()
    ch.close()
    assert message_count(observer, q) == 0


def test_tx_rolled_back_ack_does_not_ack(tx):
    # CONF-8
    ch, observer, q = tx
    put(observer, q, b"m")
    m, _, _ = ch.basic_get(q)
    ch.basic_ack(m.delivery_tag)
    ch.tx_rollback()
    ch.close()  # the message is still unacked: requeued
    wait_until(lambda: message_count(observer, q) == 1, 5,
               message="ack inside a rolled-back transaction was applied")
    m2, _, body = observer.basic_get(q, auto_ack=True)
    assert (body, m2.redelivered) == (b"m", True)


def test_tx_ack_after_rollback_can_be_committed(tx):
    # CONF-8
    ch, observer, q = tx
    put(observer, q, b"m")
    m, _, _ = ch.basic_get(q)
    ch.basic_ack(m.delivery_tag)
    ch.tx_rollback()
    ch.basic_ack(m.delivery_tag)  # the tag is still valid after rollback
    ch.tx_commit()
    ch.close()
    assert message_count(observer, q) == 0


def test_tx_reject_requeue_at_commit(tx):
    # CONF-8
    ch, observer, q = tx
    put(observer, q, b"m")
    m, _, _ = ch.basic_get(q)
    ch.basic_reject(m.delivery_tag, requeue=True)
    assert message_count(observer, q) == 0  # not requeued before commit
    ch.tx_commit()
    wait_until(lambda: message_count(observer, q) == 1, 5)


def test_tx_several_commits_on_one_channel(tx):
    # CONF-8
    ch, observer, q = tx
    for i in range(3):
        ch.basic_publish("", q, str(i).encode())
        ch.tx_commit()
        assert message_count(observer, q) == i + 1


def test_tx_select_twice_is_ok(tx):
    # CONF-8
    ch, observer, q = tx
    ch.tx_select()
    ch.basic_publish("", q, b"x")
    ch.tx_commit()
    assert message_count(observer, q) == 1


def test_tx_commit_a_queue_refused_fails_the_commit(conn):
    """A publish of the transaction refused by its queue (x-overflow reject-publish): as
    RabbitMQ does, the commit is not answered commit-ok but fails the channel with
    406 PRECONDITION_FAILED - partial tx completion (RabbitMQ's rabbit_channel complete_tx)."""
    ch = conn.channel()
    q = unique_name("txfull")
    ch.queue_declare(q, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    ch.tx_select()
    ch.basic_publish("", q, b"fits")
    ch.basic_publish("", q, b"refused")
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.tx_commit()
    assert ei.value.reply_code == 406 and ei.value.reply_text == "PRECONDITION_FAILED - partial tx completion"
    observer = conn.channel()
    assert message_count(observer, q) == 1       # what the queue took stays: RabbitMQ's tx is not atomic
    observer.queue_delete(q)
