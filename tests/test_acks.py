"""ACK-1..7: delivery tags, ack/nack/reject, requeue, redelivery."""
import pytest
from pamqp import commands as spec
from pika.exceptions import ChannelClosedByBroker

from tests.conftest import message_count, pika_conn, raw_socket, unique_name, wait_until


@pytest.fixture
def ch(conn):
    return conn.channel()     # no confirm mode here, unlike conftest's


def fill(node, n, prefix="m", **declare):
    """A new queue holding ``n`` messages m0..m{n-1} (published with confirms)."""
    c = pika_conn(node)
    pch = c.channel()
    pch.confirm_delivery()
    q = unique_name("ackq")
    pch.queue_declare(q, **declare)
    for i in range(n):
        pch.basic_publish("", q, f"{prefix}{i}".encode())
    c.close()
    return q


def get(ch, q):
    m, _, body = ch.basic_get(q)
    assert m is not None, f"queue {q} unexpectedly empty"
    return m, body


def drain(ch, q):
    """(body, redelivered) of every ready message, auto-acked."""
    out = []
    while True:
        m, _, body = ch.basic_get(q, auto_ack=True)
        if m is None:
            return out
        out.append((body.decode(), m.redelivered))


def ready(ch, q, n, timeout=5):
    wait_until(lambda: message_count(ch, q) == n, timeout,
               message=f"queue {q} never had {n} ready messages (has {message_count(ch, q)})")


def assert_channel_error(ch, code, text):
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.exchange_declare("amq.direct", passive=True)  # sync round trip surfaces the close
    assert (ei.value.reply_code, ei.value.reply_text) == (code, text)


# ------------------------------------------------------------------ ACK-1 tags

def test_delivery_tags_start_at_1_and_grow_per_channel(node, conn):
    # ACK-1
    q = fill(node, 5)
    ch1, ch2 = conn.channel(), conn.channel()
    assert [get(ch1, q)[0].delivery_tag for _ in range(3)] == [1, 2, 3]
    assert [get(ch2, q)[0].delivery_tag for _ in range(2)] == [1, 2]


def test_get_and_deliver_share_one_tag_sequence(node, conn, ch):
    # ACK-1
    q = fill(node, 4, auto_delete=True)
    assert get(ch, q)[0].delivery_tag == 1
    tags = []
    ch.basic_consume(q, lambda c, m, p, b: tags.append(m.delivery_tag))
    wait_until(lambda: conn.process_data_events(0.05) or len(tags) == 3, 5)
    assert tags == [2, 3, 4]


def test_tags_keep_growing_after_acks_and_requeues(node, ch):
    # ACK-1
    q = fill(node, 2, exclusive=False)
    m1, _ = get(ch, q)
    ch.basic_nack(m1.delivery_tag, requeue=True)
    m2, _ = get(ch, q)
    ch.basic_ack(m2.delivery_tag)
    m3, _ = get(ch, q)
    assert (m1.delivery_tag, m2.delivery_tag, m3.delivery_tag) == (1, 2, 3)


# ------------------------------------------------------------------ ACK-2 auto-ack

def test_autoack_consumer_messages_never_requeued(node, conn):
    # ACK-2
    q = fill(node, 5)
    ch = conn.channel()
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(b), auto_ack=True)
    wait_until(lambda: conn.process_data_events(0.05) or len(got) == 5, 5)
    ch.close()
    conn.close()
    other = pika_conn(node).channel()
    assert message_count(other, q) == 0
    assert drain(other, q) == []


def test_autoack_get_not_requeued_on_close(node):
    # ACK-2
    q = fill(node, 1)
    c = pika_conn(node)
    m, _, _ = c.channel().basic_get(q, auto_ack=True)
    assert m is not None
    c.close()
    assert message_count(pika_conn(node).channel(), q) == 0


def test_acking_an_autoacked_tag_is_unknown_406(node, ch):
    # ACK-2, ACK-5
    q = fill(node, 1)
    m, _, _ = ch.basic_get(q, auto_ack=True)
    ch.basic_ack(m.delivery_tag)
    assert_channel_error(ch, 406, "PRECONDITION_FAILED - unknown delivery tag 1")


# ------------------------------------------------------------------ ACK-3 ack / nack / reject

def test_ack_removes_message(node, conn, ch):
    # ACK-3
    q = fill(node, 2)
    m, body = get(ch, q)
    ch.basic_ack(m.delivery_tag)
    ch.close()
    assert drain(conn.channel(), q) == [("m1", False)]


def test_ack_multiple_covers_all_up_to_tag(node, conn, ch):
    # ACK-3
    q = fill(node, 5)
    for _ in range(5):
        get(ch, q)
    ch.basic_ack(3, multiple=True)
    ch.close()  # 4 and 5 were not acked: requeued
    assert drain(conn.channel(), q) == [("m3", True), ("m4", True)]


def test_ack_tag_0_multiple_acks_everything(node, conn, ch):
    # ACK-3
    q = fill(node, 4)
    for _ in range(4):
        get(ch, q)
    ch.basic_ack(0, multiple=True)
    ch.close()
    assert drain(conn.channel(), q) == []


def test_ack_tag_0_multiple_with_nothing_outstanding_is_ok(ch):
    # ACK-3
    ch.basic_ack(0, multiple=True)
    ch.exchange_declare("amq.direct", passive=True)
    assert ch.is_open


def test_ack_tag_0_without_multiple_406(ch):
    # ACK-3, ACK-5
    ch.basic_ack(0, multiple=False)
    assert_channel_error(ch, 406, "PRECONDITION_FAILED - unknown delivery tag 0")


def test_nack_multiple_requeue_false_discards(node, conn, ch):
    # ACK-3, ACK-4
    q = fill(node, 4)
    for _ in range(4):
        get(ch, q)
    ch.basic_nack(2, multiple=True, requeue=False)
    ch.close()
    assert drain(conn.channel(), q) == [("m2", True), ("m3", True)]


def test_nack_tag_0_multiple_requeues_everything(node, ch):
    # ACK-3, ACK-4
    q = fill(node, 3)
    for _ in range(3):
        get(ch, q)
    ch.basic_nack(0, multiple=True, requeue=True)
    assert drain(ch, q) == [("m0", True), ("m1", True), ("m2", True)]


def test_reject_requeue_false_discards(node, ch):
    # ACK-3, ACK-4
    q = fill(node, 2)
    m, _ = get(ch, q)
    ch.basic_reject(m.delivery_tag, requeue=False)
    assert drain(ch, q) == [("m1", False)]


# ------------------------------------------------------------------ ACK-4 requeue position

def test_requeue_true_redelivered_flag(node, ch):
    # ACK-4
    q = fill(node, 1)
    m, body = get(ch, q)
    assert m.redelivered is False
    ch.basic_reject(m.delivery_tag, requeue=True)
    m2, _, body2 = ch.basic_get(q)
    assert (m2.redelivered, body2, m2.delivery_tag) == (True, body, 2)


def test_requeue_puts_messages_back_at_original_position(node, ch):
    # ACK-4: m0..m4 queued; take m0..m2; requeue m1 then m0 (reverse order):
    # they go back in their original order, ahead of m3, m4
    q = fill(node, 5)
    tags = [get(ch, q)[0].delivery_tag for _ in range(3)]
    ch.basic_reject(tags[1], requeue=True)
    ch.basic_reject(tags[0], requeue=True)
    assert drain(ch, q) == [("m0", True), ("m1", True), ("m3", False), ("m4", False)]
    ch.basic_ack(tags[2])


def test_requeue_false_dead_letters_when_queue_has_dlx(node, ch):
    # ACK-4
    dlx, dlq = unique_name("dlx"), unique_name("dlq")
    ch.exchange_declare(dlx, "fanout", auto_delete=True)
    ch.queue_declare(dlq, exclusive=True)
    ch.queue_bind(dlq, dlx)
    q = fill(node, 1, arguments={"x-dead-letter-exchange": dlx})
    m, _ = get(ch, q)
    ch.basic_reject(m.delivery_tag, requeue=False)
    ready(ch, dlq, 1)
    m2, props, body = ch.basic_get(dlq, auto_ack=True)
    assert body == b"m0"
    death = props.headers["x-death"][0]
    assert (death["reason"], death["queue"], death["count"]) == ("rejected", q, 1)
    assert message_count(ch, q) == 0


# ------------------------------------------------------------------ ACK-5 bad tags

def test_double_ack_406_unknown_delivery_tag(node, ch):
    # ACK-5
    q = fill(node, 1)
    m, _ = get(ch, q)
    ch.basic_ack(m.delivery_tag)
    ch.basic_ack(m.delivery_tag)
    assert_channel_error(ch, 406, "PRECONDITION_FAILED - unknown delivery tag 1")


def test_ack_unknown_tag_406(node, ch):
    # ACK-5
    q = fill(node, 1)
    get(ch, q)
    ch.basic_ack(42)
    assert_channel_error(ch, 406, "PRECONDITION_FAILED - unknown delivery tag 42")


def test_ack_multiple_beyond_last_tag_406(node, ch):
    # ACK-5
    q = fill(node, 2)
    get(ch, q)
    get(ch, q)
    ch.basic_ack(5, multiple=True)
    assert_channel_error(ch, 406, "PRECONDITION_FAILED - unknown delivery tag 5")


@pytest.mark.parametrize("how", ["ack", "nack", "reject"])
def test_settle_tag_from_another_channel_406(node, conn, how):
    # ACK-5
    q = fill(node, 1)
    ch1, ch2 = conn.channel(), conn.channel()
    m, _ = get(ch1, q)
    if how == "ack":
        ch2.basic_ack(m.delivery_tag)
    elif how == "nack":
        ch2.basic_nack(m.delivery_tag)
    else:
        ch2.basic_reject(m.delivery_tag)
    assert_channel_error(ch2, 406, "PRECONDITION_FAILED - unknown delivery tag 1")
    assert ch1.is_open
    ch1.basic_ack(m.delivery_tag)  # still valid on its own channel
    ch1.close()
    assert message_count(conn.channel(), q) == 0


def test_reject_after_ack_406(node, ch):
    # ACK-5
    q = fill(node, 1)
    m, _ = get(ch, q)
    ch.basic_ack(m.delivery_tag)
    ch.basic_reject(m.delivery_tag)
    assert_channel_error(ch, 406, "PRECONDITION_FAILED - unknown delivery tag 1")


def test_bad_ack_closes_channel_and_requeues_its_unacked(node, conn, ch):
    # ACK-5, ACK-6
    q = fill(node, 2)
    get(ch, q)
    get(ch, q)
    ch.basic_ack(9)
    with pytest.raises(ChannelClosedByBroker):
        ch.exchange_declare("amq.direct", passive=True)
    assert drain(conn.channel(), q) == [("m0", True), ("m1", True)]


# ------------------------------------------------------------------ ACK-6 requeue on close

def test_unacked_requeued_on_channel_close(node, conn, ch):
    # ACK-6
    q = fill(node, 2)
    get(ch, q)
    get(ch, q)
    ch.close()
    assert drain(conn.channel(), q) == [("m0", True), ("m1", True)]


def test_unacked_requeued_on_connection_close(node):
    # ACK-6
    q = fill(node, 3)
    c = pika_conn(node)
    ch = c.channel()
    got = []
    ch.basic_consume(q, lambda cc, m, p, b: got.append(b))
    wait_until(lambda: c.process_data_events(0.05) or len(got) == 3, 5)
    c.close()
    other = pika_conn(node).channel()
    ready(other, q, 3)
    assert drain(other, q) == [("m0", True), ("m1", True), ("m2", True)]


def test_unacked_requeued_on_tcp_drop(node):
    # ACK-6
    q = fill(node, 2)
    c = raw_socket(node)
    c.open_channel(1)
    c.send_frame(spec.Basic.Get(queue=q), 1)
    ok = c.expect(spec.Basic.GetOk, 1)
    assert ok.delivery_tag == 1
    c.read_message()
    c.abort()  # RST, no connection.close
    ch = pika_conn(node).channel()
    ready(ch, q, 2)
    assert drain(ch, q) == [("m0", True), ("m1", False)]


def test_unacked_requeued_after_channel_error(node, conn, ch):
    # ACK-6
    q = fill(node, 1)
    get(ch, q)
    with pytest.raises(ChannelClosedByBroker):
        ch.queue_declare(unique_name("missing"), passive=True)
    other = conn.channel()
    ready(other, q, 1)
    assert drain(other, q) == [("m0", True)]


def test_redelivered_to_another_consumer_after_close(node):
    # ACK-6
    q = fill(node, 1, auto_delete=False)
    c1 = pika_conn(node)
    ch1 = c1.channel()
    m, _ = get(ch1, q)
    c2 = pika_conn(node)
    ch2 = c2.channel()
    got = []
    ch2.basic_consume(q, lambda c, m, p, b: got.append((m.redelivered, b)))
    c2.process_data_events(0.2)
    assert got == []
    c1.close()
    wait_until(lambda: c2.process_data_events(0.05) or got, 5)
    assert got == [(True, b"m0")]
    ch2.queue_delete(q)


# ------------------------------------------------------------------ ACK-7 recover

def test_basic_recover_requeue_true_requeues_all_unacked(node, ch):
    # ACK-7
    q = fill(node, 3)
    get(ch, q)
    get(ch, q)
    ch.basic_recover(requeue=True)
    ready(ch, q, 3)
    assert drain(ch, q) == [("m0", True), ("m1", True), ("m2", False)]


def test_basic_recover_redelivers_to_consumer(node, conn, ch):
    # ACK-7
    q = fill(node, 2)
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append((m.delivery_tag, m.redelivered, b)))
    wait_until(lambda: conn.process_data_events(0.05) or len(got) == 2, 5)
    ch.basic_recover(requeue=True)
    wait_until(lambda: conn.process_data_events(0.05) or len(got) == 4, 5)
    assert got == [(1, False, b"m0"), (2, False, b"m1"), (3, True, b"m0"), (4, True, b"m1")]
    ch.basic_ack(1)  # old tags are gone after recover
    assert_channel_error(ch, 406, "PRECONDITION_FAILED - unknown delivery tag 1")
