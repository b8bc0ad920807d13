"""Fuzzing (ERR-1, ERR-2): random and mutated frames thrown at a node for a bounded time.

Hypothesis builds sequences of valid AMQP frames (handshake, channel,
queue, exchange, publish with content, consume, ack, tx, confirm, close)
and mutates them: bytes flipped or overwritten, frame types, channel ids
and size fields changed, bytes cut out or inserted; some connections get
pure random bytes. Each example is one TCP connection, with or without a
correct handshake first. Afterwards the node process must be alive, a new
connection must work, and every persistent message confirmed before the
fuzzing must still be there, also after a kill -9 and restart.
"""
import os
import socket
import struct
import time

import pika
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import body as pbody
from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp import heartbeat as pheartbeat

from tests.conftest import HOST, assert_node_healthy, message_count, needs_process, pika_conn

pytestmark = needs_process

FUZZ_SECONDS = float(os.environ.get("HAREMQ_FUZZ_SECONDS", "20"))
SAFE_QUEUE = "fuzz.safe"
SAFE_COUNT = 200
PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"


def _m(method, channel=1) -> bytes:
    return pframe.marshal(method, channel)


def _publish(channel=1, body=b"fuzz body", **props) -> bytes:
    return (_m(spec.Basic.Publish(exchange="", routing_key="fz.q"), channel)
            + pframe.marshal(pheader.ContentHeader(0, len(body), spec.Basic.Properties(**props)), channel)
            + pframe.marshal(pbody.ContentBody(body), channel))


HANDSHAKE_FRAMES = [
    _m(spec.Connection.StartOk(client_properties={"product": "fuzz"}, mechanism="PLAIN",
                               response="\x00guest\x00guest"), 0),
    _m(spec.Connection.TuneOk(channel_max=2047, frame_max=131072, heartbeat=0), 0),
    _m(spec.Connection.Open(virtual_host="/"), 0),
]
TEMPLATES = [
    _m(spec.Channel.Open()),
    _m(spec.Channel.Open(), 2),
    _m(spec.Queue.Declare(queue="fz.q", auto_delete=True)),
    _m(spec.Queue.Declare(queue="", exclusive=True, arguments={"x-max-length": 3, "x-message-ttl": 10})),
    _m(spec.Exchange.Declare(exchange="fz.x", exchange_type="topic", auto_delete=True)),
    _m(spec.Queue.Bind(queue="fz.q", exchange="fz.x", routing_key="#")),
    _m(spec.Basic.Qos(prefetch_size=0, prefetch_count=2, global_=False)),
    _m(spec.Confirm.Select()),
    _m(spec.Tx.Select()),
    _m(spec.Tx.Commit()),
    _m(spec.Basic.Consume(queue="fz.q", consumer_tag="fz")),
    _m(spec.Basic.Get(queue="fz.q")),
    _m(spec.Basic.Ack(delivery_tag=1)),
    _m(spec.Basic.Nack(delivery_tag=0, multiple=True, requeue=True)),
    _m(spec.Basic.Reject(delivery_tag=2, requeue=False)),
    _m(spec.Basic.Cancel(consumer_tag="fz")),
    _m(spec.Basic.Recover(requeue=True)),
    _m(spec.Queue.Purge(queue="fz.q")),
    _m(spec.Queue.Delete(queue="fz.q")),
    _m(spec.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)),
    _m(spec.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0), 0),
    pframe.marshal(pheartbeat.Heartbeat(), 0),
    _publish(),
    _publish(body=b"x" * 5000, delivery_mode=2, priority=3, expiration="100", headers={"h": [1, "a"]}),
    _publish(body=b""),
]

mutation = st.one_of(
    st.tuples(st.just("flip"), st.floats(0, 1), st.integers(1, 255)),
    st.tuples(st.just("set"), st.floats(0, 1), st.integers(0, 255)),
    st.tuples(st.just("cut"), st.floats(0, 1), st.integers(1, 64)),
    st.tuples(st.just("insert"), st.floats(0, 1), st.binary(min_size=1, max_size=32)),
    st.tuples(st.just("type"), st.integers(0, 40), st.sampled_from([0, 1, 2, 3, 4, 8, 9, 206, 255])),
    st.tuples(st.just("channel"), st.integers(0, 40), st.sampled_from([0, 1, 2, 3, 2047, 2048, 65535])),
    st.tuples(st.just("size"), st.integers(0, 40), st.sampled_from([0, 1, 7, 13, 4096, 131064, 131073,
                                                                    0x7FFFFFFF, 0xFFFFFFFF])),
)


def frame_starts(data: bytes) -> list[int]:
    """Offsets of the frames in a well-formed byte string (before mutation)."""
    starts, pos = [], 0
    while pos + 7 <= len(data):
        starts.append(pos)
        pos += struct.unpack_from(">I", data, pos + 3)[0] + 8
    return starts


def mutate(data: bytes, mutations) -> bytes:
    buf = bytearray(data)
    starts = frame_starts(data)
    for kind, where, value in mutations:
        if not buf:
            break
        if kind in ("type", "channel", "size"):
            if not starts:
                continue
            pos = starts[where % len(starts)]
            if kind == "type" and pos < len(buf):
                buf[pos] = value
            elif kind == "channel" and pos + 3 <= len(buf):
                buf[pos + 1:pos + 3] = struct.pack(">H", value)
            elif kind == "size" and pos + 7 <= len(buf):
                buf[pos + 3:pos + 7] = struct.pack(">I", value)
            continue
        pos = min(int(where * len(buf)), len(buf) - 1)
        if kind == "flip":
            buf[pos] ^= value
        elif kind == "set":
            buf[pos] = value
        elif kind == "cut":
            del buf[pos:pos + value]
        else:
            buf[pos:pos] = value
    return bytes(buf)


def handshake(sock: socket.socket) -> bool:
    """A correct handshake by hand; False if the node did not go along."""
    start_ok, tune_ok, open_ = HANDSHAKE_FRAMES
    try:
        sock.sendall(PROTOCOL_HEADER)
        read_some(sock, 1.0, want=1)            # connection.start
        sock.sendall(start_ok)
        read_some(sock, 1.0, want=1)            # connection.tune
        sock.sendall(tune_ok + open_)
        return bool(read_some(sock, 1.0, want=1))   # connection.open-ok
    except OSError:
        return False


def read_some(sock: socket.socket, timeout: float, want: int = 1 << 20) -> bytes:
    sock.settimeout(timeout)
    data = b""
    try:
        while len(data) < want:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except (socket.timeout, OSError):
        pass
    return data


@pytest.fixture(scope="module")
def fuzz_node(tmp_path_factory):
    from tests.conftest import _make_node
    node = _make_node(tmp_path_factory.mktemp("fuzz"), "hare-fuzz")
    conn = pika_conn(node)
    ch = conn.channel()
    ch.confirm_delivery()                     # every publish below is confirmed before we go on
    ch.queue_declare(SAFE_QUEUE, durable=True)
    for i in range(SAFE_COUNT):
        ch.basic_publish("", SAFE_QUEUE, f"safe-{i}".encode(), properties=pika.BasicProperties(delivery_mode=2))
    conn.close()
    yield node
    node.kill9()


def test_fuzzed_frames_leave_the_node_serving(fuzz_node):
    deadline = time.monotonic() + FUZZ_SECONDS
    stats = {"examples": 0}
    bystander = pika_conn(fuzz_node)               # "every other connection keeps working"
    by_ch = bystander.channel()
    by_q = by_ch.queue_declare("", exclusive=True).method.queue

    @settings(max_examples=100, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(do_handshake=st.booleans(),
           frames=st.lists(st.sampled_from(TEMPLATES), min_size=1, max_size=8),
           mutations=st.lists(mutation, max_size=4),
           noise=st.one_of(st.none(), st.binary(min_size=1, max_size=256)),
           header=st.sampled_from([PROTOCOL_HEADER, b"AMQP\x01\x01\x00\x09", b"AMQP\x00\x00\x08\x00",
                                   b"GET / HTTP/1.1\r\n\r\n", b""]))
    def fuzz_once(do_handshake, frames, mutations, noise, header):
        if time.monotonic() > deadline:
            return
        stats["examples"] += 1
        with socket.create_connection((HOST, fuzz_node.port), timeout=2) as sock:
            if do_handshake:
                if not handshake(sock):
                    return
                payload = mutate(b"".join(frames), mutations)
            else:
                payload = header + mutate(b"".join(HANDSHAKE_FRAMES + frames), mutations)
            if noise is not None:
                payload += noise
            try:
                sock.sendall(payload)
            except OSError:
                return
            read_some(sock, 0.02)
        if stats["examples"] % 50 == 0:     # the node is still there while it is being fuzzed
            fuzz_node.assert_alive()
            by_ch.basic_publish("", by_q, b"still here")
            assert by_ch.basic_get(by_q, auto_ack=True)[2] == b"still here"

    while time.monotonic() < deadline:       # rounds of fresh random examples until time is up
        fuzz_once()
        bystander.process_data_events(0)
    print("fuzz examples:", stats["examples"])
    assert stats["examples"] > 50, f"only {stats['examples']} examples ran"
    fuzz_node.assert_alive()
    by_ch.basic_publish("", by_q, b"after")
    assert by_ch.basic_get(by_q, auto_ack=True)[2] == b"after"
    assert_node_healthy(fuzz_node)
    ch = pika_conn(fuzz_node).channel()
    assert message_count(ch, SAFE_QUEUE) == SAFE_COUNT

    # confirmed means durable: still all there after a crash
    fuzz_node.kill9()
    fuzz_node.start()
    ch = pika_conn(fuzz_node).channel()
    bodies = []
    while True:
        m, _, b = ch.basic_get(SAFE_QUEUE, auto_ack=True)
        if m is None:
            break
        bodies.append(b)
    assert bodies == [f"safe-{i}".encode() for i in range(SAFE_COUNT)]
