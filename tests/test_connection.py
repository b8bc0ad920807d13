"""Connection-level behaviour: handshake, auth, vhosts, heartbeats, channels.

Expectations were recorded against RabbitMQ 3.10 (HAREMQ_TEST_REF_PORT).
"""
import socket
import time

import pika
import pytest
from pamqp import commands as spec
from pamqp import encode
from pamqp import heartbeat as pheartbeat

from tests.conftest import (HOST, CLIENT_CAPABILITIES, assert_node_healthy,
                            message_count, needs_process, pika_conn, port_open,
                            raw_socket, unique_name, wait_until)

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
ACCESS_REFUSED_PLAIN = ("ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
                        "For details see the broker logfile.")


def _start_ok(c, response, mechanism="PLAIN", caps=True):
    c.send_bytes(PROTOCOL_HEADER)
    c.expect(spec.Connection.Start, 0)
    props = {"capabilities": dict(CLIENT_CAPABILITIES)} if caps else {}
    c.send_frame(spec.Connection.StartOk(client_properties=props, mechanism=mechanism,
                                         response=response))


def _amqplain(user, password):
    # AMQPLAIN response: a field table without its leading length
    return encode.field_table({"LOGIN": user, "PASSWORD": password})[4:].decode("latin-1")


# ------------------------------------------------------------------ handshake

def test_handshake_start_offers_0_9_plain_and_amqplain(node):
    # ERR-3
    c = raw_socket(node, handshake=False)
    c.send_bytes(PROTOCOL_HEADER)
    start = c.expect(spec.Connection.Start, 0)
    assert (start.version_major, start.version_minor) == (0, 9)
    assert set(start.mechanisms.split()) >= {"PLAIN", "AMQPLAIN"}
    assert "en_US" in start.locales.split()


def test_tune_proposes_rabbitmq_defaults(node):
    c = raw_socket(node)
    # RabbitMQ 3.x: channel_max 2047, frame_max 128 KiB, heartbeat 60 s
    assert (c.tune.channel_max, c.tune.frame_max, c.tune.heartbeat) == (2047, 131072, 60)


def test_server_properties_capabilities(node):
    c = raw_socket(node, handshake=False)
    c.send_bytes(PROTOCOL_HEADER)
    props = c.expect(spec.Connection.Start, 0).server_properties
    caps = props["capabilities"]
    for cap in ("publisher_confirms", "basic.nack", "consumer_cancel_notify",
                "exchange_exchange_bindings", "connection.blocked",
                "authentication_failure_close", "per_consumer_qos", "direct_reply_to"):
        assert caps.get(cap) is True, f"capability {cap} = {caps.get(cap)!r}"
    for key in ("product", "version", "platform"):
        assert isinstance(props.get(key), str) and props[key], f"server property {key} missing"


def test_full_handshake_then_channel_works(node):
    c = raw_socket(node)
    c.open_channel(1)
    ok = c.rpc(spec.Queue.Declare(queue="", exclusive=True), 1, spec.Queue.DeclareOk)
    assert ok.queue.startswith("amq.gen-")


@pytest.mark.parametrize("header", [
    b"AMQP\x00\x00\x08\x00",        # AMQP 0-8 style revision
    b"AMQP\x00\x00\x09\x00",        # wrong revision
    b"AMQP\x03\x01\x00\x00",        # unknown protocol id
    b"GET / HTTP/1.1\r\n\r\n",      # not AMQP at all
    b"XXXXXXXX",
], ids=["0-8", "0-9-0", "proto-id-3", "http", "garbage"])
def test_wrong_protocol_header_answered_with_0_9_1_and_closed(node, header):
    # ERR-2: a wrong header is answered with the 0-9-1 header, then the socket is closed
    c = raw_socket(node, handshake=False)
    c.send_bytes(header)
    assert c.recv_bytes(8, timeout=5) == PROTOCOL_HEADER
    frames = c.expect_eof(10)
    assert frames == [], f"frames after the protocol header: {frames!r}"
    assert_node_healthy(node)


# ------------------------------------------------------------------ authentication

def test_bad_password_access_refused_403(node):
    # ERR-3
    c = raw_socket(node, handshake=False)
    _start_ok(c, "\x00guest\x00wrong")
    _, close = c.recv_frame(5)
    assert isinstance(close, spec.Connection.Close), f"got {close!r}"
    assert (close.reply_code, close.reply_text) == (403, ACCESS_REFUSED_PLAIN)
    assert (close.class_id, close.method_id) == (0, 0)
    c.expect_eof(10)


def test_unknown_user_access_refused_403(node):
    # ERR-3
    c = raw_socket(node, handshake=False)
    _start_ok(c, "\x00nosuchuser\x00guest")
    _, close = c.recv_frame(5)
    assert isinstance(close, spec.Connection.Close)
    assert (close.reply_code, close.reply_text) == (403, ACCESS_REFUSED_PLAIN)


def test_bad_password_with_pika_is_an_authentication_error(node):
    # ERR-3
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as ei:
        pika_conn(node, credentials=pika.PlainCredentials("guest", "nope"))
    assert "ACCESS_REFUSED" in str(ei.value)


def test_amqplain_auth_works(node):
    # ERR-3
    c = raw_socket(node, mechanism="AMQPLAIN", response=_amqplain("guest", "guest"))
    c.open_channel(1)
    c.rpc(spec.Queue.Declare(queue="", exclusive=True), 1, spec.Queue.DeclareOk)


def test_amqplain_bad_password_403(node):
    # ERR-3
    c = raw_socket(node, handshake=False)
    _start_ok(c, _amqplain("guest", "wrong"), mechanism="AMQPLAIN")
    _, close = c.recv_frame(5)
    assert isinstance(close, spec.Connection.Close)
    assert close.reply_code == 403
    assert close.reply_text == ("ACCESS_REFUSED - Login was refused using authentication "
                                "mechanism AMQPLAIN. For details see the broker logfile.")


def test_unknown_vhost_530(node):
    # ERR-3
    c = raw_socket(node, handshake=False)
    _start_ok(c, "\x00guest\x00guest")
    c.expect(spec.Connection.Tune, 0)
    c.send_frame(spec.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0))
    c.send_frame(spec.Connection.Open(virtual_host="no-such-vhost"))
    _, close = c.recv_frame(5)
    assert isinstance(close, spec.Connection.Close), f"got {close!r}"
    assert (close.reply_code, close.reply_text) == (530, "NOT_ALLOWED - vhost no-such-vhost not found")
    assert (close.class_id, close.method_id) == (10, 40)
    c.send_frame(spec.Connection.CloseOk())
    c.expect_eof(10)


def test_unknown_vhost_with_pika(node):
    # ERR-3
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as ei:
        pika_conn(node, virtual_host="no-such-vhost")
    assert "530" in str(ei.value) and "vhost no-such-vhost not found" in str(ei.value)


# ------------------------------------------------------------------ heartbeats

def test_heartbeat_negotiated_to_client_value(node):
    c = pika_conn(node, heartbeat=5)
    assert c._impl.params.heartbeat == 5
    ch = c.channel()
    q = unique_name("hb")
    ch.queue_declare(q, exclusive=True)
    ch.basic_publish("", q, b"x")
    m, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"x"


def test_server_sends_heartbeats_at_negotiated_interval(node):
    c = raw_socket(node, heartbeat=2)
    c.open_channel(1)
    deadline = time.monotonic() + 8
    got = False
    while time.monotonic() < deadline and not got:
        c.send_frame(pheartbeat.Heartbeat())
        try:
            _, f = c.recv_frame(0.5, skip_heartbeats=False)
        except socket.timeout:
            continue
        got = isinstance(f, pheartbeat.Heartbeat)
    assert got, "no heartbeat frame from the broker within 8 s with heartbeat=2"


def test_silent_client_disconnected_after_missed_heartbeats(node):
    # A client that negotiated heartbeat=1 and then sends nothing is dropped
    # after two missed intervals. RabbitMQ just closes the socket: no connection.close.
    c = raw_socket(node, heartbeat=1)
    c.open_channel(1)
    frames = c.expect_eof(10)
    others = [f for _, f in frames if not isinstance(f, pheartbeat.Heartbeat)]
    assert others == [], f"non-heartbeat frames before the disconnect: {others!r}"
    assert_node_healthy(node)


def test_heartbeating_client_stays_connected(node):
    c = raw_socket(node, heartbeat=1)
    c.open_channel(1)
    end = time.monotonic() + 3.5
    while time.monotonic() < end:
        c.send_frame(pheartbeat.Heartbeat())
        try:
            c.recv_frame(0.25)
        except socket.timeout:
            pass
    ok = c.rpc(spec.Queue.Declare(queue="", exclusive=True), 1, spec.Queue.DeclareOk)
    assert ok.queue.startswith("amq.gen-")


# ------------------------------------------------------------------ close

def test_client_initiated_connection_close(node):
    c = raw_socket(node)
    c.open_channel(1)
    c.send_frame(spec.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0))
    c.expect(spec.Connection.CloseOk, 0)


def test_pika_connection_close_releases_exclusive_queue(node):
    c = pika_conn(node)
    q = unique_name("cclose")
    c.channel().queue_declare(q, exclusive=True)
    c.close()
    assert c.is_closed
    c2 = pika_conn(node)
    ch = c2.channel()

    def gone():
        try:
            c2.channel().queue_declare(q, passive=True)
            return False
        except pika.exceptions.ChannelClosedByBroker as e:
            return e.reply_code == 404

    wait_until(gone, 5, message="exclusive queue survived its connection's close")
    assert ch.is_open


# ------------------------------------------------------------------ channels

def test_channel_open_close_and_reopen_same_number(node):
    c = raw_socket(node)
    c.open_channel(1)
    c.send_frame(spec.Channel.Close(reply_code=200, reply_text="done", class_id=0, method_id=0), 1)
    c.expect(spec.Channel.CloseOk, 1)
    c.open_channel(1)
    c.rpc(spec.Basic.Qos(prefetch_count=1), 1, spec.Basic.QosOk)


def test_highest_channel_number_opens(node):
    c = raw_socket(node)
    assert c.open_channel(2047) == 2047


def test_channels_are_independent(node):
    c = pika_conn(node)
    ch1, ch2 = c.channel(), c.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        ch1.queue_declare(unique_name("missing"), passive=True)
    assert ch1.is_closed and ch2.is_open
    q = unique_name("indep")
    ch2.queue_declare(q, exclusive=True)
    assert message_count(ch2, q) == 0


def test_channel_flow_active_true_ok(node):
    c = raw_socket(node)
    c.open_channel(1)
    ok = c.rpc(spec.Channel.Flow(active=True), 1, spec.Channel.FlowOk)
    assert ok.active is True


def test_channel_flow_active_false_is_540_not_implemented(node):
    # RabbitMQ 3.x no longer supports client-side flow control: connection error
    c = raw_socket(node)
    c.open_channel(1)
    c.send_frame(spec.Channel.Flow(active=False), 1)
    close = c.expect_connection_close()
    assert (close.reply_code, close.reply_text) == (540, "NOT_IMPLEMENTED - active=false")
    assert (close.class_id, close.method_id) == (20, 20)


def test_channel_flow_with_pika(node):
    c = pika_conn(node)
    assert c.channel().flow(True) is True


# ------------------------------------------------------------------ the node process

@needs_process
def test_node_stops_on_sigterm(own_node):
    assert port_open(own_node.port)
    code = own_node.stop(timeout=15)
    assert code == 0, f"exit code {code} after SIGTERM:\n{own_node.log_tail()}"
    assert not port_open(own_node.port)


@needs_process
def test_node_logs_to_stderr(own_node):
    pika_conn(own_node).close()
    own_node.stop()
    assert own_node.log_text().strip(), "node wrote nothing to stdout/stderr"


@needs_process
def test_node_exits_nonzero_when_port_in_use(tmp_path):
    import subprocess
    from tests.conftest import Node
    with socket.socket() as blocker:
        blocker.bind((HOST, 0))
        blocker.listen(1)
        n = Node("hare-busy", tmp_path, port=blocker.getsockname()[1])
        n.data_dir.mkdir(parents=True)
        with open(n.log_path, "wb") as log:
            proc = subprocess.Popen(n.argv(), stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                code = proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                pytest.fail("node kept running although its AMQP port was taken")
        assert code != 0, "node exited 0 although its AMQP port was taken"


@needs_process
def test_node_restarts_after_kill9_on_same_data_dir(own_node):
    own_node.kill9()
    assert not port_open(own_node.port)
    own_node.start()
    assert_node_healthy(own_node)
