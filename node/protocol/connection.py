"""AMQP 0-9-1 connection state machine, sans I/O.

Theory of operation: the caller feeds bytes with `receive_data()` and gets
events back; whatever the machine has to say goes to an output buffer the
caller drains with `data_to_send()`. The machine owns the handshake
(header, start, tune, open), frame sequencing (method, then content header,
then body frames), channel opening and closing, and the close handshakes in
both directions. It knows nothing of queues: every channel-level method is
handed on as an event. Authentication and vhost checks are plain callables
given at construction.

Every transition is a table lookup; an illegal frame is a lookup miss that
becomes the connection error the spec names for it.
"""
from __future__ import annotations

import enum
from typing import Callable

from pamqp import commands
from pamqp import decode as pdecode

from . import events as ev
from .frames import (FRAME_BODY, FRAME_HEADER, FRAME_HEARTBEAT, FRAME_METHOD, HEARTBEAT_FRAME,
                     PROTOCOL_HEADER, PROTOCOL_HEADERS, PUBLISH, PUBLISH_INDEX, CONTENT_HEAD, FrameReader,
                     UnknownMethod, decode_content_header, decode_method, decode_publish, encode_method,
                     erlang_binary)
from .replies import AMQPError, ReplyCode

C = commands.Connection
Ch = commands.Channel

SERVER_FRAME_MAX = 131072
SERVER_CHANNEL_MAX = 2047
SERVER_HEARTBEAT = 60
FRAME_MIN_SIZE = 4096
MAX_MESSAGE_SIZE = 128 * 1024 * 1024
# Body bytes a connection may hold in messages not yet whole, over all its channels: one largest
# message's worth. A client that starts large messages on many channels at once (2047 x 128 MiB
# would be 256 GiB) is closed with 506 RESOURCE_ERROR past it.
MAX_PARTIAL_BYTES = MAX_MESSAGE_SIZE
PUBLISH_CACHE = 64      # decoded basic.publish methods a connection keeps for reuse

CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "consumer_priorities": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "direct_reply_to": True,
}


class State(enum.Enum):
    AWAIT_HEADER = "await-header"
    AWAIT_START_OK = "await-start-ok"
    AWAIT_TUNE_OK = "await-tune-ok"
    AWAIT_OPEN = "await-open"
    OPEN = "open"
    CLOSE_RECEIVED = "close-received"   # the client sent connection.close; close-ok follows once
                                        # the frames before it are processed (`close_ok()`)
    CLOSING = "closing"      # we sent connection.close, waiting for close-ok
    CLOSED = "closed"        # nothing more to say; the transport goes (after the client's bytes)


class ChannelState(enum.Enum):
    OPEN = "open"
    AWAIT_HEADER = "await-header"   # basic.publish seen, content header next
    AWAIT_BODY = "await-body"
    CLOSE_RECEIVED = "close-received"   # the client sent channel.close; close-ok once the session
                                        # has handled what came before it (`channel_close_ok()`)
    FAILED = "failed"               # an error in the channel's frames; the session sends channel.close
                                    # once it has handled what came before (`close_channel()`)
    CLOSING = "closing"             # we sent channel.close, waiting for close-ok

    __hash__ = object.__hash__      # members are singletons: CHANNEL_FRAMES' keys hash in C


# Handshake: state -> {method class: handler name}
HANDSHAKE = {
    State.AWAIT_START_OK: {C.StartOk: "_on_start_ok"},
    State.AWAIT_TUNE_OK: {C.TuneOk: "_on_tune_ok"},
    State.AWAIT_OPEN: {C.Open: "_on_open"},
}

# Channel framing: (channel state, frame type) -> handler name
CHANNEL_FRAMES = {
    (ChannelState.OPEN, FRAME_METHOD): "_on_channel_method",
    (ChannelState.AWAIT_HEADER, FRAME_HEADER): "_on_content_header",
    (ChannelState.AWAIT_BODY, FRAME_BODY): "_on_content_body",
}

# A channel on its way out, as RabbitMQ's: (state, method) -> handler. Every other frame on it is
# discarded; so is a channel.close while its earlier frames' error is pending (FAILED), which is
# answered with the server's channel.close (`close_channel`).
LEAVING = {
    (ChannelState.CLOSING, Ch.Close): "_on_crossing_close",
    (ChannelState.CLOSING, Ch.CloseOk): "_on_close_ok",
    (ChannelState.FAILED, Ch.Close): "_on_close_after_failure",
}

UNEXPECTED = {
    ChannelState.OPEN: "expected method frame, got non method frame instead",
    ChannelState.AWAIT_HEADER: "expected content header for class 60, got non content header frame instead",
    ChannelState.AWAIT_BODY: "expected content body, got non content body frame instead",
}


class _Assembly:
    """A publish being assembled from its method, header and body frames."""

    __slots__ = ("publish", "props_raw", "remaining", "parts", "held")

    def __init__(self, publish):
        self.publish = publish
        self.props_raw = b""
        self.remaining = 0
        self.parts: list[bytes] = []
        self.held = 0           # bytes in parts


Authenticator = Callable[[str, str, str], "str | None"]   # (user, password, peer_host) -> user
VhostCheck = Callable[[str, str], "AMQPError | None"]      # (user, vhost) -> error or None


class AMQPConnection:
    """One client connection's protocol state. Feed bytes in, read bytes and events out."""

    def __init__(self, authenticate: Authenticator, check_vhost: VhostCheck, peer_host: str,
                 server_properties: dict | None = None, heartbeat: int = SERVER_HEARTBEAT,
                 frame_max: int = SERVER_FRAME_MAX, channel_max: int = SERVER_CHANNEL_MAX,
                 max_partial: int = MAX_PARTIAL_BYTES):
        self.state = State.AWAIT_HEADER
        self._authenticate = authenticate
        self._check_vhost = check_vhost
        self.peer_host = peer_host
        self.server_properties = dict(server_properties or {})
        self.server_properties.setdefault("capabilities", CAPABILITIES)
        self.server_heartbeat = heartbeat
        self.server_frame_max = frame_max
        self.server_channel_max = channel_max
        self.heartbeat = 0
        self.frame_max = frame_max
        self.channel_max = channel_max
        self.user: str | None = None
        self.vhost: str | None = None
        self.client_properties: dict = {}
        self.close_reason: AMQPError | None = None
        self._header = b""
        self._reader = FrameReader(frame_max)
        self._channels: dict[int, ChannelState] = {}
        self._peer_closed: set[int] = set()      # the client's channel.close not answered yet
        self._assembly: dict[int, _Assembly] = {}
        self.partial_bytes = 0      # body bytes held in messages not yet whole, every channel
        self.max_partial = max_partial
        self.publishing = False     # a content frame has arrived: the session counts us a publisher
        self._publishes: dict[bytes, object] = {}   # method payload -> its decoded basic.publish (read only)
        self._out: list[bytes] = []

    # ---- output -------------------------------------------------------------
    def send_method(self, channel: int, method) -> None:
        self._out.append(encode_method(channel, method))

    def send_raw(self, data: bytes) -> None:
        self._out.append(data)

    def send_heartbeat(self) -> None:
        self._out.append(HEARTBEAT_FRAME)

    def data_to_send(self) -> bytes:
        if not self._out:
            return b""
        data = b"".join(self._out)
        self._out.clear()
        return data

    @property
    def has_output(self) -> bool:
        return bool(self._out)

    @property
    def should_close_transport(self) -> bool:
        return self.state is State.CLOSED

    # ---- input --------------------------------------------------------------
    def receive_data(self, data: bytes) -> list:
        """Consume bytes; return the events they complete."""
        out: list = []
        if self.state is State.AWAIT_HEADER:
            data = self._receive_header(data)
            if not data:
                return out
        if self.state is State.CLOSED:
            return out
        frames, framing_error = self._reader.feed(data)
        channels = self._channels
        i, count = 0, len(frames)
        while i < count:
            ftype, channel, payload = frames[i]
            i += 1
            state = self.state
            if state is State.CLOSED:
                break
            try:
                # the frames of an open channel (publishes, mostly) go straight to their handler;
                # _on_frame does the same after checking for every other case
                channel_state = channels.get(channel) if state is State.OPEN and channel else None
                if channel_state is ChannelState.OPEN and ftype == FRAME_METHOD \
                        and payload[:4] == PUBLISH_INDEX and i + 1 < count:
                    i += self._whole_publish(channel, payload, frames[i], frames[i + 1], out)
                    continue
                handler = CHANNEL_FRAMES.get((channel_state, ftype))
                if handler is not None:
                    getattr(self, handler)(channel, payload, out)
                else:
                    self._on_frame(ftype, channel, payload, out)
            except UnknownMethod as exc:
                self.close_reason = AMQPError(ReplyCode.COMMAND_INVALID, str(exc))
                self.state = State.CLOSED      # as RabbitMQ: the connection is dropped, no close frame
                break
            except AMQPError as err:
                if err.is_channel_error and channel and self.state is State.OPEN:
                    self._channel_failed(channel, err, out)
                else:
                    self.close(err)
        if framing_error is not None and self.state not in (State.CLOSED, State.CLOSING,
                                                            State.CLOSE_RECEIVED):
            self.close(framing_error)
            self.state = State.CLOSED   # the stream is out of sync: nothing more can be read
        return out

    def _receive_header(self, data: bytes) -> bytes:
        self._header += data
        if len(self._header) < 8:
            if any(h.startswith(self._header) for h in PROTOCOL_HEADERS):
                return b""
        header, rest = self._header[:8], self._header[8:]
        self._header = b""
        if header not in PROTOCOL_HEADERS:
            self._out.append(PROTOCOL_HEADER)
            self.state = State.CLOSED
            self.close_reason = AMQPError(ReplyCode.FRAME_ERROR, f"bad protocol header {header!r}")
            return b""
        self.state = State.AWAIT_START_OK
        self.send_method(0, C.Start(0, 9, self.server_properties, "AMQPLAIN PLAIN", "en_US"))
        return rest

    def _on_frame(self, ftype: int, channel: int, payload: bytes, out: list) -> None:
        if self.state is State.CLOSE_RECEIVED:
            return       # the client said it is done: nothing it sends after the close counts
        if ftype == FRAME_HEARTBEAT:
            if channel:
                raise AMQPError(ReplyCode.UNEXPECTED_FRAME,
                                f"type {ftype}, all octets = {erlang_binary(payload)}")
            return
        if ftype not in (FRAME_METHOD, FRAME_HEADER, FRAME_BODY):
            raise AMQPError(ReplyCode.FRAME_ERROR, f"type {ftype}, all octets = {erlang_binary(payload)}: "
                            "unknown_frame")
        if channel == 0:
            if ftype != FRAME_METHOD:
                raise AMQPError(ReplyCode.UNEXPECTED_FRAME, UNEXPECTED[ChannelState.OPEN])
            self._on_connection_method(decode_method(payload), out)
            return
        if self.state is State.CLOSING:
            return
        if self.state is not State.OPEN:
            raise AMQPError(ReplyCode.CHANNEL_ERROR, f"unexpected frame on channel {channel} before connection.open")
        state = self._channels.get(channel)
        if state is None:
            self._on_unopened_channel(channel, ftype, payload, out)
            return
        if state in (ChannelState.CLOSE_RECEIVED, ChannelState.FAILED, ChannelState.CLOSING):
            if ftype == FRAME_METHOD:
                handler = LEAVING.get((state, type(decode_method(payload))))
                if handler is not None:
                    getattr(self, handler)(channel)
            return
        handler = CHANNEL_FRAMES.get((state, ftype))
        if handler is None:
            ids = (60, 40) if state in (ChannelState.AWAIT_HEADER, ChannelState.AWAIT_BODY) else (0, 0)
            raise AMQPError(ReplyCode.UNEXPECTED_FRAME, UNEXPECTED[state], *ids)
        getattr(self, handler)(channel, payload, out)

    # ---- connection class ---------------------------------------------------
    def _on_connection_method(self, method, out: list) -> None:
        if self.state is State.CLOSING:
            if isinstance(method, C.CloseOk):
                self.state = State.CLOSED
            elif isinstance(method, C.Close):
                self.send_method(0, C.CloseOk())
                self.state = State.CLOSED
            return
        if self.state is State.OPEN:
            if isinstance(method, C.Close):
                # close-ok waits until the session has handled everything sent before the close
                # (a channel may be holding frames for a durable write): `close_ok()` sends it
                self.state = State.CLOSE_RECEIVED
                out.append(ev.ConnectionClosedByPeer(method.reply_code, method.reply_text))
                return
            if isinstance(method, C.CloseOk):
                return
            if isinstance(method, C.UpdateSecret):
                self.send_method(0, C.UpdateSecretOk())
                return
            raise AMQPError(ReplyCode.CHANNEL_ERROR, "unexpected method in connection state running",
                            method.index >> 16, method.index & 0xFFFF)
        handler = HANDSHAKE.get(self.state, {}).get(type(method))
        if handler is None:
            raise AMQPError(ReplyCode.COMMAND_INVALID,
                            f"expected {'/'.join(m.name for m in HANDSHAKE[self.state])}, got {method.name}")
        getattr(self, handler)(method, out)

    def _on_start_ok(self, method, out: list) -> None:
        mechanism = method.mechanism
        response = method.response if isinstance(method.response, (bytes, bytearray)) \
            else str(method.response).encode("latin-1")
        self.client_properties = method.client_properties or {}
        user, password = _credentials(mechanism, bytes(response))
        accepted = self._authenticate(user, password, self.peer_host) if user is not None else None
        if accepted is None:
            # the close waits for close-ok (or the server's timeout) like any other: a client
            # such as rabbitpy must be able to read the 403 before the socket goes
            self.close(AMQPError(ReplyCode.ACCESS_REFUSED,
                                 f"Login was refused using authentication mechanism {mechanism}. "
                                 "For details see the broker logfile."))
            return
        self.user = accepted
        self.state = State.AWAIT_TUNE_OK
        self.send_method(0, C.Tune(self.server_channel_max, self.server_frame_max, self.server_heartbeat))

    def _on_tune_ok(self, method, out: list) -> None:
        frame_max = method.frame_max or self.server_frame_max
        if frame_max < FRAME_MIN_SIZE:
            raise AMQPError(ReplyCode.NOT_ALLOWED, f"frame_max={frame_max} < {FRAME_MIN_SIZE} min size")
        if frame_max > self.server_frame_max:
            raise AMQPError(ReplyCode.NOT_ALLOWED,
                            f"frame_max={frame_max} > {self.server_frame_max} max size")
        channel_max = method.channel_max or self.server_channel_max
        if channel_max > self.server_channel_max:
            raise AMQPError(ReplyCode.NOT_ALLOWED,
                            f"channel_max={channel_max} > {self.server_channel_max} max channels")
        self.frame_max = frame_max
        self._reader.frame_max = frame_max
        self.channel_max = channel_max
        self.heartbeat = method.heartbeat
        self.state = State.AWAIT_OPEN

    def _on_open(self, method, out: list) -> None:
        vhost = method.virtual_host or "/"
        problem = self._check_vhost(self.user, vhost)
        if problem is not None:
            raise problem
        self.vhost = vhost
        self.state = State.OPEN
        self.send_method(0, C.OpenOk())
        out.append(ev.ConnectionOpened(self.user, vhost, self.client_properties))

    # ---- channels -----------------------------------------------------------
    def _whole_publish(self, channel: int, payload: bytes, header, body, out: list) -> int:
        """A publish whose header and single body frame arrived with it, as one event: what
        the three handlers would do frame by frame. Returns how many frames after the method
        it used (0: not that case; the method frame is handled as usual)."""
        htype, hchannel, hpayload = header
        btype, bchannel, bpayload = body
        if htype != FRAME_HEADER or btype != FRAME_BODY or hchannel != channel or bchannel != channel \
                or len(hpayload) < 14:
            self._on_channel_method(channel, payload, out)
            return 0
        class_id, _weight, body_size = CONTENT_HEAD.unpack_from(hpayload, 0)
        if class_id != 60 or not body_size or body_size != len(bpayload) or body_size > MAX_MESSAGE_SIZE:
            self._on_channel_method(channel, payload, out)
            return 0
        publish = self._publishes.get(payload)
        if publish is None:       # a publisher mostly repeats one exchange and routing key
            if len(self._publishes) >= PUBLISH_CACHE:
                self._publishes.clear()
            publish = self._publishes[payload] = decode_publish(payload)
        if not self.publishing:
            self._started_publishing(out)
        out.append(ev.MessageReceived(channel, publish, hpayload[12:], bpayload))
        return 2

    def _on_unopened_channel(self, channel: int, ftype: int, payload: bytes, out: list) -> None:
        # channel_max is a count of open channels, not the highest id: as in RabbitMQ, any id up
        # to 65535 may be opened (aiormq picks 65535 first) while fewer than channel_max are open
        if self.channel_max and len(self._channels) >= self.channel_max:
            raise AMQPError(ReplyCode.NOT_ALLOWED,
                            f"number of channels opened ({len(self._channels)}) has reached the "
                            f"negotiated channel_max ({self.channel_max})")
        method = decode_method(payload) if ftype == FRAME_METHOD else None
        if not isinstance(method, Ch.Open):
            index = getattr(method, "index", 0)
            raise AMQPError(ReplyCode.CHANNEL_ERROR, "expected 'channel.open'", index >> 16, index & 0xFFFF)
        self._channels[channel] = ChannelState.OPEN
        self.send_method(channel, Ch.OpenOk())
        out.append(ev.ChannelOpened(channel))

    def _on_channel_method(self, channel: int, payload: bytes, out: list) -> None:
        method = decode_method(payload)
        index = method.index
        if index == PUBLISH:
            self._assembly[channel] = _Assembly(method)
            self._channels[channel] = ChannelState.AWAIT_HEADER
            return
        if isinstance(method, Ch.Open):
            raise AMQPError(ReplyCode.CHANNEL_ERROR, "second 'channel.open' seen", 20, 10)
        if isinstance(method, Ch.Close):
            # close-ok waits until the session has handled the frames before the close (their
            # replies and deliveries go first), and nothing follows it on this channel
            self._channels[channel] = ChannelState.CLOSE_RECEIVED
            self._peer_closed.add(channel)
            out.append(ev.ChannelClosedByPeer(channel))
            return
        if isinstance(method, Ch.CloseOk):
            return
        if (index >> 16) == 10:
            raise AMQPError(ReplyCode.CHANNEL_ERROR, f"connection method {method.name} on channel {channel}")
        out.append(ev.MethodReceived(channel, method))

    def _on_content_header(self, channel: int, payload: bytes, out: list) -> None:
        class_id, body_size, props_raw = decode_content_header(payload)
        if class_id != 60:
            raise AMQPError(ReplyCode.UNEXPECTED_FRAME, f"content header for class {class_id}, expected 60")
        asm = self._assembly[channel]
        if body_size > MAX_MESSAGE_SIZE:
            del self._assembly[channel]
            self._channels[channel] = ChannelState.OPEN
            raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                            f"message size {body_size} is larger than configured max size {MAX_MESSAGE_SIZE}",
                            60, 40)
        if not self.publishing:
            self._started_publishing(out)
        asm.props_raw = props_raw
        asm.remaining = body_size
        if body_size == 0:
            self._finish_message(channel, asm, b"", out)
        else:
            self._channels[channel] = ChannelState.AWAIT_BODY

    def _on_content_body(self, channel: int, payload: bytes, out: list) -> None:
        asm = self._assembly[channel]
        asm.remaining -= len(payload)
        if asm.remaining < 0:
            raise AMQPError(ReplyCode.FRAME_ERROR, "content body larger than the size in its header")
        if asm.remaining == 0:
            body = b"".join(asm.parts) + payload if asm.parts else payload
            self._finish_message(channel, asm, body, out)
            return
        asm.parts.append(payload)
        asm.held += len(payload)
        self.partial_bytes += len(payload)
        if self.partial_bytes > self.max_partial:
            held = self.partial_bytes
            for other in list(self._assembly):
                self._drop_assembly(other)
            raise AMQPError(ReplyCode.RESOURCE_ERROR,
                            f"unfinished messages on this connection hold {held} bytes, more than "
                            f"the limit of {self.max_partial}")

    def _started_publishing(self, out: list) -> None:
        self.publishing = True
        out.append(ev.PublishingStarted())

    def _drop_assembly(self, channel: int) -> None:
        asm = self._assembly.pop(channel, None)
        if asm is not None:
            self.partial_bytes -= asm.held
            asm.parts = []

    def _finish_message(self, channel: int, asm: _Assembly, body: bytes, out: list) -> None:
        del self._assembly[channel]
        self.partial_bytes -= asm.held
        self._channels[channel] = ChannelState.OPEN
        out.append(ev.MessageReceived(channel, asm.publish, asm.props_raw, body))

    # ---- closing -----------------------------------------------------------------
    def close_ok(self) -> None:
        """Answer the client's connection.close, once what it sent before is handled."""
        if self.state is State.CLOSE_RECEIVED:
            self.send_method(0, C.CloseOk())
            self.state = State.CLOSED

    def channel_close_ok(self, channel: int) -> None:
        """Answer the client's channel.close, once the session has handled what it sent before
        (`ChannelClosedByPeer`); the channel is then gone, unless our own close crossed the
        client's: then it is gone at the client's close-ok."""
        if channel not in self._peer_closed:
            return
        self._peer_closed.discard(channel)
        self.send_method(channel, Ch.CloseOk())
        if self._channels.get(channel) is ChannelState.CLOSE_RECEIVED:
            del self._channels[channel]

    def close_channel(self, channel: int, err: AMQPError) -> None:
        """Close one channel with a channel error. Until the client's close-ok, its frames are
        discarded, and a channel.close of the client's, crossing ours, is answered with close-ok."""
        if self._channels.get(channel) in (None, ChannelState.CLOSING):
            return
        self._drop_assembly(channel)
        self._channels[channel] = ChannelState.CLOSING
        self.send_method(channel, Ch.Close(err.code, err.text, err.class_id, err.method_id))
        if channel in self._peer_closed:      # the session has done with it: answer now
            self.channel_close_ok(channel)

    def _channel_failed(self, channel: int, err: AMQPError, out: list) -> None:
        """A channel error in a channel's frames: the session closes the channel after it has
        handled the frames before (a delivery they cause goes before the channel.close)."""
        if self._channels.get(channel) not in (ChannelState.OPEN, ChannelState.AWAIT_HEADER,
                                               ChannelState.AWAIT_BODY):
            return
        self._drop_assembly(channel)
        self._channels[channel] = ChannelState.FAILED
        out.append(ev.ChannelFailed(channel, err))

    def _on_crossing_close(self, channel: int) -> None:
        """Our channel.close and the client's crossed: close-ok, and wait for the client's."""
        self.send_method(channel, Ch.CloseOk())

    def _on_close_ok(self, channel: int) -> None:
        """The client's answer to our channel.close: the channel is gone (a frame on it after
        this is on a channel not open, 504, as in RabbitMQ)."""
        del self._channels[channel]

    def _on_close_after_failure(self, channel: int) -> None:
        self._peer_closed.add(channel)      # answered after our channel.close (`close_channel`)

    def close(self, err: AMQPError) -> None:
        """Close the connection with a connection error (or a forced close)."""
        if self.state is State.CLOSE_RECEIVED:
            self.close_ok()       # the client is closing anyway: answer it rather than cross closes
            return
        if self.state in (State.CLOSING, State.CLOSED):
            return
        self.close_reason = err
        if self.state is State.AWAIT_HEADER:
            self.state = State.CLOSED
            return
        self.send_method(0, C.Close(err.code, err.text, err.class_id, err.method_id))
        self.state = State.CLOSING

    def open_channels(self) -> list[int]:
        return list(self._channels)

    def is_channel_usable(self, channel: int) -> bool:
        return self.state is State.OPEN and self._channels.get(channel) in (
            ChannelState.OPEN, ChannelState.AWAIT_HEADER, ChannelState.AWAIT_BODY)


def _credentials(mechanism: str, response: bytes) -> tuple[str | None, str | None]:
    """Decode a PLAIN or AMQPLAIN response into (user, password)."""
    try:
        if mechanism == "PLAIN":
            _authzid, user, password = response.split(b"\x00", 2)
            return user.decode(), password.decode()
        if mechanism == "AMQPLAIN":
            table = pdecode.field_table(len(response).to_bytes(4, "big") + response)[1]
            user, password = table.get("LOGIN"), table.get("PASSWORD")
            if isinstance(user, bytes):
                user = user.decode()
            if isinstance(password, bytes):
                password = password.decode()
            return user, password
    except (ValueError, UnicodeDecodeError, KeyError):
        pass
    return None, None
