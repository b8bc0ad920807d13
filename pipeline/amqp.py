"""The AMQP side of the Spark connector: node URIs, error texts, the consumer and the publisher.

Nothing here imports pyspark, so the delivery logic can be tested against a broker without a
SparkSession. `pipeline.datasource` decides *where* each piece runs; this module only knows
how to talk to HareMQ (or any RabbitMQ-compatible broker) with pika 1.3.

* `parse_uris` / `mask` / `describe` turn options and pika exceptions into messages that name
  the node, the user, the vhost or the queue at fault, with passwords masked.
* `QueueConsumer` owns one consumer connection at a time in a daemon I/O thread. Every
  connection+channel is a *session* with a random id; deliveries are buffered per session and
  acknowledged, cumulatively, only when the owner calls `ack_through(session, tag)`. While a
  session is alive it also holds an exclusive marker queue `haremq.spark.session.<id>`, so any
  process can ask the broker whether that session (and its unacked deliveries) still exists.
* `wait_session_gone` is that question, asked from another process until the answer is no.
* `check_target` fails fast on a refused login or a missing exchange (the sink's start check).
* `ConfirmingPublisher` publishes an iterator of messages with publisher confirms, a window
  of unconfirmed messages, mandatory routing, and fails on nack, basic.return or timeout.

Both the consumer and the publisher ride through the loss of their node: on a lost connection
they connect to the next node of the URI list (then the others in turn) and go on, the consumer
as a new session (the broker redelivers what the lost one had not acked), the publisher
publishing again what the lost connection had not confirmed. They give up only when no node
takes a connection for `reconnect_timeout` seconds.
"""
from __future__ import annotations

import collections
import logging
import re
import socket
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from typing import Iterable, Iterator, List, Optional, Sequence, Tuple

import pika
import pika.exceptions as pexc

log = logging.getLogger("pipeline.haremq")

MARKER_PREFIX = "haremq.spark.session."


class HareMQError(RuntimeError):
    """A connector failure with a message meant for the person running the query."""


# --------------------------------------------------------------------------- URIs and errors

def mask(uri: str) -> str:
    """`uri` with the password replaced by ***, for messages and logs."""
    try:
        parts = urllib.parse.urlsplit(uri)
    except ValueError:
        return "<unparsable uri>"
    if parts.password is None:
        return uri
    netloc = parts.netloc.rsplit("@", 1)
    user = parts.username or ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[-1]}"))


def parse_uris(value: Optional[str], role: str) -> List[Tuple[str, pika.URLParameters]]:
    """The comma-separated `uri` option as [(masked uri, pika parameters)], in failover order.

    Raises HareMQError naming the offending URI for anything pika cannot use.
    """
    if not value or not value.strip():
        raise HareMQError(f"haremq {role}: option 'uri' is required "
                          "(amqp://user:password@host:port/vhost, several separated by commas)")
    out = []
    for raw in value.split(","):
        raw = raw.strip()
        if not raw:
            continue
        shown = mask(raw)
        scheme = raw.split("://", 1)[0].lower() if "://" in raw else ""
        if scheme not in ("amqp", "amqps"):
            raise HareMQError(f"haremq {role}: bad uri {shown!r}: expected amqp://user:password@host:port/vhost")
        try:
            params = pika.URLParameters(raw)
        except Exception as e:  # pika raises ValueError, TypeError, ... for a malformed uri
            raise HareMQError(f"haremq {role}: bad uri {shown!r}: {e}") from None
        if not urllib.parse.urlsplit(raw).hostname:
            raise HareMQError(f"haremq {role}: bad uri {shown!r}: no host")
        out.append((shown, params))
    if not out:
        raise HareMQError(f"haremq {role}: option 'uri' names no node")
    return out


def _reply(exc: BaseException) -> str:
    """'403 ACCESS_REFUSED - ...' out of pika's nested exception arguments."""
    if isinstance(exc, (pexc.ConnectionClosedByBroker, pexc.ChannelClosedByBroker)):
        return f"{exc.reply_code} {exc.reply_text}"
    for arg in getattr(exc, "args", ()):
        if isinstance(arg, BaseException):
            return _reply(arg)
        if isinstance(arg, str) and arg:
            # pika words some failures as "ConnectionClosedByBroker: (403) 'ACCESS_REFUSED - ...'"
            m = re.search(r"\((\d{3})\) '(.*)'", arg)
            return f"{m.group(1)} {m.group(2)}" if m else arg
    return repr(exc)


def describe(exc: BaseException, params: pika.URLParameters, shown: str, queue: Optional[str] = None) -> str:
    """One clause naming what went wrong with one node."""
    where = f"{shown}"
    user = params.credentials.username if params.credentials else "?"
    if isinstance(exc, (pexc.ProbableAuthenticationError, pexc.AuthenticationError)):
        return f"{where}: login refused for user {user!r} (wrong user name or password): {_reply(exc)}"
    if isinstance(exc, pexc.ProbableAccessDeniedError):
        return f"{where}: user {user!r} may not open vhost {params.virtual_host!r}: {_reply(exc)}"
    if isinstance(exc, pexc.ChannelClosedByBroker) and exc.reply_code == 404 and queue is not None:
        return f"{where}: queue {queue!r} not found in vhost {params.virtual_host!r}: {_reply(exc)}"
    if isinstance(exc, pexc.ChannelClosedByBroker) and exc.reply_code == 403:
        return f"{where}: user {user!r} is not allowed to do this: {_reply(exc)}"
    if isinstance(exc, socket.gaierror):
        return f"{where}: cannot resolve host {params.host!r}: {exc.strerror or exc}"
    if isinstance(exc, pexc.AMQPConnectionError):
        text = _reply(exc)
        if "Refused" in text or "refused" in text:
            return f"{where}: cannot connect to {params.host}:{params.port}: connection refused (is a node running there?)"
        if "Timeout" in text or "timed out" in text:
            return f"{where}: cannot connect to {params.host}:{params.port}: timed out"
        return f"{where}: connection failed: {text}"
    return f"{where}: {type(exc).__name__}: {_reply(exc)}"


def _connect_params(params: pika.URLParameters, name: str, timeout: float,
                    heartbeat: Optional[int]) -> pika.URLParameters:
    params.connection_attempts = 1
    params.retry_delay = 0
    params.socket_timeout = timeout
    params.stack_timeout = timeout * 2
    params.blocked_connection_timeout = None
    if heartbeat is not None:
        params.heartbeat = heartbeat
    params.client_properties = {"connection_name": name, "product": "haremq-spark"}
    return params


# --------------------------------------------------------------------------- consumer

@dataclass
class Delivery:
    tag: int
    exchange: str
    routing_key: str
    redelivered: bool
    properties: pika.BasicProperties
    body: bytes


@dataclass
class _Session:
    id: str
    node: str
    index: int          # of `node` in the URI list
    connection: pika.BlockingConnection
    channel: object
    buffer: collections.deque = field(default_factory=collections.deque)
    acked: int = 0
    alive: bool = True


class QueueConsumer:
    """One consumer on `queue`, kept alive by a daemon I/O thread; acks only on request.

    `start()` connects (one pass over the URIs) and raises HareMQError if no node works.
    A lost connection (reset, closed by the broker, missed heartbeats, the channel closed or the
    consumer cancelled) is replaced by one to the next node of the list, then the others in
    turn, for `reconnect_timeout` seconds; each new connection is a new session, and the
    deliveries of a lost session are dropped here (the broker requeues them, redelivered).
    `take(n)` returns (session id, deliveries) from the live session; `ack_through(session,
    tag)` acks tags <= tag with multiple=true if `session` is still the live one and otherwise
    does nothing.
    """

    def __init__(self, uris: Sequence[Tuple[str, pika.URLParameters]], queue: str, prefetch: int,
                 connect_timeout: float = 10.0, reconnect_timeout: float = 60.0,
                 heartbeat: Optional[int] = None):
        self.uris = list(uris)
        self.queue = queue
        self.prefetch = prefetch
        self.connect_timeout = connect_timeout
        self.reconnect_timeout = reconnect_timeout
        self.heartbeat = heartbeat
        self._lock = threading.Lock()
        self._session: Optional[_Session] = None
        self._fatal: Optional[HareMQError] = None
        self._stopping = False
        self._thread: Optional[threading.Thread] = None
        self._next_uri = 0

    # -- called from the owner's thread

    def start(self) -> None:
        session = self._open_any(deadline=None)  # raises HareMQError
        with self._lock:
            self._session = session
        self._thread = threading.Thread(target=self._run, name=f"haremq-consumer-{self.queue}", daemon=True)
        self._thread.start()

    def check(self) -> None:
        if self._fatal is not None:
            raise self._fatal

    def live_session(self) -> Optional[str]:
        s = self._session
        return s.id if s is not None and s.alive else None

    def take(self, n: int, max_bytes: int = 1 << 62) -> Tuple[Optional[str], List[Delivery]]:
        """Up to `n` buffered deliveries of the live session whose bodies total at most
        `max_bytes` (but at least one delivery when there is one)."""
        self.check()
        s = self._session
        if s is None or not s.alive:
            return None, []
        out = []
        buf = s.buffer  # only this thread takes from the left; the I/O thread appends
        size = 0
        try:
            while len(out) < n:
                size += len(buf[0].body)
                if out and size > max_bytes:
                    break
                out.append(buf.popleft())
        except IndexError:
            pass
        return s.id, out

    def ack_through(self, session_id: Optional[str], tag: int, timeout: float = 10.0) -> bool:
        """Ack every delivery of `session_id` up to `tag`; False if that session is gone."""
        s = self._session
        if s is None or not s.alive or s.id != session_id:
            return False
        if tag <= s.acked:
            return True
        done = threading.Event()
        result = []

        def ack():
            try:
                if s.alive and tag > s.acked:
                    s.channel.basic_ack(delivery_tag=tag, multiple=True)
                    s.acked = tag
                result.append(True)
            except Exception as e:  # the session died under us: the broker requeues
                log.warning("haremq source: ack of %s up to %d failed: %s", s.id, tag, e)
                result.append(False)
            finally:
                done.set()

        try:
            s.connection.add_callback_threadsafe(ack)
        except Exception as e:
            log.warning("haremq source: session %s gone before its ack: %s", s.id, e)
            return False
        if not done.wait(timeout):
            log.warning("haremq source: ack of %s up to %d not written within %.0fs", s.id, tag, timeout)
            return False
        return bool(result and result[0])

    def backlog(self) -> int:
        """Messages available now: buffered here plus ready in the queue (a lower bound)."""
        s = self._session
        buffered = len(s.buffer) if s is not None and s.alive else 0
        shown, params = self.uris[self._next_uri]
        try:
            conn = pika.BlockingConnection(_connect_params(params, "haremq-spark backlog", self.connect_timeout, None))
            try:
                ready = conn.channel().queue_declare(self.queue, passive=True).method.message_count
            finally:
                conn.close()
        except Exception as e:
            raise HareMQError(f"haremq source: cannot count the messages in queue {self.queue!r}: "
                              f"{describe(e, params, shown, self.queue)}") from None
        return buffered + ready

    def stop(self) -> None:
        self._stopping = True
        s = self._session
        if s is not None:
            try:
                s.connection.add_callback_threadsafe(lambda: None)
            except Exception:
                pass
        if self._thread is not None:
            self._thread.join(5)

    # -- the I/O thread

    def _run(self) -> None:
        while not self._stopping:
            s = self._session
            try:
                while not self._stopping and s.alive:
                    s.connection.process_data_events(time_limit=1)
                    if s.channel.is_closed:  # closed by the broker without closing the connection
                        raise HareMQError("channel closed by the broker")
            except Exception as e:  # connection or channel lost
                log.warning("haremq source: consumer session %s on %s lost: %s", s.id, s.node, _reply(e))
            s.alive = False
            s.buffer.clear()  # the broker requeues these; another session will get them
            try:
                if s.connection.is_open:
                    s.connection.close()
            except Exception:
                pass
            if self._stopping:
                return
            self._next_uri = (s.index + 1) % len(self.uris)   # the node that lost it last
            try:
                new = self._open_any(deadline=time.monotonic() + self.reconnect_timeout)
            except HareMQError as e:
                self._fatal = e
                log.error("%s", e)
                return
            with self._lock:
                self._session = new

    def _open_any(self, deadline: Optional[float]) -> _Session:
        """Open a session on the first node that works, starting with `_next_uri`.

        With deadline None, one pass over the URIs; otherwise passes until the deadline.
        """
        errors = {}
        delay = 0.2
        while True:
            for i in range(len(self.uris)):
                k = (self._next_uri + i) % len(self.uris)
                shown, params = self.uris[k]
                try:
                    s = self._open(k, shown, params)
                    self._next_uri = k
                    return s
                except Exception as e:
                    errors[shown] = describe(e, params, shown, self.queue)
                    log.info("haremq source: %s", errors[shown])
            if deadline is None or time.monotonic() + delay > deadline:
                raise HareMQError(f"haremq source: cannot consume from queue {self.queue!r}: "
                                  + "; ".join(errors.values()))
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
            self._next_uri = (self._next_uri + 1) % len(self.uris)

    def _open(self, index: int, shown: str, params: pika.URLParameters) -> _Session:
        sid = uuid.uuid4().hex
        params = _connect_params(params, f"haremq-spark source {self.queue} {sid}", self.connect_timeout,
                                 self.heartbeat)
        conn = pika.BlockingConnection(params)
        try:
            ch = conn.channel()
            ch.queue_declare(self.queue, passive=True)
            ch.queue_declare(MARKER_PREFIX + sid, exclusive=True, auto_delete=True)
            ch.basic_qos(prefetch_count=self.prefetch)
            s = _Session(id=sid, node=shown, index=index, connection=conn, channel=ch)

            def on_message(_ch, method, properties, body, buf=s.buffer):
                buf.append(Delivery(method.delivery_tag, method.exchange, method.routing_key,
                                    method.redelivered, properties, body))

            def on_cancel(_frame):
                log.warning("haremq source: the broker cancelled the consumer on %s (queue deleted?)",
                            self.queue)
                s.alive = False

            ch.add_on_cancel_callback(on_cancel)
            ch.basic_consume(self.queue, on_message, auto_ack=False, consumer_tag=f"haremq-spark-{sid}")
        except Exception:
            try:
                conn.close()
            except Exception:
                pass
            raise
        log.info("haremq source: session %s consuming %r on %s", sid, self.queue, shown)
        return s


def wait_session_gone(uris: Sequence[Tuple[str, pika.URLParameters]], session_id: str,
                      timeout: float = 150.0, unreachable_timeout: float = 60.0,
                      connect_timeout: float = 10.0) -> Optional[str]:
    """Wait until consumer session `session_id` no longer holds its connection: None then.

    The nodes are asked in order, once a second, for the session's marker queue (passive
    declare); the first that answers decides. 404 means the session is gone: its connection
    closed, or its node went down and the cluster deleted its exclusive queues, so the broker
    has its unacked deliveries back. 405 RESOURCE_LOCKED (an exclusive queue of another
    connection) means it is still there: a half-open connection is only dropped after missed
    heartbeats, a node that died only once the others agree it is down. After `timeout` seconds
    of that, returns what the nodes answered. A node that refuses the connection or times out
    is passed over; if none answers for `unreachable_timeout` seconds, raises HareMQError naming
    each node's failure.
    """
    started = time.monotonic()
    answered = started       # when a node last answered
    while True:
        answers = {}
        held = False
        for shown, params in uris:
            try:
                p = _connect_params(params, f"haremq-spark session check {session_id}", connect_timeout, None)
                conn = pika.BlockingConnection(p)
            except Exception as e:
                answers[shown] = describe(e, params, shown)
                continue
            try:
                conn.channel().queue_declare(MARKER_PREFIX + session_id, passive=True)
                answers[shown] = f"{shown}: its marker queue {MARKER_PREFIX + session_id!r} exists"
                held = True
            except pexc.ChannelClosedByBroker as e:
                if e.reply_code == 404:
                    return None
                answers[shown] = f"{shown}: {_reply(e)}"
                held = True
            except Exception as e:  # the connection dropped while asking: ask the next node
                answers[shown] = describe(e, params, shown)
            finally:
                try:
                    if conn.is_open:
                        conn.close()
                except Exception:
                    pass
            if held:
                break
        now = time.monotonic()
        if held:
            answered = now
            if now - started >= timeout:
                return "; ".join(answers.values())
        elif now - answered >= unreachable_timeout:
            raise HareMQError(
                f"haremq source: cannot ask any node whether consumer session {session_id} is gone "
                f"(no answer for {unreachable_timeout:g}s, reconnectTimeout): " + "; ".join(answers.values()))
        time.sleep(1.0)


# --------------------------------------------------------------------------- publisher

def check_target(uris: Sequence[Tuple[str, pika.URLParameters]], exchange: str,
                 connect_timeout: float = 10.0) -> None:
    """Fail early, naming the problem, if the login is refused or `exchange` is missing.

    Spark calls this for every batch commit as well as at query start, so a node that cannot be
    reached right now is not an error here (the tasks' publishing reports it, or fails over);
    only answers that would make every publish fail are.
    """
    unreachable = []
    for shown, params in uris:
        try:
            conn = pika.BlockingConnection(
                _connect_params(params, "haremq-spark sink check", connect_timeout, None))
        except (pexc.ProbableAuthenticationError, pexc.AuthenticationError, pexc.ProbableAccessDeniedError) as e:
            raise HareMQError(f"haremq sink: cannot publish to exchange {exchange!r}: "
                              f"{describe(e, params, shown)}") from None
        except Exception as e:
            unreachable.append(describe(e, params, shown))
            continue
        try:
            if exchange:
                conn.channel().exchange_declare(exchange, passive=True)
            return
        except pexc.ChannelClosedByBroker as e:
            if e.reply_code == 404:
                raise HareMQError(f"haremq sink: {shown}: exchange {exchange!r} not found in vhost "
                                  f"{params.virtual_host!r}: {_reply(e)}") from None
            raise HareMQError(f"haremq sink: {describe(e, params, shown)}") from None
        finally:
            try:
                conn.close()
            except Exception:
                pass
    log.warning("haremq sink: no node reachable for a check now: %s", "; ".join(unreachable))


@dataclass
class Outgoing:
    routing_key: str
    body: bytes
    properties: pika.BasicProperties


# Reply codes another node may not repeat: this one is going away (320 CONNECTION_FORCED: it is
# stopping, or paused without a majority), lacked a resource for a moment (506) or failed
# internally (541). Any other code (403, 404, 406, 530, ...) every node would answer alike.
TRANSIENT_REPLY_CODES = frozenset({320, 506, 541})


def lost_connection(reason: BaseException) -> bool:
    """Whether pika's close `reason` of a connection or channel means the connection was lost
    (reset, closed by a node that is going away, missed heartbeats) rather than refused."""
    if isinstance(reason, (pexc.ConnectionClosedByBroker, pexc.ChannelClosedByBroker)):
        return reason.reply_code in TRANSIENT_REPLY_CODES
    return not isinstance(reason, (pexc.ConnectionClosedByClient, pexc.ChannelClosedByClient))


def _login_refused(exc: BaseException) -> bool:
    """A refusal every node of the cluster would repeat (users and permissions are shared)."""
    return isinstance(exc, (pexc.ProbableAuthenticationError, pexc.AuthenticationError,
                            pexc.ProbableAccessDeniedError))


class ConfirmingPublisher:
    """Publishes messages with confirms on a SelectConnection driven by this thread.

    `publish(messages)` returns the number confirmed. A lost connection (reset, a node that
    closes it with 320 CONNECTION_FORCED, missed heartbeats, a channel closed with 320, 506 or
    541) is not an error: the next node of the list takes over and the messages the lost one
    had not confirmed are published there again, in order and unchanged (so a deduplicating
    queue drops the copies that had arrived), then the rest. The call raises HareMQError only
    when no node takes the connection within `reconnect_timeout` seconds (counted from the start,
    or from the last confirm), or when the broker nacks a message, returns one (mandatory,
    unroutable), stays silent for `confirm_timeout` seconds while confirms are outstanding,
    refuses the login or closes the channel with any other code. Then the caller (a Spark task)
    fails and Spark runs the whole batch again.
    """

    def __init__(self, uris: Sequence[Tuple[str, pika.URLParameters]], exchange: str,
                 mandatory: bool = True, window: int = 2000, confirm_timeout: float = 30.0,
                 connect_timeout: float = 10.0, name: str = "haremq-spark sink",
                 reconnect_timeout: float = 60.0, heartbeat: Optional[int] = None):
        self.uris = list(uris)
        self.exchange = exchange
        self.mandatory = mandatory
        self.window = window
        self.confirm_timeout = confirm_timeout
        self.connect_timeout = connect_timeout
        self.name = name
        self.reconnect_timeout = reconnect_timeout
        self.heartbeat = heartbeat

    def publish(self, messages: Iterable[Outgoing]) -> int:
        it = iter(messages)
        try:
            first = next(it)
        except StopIteration:
            return 0
        work = _Work(first, it)
        k = 0
        deadline = time.monotonic() + self.reconnect_timeout
        failures: dict = {}     # node -> why, since the last connection that got a confirm
        tried = 0               # connections tried since then
        delay = 0.2
        while True:
            shown, params = self.uris[k]
            run = _PublishRun(self, shown, params, work)
            run.start()
            if run.raised is not None:
                raise run.raised
            if run.fatal is not None:
                raise HareMQError(run.fatal)
            if run.finished:
                return work.confirmed
            if run.confirmed:   # progress: the allowance starts again
                deadline = time.monotonic() + self.reconnect_timeout
                failures, tried, delay = {}, 0, 0.2
            failures[shown] = run.lost
            tried += 1
            if run.opened:
                log.warning("haremq sink: %s; publishing its %d unconfirmed messages again on the next node",
                            run.lost, run.given_back)
            k = (k + 1) % len(self.uris)
            if tried >= len(self.uris):   # every node tried since the last progress
                now = time.monotonic()
                if now >= deadline:
                    raise HareMQError(self._no_node(work, failures))
                time.sleep(min(delay, deadline - now))
                delay = min(delay * 2, 2.0)
                tried = 0

    def _no_node(self, work: "_Work", failures: dict) -> str:
        done = f" after {work.confirmed} messages confirmed" if work.confirmed else ""
        return (f"haremq sink: cannot publish to exchange {self.exchange!r}{done}: no node took the "
                f"connection within reconnectTimeout ({self.reconnect_timeout:g}s): "
                + "; ".join(failures.values()))


class _Work:
    """What one `publish` call still has to do, carried from one connection to the next."""

    def __init__(self, first: Outgoing, rest: Iterator[Outgoing]):
        self.again: collections.deque = collections.deque([first])   # taken from `rest`, not confirmed
        self.rest = rest
        self.exhausted = False
        self.confirmed = 0

    def next(self) -> Optional[Outgoing]:
        if self.again:
            return self.again.popleft()
        if self.exhausted:
            return None
        try:
            return next(self.rest)
        except StopIteration:
            self.exhausted = True
            return None

    @property
    def finished(self) -> bool:
        return self.exhausted and not self.again


class _PublishRun:
    """One connection's worth of publishing (callbacks of pika's SelectConnection).

    Ends `finished` (all confirmed), with `fatal` (a text: the task must fail), `raised` (the
    messages' iterator failed) or `lost` (a text: the connection did not open, or was lost; what
    it had not confirmed is back at the front of the work, `given_back` messages).
    """

    def __init__(self, pub: ConfirmingPublisher, shown: str, params: pika.URLParameters, work: _Work):
        self.pub = pub
        self.shown = shown
        self.params = _connect_params(params, pub.name, pub.connect_timeout, pub.heartbeat)
        self.work = work
        self.opened = False
        self.finished = False
        self.fatal: Optional[str] = None
        self.lost: Optional[str] = None
        self.raised: Optional[BaseException] = None
        self.given_back = 0
        self.published = 0      # on this connection: its publish sequence numbers
        self.confirmed = 0
        self.unconfirmed: collections.deque = collections.deque()    # (sequence number, message)
        self.acked_out_of_order: set = set()
        self.last_progress = time.monotonic()
        self.channel = None
        self.conn: Optional[pika.SelectConnection] = None
        self.closing = False

    def start(self) -> None:
        self.conn = pika.SelectConnection(self.params, on_open_callback=self._on_open,
                                          on_open_error_callback=self._on_open_error,
                                          on_close_callback=self._on_closed)
        self.conn.ioloop.start()
        if self.fatal is None and self.raised is None and not self.finished:
            if self.lost is None:
                self.lost = f"connection to {self.shown} ended"
            back = [m for seq, m in self.unconfirmed if seq not in self.acked_out_of_order]
            self.work.again.extendleft(reversed(back))
            self.given_back = len(back)
            self.unconfirmed.clear()

    # -- connection lifecycle

    def _on_open(self, conn) -> None:
        self.opened = True
        conn.channel(on_open_callback=self._on_channel)

    def _on_open_error(self, conn, exc) -> None:
        text = describe(exc, self.params, self.shown)
        if _login_refused(exc):
            self.fatal = f"haremq sink: cannot publish to exchange {self.pub.exchange!r}: {text}"
        else:
            self.lost = text
        conn.ioloop.stop()

    def _on_closed(self, conn, reason) -> None:
        if not self.closing:
            text = (f"connection to {self.shown} closed after {self.published} published, "
                    f"{self.confirmed} confirmed: {_reply(reason)}")
            if lost_connection(reason):
                self._lose(text)
            else:
                self._fail(f"haremq sink: {text}")
        conn.ioloop.stop()

    def _on_channel(self, ch) -> None:
        self.channel = ch
        ch.add_on_close_callback(self._on_channel_closed)
        ch.add_on_return_callback(self._on_return)
        ch.confirm_delivery(ack_nack_callback=self._on_confirm, callback=self._on_confirm_ok)
        self.conn.ioloop.call_later(1.0, self._watchdog)

    def _on_confirm_ok(self, _frame) -> None:
        self.last_progress = time.monotonic()
        self._pump()

    def _on_channel_closed(self, ch, reason) -> None:
        if self.closing:
            return
        text = _reply(reason)
        if lost_connection(reason):   # the connection went, or the node is going away
            self._lose(f"channel on {self.shown} closed after {self.published} published, "
                       f"{self.confirmed} confirmed: {text}")
            return
        if isinstance(reason, pexc.ChannelClosedByBroker) and reason.reply_code == 404:
            text = f"exchange {self.pub.exchange!r} not found: {text}"
        self._fail(f"haremq sink: channel closed by {self.shown}: {text}")

    def _fail(self, text: str) -> None:
        if self.fatal is None and self.lost is None:
            self.fatal = text
        self._close()

    def _lose(self, text: str) -> None:
        if self.fatal is None and self.lost is None:
            self.lost = text
        self._close()

    def _close(self) -> None:
        if self.closing:
            return
        self.closing = True
        try:
            if self.conn.is_open:
                self.conn.close()
                # a node that hangs never answers the close: do not wait for it forever
                self.conn.ioloop.call_later(self.pub.connect_timeout, self.conn.ioloop.stop)
            else:
                self.conn.ioloop.stop()
        except Exception:
            self.conn.ioloop.stop()

    # -- publishing and confirms

    def _pump(self) -> None:
        if self.closing:
            return
        ch = self.channel
        while len(self.unconfirmed) - len(self.acked_out_of_order) < self.pub.window:
            try:
                m = self.work.next()
            except Exception as e:  # the rows' iterator failed (in Spark, or a row the sink refuses)
                self.raised = e
                self._fail(f"haremq sink: publishing failed after {self.published} messages: "
                           f"{type(e).__name__}: {e}")
                return
            if m is None:
                break
            try:
                ch.basic_publish(self.pub.exchange, m.routing_key, m.body, m.properties,
                                 mandatory=self.pub.mandatory)
            except Exception as e:
                if ch.is_open and self.conn.is_open:   # the message itself: pika cannot encode it
                    self.raised = e
                    self._fail(f"haremq sink: publishing failed after {self.published} messages: "
                               f"{type(e).__name__}: {e}")
                else:                                  # the channel went away under us
                    self.work.again.appendleft(m)
                    self._lose(f"publishing to {self.shown} failed after {self.published} messages: "
                               f"{type(e).__name__}: {e}")
                return
            self.published += 1
            self.unconfirmed.append((self.published, m))
        # Time spent waiting for Spark's rows is not the broker's silence: restart the clock.
        self.last_progress = time.monotonic()
        self._maybe_done()

    def _maybe_done(self) -> None:
        if not self.unconfirmed and self.work.finished:
            self.finished = True
            self._close()

    def _confirmed_one(self) -> None:
        self.confirmed += 1
        self.work.confirmed += 1

    def _on_confirm(self, frame) -> None:
        method = frame.method
        tag = method.delivery_tag
        if isinstance(method, pika.spec.Basic.Nack):
            self._fail(f"haremq sink: {self.shown} nacked message {tag} published to exchange "
                       f"{self.pub.exchange!r} (the queue refused it, e.g. x-overflow=reject-publish)")
            return
        dq = self.unconfirmed
        if method.multiple:
            while dq and dq[0][0] <= tag:
                dq.popleft()
                self._confirmed_one()
            self.acked_out_of_order = {t for t in self.acked_out_of_order if t > tag}
        elif dq and dq[0][0] == tag:
            dq.popleft()
            self._confirmed_one()
        else:
            self.acked_out_of_order.add(tag)
        while dq and dq[0][0] in self.acked_out_of_order:
            self.acked_out_of_order.discard(dq.popleft()[0])
            self._confirmed_one()
        self.last_progress = time.monotonic()
        self._pump()

    def _on_return(self, ch, method, properties, body) -> None:
        self._fail(f"haremq sink: {self.shown} returned a message: {method.reply_code} {method.reply_text} "
                   f"(exchange {method.exchange!r}, routing key {method.routing_key!r}): "
                   "no queue is bound for it")

    def _watchdog(self) -> None:
        if self.closing:
            return
        if self.unconfirmed and time.monotonic() - self.last_progress > self.pub.confirm_timeout:
            self._fail(f"haremq sink: no publisher confirm from {self.shown} for "
                       f"{self.pub.confirm_timeout:.0f}s with {len(self.unconfirmed)} messages unconfirmed")
            return
        self.conn.ioloop.call_later(1.0, self._watchdog)
