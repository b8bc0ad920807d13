"""A direct AMQP connection inside the node, for the management API's actions.

RabbitMQ's management plugin declares, deletes, purges, gets and publishes
through a "direct" connection of the Erlang client: the same channel code a
network client goes through, without a socket. This is HareMQ's: a `Session`
(the sans-I/O broker side of a connection) fed frames encoded by pamqp, its
output parsed back into frames. Every action therefore takes the path an AMQP
client's would: the user's permissions are checked, and in a cluster declares
and deletes go through the metadata log and reach queues homed on other nodes
over their links.
"""
from __future__ import annotations

import asyncio
import struct
from collections import defaultdict

from pamqp import body as pbody
from pamqp import commands as spec
from pamqp import exceptions as pexc
from pamqp import frame as pframe
from pamqp import header as pheader

from ..broker.session import Session
from .inputs import BadInput

CLIENT_PROPERTIES = {"product": "HareMQ management", "connection_name": "HareMQ management API",
                     "capabilities": {"publisher_confirms": True, "basic.nack": True,
                                      "consumer_cancel_notify": True, "authentication_failure_close": True}}
TIMEOUT = 15.0


class AMQPClosed(Exception):
    """The broker closed the channel or connection: RabbitMQ's reply code and text."""

    def __init__(self, code: int, text: str):
        super().__init__(f"{code} {text}")
        self.code = code
        self.text = text

    @property
    def reason(self) -> str:
        """The text without its leading constant name (`NOT_FOUND - no queue ...` -> `no queue ...`)."""
        return self.text.split(" - ", 1)[-1]


class Message:
    __slots__ = ("method", "properties", "body")

    def __init__(self, method, properties, body: bytes):
        self.method = method
        self.properties = properties
        self.body = body


class DirectConnection:
    """One AMQP connection as `user` to `vhost`, opened with `await open()` and closed with
    `await close()` (or used with `async with`). `peer` is the HTTP client's address."""

    def __init__(self, broker, user: str, password: str, vhost: str, peer: tuple[str, int]):
        self.broker = broker
        self.user, self.password, self.vhost = user, password, vhost
        self.session = Session(broker, peer, wakeup=self._schedule, write_out=self._drain, set_reading=_ignore,
                               direct=True)    # not listed among client connections
        self.loop = asyncio.get_running_loop()
        self.frames: dict[int, asyncio.Queue] = defaultdict(asyncio.Queue)
        self._buffer = bytearray()
        self._scheduled = False
        self._next_channel = 1

    async def __aenter__(self) -> "DirectConnection":
        try:
            await self.open()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # ---- bytes in and out -------------------------------------------------------------------
    def _send(self, frame, channel: int = 0) -> None:
        try:
            data = pframe.marshal(frame, channel)
        except (struct.error, TypeError, ValueError) as exc:   # a value AMQP (or pamqp) cannot encode
            raise BadInput(f"cannot be sent in AMQP: {exc}") from None
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        if not self.session.closed:
            self.session.receive_data(data)
        self._drain()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        data = self.session.take_output(self._schedule)
        if data is None:
            return
        self._buffer += data
        while self._buffer:
            try:
                used, channel, frame = pframe.unmarshal(bytes(self._buffer))
            except pexc.UnmarshalingException:
                break
            del self._buffer[:used]
            self.frames[channel].put_nowait(frame)
            if channel == 0 and isinstance(frame, spec.Connection.Close):
                for other, frames in list(self.frames.items()):     # every channel waiting learns it
                    if other:
                        frames.put_nowait(frame)
        if not self.session.closed:
            self.session.drained()

    async def _next(self, channel: int):
        frame = await asyncio.wait_for(self.frames[channel].get(), TIMEOUT)
        if isinstance(frame, spec.Channel.Close):
            self._send(spec.Channel.CloseOk(), channel)
            raise AMQPClosed(frame.reply_code, frame.reply_text)
        if isinstance(frame, spec.Connection.Close):
            if not self.session.closed:
                self._send(spec.Connection.CloseOk())
            raise AMQPClosed(frame.reply_code, frame.reply_text)
        return frame

    async def _expect(self, channel: int, *kinds):
        while True:
            frame = await self._next(channel)
            if isinstance(frame, kinds):
                return frame

    async def _connection_frame(self, *kinds):
        return await self._expect(0, *kinds)

    # ---- connection ---------------------------------------------------------------------------
    async def open(self) -> None:
        self._feed(pframe.marshal(pheader.ProtocolHeader(), 0))
        await self._connection_frame(spec.Connection.Start)
        self._send(spec.Connection.StartOk(client_properties=CLIENT_PROPERTIES, mechanism="PLAIN",
                                           response=f"\0{self.user}\0{self.password}", locale="en_US"))
        tune = await self._connection_frame(spec.Connection.Tune)
        self._send(spec.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0))
        self._send(spec.Connection.Open(virtual_host=self.vhost))
        await self._connection_frame(spec.Connection.OpenOk)

    async def close(self) -> None:
        if self.session.closed:
            return
        try:
            self._send(spec.Connection.Close(200, "Goodbye", 0, 0))
            await asyncio.wait_for(self._connection_frame(spec.Connection.CloseOk), 2.0)
        except (AMQPClosed, asyncio.TimeoutError, pexc.PAMQPException):
            pass
        finally:
            if not self.session.closed:
                self.session.teardown()

    async def channel(self, confirm: bool = False) -> int:
        number = self._next_channel
        self._next_channel += 1
        self._send(spec.Channel.Open(), number)
        await self._expect(number, spec.Channel.OpenOk)
        if confirm:
            await self.call(number, spec.Confirm.Select(), spec.Confirm.SelectOk)
        return number

    async def call(self, channel: int, method, *replies):
        """Send a synchronous method and wait for its reply (or the channel's closing)."""
        self._send(method, channel)
        return await self._expect(channel, *replies)

    # ---- the actions ----------------------------------------------------------------------------
    async def _content(self, channel: int, method) -> Message:
        header = await self._expect(channel, pheader.ContentHeader)
        chunks, size = [], 0
        while size < header.body_size:
            part = await self._expect(channel, pbody.ContentBody)
            chunks.append(part.value)
            size += len(part.value)
        return Message(method, header.properties, b"".join(chunks))

    async def get(self, channel: int, queue: str, no_ack: bool) -> Message | None:
        reply = await self.call(channel, spec.Basic.Get(queue=queue, no_ack=no_ack),
                                spec.Basic.GetOk, spec.Basic.GetEmpty)
        if isinstance(reply, spec.Basic.GetEmpty):
            return None
        return await self._content(channel, reply)

    async def publish(self, channel: int, exchange: str, routing_key: str, body: bytes,
                      properties: spec.Basic.Properties) -> tuple[bool, bool]:
        """Publish with mandatory=true on a confirm channel: (routed, confirmed)."""
        self._send(spec.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=True), channel)
        self._send(pheader.ContentHeader(0, len(body), properties), channel)
        frame_max = self.session.frame_max or 131072
        step = max(1, frame_max - 8)
        for start in range(0, len(body), step):
            self._send(pbody.ContentBody(body[start:start + step]), channel)
        routed = True
        while True:
            frame = await self._next(channel)
            if isinstance(frame, spec.Basic.Return):
                await self._content(channel, frame)
                routed = False
            elif isinstance(frame, spec.Basic.Ack):
                return routed, True
            elif isinstance(frame, spec.Basic.Nack):
                return routed, False


def _ignore(*_args) -> None:
    return None
