"""ERR-1 / ERR-2: protocol violations and bad input.

Reply codes and texts are RabbitMQ 3.10's (recorded with HAREMQ_TEST_REF_PORT).
After every bad input the node must keep serving everyone else
(``assert_node_healthy``: a new pika connection can declare, publish, get).
"""
import socket
import struct
import threading
import time

import pytest
from pamqp import body as pbody
from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp import header as pheader
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

from tests.conftest import PeerClosed, assert_node_healthy, pika_conn, raw_socket, unique_name

FRAME_END = b"\xce"


def raw_frame(ftype, channel, payload, end=FRAME_END):
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + end


def close_of(c, timeout=10):
    close = c.expect_connection_close(timeout)
    return close.reply_code, close.reply_text, close.class_id, close.method_id


def channel_close_of(c, channel=1):
    close = c.expect_channel_close(channel)
    return close.reply_code, close.reply_text, close.class_id, close.method_id


# ------------------------------------------------------------------ framing (ERR-2)

def test_frame_over_negotiated_frame_max_501(node):
    # ERR-2
    c = raw_socket(node, frame_max=4096)
    c.open_channel(1)
    c.send_frame(spec.Basic.Publish(exchange="", routing_key="nowhere"), 1)
    c.send_frame(pheader.ContentHeader(0, 5000, spec.Basic.Properties()), 1)
    # the header of a 5000-byte body frame is enough for the broker to refuse it
    c.send_bytes(struct.pack(">BHI", 3, 1, 5000))
    assert close_of(c) == (
        501, "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,5000,4088}", 0, 0)
    assert_node_healthy(node)


def test_method_frame_over_default_frame_max_501(node):
    # ERR-2
    c = raw_socket(node)  # frame_max 131072
    c.send_bytes(struct.pack(">BHI", 1, 1, 200000) + b"\x00" * 1000)
    assert close_of(c) == (
        501, "FRAME_ERROR - type 1, all octets = <<>>: {frame_too_large,200000,131064}", 0, 0)
    assert_node_healthy(node)


def test_bad_frame_end_byte_501(node):
    # ERR-2
    c = raw_socket(node)
    good = pframe.marshal(spec.Channel.Open(), 1)
    c.send_bytes(good[:-1] + b"\x00")
    assert close_of(c) == (
        501, "FRAME_ERROR - type 1, all octets = <<0,20,0,10,1,48>>: "
             "{invalid_frame_end_marker,0}", 0, 0)
    assert_node_healthy(node)


def test_unknown_frame_type_501(node):
    # ERR-2
    c = raw_socket(node)
    c.send_bytes(raw_frame(7, 0, b"a"))
    assert close_of(c) == (501, 'FRAME_ERROR - type 7, all octets = <<"a">>: unknown_frame', 0, 0)
    assert_node_healthy(node)


def test_truncated_frame_then_socket_close(node):
    # ERR-2
    c = raw_socket(node)
    c.open_channel(1)
    frame = pframe.marshal(spec.Queue.Declare(queue=unique_name("trunc")), 1)
    c.send_bytes(frame[: len(frame) // 2])
    c.close()
    assert_node_healthy(node)


def test_truncated_frame_does_not_block_other_connections(node):
    # ERR-2
    c = raw_socket(node)
    c.send_bytes(struct.pack(">BHI", 1, 0, 100) + b"\x00\x0a")  # 2 of 100 payload bytes
    assert_node_healthy(node)
    c.close()


def test_garbage_after_handshake_501(node):
    # ERR-2
    c = raw_socket(node)
    c.send_bytes(b"\xff" * 64)
    code, text, _, _ = close_of(c)
    assert code == 501 and text.startswith("FRAME_ERROR - type 255"), (code, text)
    assert_node_healthy(node)


@pytest.mark.parametrize("class_id,method_id", [(99, 99), (60, 99)], ids=["class", "method"])
def test_unknown_class_or_method_id_drops_connection(node, class_id, method_id):
    # RabbitMQ 3.10's reader exits with {unknown_method_id, {C, M}}: the TCP
    # connection is closed without a connection.close frame.
    c = raw_socket(node)
    c.open_channel(1)
    c.send_bytes(raw_frame(1, 1, struct.pack(">HH", class_id, method_id)))
    frames = c.expect_eof(10)
    assert not any(isinstance(f, spec.Connection.Close) for _, f in frames), frames
    assert_node_healthy(node)


def test_content_body_without_header_505(node):
    # ERR-2
    c = raw_socket(node)
    c.open_channel(1)
    c.send_frame(pbody.ContentBody(b"abc"), 1)
    assert close_of(c) == (
        505, "UNEXPECTED_FRAME - expected method frame, got non method frame instead", 0, 0)
    assert_node_healthy(node)


def test_content_header_without_publish_505(node):
    # ERR-2
    c = raw_socket(node)
    c.open_channel(1)
    c.send_frame(pheader.ContentHeader(0, 3, spec.Basic.Properties()), 1)
    assert close_of(c) == (
        505, "UNEXPECTED_FRAME - expected method frame, got non method frame instead", 0, 0)
    assert_node_healthy(node)


def test_publish_followed_by_body_instead_of_header_505(node):
    # ERR-2
    c = raw_socket(node)
    c.open_channel(1)
    c.send_frame(spec.Basic.Publish(exchange="", routing_key="x"), 1)
    c.send_frame(pbody.ContentBody(b"abc"), 1)
    assert close_of(c) == (
        505, "UNEXPECTED_FRAME - expected content header for class 60, "
             "got non content header frame instead", 60, 40)
    assert_node_healthy(node)


def test_method_instead_of_content_body_505(node):
    # ERR-2
    c = raw_socket(node)
    c.open_channel(1)
    c.send_frame(spec.Basic.Publish(exchange="", routing_key="x"), 1)
    c.send_frame(pheader.ContentHeader(0, 10, spec.Basic.Properties()), 1)
    c.send_frame(spec.Basic.Qos(prefetch_count=1), 1)
    assert close_of(c) == (
        505, "UNEXPECTED_FRAME - expected content body, got non content body frame instead",
        60, 40)
    assert_node_healthy(node)


def test_heartbeat_on_nonzero_channel_505(node):
    # ERR-2
    c = raw_socket(node)
    c.send_bytes(raw_frame(8, 1, b""))
    assert close_of(c) == (505, "UNEXPECTED_FRAME - type 8, all octets = <<>>", 0, 0)
    assert_node_healthy(node)


def test_method_on_unopened_channel_504(node):
    # ERR-2
    c = raw_socket(node)
    c.send_frame(spec.Queue.Declare(queue=unique_name("unopened")), 5)
    assert close_of(c) == (504, "CHANNEL_ERROR - expected 'channel.open'", 50, 10)
    assert_node_healthy(node)


def test_channel_open_twice_504(node):
    # ERR-2
    c = raw_socket(node)
    c.open_channel(1)
    c.send_frame(spec.Channel.Open(), 1)
    assert close_of(c) == (504, "CHANNEL_ERROR - second 'channel.open' seen", 20, 10)
    assert_node_healthy(node)


def test_channel_method_on_channel_zero_504(node):
    # ERR-2
    c = raw_socket(node)
    c.send_frame(spec.Basic.Qos(prefetch_count=1), 0)
    assert close_of(c) == (
        504, "CHANNEL_ERROR - unexpected method in connection state running", 60, 10)
    assert_node_healthy(node)


def test_client_that_never_reads_does_not_block_others(fresh_node):
    # ERR-2: a client with a tiny receive buffer consumes (no-ack) a queue it keeps
    # publishing to, and never reads a byte. Everyone else keeps working.
    node = fresh_node
    q = unique_name("noread")
    c = raw_socket(node, rcvbuf=4096)
    c.open_channel(1)
    c.rpc(spec.Queue.Declare(queue=q, auto_delete=True), 1, spec.Queue.DeclareOk)
    c.rpc(spec.Basic.Consume(queue=q, no_ack=True), 1, spec.Basic.ConsumeOk)
    payload = b"p" * 16384
    chunk = b"".join(c.publish_bytes(1, "", q, payload) for _ in range(64))  # 1 MiB
    c.sock.settimeout(0.2)
    sent = 0
    deadline = time.monotonic() + 8
    while time.monotonic() < deadline and sent < 32 * len(chunk):
        try:
            c.sock.sendall(chunk)
            sent += len(chunk)
        except socket.timeout:
            break  # the broker stopped reading us: fine (flow control)
    for _ in range(3):
        t0 = time.monotonic()
        assert_node_healthy(node)
        assert time.monotonic() - t0 < 10, "another client was stalled by the non-reader"
    c.abort()
    assert_node_healthy(node)


# ------------------------------------------------------------------ channel errors (ERR-1)

def sync_probe(ch):
    """A synchronous round trip, so an asynchronous channel error surfaces."""
    ch.exchange_declare("amq.direct", passive=True)


def test_publish_to_missing_exchange_404_connection_stays_usable(node):
    # ERR-1
    c = pika_conn(node)
    ch = c.channel()
    x = unique_name("nox")
    ch.basic_publish(x, "rk", b"lost")
    with pytest.raises(ChannelClosedByBroker) as ei:
        sync_probe(ch)
    assert (ei.value.reply_code, ei.value.reply_text) == (
        404, f"NOT_FOUND - no exchange '{x}' in vhost '/'")
    assert ch.is_closed and c.is_open
    ch2 = c.channel()
    q = unique_name("after404")
    ch2.queue_declare(q, exclusive=True)
    ch2.basic_publish("", q, b"ok")
    m, _, b = ch2.basic_get(q, auto_ack=True)
    assert b == b"ok"


def test_publish_to_missing_exchange_raw_close_names_basic_publish(node):
    # ERR-1
    c = raw_socket(node)
    c.open_channel(1)
    x = unique_name("nox")
    c.publish(1, x, "k", b"x")
    assert channel_close_of(c) == (404, f"NOT_FOUND - no exchange '{x}' in vhost '/'", 60, 40)
    c.open_channel(1)  # connection still usable, channel number reusable after close-ok
    c.rpc(spec.Basic.Qos(prefetch_count=1), 1, spec.Basic.QosOk)


def test_passive_declare_missing_queue_404(node):
    # ERR-1
    c = pika_conn(node)
    q = unique_name("missing")
    with pytest.raises(ChannelClosedByBroker) as ei:
        c.channel().queue_declare(q, passive=True)
    assert (ei.value.reply_code, ei.value.reply_text) == (404, f"NOT_FOUND - no queue '{q}' in vhost '/'")
    assert c.is_open


def test_passive_declare_missing_exchange_404(node):
    # ERR-1
    c = pika_conn(node)
    x = unique_name("missing")
    with pytest.raises(ChannelClosedByBroker) as ei:
        c.channel().exchange_declare(x, passive=True)
    assert (ei.value.reply_code, ei.value.reply_text) == (
        404, f"NOT_FOUND - no exchange '{x}' in vhost '/'")


@pytest.mark.parametrize("op", ["passive_declare", "declare", "consume", "get", "purge"])
def test_exclusive_queue_from_another_connection_405(node, op):
    # ERR-1
    owner = pika_conn(node)
    q = unique_name("excl")
    owner.channel().queue_declare(q, exclusive=True)
    ch = pika_conn(node).channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        if op == "passive_declare":
            ch.queue_declare(q, passive=True)
        elif op == "declare":
            ch.queue_declare(q, exclusive=True)
        elif op == "consume":
            ch.basic_consume(q, lambda *a: None)
        elif op == "get":
            ch.basic_get(q)
        else:
            ch.queue_purge(q)
    assert ei.value.reply_code == 405
    assert ei.value.reply_text == (
        f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{q}' in vhost '/'. "
        "It could be originally declared on another connection or the exclusive property "
        "value does not match that of the original declaration.")


def test_inequivalent_queue_redeclare_406(node):
    # ERR-1
    ch = pika_conn(node).channel()
    q = unique_name("ineq")
    ch.queue_declare(q, durable=False, auto_delete=True)
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_declare(q, durable=True, auto_delete=True)
    assert (ei.value.reply_code, ei.value.reply_text) == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'durable' for queue '{q}' in vhost '/': "
             "received 'true' but current is 'false'")


def test_inequivalent_queue_argument_406(node):
    # ERR-1
    ch = pika_conn(node).channel()
    q = unique_name("ineqarg")
    ch.queue_declare(q, auto_delete=True, arguments={"x-max-length": 1})
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_declare(q, auto_delete=True, arguments={"x-max-length": 2})
    assert (ei.value.reply_code, ei.value.reply_text) == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue '{q}' in vhost '/': "
             "received '2' but current is '1'")


def test_equivalent_redeclare_is_fine(node):
    # ERR-1
    ch = pika_conn(node).channel()
    q = unique_name("eq")
    ch.queue_declare(q, auto_delete=True, arguments={"x-max-length": 5})
    ok = ch.queue_declare(q, auto_delete=True, arguments={"x-max-length": 5})
    assert ok.method.queue == q
    x = unique_name("eqx")
    ch.exchange_declare(x, "topic", auto_delete=True)
    ch.exchange_declare(x, "topic", auto_delete=True)
    ch.exchange_declare("amq.direct", "direct", durable=True)  # predeclared, equivalent: allowed


def test_inequivalent_exchange_redeclare_406(node):
    # ERR-1
    ch = pika_conn(node).channel()
    x = unique_name("ineqx")
    ch.exchange_declare(x, "direct", auto_delete=True)
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.exchange_declare(x, "fanout", auto_delete=True)
    assert (ei.value.reply_code, ei.value.reply_text) == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{x}' in vhost '/': "
             "received 'fanout' but current is 'direct'")
    ch2 = ch.connection.channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch2.exchange_declare(x, "direct", durable=True, auto_delete=True)
    assert (ei.value.reply_code, ei.value.reply_text) == (
        406, f"PRECONDITION_FAILED - inequivalent arg 'durable' for exchange '{x}' in vhost '/': "
             "received 'true' but current is 'false'")


def test_declare_amq_prefixed_exchange_403(node):
    # ERR-1
    ch = pika_conn(node).channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.exchange_declare("amq.haremq-test", "direct")
    assert (ei.value.reply_code, ei.value.reply_text) == (
        403, "ACCESS_REFUSED - exchange name 'amq.haremq-test' contains reserved prefix 'amq.*'")


def test_declare_amq_prefixed_queue_403(node):
    # ERR-1
    ch = pika_conn(node).channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_declare("amq.haremq-test")
    assert (ei.value.reply_code, ei.value.reply_text) == (
        403, "ACCESS_REFUSED - queue name 'amq.haremq-test' contains reserved prefix 'amq.*'")


def test_delete_predeclared_exchange_403(node):
    # ERR-1
    ch = pika_conn(node).channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.exchange_delete("amq.direct")
    assert (ei.value.reply_code, ei.value.reply_text) == (
        403, "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed")


def test_operations_on_default_exchange_403(node):
    # ERR-1
    c = pika_conn(node)
    ch = c.channel()
    q = unique_name("defx")
    ch.queue_declare(q, exclusive=True)
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_bind(q, "", routing_key="other")
    assert (ei.value.reply_code, ei.value.reply_text) == (
        403, "ACCESS_REFUSED - operation not permitted on the default exchange")
    with pytest.raises(ChannelClosedByBroker) as ei:
        c.channel().exchange_delete("")
    assert ei.value.reply_code == 403


def test_publish_to_internal_exchange_403(node):
    # ERR-1
    c = pika_conn(node)
    ch = c.channel()
    x = unique_name("internal")
    ch.exchange_declare(x, "direct", internal=True, auto_delete=True)
    ch.basic_publish(x, "k", b"x")
    with pytest.raises(ChannelClosedByBroker) as ei:
        sync_probe(ch)
    assert (ei.value.reply_code, ei.value.reply_text) == (
        403, f"ACCESS_REFUSED - cannot publish to internal exchange '{x}' in vhost '/'")


def test_exclusive_consumer_conflict_403(node):
    # ERR-1
    c1 = pika_conn(node)
    ch1 = c1.channel()
    q = unique_name("exclcons")
    ch1.queue_declare(q, auto_delete=True)
    ch1.basic_consume(q, lambda *a: None, exclusive=True)
    ch2 = pika_conn(node).channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch2.basic_consume(q, lambda *a: None)
    assert (ei.value.reply_code, ei.value.reply_text) == (
        403, f"ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use")


def test_exclusive_consume_when_queue_has_consumer_403(node):
    # ERR-1
    ch1 = pika_conn(node).channel()
    q = unique_name("exclcons2")
    ch1.queue_declare(q, auto_delete=True)
    ch1.basic_consume(q, lambda *a: None)
    ch2 = pika_conn(node).channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch2.basic_consume(q, lambda *a: None, exclusive=True)
    assert (ei.value.reply_code, ei.value.reply_text) == (
        403, f"ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use")


def test_reused_consumer_tag_530_closes_connection(node):
    # ERR-1
    c = raw_socket(node)
    c.open_channel(1)
    q = c.rpc(spec.Queue.Declare(queue="", exclusive=True), 1, spec.Queue.DeclareOk).queue
    c.rpc(spec.Basic.Consume(queue=q, consumer_tag="ctag-1"), 1, spec.Basic.ConsumeOk)
    c.send_frame(spec.Basic.Consume(queue=q, consumer_tag="ctag-1"), 1)
    assert close_of(c) == (530, "NOT_ALLOWED - attempt to reuse consumer tag 'ctag-1'", 60, 20)
    assert_node_healthy(node)


def test_unknown_exchange_type_503_closes_connection(node):
    # ERR-1
    c = pika_conn(node)
    with pytest.raises(ConnectionClosedByBroker) as ei:
        c.channel().exchange_declare(unique_name("badtype"), "no-such-type")
    # RabbitMQ says "invalid exchange type" only for names that happen to be
    # existing Erlang atoms (e.g. 'foo'); for any other name it is "unknown".
    assert (ei.value.reply_code, ei.value.reply_text) == (
        503, "COMMAND_INVALID - unknown exchange type 'no-such-type'")
    assert c.is_closed


def test_immediate_publish_540_closes_connection(node):
    # PUB-2
    c = raw_socket(node)
    c.open_channel(1)
    c.publish(1, "", "whatever", b"x", immediate=True)
    assert close_of(c) == (540, "NOT_IMPLEMENTED - immediate=true", 60, 40)
    assert_node_healthy(node)


def test_tx_select_after_confirm_select_406(node):
    # CONF-1
    ch = pika_conn(node).channel()
    ch.confirm_delivery()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.tx_select()
    assert (ei.value.reply_code, ei.value.reply_text) == (
        406, "PRECONDITION_FAILED - cannot switch from confirm to tx mode")


def test_confirm_select_after_tx_select_406(node):
    # CONF-1
    ch = pika_conn(node).channel()
    ch.tx_select()
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.confirm_delivery()
    assert (ei.value.reply_code, ei.value.reply_text) == (
        406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode")


@pytest.mark.parametrize("method", ["tx_commit", "tx_rollback"])
def test_tx_commit_or_rollback_without_select_406(node, method):
    # CONF-8
    ch = pika_conn(node).channel()
    with pytest.raises(ChannelClosedByBroker) as ei:
        getattr(ch, method)()
    assert (ei.value.reply_code, ei.value.reply_text) == (
        406, "PRECONDITION_FAILED - channel is not transactional")


def test_basic_recover_requeue_false_540(node):
    # ERR-1
    c = raw_socket(node)
    c.open_channel(1)
    c.send_frame(spec.Basic.Recover(requeue=False), 1)
    assert close_of(c) == (540, "NOT_IMPLEMENTED - requeue=false", 60, 110)


def test_qos_prefetch_size_540(node):
    # ERR-1
    c = raw_socket(node)
    c.open_channel(1)
    c.send_frame(spec.Basic.Qos(prefetch_size=10), 1)
    assert close_of(c) == (540, "NOT_IMPLEMENTED - prefetch_size!=0 (10)", 60, 10)


def test_get_or_consume_with_empty_name_and_no_previous_declare_404(node):
    # ERR-1
    c = raw_socket(node)
    c.open_channel(1)
    c.send_frame(spec.Basic.Get(queue=""), 1)
    assert channel_close_of(c) == (404, "NOT_FOUND - no previously declared queue", 60, 70)


def test_invalid_queue_argument_406(node):
    # ERR-1
    ch = pika_conn(node).channel()
    q = unique_name("badarg")
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_declare(q, auto_delete=True, arguments={"x-overflow": "sideways"})
    assert (ei.value.reply_code, ei.value.reply_text) == (
        406, f"PRECONDITION_FAILED - invalid arg 'x-overflow' for queue '{q}' in vhost '/': "
             "invalid_overflow")


def test_idempotent_deletes_and_unbinds_of_missing_things(node):
    # ERR-1
    ch = pika_conn(node).channel()
    ok = ch.queue_delete(unique_name("never"))
    assert ok.method.message_count == 0
    ch.exchange_delete(unique_name("never"))
    ch.queue_unbind(unique_name("never"), unique_name("never"), "k")
    assert ch.is_open


def test_cancel_unknown_consumer_tag_is_ok(node):
    # ERR-1
    c = raw_socket(node)
    c.open_channel(1)
    ok = c.rpc(spec.Basic.Cancel(consumer_tag="never-seen"), 1, spec.Basic.CancelOk)
    assert ok.consumer_tag == "never-seen"


def test_many_concurrent_bad_clients_leave_node_serving(node):
    # ERR-1
    def bad(i):
        try:
            c = raw_socket(node)
            c.send_bytes(b"\x01\x00\x01" + b"\xff" * (i + 1))
            c.abort()
        except (OSError, PeerClosed):
            pass

    threads = [threading.Thread(target=bad, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert_node_healthy(node)
