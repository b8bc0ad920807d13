"""Resource alarms (ERR-4): memory high watermark and disk free limit.

Thresholds are lowered to force an alarm: publishing connections get
connection.blocked and are not read (what they send waits in the socket),
consumers keep consuming, and raising the threshold again unblocks them
and lets the waiting publishes through.
"""
import socket

import pika
import pytest
from pamqp import commands as spec
from pamqp.body import ContentBody

from haremq.node.broker.broker import Broker
from tests.conftest import (HOST, Node, _open_clients, needs_process, pika_conn, raw_socket,
                            wait_until)
from tests.inprocess import InProcessNode

pytestmark = needs_process


def publisher(node):
    pub = raw_socket(node)
    pub.open_channel(1)
    pub.rpc(spec.Confirm.Select(), 1, spec.Confirm.SelectOk)
    return pub


def frames_until_quiet(client, timeout=0.5):
    out = []
    while True:
        try:
            out.append(client.recv_frame(timeout)[1])
        except socket.timeout:
            return out


def test_memory_alarm_blocks_publishers_consumers_go_on_and_recovery_unblocks(tmp_path):
    with InProcessNode(tmp_path) as n:
        setup = pika_conn(n).channel()
        setup.queue_declare("alarm.q")
        setup.confirm_delivery()
        for i in range(20):
            setup.basic_publish("", "alarm.q", f"before{i}".encode())
        setup.connection.close()
        pub = publisher(n)
        pub.publish(1, "", "alarm.q", b"first")          # a publisher from now on
        assert isinstance(pub.recv_frame()[1], spec.Basic.Ack)

        status = n.call(n.broker.set_vm_memory_high_watermark, "1MB")      # far below our RSS
        assert "memory" in status["alarms"]
        blocked = pub.expect(spec.Connection.Blocked, 0)
        assert blocked.reason == "low on memory"
        for i in range(5):
            pub.publish(1, "", "alarm.q", f"while{i}".encode())
        assert frames_until_quiet(pub) == [], "a blocked publisher's messages were read and confirmed"

        # a consumer on another connection drains the queue meanwhile
        c = pika_conn(n)
        got = []
        c.channel().basic_consume("alarm.q", lambda ch, m, p, b: got.append(b), auto_ack=True)
        wait_until(lambda: c.process_data_events(0.05) or len(got) >= 21, 10)
        assert got[:21] == [f"before{i}".encode() for i in range(20)] + [b"first"]
        c.process_data_events(0.2)
        assert len(got) == 21, "publishes sent while blocked reached the queue"

        n.call(n.broker.set_vm_memory_high_watermark, "0.95")
        pub.expect(spec.Connection.Unblocked, 0)
        acks = []
        while not acks or acks[-1].delivery_tag < 6:
            frame = pub.recv_frame()[1]
            assert isinstance(frame, spec.Basic.Ack), frame
            acks.append(frame)
        wait_until(lambda: c.process_data_events(0.05) or len(got) == 26, 10)
        assert got[21:] == [f"while{i}".encode() for i in range(5)]


def test_disk_free_alarm_and_the_store_alarm_are_separate(tmp_path):
    with InProcessNode(tmp_path) as n:
        pub = publisher(n)
        pub.publish(1, "", "nowhere", b"x")
        pub.recv_frame()
        n.call(n.broker.set_disk_free_limit, "1000TB")
        assert pub.expect(spec.Connection.Blocked, 0).reason == "low on disk"
        n.call(n.broker.set_alarm, "disk", True)          # as the store does on a failed write
        n.call(n.broker.set_disk_free_limit, "1MB")       # free space is fine again ...
        assert frames_until_quiet(pub) == []                # ... but the write alarm still blocks
        assert n.call(lambda: sorted(n.broker.alarms)) == ["disk"]
        n.call(n.broker.set_alarm, "disk", False)
        pub.expect(spec.Connection.Unblocked, 0)


def test_consumer_only_connection_is_not_blocked(tmp_path):
    with InProcessNode(tmp_path) as n:
        cons = raw_socket(n)
        cons.open_channel(1)
        n.call(n.broker.set_vm_memory_high_watermark, "1MB")
        cons.rpc(spec.Queue.Declare(queue="", exclusive=True), 1, spec.Queue.DeclareOk)
        assert frames_until_quiet(cons) == []      # no connection.blocked: it never published
        n.call(n.broker.set_vm_memory_high_watermark, "0.95")


def _partial_publish(client, channel: int, body_size: int, sent: bytes) -> None:
    """basic.publish, a content header for `body_size` bytes and the first `sent` of them."""
    from pamqp import frame as pframe
    from pamqp import header as pheader
    client.send_frames([spec.Basic.Publish(exchange="", routing_key="partial.q"),
                        pheader.ContentHeader(0, body_size, spec.Basic.Properties())], channel)
    if sent:
        client.send_bytes(pframe.marshal(ContentBody(sent), channel))


def test_a_partial_message_makes_a_publisher_that_the_memory_alarm_blocks(tmp_path):
    """A connection counts as publishing from its first content frame, not from its first whole
    message: one that only ever sends parts of messages is blocked (and not read) too."""
    with InProcessNode(tmp_path) as n:
        pub = raw_socket(n)
        pub.open_channel(1)
        n.call(n.broker.set_vm_memory_high_watermark, "1MB")      # far below our RSS
        assert frames_until_quiet(pub) == []          # not a publisher yet: not blocked
        _partial_publish(pub, 1, 10 << 20, b"x" * 1000)
        assert pub.expect(spec.Connection.Blocked, 0).reason == "low on memory"
        n.call(n.broker.set_vm_memory_high_watermark, "0.95")
        pub.expect(spec.Connection.Unblocked, 0)


def test_partial_bodies_are_bounded_per_connection(tmp_path):
    """Many channels, each holding the start of a large message: the bytes a connection holds in
    unfinished messages are bounded (one largest message's worth, 128 MiB); past that the
    connection is closed with 506 RESOURCE_ERROR, and a connection that stays under goes on."""
    from pamqp import frame as pframe

    from haremq.node.protocol.connection import MAX_MESSAGE_SIZE, MAX_PARTIAL_BYTES
    assert MAX_PARTIAL_BYTES <= MAX_MESSAGE_SIZE
    node = Node("hare-partial", tmp_path).start()
    try:
        pub = raw_socket(node)
        channels = range(1, 41)
        for channel in channels:
            pub.open_channel(channel)
        chunk = pframe.marshal(ContentBody(b"p" * (pub.frame_max - 8)), 1)
        per_channel = MAX_PARTIAL_BYTES // 32          # 40 channels of it go past the bound
        frames = per_channel // (pub.frame_max - 8)
        try:
            for channel in channels:
                _partial_publish(pub, channel, MAX_MESSAGE_SIZE, b"")
                frame = chunk[:1] + channel.to_bytes(2, "big") + chunk[3:]
                for _ in range(frames):
                    pub.send_bytes(frame)
        except OSError:
            pass            # closed under our feet: what we are checking for
        close = pub.expect_connection_close(30)
        assert close.reply_code == 506, close
        assert close.reply_text.startswith("RESOURCE_ERROR - unfinished messages on this connection hold"), close
        # a publisher under the bound on another connection is not affected
        ok = raw_socket(node)
        ok.open_channel(1)
        ok.rpc(spec.Queue.Declare(queue="partial.q"), 1, spec.Queue.DeclareOk)
        ok.rpc(spec.Confirm.Select(), 1, spec.Confirm.SelectOk)
        ok.publish(1, "", "partial.q", b"y" * (4 << 20))
        ok.expect(spec.Basic.Ack, 1, timeout=30)
    finally:
        node.stop()


class FlagNode(Node):
    def __init__(self, *args, extra=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.extra = list(extra)

    def argv(self):
        return super().argv() + self.extra


def test_watermark_flag_blocks_publishers_of_a_node(tmp_path):
    node = Node("hare-alarm", tmp_path).start()
    try:
        ch = pika_conn(node).channel()
        ch.confirm_delivery()
        ch.queue_declare("alarm.durable", durable=True)
        for i in range(10):
            ch.basic_publish("", "alarm.durable", b"m%d" % i, properties=pika.BasicProperties(delivery_mode=2))
        ch.connection.close()
    finally:
        node.stop()
    node = FlagNode("hare-alarm", tmp_path, port=node.port,
                    extra=["--vm-memory-high-watermark", "10MB", "--disk-free-limit", "50MB"]).start()
    try:
        blocked = []
        params = pika.ConnectionParameters(HOST, node.port, blocked_connection_timeout=30)
        pub = pika.BlockingConnection(params)
        _open_clients.append(pub)
        pub.add_on_connection_blocked_callback(lambda conn, frame: blocked.append(frame.method.reason))
        pub.channel().basic_publish("", "alarm.durable", b"blocked")
        wait_until(lambda: pub.process_data_events(0.05) or blocked, 10)
        assert blocked == ["low on memory"]
        c = pika_conn(node)
        ch = c.channel()
        got = []
        ch.basic_consume("alarm.durable", lambda c_, m, p, b: got.append(b), auto_ack=True)
        wait_until(lambda: c.process_data_events(0.05) or len(got) >= 10, 10)
        assert got[:10] == [b"m%d" % i for i in range(10)]
        assert "memory alarm set" in node.log_text()
    finally:
        node.stop()


def test_bad_threshold_is_refused_at_start(tmp_path):
    import subprocess
    from tests.conftest import free_port, haremq_command
    r = subprocess.run([*haremq_command(), "node", "--data-dir", str(tmp_path), "--amqp-port", str(free_port()),
                        "--disk-free-limit", "lots"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "'lots' is not a size" in r.stderr.strip().splitlines()[-1]


def test_alarm_reason_names_memory_and_disk():
    broker = Broker("unit")
    broker.set_alarm("disk_free", True)
    broker.set_alarm("memory", True)
    assert broker.alarm_reason() == "low on disk & low on memory"
    with pytest.raises(ValueError):
        broker.set_vm_memory_high_watermark("0.5")     # no monitor outside a node


def test_sizes_and_watermarks():
    from haremq.node.alarms import memory_limit, parse_size
    assert parse_size("50MB") == 50_000_000
    assert parse_size("1GiB") == 1 << 30
    assert parse_size("2k") == 2048 and parse_size("4096") == 4096
    assert memory_limit("0.4", total=1000) == 400
    assert memory_limit("1", total=1000) == 1000
    assert memory_limit("2GB", total=1000) == 2_000_000_000
    with pytest.raises(ValueError):
        parse_size("12 parsecs")
