"""A minimal AMQP 0-9-1 client for the load tool: one connection, one channel.

Why not pika or aio-pika: a general client spends more CPU per message than
the broker under test, and the load tool must never be the bottleneck. Here
the handshake and the rare control methods go through pamqp, while the hot
frames are handled by hand:

* outgoing basic.publish + content header + body frames are pre-built byte
  templates (see `publish_template`), so a publish is a few bytes joined;
* incoming basic.deliver / basic.return and their content, and basic.ack /
  basic.nack from publisher confirms, are parsed with `struct` straight out
  of the read buffer and handed to plain callbacks.

Every message body starts with a 12-byte stamp: the CLOCK_MONOTONIC time of
the publish in ns (system-wide, so comparable across processes) and a run
id, so a consumer can tell this run's messages from leftovers in the queue.
"""
from __future__ import annotations

import asyncio
import os
import socket
import struct
import time
import urllib.parse
from dataclasses import dataclass

from pamqp import commands as pc
from pamqp import frame as pframe

FRAME_END = b"\xce"
PROTO_HEADER = b"AMQP\x00\x00\x09\x01"
CLIENT_FRAME_MAX = 131072
STAMP = struct.Struct(">QI")          # publish time (monotonic ns), run id
STAMP_SIZE = STAMP.size               # 12: messages smaller than this carry no stamp

CM_DELIVER = (60 << 16) | 60
CM_RETURN = (60 << 16) | 50
CM_ACK = (60 << 16) | 80
CM_NACK = (60 << 16) | 120

_ACK = struct.Struct(">BHIHHQBc")     # consumer basic.ack on channel 1


class AMQPError(Exception):
    """Anything that stops a connection from being usable, in one line."""


class URLError(ValueError):
    """A broker URL that cannot be used."""


@dataclass(frozen=True)
class BrokerURL:
    host: str
    port: int
    user: str
    password: str
    vhost: str

    def __str__(self) -> str:  # never print the password
        return f"amqp://{self.user}@{self.host}:{self.port}/{urllib.parse.quote(self.vhost, safe='')}"


def parse_url(text: str) -> BrokerURL:
    """amqp://user:pass@host:port/vhost as RabbitMQ's URI spec reads it (vhost %2F is "/")."""
    try:
        u = urllib.parse.urlsplit(text)
        port = u.port
    except ValueError as exc:
        raise URLError(f"bad URL {text!r}: {exc}") from None
    if u.scheme == "amqps":
        raise URLError(f"bad URL {text!r}: amqps (TLS) is not supported")
    if u.scheme != "amqp":
        raise URLError(f"bad URL {text!r}: expected amqp://user:password@host:port/vhost")
    if not u.hostname:
        raise URLError(f"bad URL {text!r}: no host")
    path = u.path[1:] if u.path.startswith("/") else u.path
    if "/" in path:
        raise URLError(f"bad URL {text!r}: a '/' in the vhost must be written %2F")
    unq = urllib.parse.unquote
    return BrokerURL(host=u.hostname, port=port or 5672,
                     user=unq(u.username) if u.username is not None else "guest",
                     password=unq(u.password) if u.password is not None else "guest",
                     vhost=unq(path) if path else "/")


def publish_template(queue: str, size: int, persistent: bool, mandatory: bool,
                     frame_max: int, exchange: str = "") -> tuple[bytes, bytes]:
    """(head, tail): one message on the wire is head + STAMP + tail (head + tail below 12 bytes).

    The body is split into frames of at most frame_max - 8 bytes; the stamp
    sits at the start of the first body frame.
    """
    ex, rk = exchange.encode(), queue.encode()
    mpay = struct.pack(">HHH", 60, 40, 0) + bytes([len(ex)]) + ex + bytes([len(rk)]) + rk \
        + bytes([1 if mandatory else 0])
    method = struct.pack(">BHI", 1, 1, len(mpay)) + mpay + FRAME_END
    hpay = struct.pack(">HHQHB", 60, 0, size, 0x1000, 2 if persistent else 1)
    header = struct.pack(">BHI", 2, 1, len(hpay)) + hpay + FRAME_END
    if size == 0:
        return method + header, b""
    chunk = frame_max - 8
    first = min(size, chunk)
    head = method + header + struct.pack(">BHI", 3, 1, first)
    stamped = STAMP_SIZE if size >= STAMP_SIZE else 0
    tail = bytearray(b"\x00" * (first - stamped) + FRAME_END)
    left = size - first
    while left > 0:
        n = min(left, chunk)
        tail += struct.pack(">BHI", 3, 1, n) + b"\x00" * n + FRAME_END
        left -= n
    return head, bytes(tail)


def ack_frame(tag: int, multiple: bool) -> bytes:
    return _ACK.pack(1, 1, 13, 60, 80, tag, 1 if multiple else 0, FRAME_END)


def _ignore(*_args) -> None:
    return None


class Conn(asyncio.Protocol):
    """One AMQP connection using channel 1; hot frames go to the on_* callbacks."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.ctrl: asyncio.Queue = asyncio.Queue()
        self.writable = asyncio.Event()
        self.writable.set()
        self.closed = self.loop.create_future()
        self.close_reason: str | None = None
        self.blocked_count = 0
        self.cancelled = False
        self.frame_max = CLIENT_FRAME_MAX
        self.on_deliver = _ignore   # f(now_ns, delivery_tag, stamp_ts, stamp_run, redelivered)
        self.on_return = _ignore    # f()
        self.on_confirm = _ignore   # f(now_ns, tag, multiple, is_nack)
        self.on_lost = _ignore      # f() when the connection goes away
        self.on_read_end = _ignore  # f() after each read's frames are handled (to batch acks)
        # content assembly: what the current content belongs to
        self._returning = False
        self._tag = 0
        self._redeliv = 0
        self._remaining = 0
        self._need_stamp = False
        self._ts = 0
        self._run = 0

    # asyncio.Protocol ----------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        transport.set_write_buffer_limits(high=512 * 1024, low=128 * 1024)

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def connection_lost(self, exc) -> None:
        if not self.closed.done():
            lost = f"connection lost: {getattr(exc, 'strerror', None) or exc}" if exc else "connection closed by the broker"
            self.closed.set_result(self.close_reason or lost)
        self.writable.set()
        self.ctrl.put_nowait(None)
        self.on_lost()

    def data_received(self, data: bytes) -> None:
        """Parse every complete frame in the buffer; deliveries and confirms inline."""
        buf = self.buf
        buf += data
        n = len(buf)
        off = 0
        unpack = struct.unpack_from
        now = time.monotonic_ns()
        while n - off >= 8:
            ftype, _ch, size = unpack(">BHI", buf, off)
            end = off + 7 + size
            if end >= n:
                break
            p = off + 7
            if ftype == 3:  # content body
                if self._need_stamp:
                    self._need_stamp = False
                    if size >= STAMP_SIZE:
                        self._ts, self._run = unpack(">QI", buf, p)
                self._remaining -= size
                if self._remaining <= 0:
                    self._content_done(now)
            elif ftype == 1:
                cm = unpack(">I", buf, p)[0]
                if cm == CM_DELIVER:
                    q = p + 5 + buf[p + 4]          # skip the consumer tag
                    self._tag = unpack(">Q", buf, q)[0]
                    self._redeliv = buf[q + 8] & 1
                    self._returning = False
                elif cm == CM_ACK or cm == CM_NACK:
                    tag, bits = unpack(">QB", buf, p + 4)
                    self.on_confirm(now, tag, bits & 1, cm == CM_NACK)
                elif cm == CM_RETURN:
                    self._returning = True
                else:
                    self._control(bytes(buf[off:end + 1]))
            elif ftype == 2:  # content header: class, weight, body size
                self._remaining = unpack(">Q", buf, p + 4)[0]
                self._need_stamp = True
                self._ts = self._run = 0
                if self._remaining == 0:
                    self._content_done(now)
            # type 8 (heartbeat) is ignored: we negotiate heartbeat 0
            off = end + 1
        if off:
            del buf[:off]
        self.on_read_end()

    def _content_done(self, now: int) -> None:
        if self._returning:
            self._returning = False
            self.on_return()
        else:
            self.on_deliver(now, self._tag, self._ts, self._run, self._redeliv)

    def _control(self, raw: bytes) -> None:
        try:
            _, ch, obj = pframe.unmarshal(raw)
        except Exception as exc:  # noqa: BLE001 - a frame we cannot read ends the connection
            self.close_reason = f"unreadable frame from the broker: {exc}"
            if self.transport is not None:
                self.transport.close()
            return
        if isinstance(obj, pc.Connection.Close):
            self.close_reason = f"connection closed by the broker: {obj.reply_code} {obj.reply_text}"
            self.write(pframe.marshal(pc.Connection.CloseOk(), 0))
        elif isinstance(obj, pc.Channel.Close):
            self.close_reason = f"channel closed by the broker: {obj.reply_code} {obj.reply_text}"
            self.write(pframe.marshal(pc.Channel.CloseOk(), ch))
        elif isinstance(obj, pc.Connection.Blocked):
            self.blocked_count += 1
            return
        elif isinstance(obj, pc.Connection.Unblocked):
            return
        elif isinstance(obj, pc.Basic.Cancel):  # the broker cancelled our consumer
            self.cancelled = True
            self.close_reason = "consumer cancelled by the broker (queue deleted?)"
        self.ctrl.put_nowait(obj)

    # requests -------------------------------------------------------------
    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    async def rpc(self, cmd, expect, channel: int = 1, timeout: float = 10.0):
        self.write(pframe.marshal(cmd, channel))
        return await self.expect(expect, timeout)

    async def expect(self, expect, timeout: float = 10.0):
        """The next control method of type `expect`; a close or a lost connection raises."""
        deadline = self.loop.time() + timeout
        while True:
            left = deadline - self.loop.time()
            if left <= 0:
                raise AMQPError(f"no {expect.__name__} from the broker within {timeout:g}s")
            try:
                obj = await asyncio.wait_for(self.ctrl.get(), left)
            except asyncio.TimeoutError:
                continue
            if obj is None:
                raise AMQPError(self.close_reason or str(self.closed.result()))
            if isinstance(obj, expect):
                return obj
            if isinstance(obj, (pc.Connection.Close, pc.Channel.Close)):
                raise AMQPError(self.close_reason)

    async def close(self, timeout: float = 10.0) -> None:
        """connection.close and wait for close-ok: the broker has then read all we sent."""
        if self.transport is None or self.transport.is_closing():
            return
        try:
            await self.rpc(pc.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0),
                           pc.Connection.CloseOk, channel=0, timeout=timeout)
        except (AMQPError, asyncio.TimeoutError):
            pass
        self.transport.close()
        try:
            await asyncio.wait_for(asyncio.shield(self.closed), 2)
        except asyncio.TimeoutError:
            pass


async def open_conn(url: BrokerURL, name: str = "haremq-perf", timeout: float = 5.0) -> Conn:
    """Connect, authenticate, open the vhost and channel 1; AMQPError with a one-line reason."""
    loop = asyncio.get_running_loop()
    where = f"{url.host}:{url.port}"
    try:
        transport, conn = await asyncio.wait_for(loop.create_connection(Conn, url.host, url.port), timeout)
    except asyncio.TimeoutError:
        raise AMQPError(f"cannot connect to {where}: timed out after {timeout:g}s") from None
    except socket.gaierror as exc:
        raise AMQPError(f"cannot connect to {where}: unknown host ({exc.strerror})") from None
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise AMQPError(f"cannot connect to {where}: {reason}") from None
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        conn.write(PROTO_HEADER)
        await conn.expect(pc.Connection.Start, timeout)
        props = {"product": name, "connection_name": name, "capabilities": {
            "publisher_confirms": True, "consumer_cancel_notify": True, "basic.nack": True,
            "connection.blocked": True, "authentication_failure_close": True}}
        conn.write(pframe.marshal(pc.Connection.StartOk(
            client_properties=props, mechanism="PLAIN",
            response=f"\0{url.user}\0{url.password}", locale="en_US"), 0))
        tune = await conn.expect(pc.Connection.Tune, timeout)
        conn.frame_max = min(tune.frame_max or CLIENT_FRAME_MAX, CLIENT_FRAME_MAX)
        conn.write(pframe.marshal(pc.Connection.TuneOk(
            channel_max=tune.channel_max or 2047, frame_max=conn.frame_max, heartbeat=0), 0))
        await conn.rpc(pc.Connection.Open(virtual_host=url.vhost), pc.Connection.OpenOk, 0, timeout)
        await conn.rpc(pc.Channel.Open(), pc.Channel.OpenOk, 1, timeout)
    except AMQPError as exc:
        transport.close()
        reason = str(exc)
        if reason == "connection closed by the broker":
            reason += " during the handshake (wrong credentials or vhost?)"
        raise AMQPError(f"{where}: {reason}") from None
    return conn
