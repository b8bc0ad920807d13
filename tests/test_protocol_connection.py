"""The connection state machine without sockets: bytes in, frames and state out (issue 17)."""
from __future__ import annotations

import random
import struct

from pamqp import commands as spec
from pamqp import frame as pframe

from haremq.node.protocol.connection import AMQPConnection, State
from haremq.node.protocol.frames import FrameReader
from haremq.node.protocol.replies import AMQPError, ReplyCode

HEADER = b"AMQP\x00\x00\x09\x01"


def frames_of(data: bytes) -> list:
    out = []
    while data:
        used, _channel, frame = pframe.unmarshal(data)
        out.append(frame)
        data = data[used:]
    return out


def connection(password: str = "guest") -> AMQPConnection:
    conn = AMQPConnection(lambda user, pw, _peer: user if pw == "guest" else None,
                          lambda _user, _vhost: None, "127.0.0.1")
    conn.receive_data(HEADER + pframe.marshal(spec.Connection.StartOk(
        client_properties={}, mechanism="PLAIN", response=f"\x00guest\x00{password}"), 0))
    return conn


def opened(channel_max: int = 2047) -> AMQPConnection:
    conn = connection()
    conn.receive_data(pframe.marshal(spec.Connection.TuneOk(channel_max, 131072, 0), 0)
                      + pframe.marshal(spec.Connection.Open("/"), 0))
    conn.data_to_send()
    assert conn.state is State.OPEN
    return conn


def test_frame_reader_limit_is_on_the_payload():
    reader = FrameReader(4096)
    ok = b"\x03\x00\x01" + (4096).to_bytes(4, "big") + b"x" * 4096 + b"\xce"
    frames, err = reader.feed(ok)
    assert err is None and len(frames) == 1
    frames, err = reader.feed(b"\x03\x00\x01" + (4097).to_bytes(4, "big"))
    assert frames == [] and err.text.endswith("{frame_too_large,4097,4088}")


def test_frame_reader_gives_the_same_frames_however_the_stream_is_split():
    rng = random.Random(7)
    frames = [(rng.choice((1, 2, 3, 8)), rng.randint(0, 5), rng.randbytes(rng.choice((0, 1, 7, 1000, 70000))))
              for _ in range(300)]
    stream = b"".join(struct.pack(">BHI", t, c, len(p)) + p + b"\xce" for t, c, p in frames)
    for _trial in range(5):
        reader, got, pos = FrameReader(131072), [], 0
        while pos < len(stream):
            n = rng.choice((1, 3, 7, 8, 100, 4096, 65536, 200000))
            out, err = reader.feed(stream[pos:pos + n])
            assert err is None
            got.extend(out)
            pos += n
        assert got == frames


def _raw_frame(ftype: int, channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + b"\xce"


def _publish_frames(channel: int, body: bytes, size: int | None = None, body_frames: int = 1,
                    header_channel: int | None = None) -> list[bytes]:
    size = len(body) if size is None else size
    out = [pframe.marshal(spec.Basic.Publish(exchange="x", routing_key="k"), channel),
           _raw_frame(2, channel if header_channel is None else header_channel,
                      struct.pack(">HHQ", 60, 0, size) + b"\x10\x00\x02")]
    step = max(1, -(-len(body) // body_frames))
    out += [_raw_frame(3, channel, body[i:i + step]) for i in range(0, len(body), step)]
    return out


def _events_and_output(chunks: list[bytes]) -> list:
    conn = opened()
    for channel in (1, 2):
        conn.receive_data(pframe.marshal(spec.Channel.Open(), channel))
    conn.data_to_send()
    seen = []
    for chunk in chunks:
        for event in conn.receive_data(chunk):
            seen.append((type(event).__name__, getattr(event, "channel", None),
                         getattr(getattr(event, "publish", None), "routing_key", None),
                         getattr(event, "props_raw", None), getattr(event, "body", None)))
    sent = [(type(f).__name__, sorted(vars(f).items())) for f in frames_of(conn.data_to_send())]
    return seen + [sent, conn.state]


def test_a_publish_read_whole_is_the_same_as_frame_by_frame():
    # a publish whose frames come in one read is one event at once; every odd case (a header on
    # another channel, a body in several frames or of the wrong size, an empty body frame, a bad
    # method) must end as it does when the frames arrive one read each
    cases = [
        _publish_frames(1, b"hello") + _publish_frames(2, b"") + _publish_frames(1, b"x" * 300, body_frames=3),
        _publish_frames(1, b"abc", size=5) + _publish_frames(1, b"de"),
        _publish_frames(1, b"abc", size=2),
        _publish_frames(1, b"", size=0) + [_raw_frame(3, 1, b"")],
        _publish_frames(1, b"abc", header_channel=2),
        [_raw_frame(1, 1, b"\x00\x3c\x00\x28\x00\x00\xff")] + _publish_frames(1, b"abc")[1:]
        + _publish_frames(2, b"after"),
    ]
    for frames in cases:
        assert _events_and_output([b"".join(frames)]) == _events_and_output(frames), frames


def test_refused_login_waits_for_close_ok():
    conn = connection(password="wrong")
    close = frames_of(conn.data_to_send())[-1]
    assert isinstance(close, spec.Connection.Close) and close.reply_code == 403
    assert conn.state is State.CLOSING
    conn.receive_data(pframe.marshal(spec.Connection.CloseOk(), 0))
    assert conn.state is State.CLOSED


def test_client_close_is_answered_only_when_the_session_says_so():
    conn = opened()
    conn.receive_data(pframe.marshal(spec.Connection.Close(200, "bye", 0, 0), 0)
                      + pframe.marshal(spec.Channel.Open(), 1))   # after the close: ignored
    assert conn.state is State.CLOSE_RECEIVED and conn.data_to_send() == b""
    conn.close_ok()
    assert [type(f) for f in frames_of(conn.data_to_send())] == [spec.Connection.CloseOk]
    assert conn.state is State.CLOSED


def test_channel_max_counts_open_channels():
    conn = opened(channel_max=2)
    conn.receive_data(pframe.marshal(spec.Channel.Open(), 65535) + pframe.marshal(spec.Channel.Open(), 9))
    assert [type(f) for f in frames_of(conn.data_to_send())] == [spec.Channel.OpenOk] * 2
    conn.receive_data(pframe.marshal(spec.Channel.Open(), 10))
    close = frames_of(conn.data_to_send())[-1]
    assert (close.reply_code, close.reply_text) == (
        530, "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)")


def _types(conn: AMQPConnection) -> list:
    return [type(f) for f in frames_of(conn.data_to_send())]


def _opened_with(*channels: int) -> AMQPConnection:
    conn = opened()
    for channel in channels:
        conn.receive_data(pframe.marshal(spec.Channel.Open(), channel))
    conn.data_to_send()
    return conn


def test_channel_close_ok_waits_for_the_session_and_nothing_follows_it():
    conn = _opened_with(1)
    got = conn.receive_data(pframe.marshal(spec.Basic.Ack(delivery_tag=1), 1)
                            + pframe.marshal(spec.Channel.Close(200, "", 0, 0), 1)
                            + pframe.marshal(spec.Basic.Qos(prefetch_count=1), 1))   # after the close: dropped
    assert [type(e).__name__ for e in got] == ["MethodReceived", "ChannelClosedByPeer"]
    assert conn.data_to_send() == b""           # the ack's consequences go out first
    conn.channel_close_ok(1)
    conn.channel_close_ok(1)                    # answered once
    assert _types(conn) == [spec.Channel.CloseOk]
    assert conn.receive_data(pframe.marshal(spec.Channel.Open(), 1))   # the number is free again
    assert _types(conn) == [spec.Channel.OpenOk]


def test_crossing_channel_closes():
    # RabbitMQ's closing channel: the client's close gets close-ok, the client's close-ok ends it,
    # every other frame on it is discarded
    conn = _opened_with(1, 2)
    conn.close_channel(1, AMQPError(ReplyCode.NOT_FOUND, "NOT_FOUND - no exchange 'x' in vhost '/'", 60, 40))
    assert _types(conn) == [spec.Channel.Close]
    assert conn.receive_data(pframe.marshal(spec.Channel.Close(200, "", 0, 0), 1)
                             + pframe.marshal(spec.Basic.Qos(prefetch_count=1), 1)) == []
    assert _types(conn) == [spec.Channel.CloseOk]
    assert not conn.is_channel_usable(1) and 1 in conn.open_channels()
    conn.receive_data(pframe.marshal(spec.Channel.CloseOk(), 1) + pframe.marshal(spec.Channel.Open(), 1))
    assert _types(conn) == [spec.Channel.OpenOk] and conn.state is State.OPEN
    assert conn.open_channels() == [2, 1]


def test_a_channel_error_while_reading_is_closed_by_the_session_in_order():
    conn = _opened_with(1)
    too_large = pframe.marshal(spec.Basic.Publish(exchange="", routing_key="q"), 1) + struct.pack(
        ">BHIHHQH", 2, 1, 14, 60, 0, 200 * 1024 * 1024, 0) + b"\xce"
    got = conn.receive_data(pframe.marshal(spec.Basic.Ack(delivery_tag=1), 1) + too_large
                            + pframe.marshal(spec.Basic.Qos(prefetch_count=1), 1)
                            + pframe.marshal(spec.Channel.Close(200, "", 0, 0), 1))
    assert [type(e).__name__ for e in got] == ["MethodReceived", "ChannelFailed"]
    assert got[1].error.code == ReplyCode.PRECONDITION_FAILED and conn.data_to_send() == b""
    conn.close_channel(1, got[1].error)       # the session, once the ack is handled
    assert _types(conn) == [spec.Channel.Close, spec.Channel.CloseOk]   # the client's close, answered
    conn.receive_data(pframe.marshal(spec.Channel.CloseOk(), 1))
    assert conn.open_channels() == [] and conn.state is State.OPEN


def test_a_channel_error_after_the_clients_close_is_answered_with_both():
    # the session fails a channel whose close it has not handled yet (a frame before the close
    # failed): our channel.close, then close-ok for the client's; the client's close-ok ends it
    conn = _opened_with(1)
    got = conn.receive_data(pframe.marshal(spec.Channel.Close(200, "", 0, 0), 1))
    assert [type(e).__name__ for e in got] == ["ChannelClosedByPeer"]
    conn.close_channel(1, AMQPError(ReplyCode.NOT_FOUND, "NOT_FOUND - no exchange 'x' in vhost '/'", 60, 40))
    conn.channel_close_ok(1)                  # the session's answer to the close comes to nothing
    assert _types(conn) == [spec.Channel.Close, spec.Channel.CloseOk]
    conn.receive_data(pframe.marshal(spec.Channel.CloseOk(), 1))
    assert conn.open_channels() == [] and conn.state is State.OPEN


def test_partial_bodies_are_counted_over_the_connection_and_bounded():
    """Bytes held in unfinished messages, over every channel: a finished, failed or closed
    channel's message gives its bytes back; past the bound, 506 RESOURCE_ERROR closes the
    connection. The first content frame says the connection publishes (once)."""
    conn = AMQPConnection(lambda user, pw, _peer: user, lambda _user, _vhost: None, "127.0.0.1",
                          max_partial=1000)
    conn.receive_data(HEADER + pframe.marshal(spec.Connection.StartOk(
        client_properties={}, mechanism="PLAIN", response="\x00guest\x00guest"), 0)
        + pframe.marshal(spec.Connection.TuneOk(2047, 131072, 0), 0) + pframe.marshal(spec.Connection.Open("/"), 0))
    for channel in (1, 2, 3):
        conn.receive_data(pframe.marshal(spec.Channel.Open(), channel))
    conn.data_to_send()
    started = conn.receive_data(b"".join(_publish_frames(1, b"a" * 600, size=2000)))
    assert [type(e).__name__ for e in started] == ["PublishingStarted"]
    assert conn.partial_bytes == 600
    events = conn.receive_data(b"".join(_publish_frames(2, b"b" * 300, size=400)) + _raw_frame(3, 2, b"c" * 100))
    assert [type(e).__name__ for e in events] == ["MessageReceived"], "PublishingStarted comes once"
    assert conn.partial_bytes == 600
    conn.close_channel(1, AMQPError(ReplyCode.PRECONDITION_FAILED, "test"))
    assert conn.partial_bytes == 0
    conn.receive_data(b"".join(_publish_frames(3, b"d" * 900, size=5000)))
    assert conn.partial_bytes == 900 and conn.state is State.OPEN
    conn.receive_data(_raw_frame(3, 3, b"e" * 101))
    close = frames_of(conn.data_to_send())[-1]
    assert isinstance(close, spec.Connection.Close) and close.reply_code == 506
    assert close.reply_text == ("RESOURCE_ERROR - unfinished messages on this connection hold 1001 bytes, "
                                "more than the limit of 1000")
    assert conn.state is State.CLOSING and conn.partial_bytes == 0
