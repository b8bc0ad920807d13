"""The connection state machine without sockets: bytes in, frames and state out (issue 17)."""
from __future__ import annotations

import random
import struct

from pamqp import commands as spec
from pamqp import frame as pframe

from haremq.node.protocol.connection import AMQPConnection, State
from haremq.node.protocol.frames import FrameReader

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
