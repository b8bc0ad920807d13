"""asyncio glue: sockets in, sessions fed, output written, timers kept.

This is the only module of the AMQP front end that touches transports and
time. It moves bytes between a socket and a `Session`, applies TCP back
pressure in both directions (a client that does not read is neither written
to nor read from until its socket drains), and runs the heartbeat and
handshake timers.

Closing is graceful in both directions, as RabbitMQ's is: after a
connection.close the socket stays open until close-ok (or a timeout); once
the last frame is written the server half-closes (FIN) and keeps reading and
discarding until the client closes its end. A socket closed with unread
client bytes in it would be reset, and a client still writing (amqplib
flushing publishes behind its close) or about to read the close (rabbitpy
after a refused login) would see `Connection reset by peer` instead.
"""
from __future__ import annotations

import asyncio
import socket

from .broker.session import Session
from .protocol.connection import State
from .protocol.replies import AMQPError, ReplyCode

HANDSHAKE_TIMEOUT = 10.0
CLOSE_OK_TIMEOUT = 3.0       # we sent connection.close: how long to wait for close-ok
PEER_CLOSE_TIMEOUT = 30.0    # the client sent connection.close: how long its held channels may take
LINGER_TIMEOUT = 30.0        # after our FIN: how long the client has to close its end (RabbitMQ: 30 s)
WRITE_HIGH_WATER = 4 << 20
WRITE_LOW_WATER = 1 << 20


class AMQPProtocol(asyncio.Protocol):
    def __init__(self, server: "AMQPServer"):
        self.server = server
        self.loop = server.loop
        self.transport: asyncio.Transport | None = None
        self.session: Session | None = None
        self.paused = False
        self.last_received = self.last_sent = 0.0
        self._flush_handle: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._close_timer: asyncio.TimerHandle | None = None
        self.lingering = False       # all said and half-closed: reading only to discard

    # ---- transport callbacks -------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        peer = transport.get_extra_info("peername") or ("?", 0)
        self.session = Session(self.server.broker, (str(peer[0]), int(peer[1])), wakeup=self._schedule_flush,
                               write_out=self._write_out, set_reading=self._set_reading)
        self.server.protocols.add(self)
        self.last_received = self.last_sent = self.loop.time()
        self._timer = self.loop.call_later(HANDSHAKE_TIMEOUT, self._handshake_deadline)

    def data_received(self, data: bytes) -> None:
        if self.lingering:
            return
        self.last_received = self.loop.time()
        was_open = self.session.conn.state is State.OPEN
        self.session.receive_data(data)
        if not was_open and self.session.conn.state is State.OPEN:
            self._start_heartbeats()
        self._flush()

    def pause_writing(self) -> None:
        self.paused = True
        self.session.writable = False
        if not self.lingering:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.paused = False
        self.session.writable = True
        if not self.transport.is_closing() and not self.session.blocked:
            self.transport.resume_reading()
        self.session.drained()
        self._flush()

    def _set_reading(self, on: bool) -> None:
        if self.transport is None or self.transport.is_closing() or self.lingering:
            return
        if on and not self.paused:
            self.transport.resume_reading()
        elif not on:
            self.transport.pause_reading()
        self._schedule_flush()

    def eof_received(self):
        return False

    def connection_lost(self, exc) -> None:
        for handle in (self._flush_handle, self._timer, self._close_timer):
            if handle is not None:
                handle.cancel()
        self.server.protocols.discard(self)
        if self.session is not None and not self.session.closed:
            # a probe (haremq health, a TCP check) hangs up before connection.open: not news
            level = self.session.log.info if self.session.vhost is not None else self.session.log.debug
            level("connection lost", reason=str(exc) if exc else "peer closed")
            self.session.teardown()

    # ---- output ---------------------------------------------------------------------------
    def _schedule_flush(self) -> None:
        if self._flush_handle is None:
            self._flush_handle = self.loop.call_soon(self._flush)

    def _write_out(self) -> None:
        transport = self.transport
        if transport is None or transport.is_closing() or self.lingering:
            return
        data = self.session.take_output(self._schedule_flush)
        if data:
            transport.write(data)
            self.last_sent = self.loop.time()

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        transport = self.transport
        if transport is None or transport.is_closing() or self.lingering:
            return
        self._write_out()
        state = self.session.conn.state
        if state is State.CLOSED:
            self._linger()
            return
        if state is State.CLOSING and self._close_timer is None:
            self._close_timer = self.loop.call_later(CLOSE_OK_TIMEOUT, self._linger)
        if state is State.CLOSE_RECEIVED and self._close_timer is None:
            self._close_timer = self.loop.call_later(PEER_CLOSE_TIMEOUT, self._peer_close_deadline)
        if self.session.starved and not self.paused:
            self.session.drained()

    def _peer_close_deadline(self) -> None:
        self._close_timer = None
        self.session.log.warning("channels still busy after the client's connection.close; closing")
        self.session.finish_peer_close(force=True)
        self._flush()

    def _linger(self) -> None:
        """Nothing more to say: write what is left, half-close, and read (discarding) until the
        client closes its end, so the socket is never reset under bytes the client sent."""
        transport = self.transport
        if transport is None or transport.is_closing() or self.lingering:
            return
        self.lingering = True
        if not self.session.closed:
            self.session.teardown()
        for handle in (self._timer, self._close_timer):
            if handle is not None:
                handle.cancel()
        if not transport.can_write_eof():      # TLS: close_notify, then the socket
            transport.close()
            return
        transport.write_eof()
        transport.resume_reading()
        self._close_timer = self.loop.call_later(LINGER_TIMEOUT, transport.close)

    def force_close(self, err: AMQPError) -> None:
        """Close from the server side (shutdown, pause-minority): connection.close, then the socket."""
        if self.session.conn.state in (State.OPEN, State.CLOSE_RECEIVED):
            self.session.close(err)
            self._flush()
        elif self.transport is not None and not self.lingering:
            self.transport.close()

    # ---- timers -----------------------------------------------------------------------------
    def _handshake_deadline(self) -> None:
        self._timer = None
        if self.session.conn.state is not State.OPEN and self.transport is not None:
            self.session.log.info("handshake timeout")
            self.transport.abort()

    def _start_heartbeats(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.session.heartbeat:
            self._timer = self.loop.call_later(self.session.heartbeat / 2, self._heartbeat_tick)

    def _heartbeat_tick(self) -> None:
        interval = self.session.heartbeat
        now = self.loop.time()
        if self.paused or self.session.blocked:
            self.last_received = now     # we are not reading: silence is ours, not the client's
        if now - self.last_received > 2 * interval:
            self.session.log.info("missed heartbeats from client, closing", timeout=interval)
            self.transport.abort()
            return
        if now - self.last_sent >= interval / 2 and not self.paused:
            self.session.conn.send_heartbeat()
            self._flush()
        self._timer = self.loop.call_later(interval / 2, self._heartbeat_tick)


class AMQPServer:
    """The AMQP listener of a node and the protocols it has accepted.

    With `tls_port` and an `ssl` context it also listens for AMQP over TLS
    (amqps, 5671) on a second socket; both are started, paused and stopped together.
    """

    def __init__(self, broker, host: str, port: int, tls_port: int | None = None, ssl=None):
        self.broker = broker
        self.host = host
        self.port = port
        self.tls_port = tls_port if ssl is not None else None
        self.ssl = ssl
        self.loop = asyncio.get_running_loop()
        self.protocols: set[AMQPProtocol] = set()
        self._server: asyncio.base_events.Server | None = None
        self._tls_server: asyncio.base_events.Server | None = None
        self.shut = False          # stopped for good: a pause-minority resume must not reopen it

    async def start(self, serving: bool = True) -> None:
        """Bind the listener (so a port in use fails at start); accept clients if `serving`."""
        self._server = await self.loop.create_server(lambda: AMQPProtocol(self), self.host, self.port,
                                                     reuse_address=True, backlog=1024, start_serving=serving)
        if self.port == 0:
            self.port = self._server.sockets[0].getsockname()[1]
        if self.tls_port is not None:
            try:
                self._tls_server = await self.loop.create_server(
                    lambda: AMQPProtocol(self), self.host, self.tls_port, ssl=self.ssl, reuse_address=True,
                    backlog=1024, start_serving=serving, ssl_handshake_timeout=HANDSHAKE_TIMEOUT)
            except OSError:
                self._server.close()
                raise
            if self.tls_port == 0:
                self.tls_port = self._tls_server.sockets[0].getsockname()[1]

    async def pause(self, reason: str) -> None:
        """Stop serving: close the listener and every client connection (320 CONNECTION_FORCED)."""
        await self.stop(reason)
        self._server = None

    async def resume(self) -> None:
        if self.shut:
            return
        if self._server is None:
            await self.start()
        elif not self._server.is_serving():
            await self._server.start_serving()
            if self._tls_server is not None:
                await self._tls_server.start_serving()

    async def shutdown(self) -> None:
        """The node is stopping: clients go first (320, as RabbitMQ closes them), while the
        cluster side they may be using through other nodes' queues is still there."""
        self.shut = True
        await self.stop()

    async def stop(self, reason: str = "shutdown") -> None:
        if self._server is not None:
            self._server.close()
        if self._tls_server is not None:
            self._tls_server.close()
            self._tls_server = None
        err = AMQPError(ReplyCode.CONNECTION_FORCED, f"broker forced connection closure with reason '{reason}'")
        for protocol in list(self.protocols):
            protocol.force_close(err)
        await asyncio.sleep(0)
        for protocol in list(self.protocols):
            if protocol.transport is not None:
                protocol.transport.close()
