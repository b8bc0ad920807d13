"""Wire-level details real clients depend on, frame by frame (issue 17).

Each one was found by a client written for RabbitMQ (named in the test) and
is checked here with raw frames, so it holds whatever the client does; the
client modules (tests/test_client_*.py) drive the clients themselves.
"""
from __future__ import annotations

import struct
import time

import pytest
from pamqp import commands as spec
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp import heartbeat as pheartbeat

from tests.conftest import IS_REF, PeerClosed, pika_conn, raw_socket, unique_name

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"


def expect_clean_eof(c, timeout: float = 10.0) -> list:
    """Frames until the broker closes the socket, which must be a FIN, never a reset.

    HareMQ's own rule, stricter than RabbitMQ 3.10, which after close-ok waits for the client
    to close (up to 30 s) and after a refused login closes 3 s later whatever is unread."""
    if IS_REF:
        c.close()
        return []
    frames = []
    while True:
        try:
            frames.append(c.recv_frame(timeout, skip_heartbeats=False)[1])
        except PeerClosed as e:
            assert str(e) == "EOF", f"the broker reset the connection instead of closing it ({e})"
            return frames


def body_frame(channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", 3, channel, len(payload)) + payload + b"\xce"


def publish_with_body_frame(channel: int, queue: str, payload: bytes) -> bytes:
    """basic.publish + header + one body frame of exactly `payload` (pamqp would split it)."""
    return (pframe.marshal(spec.Basic.Publish(exchange="", routing_key=queue), channel)
            + pframe.marshal(pheader.ContentHeader(0, len(payload), spec.Basic.Properties()), channel)
            + body_frame(channel, payload))


# ------------------------------------------------------------------ 1. body frames of frame_max

def test_body_frame_with_frame_max_payload_is_accepted(node):
    # rabbitpy sends body frames whose payload is frame_max bytes; RabbitMQ accepts them
    c = raw_socket(node, frame_max=4096)
    c.open_channel(1)
    q = c.rpc(spec.Queue.Declare(queue="", exclusive=True), 1, spec.Queue.DeclareOk).queue
    c.send_bytes(publish_with_body_frame(1, q, b"b" * 4096))
    c.send_frame(spec.Basic.Get(queue=q, no_ack=True), 1)
    c.expect(spec.Basic.GetOk, 1)
    _, body = c.read_message()
    assert body == b"b" * 4096


def test_body_frame_over_frame_max_payload_is_501(node):
    c = raw_socket(node, frame_max=4096)
    c.open_channel(1)
    q = c.rpc(spec.Queue.Declare(queue="", exclusive=True), 1, spec.Queue.DeclareOk).queue
    c.send_bytes(publish_with_body_frame(1, q, b"b" * 4097))
    close = c.expect_connection_close()
    assert (close.reply_code, close.reply_text) == (
        501, "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,4097,4088}")


# ------------------------------------------------------------------ 2. refused login

@pytest.mark.parametrize("user,password", [("guest", "wrong"), ("nosuchuser", "guest")])
def test_refused_login_close_waits_for_close_ok_and_never_resets(node, user, password):
    # rabbitpy reads connection.close 403 and answers close-ok; the broker must not reset the
    # socket under it (bytes it sent after the close must be read, not answered with RST)
    c = raw_socket(node, handshake=False)
    c.send_bytes(PROTOCOL_HEADER)
    c.expect(spec.Connection.Start, 0)
    c.send_frame(spec.Connection.StartOk(client_properties={"capabilities": {
        "authentication_failure_close": True}}, mechanism="PLAIN", response=f"\x00{user}\x00{password}"))
    _, close = c.recv_frame()
    assert isinstance(close, spec.Connection.Close), close
    assert (close.reply_code, close.reply_text) == (
        403, "ACCESS_REFUSED - Login was refused using authentication mechanism PLAIN. "
             "For details see the broker logfile.")
    c.send_bytes(pframe.marshal(pheartbeat.Heartbeat(), 0) + pframe.marshal(spec.Connection.CloseOk(), 0))
    assert expect_clean_eof(c) == []


# ------------------------------------------------------------------ 3. queue.delete under a consumer

@pytest.mark.parametrize("kind", ["plain", "exclusive", "auto_delete", "durable"])
def test_queue_delete_ok_comes_before_the_cancel_of_own_consumers(node, kind):
    # kombu and amqplib wait for delete-ok; a basic.cancel before it fails their call
    c = raw_socket(node)
    c.open_channel(1)
    q = c.rpc(spec.Queue.Declare(queue=unique_name("del"), exclusive=kind == "exclusive",
                                 auto_delete=kind == "auto_delete", durable=kind == "durable"),
              1, spec.Queue.DeclareOk).queue
    c.rpc(spec.Basic.Consume(queue=q, consumer_tag="ct-1"), 1, spec.Basic.ConsumeOk)
    c.rpc(spec.Basic.Consume(queue=q, consumer_tag="ct-2"), 1, spec.Basic.ConsumeOk)
    c.send_frame(spec.Queue.Delete(queue=q), 1)
    c.expect(spec.Queue.DeleteOk, 1)
    cancelled = {c.expect(spec.Basic.Cancel, 1).consumer_tag for _ in range(2)}
    assert cancelled == {"ct-1", "ct-2"}


def test_queue_delete_from_another_channel_cancels_consumers(node):
    c = raw_socket(node)
    c.open_channel(1)
    c.open_channel(2)
    q = c.rpc(spec.Queue.Declare(queue="", exclusive=True), 1, spec.Queue.DeclareOk).queue
    c.rpc(spec.Basic.Consume(queue=q, consumer_tag="ct-1"), 1, spec.Basic.ConsumeOk)
    c.send_frame(spec.Queue.Delete(queue=q), 2)
    frames = {type(c.recv_frame()[1]) for _ in range(2)}
    assert frames == {spec.Queue.DeleteOk, spec.Basic.Cancel}


# ------------------------------------------------------------------ 4. close after a flood

def test_close_ok_after_the_frames_before_it_are_handled(node):
    # a durable declare holds the channel until it is on disk: the publishes behind it wait,
    # and the connection.close behind them gets its close-ok only once they are in the queue
    q = unique_name("flood")
    c = raw_socket(node)
    c.open_channel(1)
    n = 200
    data = [pframe.marshal(spec.Queue.Declare(queue=q, durable=True), 1)]
    data += [c.publish_bytes(1, "", q, b"m%d" % i) for i in range(n)]
    data.append(pframe.marshal(spec.Connection.Close(200, "bye", 0, 0), 0))
    c.send_bytes(b"".join(data))
    _, frame, _ = c.recv_until(spec.Connection.CloseOk)
    assert expect_clean_eof(c) == []
    ch = pika_conn(node).channel()
    try:
        assert ch.queue_declare(q, passive=True).method.message_count == n
    finally:
        ch.queue_delete(q)


def test_frames_after_connection_close_are_read_not_reset(node):
    # amqplib's connection.close can overtake publishes still in its socket buffer (it
    # multiplexes channels): the broker ignores them, answers close-ok and closes cleanly
    q = unique_name("after")
    c = raw_socket(node)
    c.open_channel(1)
    c.rpc(spec.Queue.Declare(queue=q, exclusive=False, auto_delete=False), 1, spec.Queue.DeclareOk)
    before = b"".join(c.publish_bytes(1, "", q, b"x" * 1000) for _ in range(10))
    after = b"".join(c.publish_bytes(1, "", q, b"y" * 1000) for _ in range(2000))
    c.send_bytes(before + pframe.marshal(spec.Connection.Close(200, "bye", 0, 0), 0) + after)
    c.recv_until(spec.Connection.CloseOk)
    assert expect_clean_eof(c) == []
    ch = pika_conn(node).channel()
    try:
        assert ch.queue_declare(q, passive=True).method.message_count == 10
    finally:
        ch.queue_delete(q)


# ------------------------------------------------------------------ 5. channel_max is a count

def test_any_channel_id_opens_and_channel_max_counts_open_channels(node):
    # aiormq opens channel 65535 on a connection that negotiated channel_max 2047
    c = raw_socket(node, channel_max=3)
    for channel in (65535, 2, 300):
        c.open_channel(channel)
    c.rpc(spec.Channel.Close(200, "", 0, 0), 2, spec.Channel.CloseOk)
    c.open_channel(7)
    c.send_frame(spec.Channel.Open(), 8)
    close = c.expect_connection_close()
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        530, "NOT_ALLOWED - number of channels opened (3) has reached the negotiated channel_max (3)", 0, 0)


def test_channel_65535_with_the_default_channel_max(node):
    c = raw_socket(node)
    c.open_channel(65535)
    q = c.rpc(spec.Queue.Declare(queue="", exclusive=True), 65535, spec.Queue.DeclareOk).queue
    c.publish(65535, "", q, b"hi")
    c.send_frame(spec.Basic.Get(queue=q, no_ack=True), 65535)
    c.expect(spec.Basic.GetOk, 65535)
    assert c.read_message()[1] == b"hi"


# ------------------------------------------------------------------ 6. auto-delete exchanges

def _exchange_exists(c, name: str, channel: int) -> bool:
    c.open_channel(channel)
    c.send_frame(spec.Exchange.Declare(exchange=name, passive=True), channel)
    _, frame = c.recv_frame()
    if isinstance(frame, spec.Channel.Close):
        assert frame.reply_code == 404, frame.reply_text
        c.send_frame(spec.Channel.CloseOk(), channel)
        return False
    assert isinstance(frame, spec.Exchange.DeclareOk), frame
    c.rpc(spec.Channel.Close(200, "", 0, 0), channel, spec.Channel.CloseOk)
    return True


def test_auto_delete_cascades_through_source_bindings_and_unbind_of_gone_is_ok(node):
    # aio-pika: S -> D -> queue, all auto-delete exchanges. Unbinding the queue removes D's last
    # binding as a source, so D goes; that removes S's last binding as a source, so S goes too
    # (RabbitMQ 3.10 does the same). Unbinding D from S afterwards is unbind-ok, not 404.
    c = raw_socket(node)
    c.open_channel(1)
    s, d = unique_name("S"), unique_name("D")
    for name in (s, d):
        c.rpc(spec.Exchange.Declare(exchange=name, exchange_type="direct", auto_delete=True), 1,
              spec.Exchange.DeclareOk)
    c.rpc(spec.Exchange.Bind(destination=d, source=s, routing_key="k"), 1, spec.Exchange.BindOk)
    q = c.rpc(spec.Queue.Declare(queue="", exclusive=True), 1, spec.Queue.DeclareOk).queue
    c.rpc(spec.Queue.Bind(queue=q, exchange=d, routing_key="k"), 1, spec.Queue.BindOk)
    c.publish(1, s, "k", b"through")
    c.rpc(spec.Queue.Unbind(queue=q, exchange=d, routing_key="k"), 1, spec.Queue.UnbindOk)
    assert not _exchange_exists(c, d, 2)
    assert not _exchange_exists(c, s, 3)
    c.rpc(spec.Exchange.Unbind(destination=d, source=s, routing_key="k"), 1, spec.Exchange.UnbindOk)
    c.send_frame(spec.Basic.Get(queue=q, no_ack=True), 1)
    c.expect(spec.Basic.GetOk, 1)
    assert c.read_message()[1] == b"through"


def test_removing_a_destination_binding_does_not_auto_delete_the_destination(node):
    c = raw_socket(node)
    c.open_channel(1)
    s, d = unique_name("S"), unique_name("D")
    for name in (s, d):
        c.rpc(spec.Exchange.Declare(exchange=name, exchange_type="fanout", auto_delete=True), 1,
              spec.Exchange.DeclareOk)
    c.rpc(spec.Exchange.Bind(destination=d, source=s, routing_key=""), 1, spec.Exchange.BindOk)
    c.rpc(spec.Exchange.Unbind(destination=d, source=s, routing_key=""), 1, spec.Exchange.UnbindOk)
    assert not _exchange_exists(c, s, 2)     # its last binding as a source went
    assert _exchange_exists(c, d, 3)         # it never had one: a destination binding does not count
    c.rpc(spec.Exchange.Delete(exchange=d), 1, spec.Exchange.DeleteOk)


@pytest.mark.parametrize("gone", ["source", "destination", "both"])
def test_exchange_unbind_with_a_missing_exchange_is_ok(node, gone):
    c = raw_socket(node)
    c.open_channel(1)
    s, d = unique_name("S"), unique_name("D")
    for name, missing in ((s, gone in ("source", "both")), (d, gone in ("destination", "both"))):
        if not missing:
            c.rpc(spec.Exchange.Declare(exchange=name, exchange_type="direct", auto_delete=False), 1,
                  spec.Exchange.DeclareOk)
    c.rpc(spec.Exchange.Unbind(destination=d, source=s, routing_key="k"), 1, spec.Exchange.UnbindOk)
    for name in (s, d):
        c.rpc(spec.Exchange.Delete(exchange=name), 1, spec.Exchange.DeleteOk)


def test_exchange_unbind_from_the_default_exchange_is_403(node):
    c = raw_socket(node)
    c.open_channel(1)
    c.send_frame(spec.Exchange.Unbind(destination="amq.direct", source="", routing_key="k"), 1)
    close = c.expect_channel_close(1)
    assert (close.reply_code, close.reply_text) == (
        403, "ACCESS_REFUSED - operation not permitted on the default exchange")



@pytest.mark.cluster(failure_timeout=1.5, shared=True)
@pytest.mark.parametrize("home", ["hare1", "hare2"])
def test_queue_delete_ok_before_cancel_in_a_cluster(cluster, home):
    # the channel is on hare1; the queue lives on `home` (through a link when it is hare2)
    members = {m.name: m for m in cluster}
    q = unique_name("cdel")
    d = raw_socket(members[home])
    d.open_channel(1)
    d.rpc(spec.Queue.Declare(queue=q, durable=False, auto_delete=False), 1, spec.Queue.DeclareOk)
    c = raw_socket(members["hare1"])
    c.open_channel(1)
    c.rpc(spec.Basic.Consume(queue=q, consumer_tag="ct-1"), 1, spec.Basic.ConsumeOk)
    c.send_frame(spec.Queue.Delete(queue=q), 1)
    c.expect(spec.Queue.DeleteOk, 1, timeout=15)
    assert c.expect(spec.Basic.Cancel, 1, timeout=15).consumer_tag == "ct-1"


# ------------------------------------------------------------------ 7. closes that cross

def _frames_until(c, cls, channel: int, timeout: float = 5.0) -> list:
    """(channel, frame) pairs up to and including the first `cls` on `channel`."""
    seen = []
    deadline = time.monotonic() + timeout
    while True:
        ch, frame = c.recv_frame(max(0.01, deadline - time.monotonic()))
        seen.append((ch, frame))
        if isinstance(frame, cls) and ch == channel:
            return seen


def _still_works(c, channel: int) -> None:
    c.rpc(spec.Queue.Declare(queue="", exclusive=True), channel, spec.Queue.DeclareOk)


@pytest.mark.parametrize("order", ["crossing", "not_crossing", "close_after_close_ok"])
def test_channel_close_crossing_the_servers(node, order):
    # amqp091-go (TestChannelExceptionWithCloseIssue43): a publish to a missing exchange, then
    # Channel.Close(); the server's channel.close 404 and the client's cross. As in RabbitMQ, the
    # client's close gets close-ok and the channel stays closing until the client's close-ok; the
    # connection and channel 2 go on. Not crossing: the client answers the 404 and sends no close.
    # A close after the close-ok is on a channel that is not open: 504, as RabbitMQ 3.10 answers it.
    c = raw_socket(node)
    c.open_channel(1)
    c.open_channel(2)
    c.publish(1, unique_name("missing"), "k", b"lost")
    close = c.expect(spec.Channel.Close, 1)
    assert close.reply_code == 404
    if order == "close_after_close_ok":
        c.send_bytes(pframe.marshal(spec.Channel.CloseOk(), 1) + pframe.marshal(spec.Channel.Close(200, "", 0, 0), 1))
        close = c.expect_connection_close()
        assert (close.reply_code, close.reply_text) == (504, "CHANNEL_ERROR - expected 'channel.open'")
        return
    if order == "crossing":
        c.send_frame(spec.Channel.Close(200, "", 0, 0), 1)        # sent before the 404 was read
        c.expect(spec.Channel.CloseOk, 1)
    c.send_frame(spec.Channel.CloseOk(), 1)                       # the answer to the 404
    _still_works(c, 2)
    c.open_channel(1)
    _still_works(c, 1)
    assert not [f for _ch, f in c.received if isinstance(f, spec.Connection.Close)]


def test_crossing_closes_on_the_same_read(node):
    # the publish and the client's close reach the server together: 404 first (the publish came
    # first), then close-ok for the client's close; the channel is gone at the client's close-ok
    c = raw_socket(node)
    c.open_channel(1)
    c.open_channel(2)
    c.send_bytes(c.publish_bytes(1, unique_name("missing"), "k", b"lost")
                 + pframe.marshal(spec.Channel.Close(200, "", 0, 0), 1))
    seen = _frames_until(c, spec.Channel.CloseOk, 1)
    assert [(ch, type(f)) for ch, f in seen] == [(1, spec.Channel.Close), (1, spec.Channel.CloseOk)]
    assert seen[0][1].reply_code == 404
    c.send_frame(spec.Channel.CloseOk(), 1)
    _still_works(c, 2)
    c.open_channel(1)
    _still_works(c, 1)
    assert not [f for _ch, f in c.received if isinstance(f, spec.Connection.Close)]


def _consuming_with_prefetch_one(c, channel: int, messages: int) -> str:
    q = c.rpc(spec.Queue.Declare(queue=unique_name("race")), channel, spec.Queue.DeclareOk).queue
    for i in range(messages):
        c.publish(channel, "", q, b"m%d" % i)
    c.rpc(spec.Basic.Qos(prefetch_count=1), channel, spec.Basic.QosOk)
    c.rpc(spec.Basic.Consume(queue=q, consumer_tag="ct"), channel, spec.Basic.ConsumeOk)
    deliver = c.expect(spec.Basic.Deliver, channel)
    assert deliver.delivery_tag == 1
    c.read_message()
    return q


def _after(frames: list, channel: int, cls) -> list:
    """The frames on `channel` after the first `cls` on it."""
    for i, (ch, frame) in enumerate(frames):
        if ch == channel and isinstance(frame, cls):
            return [(c, f) for c, f in frames[i + 1:] if c == channel]
    raise AssertionError(f"no {cls.__name__} on channel {channel} in {frames}")


def test_nothing_follows_close_ok_on_its_channel(node):
    # kombu's test_ack_from_another_thread (py-amqp's KeyError: 1): an ack and the channel's close
    # arrive together; the ack frees the prefetch, but the next delivery must come before the
    # close-ok or not at all: py-amqp forgets the channel at close-ok
    c = raw_socket(node)
    c.open_channel(1)
    c.open_channel(2)
    q = _consuming_with_prefetch_one(c, 1, 3)
    c.send_bytes(pframe.marshal(spec.Basic.Ack(delivery_tag=1), 1) + pframe.marshal(spec.Channel.Close(200, "", 0, 0), 1))
    frames = _frames_until(c, spec.Channel.CloseOk, 1)
    c.send_frame(spec.Queue.Declare(queue=q, passive=True), 2)
    frames += _frames_until(c, spec.Queue.DeclareOk, 2)
    assert _after(frames, 1, spec.Channel.CloseOk) == []
    assert frames[-1][1].message_count == 2                 # the unacked delivery went back
    c.rpc(spec.Queue.Delete(queue=q), 2, spec.Queue.DeleteOk)


def test_a_confirm_ready_at_the_close_goes_before_close_ok(node):
    c = raw_socket(node)
    c.open_channel(1)
    q = c.rpc(spec.Queue.Declare(queue="", exclusive=True), 1, spec.Queue.DeclareOk).queue
    c.rpc(spec.Confirm.Select(), 1, spec.Confirm.SelectOk)
    c.send_bytes(c.publish_bytes(1, "", q, b"x") + pframe.marshal(spec.Channel.Close(200, "", 0, 0), 1))
    frames = _frames_until(c, spec.Channel.CloseOk, 1)
    assert [type(f) for _ch, f in frames] in ([spec.Basic.Ack, spec.Channel.CloseOk], [spec.Channel.CloseOk])
    c.open_channel(1)
    _still_works(c, 1)


@pytest.mark.skipif(IS_REF, reason="RabbitMQ checks a message's size once its body is in")
def test_nothing_but_close_ok_follows_the_servers_channel_close(node):
    # an ack and then an error found while reading the channel's frames (a message over the
    # size limit), in one read: the delivery the ack allows comes before the channel.close or
    # not at all, and the channel's consumer is gone once the close is sent
    c = raw_socket(node)
    c.open_channel(1)
    c.open_channel(2)
    q = _consuming_with_prefetch_one(c, 1, 3)
    too_large = pframe.marshal(spec.Basic.Publish(exchange="", routing_key=q), 1) + struct.pack(
        ">BHIHHQH", 2, 1, 14, 60, 0, 200 * 1024 * 1024, 0) + b"\xce"
    c.send_bytes(pframe.marshal(spec.Basic.Ack(delivery_tag=1), 1) + too_large)
    frames = _frames_until(c, spec.Channel.Close, 1)
    assert frames[-1][1].reply_code == 406
    c.send_frame(spec.Channel.CloseOk(), 1)
    c.publish(2, "", q, b"after the close")
    c.send_frame(spec.Queue.Declare(queue=q, passive=True), 2)
    frames += _frames_until(c, spec.Queue.DeclareOk, 2)
    assert _after(frames, 1, spec.Channel.Close) == []
    assert frames[-1][1].message_count == 3                 # nobody consumes it any more
    c.rpc(spec.Queue.Delete(queue=q), 2, spec.Queue.DeleteOk)


def test_channel_close_ok_after_the_frames_before_it_are_handled(node):
    # as for connection.close (above): a durable declare holds the channel until it is on disk,
    # and the publishes behind it, then the channel's close, wait; close-ok once they are queued
    q = unique_name("chflood")
    c = raw_socket(node)
    c.open_channel(1)
    n = 200
    data = [pframe.marshal(spec.Queue.Declare(queue=q, durable=True), 1)]
    data += [c.publish_bytes(1, "", q, b"m%d" % i) for i in range(n)]
    data.append(pframe.marshal(spec.Channel.Close(200, "", 0, 0), 1))
    c.send_bytes(b"".join(data))
    frames = _frames_until(c, spec.Channel.CloseOk, 1)
    assert [type(f) for _ch, f in frames] == [spec.Queue.DeclareOk, spec.Channel.CloseOk]
    c.open_channel(1)
    assert c.rpc(spec.Queue.Declare(queue=q, passive=True), 1, spec.Queue.DeclareOk).message_count == n
    c.rpc(spec.Queue.Delete(queue=q), 1, spec.Queue.DeleteOk)


def test_an_error_in_a_held_channel_crosses_its_close(node):
    # the publish to a missing exchange waits behind a durable declare, the channel's close behind
    # it: declare-ok, the 404's channel.close, then close-ok for the client's close; the client's
    # close-ok ends the channel
    c = raw_socket(node)
    c.open_channel(1)
    q = unique_name("held")
    c.send_bytes(pframe.marshal(spec.Queue.Declare(queue=q, durable=True), 1)
                 + c.publish_bytes(1, unique_name("missing"), "k", b"lost")
                 + pframe.marshal(spec.Channel.Close(200, "", 0, 0), 1))
    frames = _frames_until(c, spec.Channel.CloseOk, 1)
    assert [type(f) for _ch, f in frames] == [spec.Queue.DeclareOk, spec.Channel.Close, spec.Channel.CloseOk]
    assert frames[1][1].reply_code == 404
    c.send_frame(spec.Channel.CloseOk(), 1)
    c.open_channel(1)
    c.rpc(spec.Queue.Delete(queue=q), 1, spec.Queue.DeleteOk)
