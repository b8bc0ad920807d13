"""Queues: naming, counts, purge/delete, exclusivity, auto-delete, consumers."""
import pika
import pytest
from pamqp import commands as spec
from pika.exceptions import ChannelClosedByBroker

from tests.conftest import message_count, pika_conn, raw_socket, unique_name, wait_until

REPLY_TO = "amq.rabbitmq.reply-to"


def queue_exists(conn, q):
    try:
        conn.channel().queue_declare(q, passive=True)
        return True
    except ChannelClosedByBroker as e:
        assert e.reply_code == 404, e
        return False


def publish_n(ch, q, n, prefix="m"):
    for i in range(n):
        ch.basic_publish("", q, f"{prefix}{i}".encode())


# ------------------------------------------------------------------ declare

def test_server_named_queue_is_amq_gen(ch):
    a = ch.queue_declare("", exclusive=True).method.queue
    b = ch.queue_declare("", exclusive=True).method.queue
    assert a.startswith("amq.gen-") and b.startswith("amq.gen-")
    assert a != b
    assert ch.queue_declare(a, passive=True).method.queue == a


def test_empty_queue_name_means_last_declared_on_channel(ch):
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind("", "amq.direct", routing_key=q)  # "" = the channel's last declared queue
    ch.basic_publish("amq.direct", q, b"via-default-name")
    m, _, body = ch.basic_get("", auto_ack=True)
    assert body == b"via-default-name"


def test_declare_ok_reports_ready_messages_and_consumers(conn, ch):
    q = unique_name("counts")
    ok = ch.queue_declare(q, auto_delete=True)
    assert (ok.method.queue, ok.method.message_count, ok.method.consumer_count) == (q, 0, 0)
    publish_n(ch, q, 3)
    ok = ch.queue_declare(q, passive=True)
    assert (ok.method.message_count, ok.method.consumer_count) == (3, 0)
    cch = conn.channel()
    cch.basic_qos(prefetch_count=1)
    got = []
    cch.basic_consume(q, lambda c, m, p, b: got.append(m.delivery_tag))
    wait_until(lambda: conn.process_data_events(0.05) or got, 5)
    # one message is unacked at the consumer: ready = 2, consumers = 1
    ok = ch.queue_declare(q, auto_delete=True)
    assert (ok.method.message_count, ok.method.consumer_count) == (2, 1)


def test_purge_returns_ready_count_and_empties(ch):
    q = unique_name("purge")
    ch.queue_declare(q, exclusive=True)
    publish_n(ch, q, 7)
    m, _, _ = ch.basic_get(q)  # one unacked: not purged
    ok = ch.queue_purge(q)
    assert ok.method.message_count == 6
    assert message_count(ch, q) == 0
    ch.basic_nack(m.delivery_tag, requeue=True)
    assert wait_until(lambda: message_count(ch, q) == 1, 5)


def test_delete_returns_message_count(ch):
    q = unique_name("del")
    ch.queue_declare(q)
    publish_n(ch, q, 4)
    assert ch.queue_delete(q).method.message_count == 4
    assert not queue_exists(ch.connection, q)


def test_delete_if_empty_406(conn, ch):
    # ERR-1
    q = unique_name("notempty")
    ch.queue_declare(q, auto_delete=False)
    publish_n(ch, q, 1)
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_delete(q, if_empty=True)
    assert (ei.value.reply_code, ei.value.reply_text) == (
        406, f"PRECONDITION_FAILED - queue '{q}' in vhost '/' not empty")
    ch2 = conn.channel()
    assert message_count(ch2, q) == 1
    ch2.queue_delete(q)


def test_delete_if_unused_406(conn, ch):
    # ERR-1
    q = unique_name("inuse")
    ch.queue_declare(q, auto_delete=False)
    conn.channel().basic_consume(q, lambda *a: None)
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_delete(q, if_unused=True)
    assert (ei.value.reply_code, ei.value.reply_text) == (
        406, f"PRECONDITION_FAILED - queue '{q}' in vhost '/' in use")
    conn.channel().queue_delete(q)


def test_delete_if_empty_and_if_unused_succeed_when_true(ch):
    q = unique_name("deletable")
    ch.queue_declare(q)
    assert ch.queue_delete(q, if_unused=True, if_empty=True).method.message_count == 0
    assert not queue_exists(ch.connection, q)


# ------------------------------------------------------------------ exclusive / auto-delete

def test_exclusive_queue_deleted_when_connection_closes(node):
    owner = pika_conn(node)
    q = unique_name("excl")
    owner.channel().queue_declare(q, exclusive=True)
    other = pika_conn(node)
    with pytest.raises(ChannelClosedByBroker) as ei:
        other.channel().queue_declare(q, passive=True)
    assert ei.value.reply_code == 405
    owner.close()
    wait_until(lambda: not queue_exists(other, q), 5,
               message="exclusive queue survived its connection")


def test_exclusive_queue_survives_channel_close(node):
    c = pika_conn(node)
    q = unique_name("excl-ch")
    ch = c.channel()
    ch.queue_declare(q, exclusive=True)
    ch.close()
    assert queue_exists(c, q)


def test_auto_delete_queue_deleted_after_last_consumer_cancels(conn, ch):
    q = unique_name("autodel")
    ch.queue_declare(q, auto_delete=True)
    assert queue_exists(conn, q)  # never had a consumer: stays
    c1, c2 = conn.channel(), conn.channel()
    t1 = c1.basic_consume(q, lambda *a: None)
    t2 = c2.basic_consume(q, lambda *a: None)
    c1.basic_cancel(t1)
    assert queue_exists(conn, q)  # one consumer left
    c2.basic_cancel(t2)
    wait_until(lambda: not queue_exists(conn, q), 5,
               message="auto-delete queue survived its last consumer")


def test_auto_delete_queue_deleted_when_consumer_channel_closes(conn, ch):
    q = unique_name("autodel-close")
    ch.queue_declare(q, auto_delete=True)
    c1 = conn.channel()
    c1.basic_consume(q, lambda *a: None)
    c1.close()
    wait_until(lambda: not queue_exists(conn, q), 5)


def test_server_cancels_consumer_when_queue_deleted(conn, ch):
    # consumer_cancel_notify: pika's on_cancel callback gets the broker's basic.cancel
    q = unique_name("cancelme")
    ch.queue_declare(q)
    cch = conn.channel()
    cancelled = []
    cch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = cch.basic_consume(q, lambda *a: None)
    conn.channel().queue_delete(q)
    wait_until(lambda: conn.process_data_events(0.05) or cancelled, 5,
               message="no basic.cancel from the broker")
    assert cancelled == [tag]
    assert cch.is_open


def test_server_cancel_frame_on_raw_socket(node):
    c = raw_socket(node)
    c.open_channel(1)
    q = unique_name("cancelraw")
    c.rpc(spec.Queue.Declare(queue=q), 1, spec.Queue.DeclareOk)
    c.rpc(spec.Basic.Consume(queue=q, consumer_tag="ct-raw"), 1, spec.Basic.ConsumeOk)
    pika_conn(node).channel().queue_delete(q)
    cancel = c.expect(spec.Basic.Cancel, 1)
    assert cancel.consumer_tag == "ct-raw"
    # the channel stays open
    c.rpc(spec.Basic.Qos(prefetch_count=1), 1, spec.Basic.QosOk)


# ------------------------------------------------------------------ get

def test_basic_get_ok_fields_and_get_empty(ch):
    q = unique_name("get")
    ch.queue_declare(q, exclusive=True)
    publish_n(ch, q, 2)
    m, props, body = ch.basic_get(q)
    assert (m.delivery_tag, m.redelivered, m.exchange, m.routing_key, m.message_count) == (
        1, False, "", q, 1)
    assert body == b"m0"
    m2, _, body2 = ch.basic_get(q, auto_ack=True)
    assert (m2.delivery_tag, m2.message_count, body2) == (2, 0, b"m1")
    assert ch.basic_get(q) == (None, None, None)  # get-empty
    ch.basic_ack(1)


def test_get_empty_raw_frame(node):
    c = raw_socket(node)
    c.open_channel(1)
    q = c.rpc(spec.Queue.Declare(queue="", exclusive=True), 1, spec.Queue.DeclareOk).queue
    c.send_frame(spec.Basic.Get(queue=q), 1)
    c.expect(spec.Basic.GetEmpty, 1)


def test_fifo_order(ch):
    q = unique_name("fifo")
    ch.queue_declare(q, exclusive=True)
    publish_n(ch, q, 100)
    got = [ch.basic_get(q, auto_ack=True)[2] for _ in range(100)]
    assert got == [f"m{i}".encode() for i in range(100)]


def test_properties_round_trip(ch):
    q = unique_name("props")
    ch.queue_declare(q, exclusive=True)
    ts = 1_700_000_000
    props = pika.BasicProperties(
        content_type="application/json", content_encoding="utf-8",
        headers={"s": "str", "i": 42, "neg": -7, "b": True, "l": [1, "two"],
                 "t": {"nested": "yes"}, "bin": b"\x00\xff"},
        delivery_mode=2, priority=3, correlation_id="corr", reply_to="rt",
        expiration="60000", message_id="mid", timestamp=ts, type="kind",
        user_id="guest", app_id="tests", cluster_id="")
    ch.basic_publish("", q, b'{"a":1}', properties=props)
    m, p, body = ch.basic_get(q, auto_ack=True)
    assert body == b'{"a":1}'
    for attr in ("content_type", "content_encoding", "delivery_mode", "priority",
                 "correlation_id", "reply_to", "expiration", "message_id", "timestamp", "type",
                 "user_id", "app_id"):
        assert getattr(p, attr) == getattr(props, attr), attr
    assert p.headers == props.headers


def test_user_id_must_match_authenticated_user_406(ch):
    # ERR-1
    q = unique_name("uid")
    ch.queue_declare(q, exclusive=True)
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.basic_publish("", q, b"x", properties=pika.BasicProperties(user_id="mallory"))
    assert (ei.value.reply_code, ei.value.reply_text) == (
        406, "PRECONDITION_FAILED - user_id property set to 'mallory' but authenticated "
             "user was 'guest'")


@pytest.mark.parametrize("size", [0, 1, 131072 - 8, 131072 - 7, 1_000_000])
def test_body_sizes_round_trip(ch, size):
    q = unique_name("size")
    ch.queue_declare(q, exclusive=True)
    body = bytes(i % 251 for i in range(size))
    ch.basic_publish("", q, body)
    m, _, got = ch.basic_get(q, auto_ack=True)
    assert got == body


# ------------------------------------------------------------------ consumers

def test_round_robin_between_two_consumers(node, ch):
    q = unique_name("rr")
    ch.queue_declare(q, exclusive=False, auto_delete=True)
    cons = pika_conn(node)
    got = []
    a, b = cons.channel(), cons.channel()
    a.basic_consume(q, lambda c, m, p, body: got.append(("a", body)), auto_ack=True)
    b.basic_consume(q, lambda c, m, p, body: got.append(("b", body)), auto_ack=True)
    cons.process_data_events(0.1)
    publish_n(ch, q, 10)
    wait_until(lambda: cons.process_data_events(0.05) or len(got) == 10, 10)
    # pika dispatches per channel, so order by message index, not arrival
    by_index = {int(body[1:]): w for w, body in got}
    assert sorted(by_index) == list(range(10))
    who = [by_index[i] for i in range(10)]
    assert who.count("a") == 5 and who.count("b") == 5
    assert all(who[i] != who[i + 1] for i in range(9)), f"not alternating: {who}"


def test_consumer_gets_messages_in_order_with_consume_ok_tag(node, ch):
    q = unique_name("order")
    ch.queue_declare(q, auto_delete=True)
    publish_n(ch, q, 20)
    cons = pika_conn(node)
    cch = cons.channel()
    got = []
    tag = cch.basic_consume(q, lambda c, m, p, b: got.append((m.consumer_tag, m.delivery_tag, b)),
                            auto_ack=True, consumer_tag="my-tag")
    assert tag == "my-tag"
    wait_until(lambda: cons.process_data_events(0.05) or len(got) == 20, 10)
    assert got == [("my-tag", i + 1, f"m{i}".encode()) for i in range(20)]


def test_direct_reply_to_rpc(node):
    # RPC with direct reply-to: no reply queue, the reply goes straight to the caller
    server_conn, client_conn = pika_conn(node), pika_conn(node)
    sch, cch = server_conn.channel(), client_conn.channel()
    rq = unique_name("rpc")
    sch.queue_declare(rq, auto_delete=True)
    replies = []
    cch.basic_consume(REPLY_TO, lambda c, m, p, b: replies.append((p.correlation_id, b)),
                      auto_ack=True)
    cch.basic_publish("", rq, b"2+2",
                      properties=pika.BasicProperties(reply_to=REPLY_TO, correlation_id="c-1"))
    method, props, body = wait_until(
        lambda: (r := sch.basic_get(rq, auto_ack=True))[0] is not None and r, 5)
    assert body == b"2+2"
    assert props.reply_to.startswith(REPLY_TO + "."), props.reply_to
    sch.basic_publish("", props.reply_to, b"4",
                      properties=pika.BasicProperties(correlation_id=props.correlation_id))
    wait_until(lambda: client_conn.process_data_events(0.05) or replies, 5,
               message="no reply through amq.rabbitmq.reply-to")
    assert replies == [("c-1", b"4")]


def test_direct_reply_to_consumer_must_be_no_ack_406(ch):
    # ERR-1
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=False)
    assert (ei.value.reply_code, ei.value.reply_text) == (
        406, "PRECONDITION_FAILED - reply consumer cannot acknowledge")


def test_direct_reply_to_publish_without_consumer_406(ch):
    # ERR-1
    q = unique_name("rpc-noconsumer")
    ch.queue_declare(q, exclusive=True)
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.basic_publish("", q, b"x", properties=pika.BasicProperties(reply_to=REPLY_TO))
    assert (ei.value.reply_code, ei.value.reply_text) == (
        406, "PRECONDITION_FAILED - fast reply consumer does not exist")
