"""Queue features (PUB-4): message TTL and per-message expiration, x-expires,
priority queues, single active consumer, consumer priorities, delivery limit,
dead-letter cycles, RabbitMQ's argument checks, and policies.

Expected behaviour and error texts were checked against RabbitMQ 3.10
(HAREMQ_TEST_REF_PORT); the delivery-limit test is HareMQ's own (RabbitMQ
supports x-delivery-limit on quorum queues only).
"""
import time

import pika
import pytest
from pamqp import commands as spec
from pika.exceptions import ChannelClosedByBroker

from tests.conftest import (IS_REF, message_count, needs_process, pika_conn, raw_socket, unique_name,
                            wait_until)


def props(**kw):
    return pika.BasicProperties(**kw)


def drain_get(ch, q):
    out = []
    while True:
        m, p, b = ch.basic_get(q, auto_ack=True)
        if m is None:
            return out
        out.append(b)


def get_eventually(ch, q, auto_ack=False):
    """basic.get until a message comes (dead-lettering is asynchronous in RabbitMQ)."""
    def attempt():
        m, p, b = ch.basic_get(q, auto_ack=auto_ack)
        return (m, p, b) if m is not None else None
    return wait_until(attempt, 5)


def collect(conn, got, n, timeout=5.0):
    wait_until(lambda: conn.process_data_events(0.05) or len(got) >= n, timeout,
               message=f"wanted {n} deliveries, got {len(got)}: {got!r}")


# ------------------------------------------------------------------ message TTL

def test_message_ttl_drops_messages_without_consumers(ch):
    q = unique_name("ttl")
    ch.queue_declare(q, exclusive=True, arguments={"x-message-ttl": 150})
    for i in range(5):
        ch.basic_publish("", q, f"m{i}".encode())
    assert message_count(ch, q) == 5
    wait_until(lambda: message_count(ch, q) == 0, 5, message="messages outlived x-message-ttl")


def test_per_message_expiration_on_a_plain_queue(ch):
    q = unique_name("exp")
    ch.queue_declare(q, exclusive=True)
    ch.basic_publish("", q, b"short", properties=props(expiration="100"))
    wait_until(lambda: message_count(ch, q) == 0, 5, message="message outlived its expiration")
    ch.basic_publish("", q, b"keep")
    time.sleep(0.2)
    assert drain_get(ch, q) == [b"keep"]


def test_shorter_of_queue_ttl_and_expiration_applies(ch):
    q = unique_name("ttlmin")
    ch.queue_declare(q, exclusive=True, arguments={"x-message-ttl": 60000})
    ch.basic_publish("", q, b"short", properties=props(expiration="100"))
    wait_until(lambda: message_count(ch, q) == 0, 5, message="expiration shorter than the queue TTL ignored")


def test_expiry_only_at_the_head(ch):
    # RabbitMQ expires per-message TTLs only when the message reaches the head
    q = unique_name("head")
    ch.queue_declare(q, exclusive=True)
    ch.basic_publish("", q, b"long", properties=props(expiration="60000"))
    ch.basic_publish("", q, b"short", properties=props(expiration="50"))
    time.sleep(0.3)
    assert message_count(ch, q) == 2
    m, _, b = ch.basic_get(q, auto_ack=True)
    assert b == b"long"
    # "short" is at the head now and long past its time: basic.get does not return it
    assert ch.basic_get(q, auto_ack=True)[0] is None
    assert message_count(ch, q) == 0


def test_expired_messages_are_dead_lettered_with_x_death(ch):
    dlq, src = unique_name("dlq"), unique_name("src")
    ch.queue_declare(dlq, exclusive=True)
    ch.queue_declare(src, exclusive=True, arguments={"x-message-ttl": 100, "x-dead-letter-exchange": "",
                                                     "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", src, b"a")
    ch.basic_publish("", src, b"b", properties=props(expiration="50", headers={"h": 1}))
    wait_until(lambda: message_count(ch, dlq) == 2, 5, message="expired messages not dead-lettered")
    m1, p1, b1 = ch.basic_get(dlq, auto_ack=True)
    m2, p2, b2 = ch.basic_get(dlq, auto_ack=True)
    assert (b1, b2) == (b"a", b"b")
    d1 = p1.headers["x-death"][0]
    assert (d1["reason"], d1["queue"], d1["count"], d1["exchange"], d1["routing-keys"]) == \
        ("expired", src, 1, "", [src])
    assert "original-expiration" not in d1
    d2 = p2.headers["x-death"][0]
    assert d2["reason"] == "expired" and d2["original-expiration"] == "50"
    assert p2.expiration is None, "the expiration property is removed when dead-lettered"
    assert p2.headers["h"] == 1
    assert p2.headers["x-first-death-reason"] == "expired"
    assert p2.headers["x-first-death-queue"] == src


def test_expiry_while_a_consumer_is_attached(conn, ch):
    q = unique_name("ttlcons")
    ch.queue_declare(q, exclusive=True, arguments={"x-message-ttl": 200})
    cch = conn.channel()
    cch.basic_qos(prefetch_count=1)
    got = []
    cch.basic_consume(q, lambda c, m, p, b: got.append((m.delivery_tag, b)))
    for i in range(4):
        ch.basic_publish("", q, f"m{i}".encode())
    collect(conn, got, 1)
    assert got[0][1] == b"m0"
    # the consumer sits on m0; the others expire in the queue meanwhile
    wait_until(lambda: conn.process_data_events(0.05) or message_count(ch, q) == 0, 5,
               message="messages did not expire while a consumer was attached")
    cch.basic_ack(got[0][0])
    conn.process_data_events(0.3)
    assert [b for _, b in got] == [b"m0"], "an expired message was delivered"
    # the consumer still gets new messages
    ch.basic_publish("", q, b"fresh")
    collect(conn, got, 2)
    assert got[1][1] == b"fresh"


def test_ttl_zero_reaches_a_ready_consumer_only(conn, ch):
    q = unique_name("ttl0")
    ch.queue_declare(q, exclusive=True, arguments={"x-message-ttl": 0})
    ch.basic_publish("", q, b"nobody")
    assert message_count(ch, q) == 0
    got = []
    cch = conn.channel()
    cch.basic_consume(q, lambda c, m, p, b: got.append(b), auto_ack=True)
    conn.process_data_events(0.1)
    ch.basic_publish("", q, b"somebody")
    collect(conn, got, 1)
    assert got == [b"somebody"]


def test_requeued_message_keeps_its_expiry(conn, ch):
    q = unique_name("ttlreq")
    ch.queue_declare(q, exclusive=True, arguments={"x-message-ttl": 200})
    ch.basic_publish("", q, b"x")
    gch = conn.channel()
    m, _, _ = gch.basic_get(q)
    time.sleep(0.4)
    gch.basic_nack(m.delivery_tag, requeue=True)
    wait_until(lambda: message_count(ch, q) == 0, 5, message="requeued message past its TTL came back")


@pytest.mark.parametrize("value,text", [
    ("abc", "no_integer"),
    ("-1", "{value_negative,-1}"),
    ("1.5", '{leftover_string,".5"}'),
    ("", "no_integer"),
])
def test_invalid_expiration_closes_the_channel(conn, value, text):
    c = conn.channel()
    q = unique_name("badexp")
    c.queue_declare(q, exclusive=True)
    c.basic_publish("", q, b"x", properties=props(expiration=value))
    with pytest.raises(ChannelClosedByBroker) as ei:
        c.queue_declare(q, passive=True)
    assert (ei.value.reply_code, ei.value.reply_text) == \
        (406, f"PRECONDITION_FAILED - invalid expiration '{value}': {text}")


# ------------------------------------------------------------------ x-expires

def test_unused_queue_expires(conn, ch):
    q = unique_name("xexp")
    ch.queue_declare(q, arguments={"x-expires": 300})
    ch.basic_publish("", q, b"lost with the queue")

    def gone():
        try:
            conn.channel().queue_declare(q, passive=True)
            return False
        except ChannelClosedByBroker as e:
            assert e.reply_code == 404
            return True
    time.sleep(0.35)
    wait_until(gone, 5, message="queue with x-expires was not deleted")


def test_queue_with_a_consumer_does_not_expire(conn, ch):
    q = unique_name("xexpc")
    ch.queue_declare(q, arguments={"x-expires": 200})
    cch = conn.channel()
    tag = cch.basic_consume(q, lambda *a: None, auto_ack=True)
    conn.process_data_events(0.6)
    ch.queue_declare(q, passive=True)        # still there
    cch.basic_cancel(tag)
    time.sleep(0.25)
    with pytest.raises(ChannelClosedByBroker) as ei:
        wait_until(lambda: conn.channel().queue_declare(q, passive=True) and False, 5)
    assert ei.value.reply_code == 404


def test_redeclare_renews_x_expires(ch):
    q = unique_name("xexpr")
    ch.queue_declare(q, arguments={"x-expires": 400})
    for _ in range(6):
        time.sleep(0.15)
        ch.queue_declare(q, arguments={"x-expires": 400})
    ch.queue_delete(q)


# ------------------------------------------------------------------ priorities

def test_priority_order_and_fifo_within_a_priority(ch):
    q = unique_name("prio")
    ch.queue_declare(q, exclusive=True, arguments={"x-max-priority": 10})
    for body, pr in [(b"p1", 1), (b"p9a", 9), (b"none", None), (b"p5", 5), (b"p9b", 9), (b"p0", 0)]:
        ch.basic_publish("", q, body, properties=props(priority=pr))
    assert drain_get(ch, q) == [b"p9a", b"p9b", b"p5", b"p1", b"none", b"p0"]


def test_priority_above_max_counts_as_max(ch):
    q = unique_name("priocap")
    ch.queue_declare(q, exclusive=True, arguments={"x-max-priority": 5})
    ch.basic_publish("", q, b"five", properties=props(priority=5))
    ch.basic_publish("", q, b"hundred", properties=props(priority=100))
    ch.basic_publish("", q, b"four", properties=props(priority=4))
    assert drain_get(ch, q) == [b"five", b"hundred", b"four"]


def test_plain_queue_ignores_priority(ch):
    q = unique_name("noprio")
    ch.queue_declare(q, exclusive=True)
    ch.basic_publish("", q, b"low", properties=props(priority=1))
    ch.basic_publish("", q, b"high", properties=props(priority=9))
    assert drain_get(ch, q) == [b"low", b"high"]


def test_requeue_keeps_priority_order(conn, ch):
    q = unique_name("prioreq")
    ch.queue_declare(q, exclusive=True, arguments={"x-max-priority": 9})
    for body, pr in [(b"a9", 9), (b"b9", 9), (b"c1", 1)]:
        ch.basic_publish("", q, body, properties=props(priority=pr))
    gch = conn.channel()
    m1, _, b1 = gch.basic_get(q)
    assert b1 == b"a9"
    ch.basic_publish("", q, b"d5", properties=props(priority=5))
    gch.basic_nack(m1.delivery_tag, requeue=True)
    got = []
    while True:
        m, _, b = ch.basic_get(q, auto_ack=True)
        if m is None:
            break
        got.append((b, m.redelivered))
    assert got == [(b"a9", True), (b"b9", False), (b"d5", False), (b"c1", False)]


def test_priority_queue_consumer_gets_highest_first(conn, ch):
    q = unique_name("priocons")
    ch.queue_declare(q, exclusive=True, arguments={"x-max-priority": 3})
    for i, pr in enumerate([0, 1, 2, 3, 0, 3]):
        ch.basic_publish("", q, f"{pr}-{i}".encode(), properties=props(priority=pr))
    got = []
    cch = conn.channel()
    cch.basic_consume(q, lambda c, m, p, b: got.append(b), auto_ack=True)
    collect(conn, got, 6)
    assert got == [b"3-3", b"3-5", b"2-2", b"1-1", b"0-0", b"0-4"]


@needs_process
def test_durable_priority_queue_survives_restart(own_node):
    c = pika_conn(own_node)
    ch = c.channel()
    ch.confirm_delivery()
    q = "prio.durable"
    ch.queue_declare(q, durable=True, arguments={"x-max-priority": 5})
    for body, pr in [(b"low", 1), (b"high", 5), (b"mid", 3), (b"high2", 5)]:
        ch.basic_publish("", q, body, properties=props(priority=pr, delivery_mode=2))
    c.close()
    own_node.stop()
    own_node.start()
    ch = pika_conn(own_node).channel()
    assert drain_get(ch, q) == [b"high", b"high2", b"mid", b"low"]


# ------------------------------------------------------------------ single active consumer

def test_single_active_consumer_and_handover_on_cancel(node):
    q = unique_name("sac")
    c1, c2 = pika_conn(node), pika_conn(node)
    ch1, ch2 = c1.channel(), c2.channel()
    ch1.queue_declare(q, auto_delete=False, arguments={"x-single-active-consumer": True})
    got1, got2 = [], []
    tag1 = ch1.basic_consume(q, lambda c, m, p, b: got1.append(b), auto_ack=True)
    ch2.basic_consume(q, lambda c, m, p, b: got2.append(b), auto_ack=True)
    pub = pika_conn(node).channel()
    for i in range(5):
        pub.basic_publish("", q, f"a{i}".encode())
    collect(c1, got1, 5)
    c2.process_data_events(0.2)
    assert got2 == [], "a second consumer got messages while the first was active"
    ch1.basic_cancel(tag1)
    for i in range(3):
        pub.basic_publish("", q, f"b{i}".encode())
    collect(c2, got2, 3)
    assert got2 == [b"b0", b"b1", b"b2"]
    pub.queue_delete(q)


def test_single_active_consumer_handover_on_connection_loss(node):
    q = unique_name("saclost")
    setup = pika_conn(node).channel()
    setup.queue_declare(q, arguments={"x-single-active-consumer": True})
    first = raw_socket(node)
    first.open_channel(1)
    first.rpc(spec.Basic.Consume(queue=q, consumer_tag="first"), 1, spec.Basic.ConsumeOk)
    c2 = pika_conn(node)
    got2 = []
    c2.channel().basic_consume(q, lambda c, m, p, b: got2.append((b, m.redelivered)))
    for i in range(3):
        setup.basic_publish("", q, f"m{i}".encode())
    first.recv_until(spec.Basic.Deliver)
    c2.process_data_events(0.2)
    assert got2 == []
    first.abort()             # the active consumer's connection drops with everything unacked
    collect(c2, got2, 3)
    assert sorted(got2) == [(b"m0", True), (b"m1", True), (b"m2", True)]
    setup.queue_delete(q)


def test_single_active_consumer_refuses_exclusive_consume(ch):
    q = unique_name("sacx")
    ch.queue_declare(q, exclusive=True, arguments={"x-single-active-consumer": True})
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.basic_consume(q, lambda *a: None, exclusive=True)
    assert (ei.value.reply_code, ei.value.reply_text) == \
        (403, f"ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use")


# ------------------------------------------------------------------ consumer priorities

def test_higher_priority_consumer_first_lower_when_it_is_full(conn, ch):
    q = unique_name("cprio")
    ch.queue_declare(q, exclusive=True)
    lo_ch, hi_ch = conn.channel(), conn.channel()
    hi_ch.basic_qos(prefetch_count=2)
    lo, hi = [], []
    lo_ch.basic_consume(q, lambda c, m, p, b: lo.append(b), auto_ack=True, arguments={"x-priority": 1})
    hi_ch.basic_consume(q, lambda c, m, p, b: hi.append(m.delivery_tag), arguments={"x-priority": 10})
    conn.process_data_events(0.1)
    for i in range(5):
        ch.basic_publish("", q, f"m{i}".encode())
    collect(conn, lo, 3)
    assert len(hi) == 2 and lo == [b"m2", b"m3", b"m4"]
    hi_ch.basic_ack(hi[-1], multiple=True)
    for i in range(2):
        ch.basic_publish("", q, f"n{i}".encode())
    collect(conn, hi, 4)
    assert lo == [b"m2", b"m3", b"m4"]


def test_invalid_consumer_priority(ch):
    q = unique_name("cpriobad")
    ch.queue_declare(q, exclusive=True)
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.basic_consume(q, lambda *a: None, arguments={"x-priority": "high"})
    assert (ei.value.reply_code, ei.value.reply_text) == \
        (406, f"PRECONDITION_FAILED - invalid arg 'x-priority' for queue '{q}' in vhost '/': "
              '"expected integer, got longstr"')


# ------------------------------------------------------------------ delivery limit

@pytest.mark.skipif(IS_REF, reason="RabbitMQ has x-delivery-limit on quorum queues only")
def test_delivery_limit_dead_letters_poison_messages(conn, ch):
    dlq, q = unique_name("poison.dlq"), unique_name("poison")
    ch.queue_declare(dlq, exclusive=True)
    ch.queue_declare(q, exclusive=True, arguments={"x-delivery-limit": 2, "x-dead-letter-exchange": "",
                                                   "x-dead-letter-routing-key": dlq})
    ch.basic_publish("", q, b"poison")
    gch = conn.channel()
    for attempt in range(3):      # delivered once, returned twice: still within the limit
        m, _, b = gch.basic_get(q)
        assert b == b"poison", f"attempt {attempt}"
        gch.basic_nack(m.delivery_tag, requeue=True)
    assert message_count(ch, q) == 0
    m, p, b = ch.basic_get(dlq, auto_ack=True)
    assert b == b"poison" and p.headers["x-death"][0]["reason"] == "delivery_limit"


@pytest.mark.skipif(IS_REF, reason="RabbitMQ has x-delivery-limit on quorum queues only")
def test_delivery_limit_counts_channel_loss(node):
    q = unique_name("poison2")
    setup = pika_conn(node).channel()
    setup.queue_declare(q, arguments={"x-delivery-limit": 0})
    setup.basic_publish("", q, b"x")
    c = pika_conn(node)
    assert c.channel().basic_get(q)[2] == b"x"
    c.close()                      # returned once: over a limit of 0, so dropped
    wait_until(lambda: message_count(setup, q) == 0, 5)
    setup.queue_delete(q)


# ------------------------------------------------------------------ dead-letter cycles

def test_expired_dead_letter_cycle_to_itself_is_dropped(ch):
    q = unique_name("cycle")
    ch.queue_declare(q, exclusive=True, arguments={"x-message-ttl": 50, "x-dead-letter-exchange": "",
                                                   "x-dead-letter-routing-key": q})
    ch.basic_publish("", q, b"round and round")
    wait_until(lambda: message_count(ch, q) == 0, 5)
    time.sleep(0.3)
    assert message_count(ch, q) == 0, "an expired message cycled back into its own queue"


def test_cycle_through_two_queues_is_dropped(ch):
    a, b = unique_name("cyc.a"), unique_name("cyc.b")
    ch.queue_declare(a, exclusive=True, arguments={"x-message-ttl": 50, "x-dead-letter-exchange": "",
                                                   "x-dead-letter-routing-key": b})
    ch.queue_declare(b, exclusive=True, arguments={"x-message-ttl": 50, "x-dead-letter-exchange": "",
                                                   "x-dead-letter-routing-key": a})
    ch.basic_publish("", a, b"x")
    time.sleep(0.5)
    assert (message_count(ch, a), message_count(ch, b)) == (0, 0)


def test_rejected_message_may_cycle_back(conn, ch):
    q = unique_name("cycrej")
    ch.queue_declare(q, exclusive=True, arguments={"x-dead-letter-exchange": "",
                                                   "x-dead-letter-routing-key": q})
    ch.basic_publish("", q, b"again")
    gch = conn.channel()
    m, _, _ = gch.basic_get(q)
    gch.basic_reject(m.delivery_tag, requeue=False)
    m, p, b = get_eventually(gch, q)
    assert b == b"again"
    assert p.headers["x-death"][0]["reason"] == "rejected" and p.headers["x-death"][0]["count"] == 1
    gch.basic_reject(m.delivery_tag, requeue=False)
    m, p, b = get_eventually(gch, q, auto_ack=True)
    assert p.headers["x-death"][0]["count"] == 2


def test_maxlen_dead_letter_to_itself_is_dropped(ch):
    q = unique_name("cycmax")
    ch.queue_declare(q, exclusive=True, arguments={"x-max-length": 1, "x-dead-letter-exchange": "",
                                                   "x-dead-letter-routing-key": q})
    ch.basic_publish("", q, b"1")
    ch.basic_publish("", q, b"2")
    assert drain_get(ch, q) == [b"2"]


# ------------------------------------------------------------------ argument checks

@pytest.mark.parametrize("args,text", [
    ({"x-message-ttl": -1}, "invalid arg 'x-message-ttl' for {q}: {{value_negative,-1}}"),
    ({"x-message-ttl": "x"}, "invalid arg 'x-message-ttl' for {q}: \"expected integer, got longstr\""),
    ({"x-message-ttl": 2 ** 40}, "invalid arg 'x-message-ttl' for {q}: {{value_too_large,1099511627776}}"),
    ({"x-expires": 0}, "invalid arg 'x-expires' for {q}: {{value_zero,0}}"),
    ({"x-max-priority": 256}, "invalid arg 'x-max-priority' for {q}: {{max_value_exceeded,256}}"),
    ({"x-max-priority": -1}, "invalid arg 'x-max-priority' for {q}: {{value_negative,-1}}"),
    ({"x-single-active-consumer": "yes"},
     "invalid arg 'x-single-active-consumer' for {q}: {{unacceptable_type,longstr}}"),
    ({"x-dead-letter-exchange": 5}, "invalid type 'signedint' for arg 'x-dead-letter-exchange' in {q}"),
    ({"x-dead-letter-routing-key": "k"},
     "invalid arg 'x-dead-letter-routing-key' for {q}: routing_key_but_no_dlx_defined"),
    ({"x-queue-type": "foo"}, "invalid arg 'x-queue-type' for {q}: \"unsupported queue type 'foo'\""),
    ({"x-queue-type": 5}, "invalid arg 'x-queue-type' for {q}: {{unacceptable_type,signedint}}"),
    ({"x-queue-type": "quorum"}, "invalid property 'non-durable' for {q}"),
])
def test_invalid_queue_arguments(conn, args, text):
    q = unique_name("badarg")
    with pytest.raises(ChannelClosedByBroker) as ei:
        conn.channel().queue_declare(q, arguments=args)
    where = f"queue '{q}' in vhost '/'"
    assert (ei.value.reply_code, ei.value.reply_text) == \
        (406, "PRECONDITION_FAILED - " + text.format(q=where))


def test_quorum_queue_declarations_are_served(conn):
    # x-queue-type=quorum: RabbitMQ's declaration rules, then a queue like any other
    ch = conn.channel()
    q = unique_name("quorum")
    ch.queue_declare(q, durable=True, arguments={"x-queue-type": "quorum"})
    ch.basic_publish("", q, b"kept")
    assert ch.basic_get(q, auto_ack=True)[2] == b"kept"
    ch.queue_delete(q)
    with pytest.raises(ChannelClosedByBroker) as ei:
        conn.channel().queue_declare(q, durable=True, exclusive=True, arguments={"x-queue-type": "quorum"})
    assert ei.value.reply_text == f"PRECONDITION_FAILED - invalid property 'exclusive-owner' for queue '{q}' in vhost '/'"


@pytest.mark.skipif(IS_REF, reason="RabbitMQ has streams; HareMQ refuses them")
def test_stream_queues_are_refused_clearly(conn):
    q = unique_name("stream")
    with pytest.raises(ChannelClosedByBroker) as ei:
        conn.channel().queue_declare(q, durable=True, arguments={"x-queue-type": "stream"})
    assert (ei.value.reply_code, ei.value.reply_text) == (
        406, f"PRECONDITION_FAILED - invalid arg 'x-queue-type' for queue '{q}' in vhost '/': "
             "\"unsupported queue type 'stream'\"")


# ------------------------------------------------------------------ durable queues and paging

@needs_process
def test_ttl_on_a_paged_durable_queue(node):
    # more messages than a durable queue keeps in memory: the rest wait on disk as ids
    q = unique_name("ttlpaged")
    setup = pika_conn(node).channel()
    setup.queue_declare(q, durable=True, arguments={"x-message-ttl": 1500})
    pub = raw_socket(node)
    pub.open_channel(1)
    pub.rpc(spec.Confirm.Select(), 1, spec.Confirm.SelectOk)
    n = 10000
    started = time.monotonic()
    pub.send_bytes(pub.publish_bytes(1, "", q, b"p" * 10, spec.Basic.Properties(delivery_mode=2)) * n)
    confirmed = 0
    while confirmed < n:
        _, frame = pub.recv_frame(timeout=30)
        if isinstance(frame, spec.Basic.Ack):
            confirmed = frame.delivery_tag
    count = message_count(setup, q)
    if time.monotonic() - started < 1.2:      # none can have expired yet (on a loaded machine, some may)
        assert count == n
    assert count <= n
    wait_until(lambda: message_count(setup, q) == 0, 15, interval=0.2,
               message="paged-out messages outlived x-message-ttl")
    setup.queue_delete(q)


@needs_process
def test_queue_ttl_after_restart(own_node):
    c = pika_conn(own_node)
    ch = c.channel()
    ch.confirm_delivery()
    ch.queue_declare("ttl.restart", durable=True, arguments={"x-message-ttl": 400})
    ch.queue_declare("ttl.keep", durable=True, arguments={"x-message-ttl": 600000})
    for q in ("ttl.restart", "ttl.keep"):
        ch.basic_publish("", q, b"x", properties=props(delivery_mode=2))
    c.close()
    own_node.stop()
    own_node.start()
    ch = pika_conn(own_node).channel()
    assert message_count(ch, "ttl.keep") == 1
    wait_until(lambda: message_count(ch, "ttl.restart") == 0, 5,
               message="recovered message outlived x-message-ttl")


# ------------------------------------------------------------------ policies (in-process)

def test_policy_definition_applies_to_a_queue():
    from haremq.node.broker.queue import Queue
    from haremq.node.broker.message import Message
    from haremq.node.protocol.properties import encode_properties
    from pamqp.commands import Basic

    raw = encode_properties(Basic.Properties())
    dead = []
    q = Queue("pq", "/", arguments={"x-max-length": 5, "x-dead-letter-exchange": "from-arg"})
    q.set_dead_letter_handler(lambda queue, messages, reason: dead.append((reason, len(messages))))
    for i in range(4):
        q.publish(Message("", "pq", raw, b"m%d" % i))
    q.apply_policy({"max-length": 2, "dead-letter-exchange": "from-policy", "message-ttl": 60000,
                    "expires": 1000, "unknown-key": 1})
    # min of argument and policy for limits; the argument wins for dead-letter-exchange
    assert (q.max_length, q.dlx, q.ttl, q.expires) == (2, "from-arg", 60000, 1000)
    assert q.message_count == 2 and dead == [("maxlen", 1), ("maxlen", 1)]
    q.apply_policy({"max-length": 10})
    assert (q.max_length, q.ttl, q.expires) == (5, None, None)
    q.apply_policy(None)
    assert q.max_length == 5 and q.overflow == "drop-head"

    plain = Queue("plain", "/")
    assert plain.dead_letter is None
    plain.set_dead_letter_handler(lambda queue, messages, reason: dead.append((reason, len(messages))))
    assert plain.dead_letter is None
    plain.apply_policy({"dead-letter-exchange": "dlx", "overflow": "reject-publish", "max-length": 1})
    assert plain.dead_letter is not None and plain.overflow == "reject-publish"
    assert plain.publish(Message("", "plain", raw, b"1")) == 1
    assert plain.publish(Message("", "plain", raw, b"2")) == 0      # REFUSED: nack


def test_vhost_policies_pick_the_highest_priority_match():
    from haremq.node.broker.policy import PolicyError, validate
    from haremq.node.broker.vhost import VHost

    vhost = VHost("/")
    vhost.policies["all-ttl"] = validate("all-ttl", ".*", {"message-ttl": 1000}, 0, "all")
    vhost.policies["orders"] = validate("orders", r"^orders\.", {"max-length": 3}, 5, "queues")
    vhost.policies["xonly"] = validate("xonly", ".*", {"alternate-exchange": "ae"}, 9, "exchanges")
    orders = vhost.declare_queue("orders.eu", False, False, False, False, {}, None)
    other = vhost.declare_queue("misc", False, False, False, False, {}, None)
    assert (orders.max_length, orders.ttl) == (3, None)
    assert (other.max_length, other.ttl) == (None, 1000)
    del vhost.policies["orders"]
    vhost.apply_policies()
    assert (orders.max_length, orders.ttl) == (None, 1000)
    with pytest.raises(PolicyError):
        validate("bad", ".*", {"message-ttl": -5}, 0, "all")
    with pytest.raises(PolicyError):
        validate("bad", ".*", {"no-such-key": 1}, 0, "all")


# ---- a header of the wrong type is not the broker's problem (RabbitMQ: x-invalid-headers) -----------

@pytest.mark.parametrize("garbage", ["garbage", 7, {"queue": "q"}, ["not a table", {"count": "x"}]],
                         ids=["string", "int", "table", "array-of-odd-things"])
@pytest.mark.parametrize("path", ["rejected", "expired"])
def test_a_malformed_x_death_header_is_dead_lettered_not_an_internal_error(conn, ch, garbage, path):
    """As RabbitMQ does: an x-death that is not an array goes to x-invalid-headers and a new
    x-death array starts; the connection stays open and the message leaves the queue for good."""
    q, dead = unique_name("poison"), unique_name("poisondl")
    ch.queue_declare(dead, exclusive=True)
    arguments = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead}
    if path == "expired":
        arguments["x-message-ttl"] = 20
    ch.queue_declare(q, exclusive=True, arguments=arguments)
    ch.basic_publish("", q, b"poison", pika.BasicProperties(headers={"x-death": garbage}))
    if path == "rejected":
        gch = conn.channel()
        m, _, _ = get_eventually(gch, q)
        gch.basic_reject(m.delivery_tag, requeue=False)
    _m, props, body = get_eventually(ch, dead, auto_ack=True)
    assert body == b"poison"
    deaths = props.headers["x-death"]
    assert deaths[0]["reason"] == path and deaths[0]["queue"] == q and deaths[0]["count"] == 1
    if not isinstance(garbage, list):
        assert len(deaths) == 1
        assert props.headers["x-invalid-headers"]["x-death"] == [garbage]
    assert message_count(ch, q) == 0 and message_count(ch, dead) == 0
    assert conn.is_open and ch.is_open
