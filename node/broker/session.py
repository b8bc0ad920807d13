"""A client connection as the broker sees it: protocol machine, channels, exclusive queues.

Still free of I/O: the server feeds it bytes and drains its output. Output
is accounted here so that deliveries stop while a connection's unsent bytes
are above the high-water mark or its socket is not draining (QOS-5); the
server says when it drains and the session resumes the queues it starved.
"""
from __future__ import annotations

from typing import Callable

from pamqp.commands import Connection as Conn

from ..protocol import events as ev
from ..protocol.connection import AMQPConnection, State
from ..protocol.frames import encode_confirm, encode_method
from ..protocol.replies import AMQPError, ReplyCode
from .channel import Channel
from .commands import QueueDelete

OUTPUT_HIGH_WATER = 1 << 20


class Session:
    def __init__(self, broker, peer: tuple[str, int], *, wakeup: Callable[[], None], write_out: Callable[[], None],
                 set_reading: Callable[[bool], None], direct: bool = False):
        """What carries the connection (node/server.py's socket, or management's direct
        connection) says how: `wakeup` when output waits outside receive_data, `write_out` to
        write pending output now, `set_reading` to pause (False) or resume (True) reading.
        A `direct` connection is the node's own and is not listed among client connections."""
        self.broker = broker
        self.peer = peer
        self.conn = AMQPConnection(broker.authenticate, broker.check_vhost, peer[0],
                                   server_properties=broker.server_properties())
        self.channels: dict[int, Channel] = {}
        self.exclusive_queues: set = set()
        self.vhost = None
        self.user: str | None = None
        self.access = None            # permissions in the vhost (ERR-3), set at connection.open
        self.writable = True
        self.pending_bytes = 0
        self.starved = False
        self.closed = False
        self.peer_closing = False     # the client sent connection.close; close-ok once held channels are done
        self.wakeup = wakeup
        self.write_out = write_out
        self.direct = direct
        self._confirm_channels: set[Channel] = set()
        self._handling: Channel | None = None    # the channel whose frame is being handled now
        self.log = broker.log.bind(peer=f"{peer[0]}:{peer[1]}")
        self.gate: tuple | None = None    # output waits until the store has written up to here
        self.gate_store = None
        self.publisher = False        # has sent a content frame: reading stops while a resource alarm is on
        self.blocked = False          # reading paused by an alarm (ERR-4)
        self.set_reading = set_reading
        broker.sessions.add(self)
        self.key = f"{broker.node_name}/{id(self):x}"   # this connection, as the cluster names it
        broker.sessions_by_key[self.key] = self

    # ---- properties the channels use ------------------------------------------------------
    @property
    def frame_max(self) -> int:
        return self.conn.frame_max

    @property
    def heartbeat(self) -> int:
        return self.conn.heartbeat

    def client_capability(self, name: str) -> bool:
        caps = self.conn.client_properties.get("capabilities") or {}
        return bool(caps.get(name))

    def can_write(self) -> bool:
        if self.writable and self.pending_bytes < OUTPUT_HIGH_WATER:
            return True
        if self.writable:
            self.write_out()          # hand the batch to the socket now; it may pause us
            if self.writable and self.pending_bytes < OUTPUT_HIGH_WATER:
                return True
        self.starved = True
        return False

    # ---- output ---------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        self.conn.send_raw(data)
        first = self.pending_bytes == 0
        self.pending_bytes += len(data)
        if first:
            self.wakeup()

    def send_method(self, channel: int, method) -> None:
        self.write(encode_method(channel, method))

    def gate_on(self, store) -> None:
        """A delivery was recorded in the log: it must reach the OS before the client sees it,
        so a kill -9 cannot lose the fact that the message was delivered (redelivered flag)."""
        self.gate = store.append_position
        self.gate_store = store

    def take_output(self, retry) -> bytes | None:
        """What to write to the socket now: the confirms ready (coalesced) and every frame
        queued. None (and retry() later) while gated output waits for the store's write."""
        gate = self.gate
        if gate is not None:
            if not self.gate_store.when_written(gate, retry):
                return None
            self.gate = None
        if self._confirm_channels:
            channels = self._confirm_channels
            self._confirm_channels = set()
            for channel in channels:
                self._send_confirms(channel)
        self.pending_bytes = 0
        return self.conn.data_to_send()

    def _send_confirms(self, channel: Channel) -> None:
        confirms = channel.confirms
        if confirms is not None and confirms.ready and not channel.closed:
            for tag, multiple, nack in confirms.flush():
                self.conn.send_raw(encode_confirm(channel.id, tag, multiple, nack))

    def note_confirms(self, channel: Channel) -> None:
        """A channel has confirms to send; they go out, coalesced, at the next drain."""
        if not self._confirm_channels:
            self.wakeup()
            self.broker.confirming.add(self)
        self._confirm_channels.add(channel)

    def drained(self) -> None:
        """The server wrote our output and the socket is accepting more: resume starved queues."""
        if not self.starved or not self.writable or self.closed:
            return
        self.starved = False
        for channel in list(self.channels.values()):
            for queue in channel.queues_to_dispatch():
                queue.dispatch()

    @property
    def should_close(self) -> bool:
        return self.conn.state is State.CLOSED

    # ---- input ----------------------------------------------------------------------------
    def receive_data(self, data: bytes) -> None:
        for event in self.conn.receive_data(data):
            if self.closed:
                break
            self._process(event)
        if self.conn.state in (State.CLOSING, State.CLOSED) and not self.closed:
            self.teardown()

    def _process(self, event) -> None:
        try:
            self._handle(event)
        except AMQPError as err:
            self._fail(getattr(event, "channel", 0), err)
        except Exception as exc:  # noqa: BLE001 - a bug closes one connection, never the node
            self.log.exception("internal error", kind=type(event).__name__)
            self._fail(0, AMQPError(ReplyCode.INTERNAL_ERROR, f"internal error: {type(exc).__name__}"))

    def resume(self, channel: Channel) -> None:
        """A held channel may go on: handle what arrived for it meanwhile, in order. A queue here
        answers while the channel's frame is still being handled: the loop handling it goes on."""
        if channel is self._handling:
            return
        while channel.backlog and not channel.held and not channel.closed and not self.closed:
            self._process(channel.backlog.popleft())
        if channel.confirms is not None and channel.confirms.ready:
            self._confirm_channels.add(channel)
        if self.peer_closing:
            self.finish_peer_close()
        self.wakeup()

    def _handle(self, event) -> None:
        kind = type(event)
        if kind is ev.MessageReceived:
            channel = self.channels.get(event.channel)
            if channel is None:
                return   # closed by an error earlier in this read
            if channel.held:
                channel.backlog.append(event)
                return
            outer, self._handling = self._handling, channel
            try:
                channel.publish(event.publish, event.props_raw, event.body)
            finally:
                self._handling = outer
            if channel.confirms is not None and channel.confirms.ready:
                self._confirm_channels.add(channel)
        elif kind is ev.MethodReceived:
            channel = self.channels.get(event.channel)
            if channel is None:
                return
            if channel.held:
                channel.backlog.append(event)
                return
            outer, self._handling = self._handling, channel
            try:
                channel.handle(event.method)
            finally:
                self._handling = outer
            if channel.confirms is not None and channel.confirms.ready:
                self._confirm_channels.add(channel)
        elif kind is ev.PublishingStarted:
            self._publishing()
        elif kind is ev.ChannelOpened:
            self.channels[event.channel] = Channel(self, event.channel)
        elif kind is ev.ChannelClosedByPeer:
            # close-ok after the replies, deliveries and confirms of the frames before the close
            # (a held channel handles them first), and nothing after it on this channel
            channel = self.channels.get(event.channel)
            if channel is not None:
                if channel.held:
                    channel.backlog.append(event)
                    return
                del self.channels[event.channel]
                self._send_confirms(channel)
                channel.teardown()
            self.conn.channel_close_ok(event.channel)
        elif kind is ev.ChannelFailed:
            channel = self.channels.get(event.channel)
            if channel is None:
                return   # closed by an error earlier in this read
            if channel.held:
                channel.backlog.append(event)
                return
            self._fail(event.channel, event.error)
        elif kind is ev.ConnectionOpened:
            self.user = event.user
            self.vhost = self.broker.vhost(event.vhost)
            self.access = self.broker.access(event.user, event.vhost)
            self.log = self.log.bind(vhost=event.vhost, user=event.user)
            self.log.info("connection opened", client=_client_name(event.client_properties))
            if self.broker.alarms:
                self.alarm_changed(True)
        elif kind is ev.ConnectionClosedByPeer:
            self.log.info("connection closed by client")
            self.peer_closing = True
            self.finish_peer_close()

    def finish_peer_close(self, force: bool = False) -> None:
        """The client closed the connection: close-ok once every channel has handled what it
        sent before the close (a channel held for a durable write still has frames to go), as
        RabbitMQ does. Channels with nothing pending end at once. `force`: stop waiting."""
        if self.closed:
            return
        for channel_id, channel in list(self.channels.items()):
            if not (channel.held or channel.backlog):
                self.channels.pop(channel_id)
                channel.teardown()
        if self.channels and not force:
            return
        self.conn.close_ok()
        self.teardown()
        self.wakeup()

    def fail_channel(self, channel_id: int, err: AMQPError) -> None:
        """Close a channel (or the connection, for a connection error) from outside its frames:
        the close goes out now, not with the next frame the client happens to send."""
        if not self.closed:
            self._fail(channel_id, err)
            self.wakeup()

    def _fail(self, channel_id: int, err: AMQPError) -> None:
        if err.is_channel_error and channel_id and channel_id in self.channels:
            self.log.info("channel error", channel=channel_id, code=int(err.code), text=err.text)
            channel = self.channels.pop(channel_id)
            channel.teardown()
            self.conn.close_channel(channel_id, err)
            if self.peer_closing:
                self.finish_peer_close()
        else:
            self.close(err)

    def close(self, err: AMQPError) -> None:
        """Close the connection from our side (connection error or forced close)."""
        self.log.info("closing connection", code=int(err.code), text=err.text)
        self.conn.close(err)
        self.teardown()

    # ---- resource alarms (ERR-4) ----------------------------------------------------------
    def alarm_changed(self, active: bool) -> None:
        """A publisher is blocked (connection.blocked, not read) until the alarm clears;
        a connection that only consumes is left alone, as in RabbitMQ."""
        if self.closed or self.conn.state is not State.OPEN:
            return
        if active and self.publisher:
            self.block()
        elif not active and self.blocked:
            self.blocked = False
            if self.client_capability("connection.blocked"):
                self.send_method(0, Conn.Unblocked())
            self.set_reading(True)

    def _publishing(self) -> None:
        """A publisher from the connection's first content frame (the protocol machine says so
        once, before the message it starts): blocked now if an alarm is on."""
        if not self.publisher:
            self.publisher = True
            if self.broker.blocking:
                self.block()

    def block(self) -> None:
        if self.blocked:
            return
        self.blocked = True
        if self.client_capability("connection.blocked"):
            self.send_method(0, Conn.Blocked(self.broker.alarm_reason()))
        self.set_reading(False)

    def teardown(self) -> None:
        """Release everything the connection held: requeue unacked, drop exclusive queues."""
        if self.closed:
            return
        self.closed = True
        self.broker.sessions.discard(self)
        self.broker.sessions_by_key.pop(self.key, None)
        channels = list(self.channels.values())
        self.channels.clear()
        for channel in channels:
            channel.teardown()
        for queue in list(self.exclusive_queues):
            if self.vhost is not None and self.vhost.queues.get(queue.name) is queue:   # every node drops it
                self.broker.metadata.submit(QueueDelete(self.vhost.name, queue.name, self.key), _ignore)
        self.exclusive_queues.clear()
        self._confirm_channels.clear()


def _ignore(*_args) -> None:
    return None


def _client_name(props: dict) -> str:
    name = props.get("product") or props.get("connection_name") or "?"
    return name.decode() if isinstance(name, bytes) else str(name)
