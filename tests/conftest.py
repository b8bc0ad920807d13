"""Integration-test fixtures for HareMQ.

Every test talks to a broker over TCP, exactly like a real client would.

* By default each test module gets its own ``haremq node`` process (fixture
  ``node``) on a free port with its own data dir, so ``pytest -n N`` (xdist)
  works: nothing is shared between workers or modules.
* ``fresh_node`` (function scope) starts a node for a single test that needs
  an untouched broker.
* ``own_node`` is a ``fresh_node`` the test may kill/stop; it is skipped in
  reference mode.
* ``cluster``: three cluster members (tests/clusters.py), set up by ``pytest.mark.cluster(...)``.
* ``node_or_cluster_member`` (module scope) is the ``node`` of the per-client modules
  (tests/test_client_*.py): a single node, then a member of a three-node cluster.
* Reference mode: if ``HAREMQ_TEST_REF_PORT`` is set, nothing is started and
  every fixture points at an already running broker on 127.0.0.1:PORT (a real
  RabbitMQ 3.10, e.g. Debian's rabbitmq-server on a port of its own). Tests use
  ``unique_name()`` for every queue/exchange, so they do not collide on a
  shared broker. Tests that must control the node process are skipped.

Helpers (import them with ``from tests.conftest import ...``):
``free_port()``, ``Node``, ``pika_conn(node, **params)``,
``raw_socket(node, ...)`` -> ``RawClient``, ``unique_name(prefix)``,
``wait_until(pred, timeout)``, ``message_count(ch, queue)``,
``assert_node_healthy(node)``.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

import pika
import pytest
from pamqp import body as pbody
from pamqp import commands as spec
from pamqp import exceptions as pexc
from pamqp import frame as pframe
from pamqp import header as pheader
from pamqp import heartbeat as pheartbeat

TEST_SEGMENT_SIZE = 8 << 20
HOST = "127.0.0.1"
REF_PORT = os.environ.get("HAREMQ_TEST_REF_PORT")
IS_REF = bool(REF_PORT)
PROJECT_ROOT = Path(__file__).resolve().parent.parent

CLIENT_CAPABILITIES = {
    "publisher_confirms": True,
    "exchange_exchange_bindings": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
}

needs_process = pytest.mark.skipif(
    IS_REF, reason="controls the node process; not possible against the reference broker")


# --------------------------------------------------------------------------- utilities

_PORTS = random.Random()
_HANDED_OUT: set[int] = set()


def _port_range() -> tuple[int, int]:
    """20000-32000, split between xdist workers so that two never pick the same port."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    count = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    size = 12000 // count
    return 20000 + index * size, 20000 + (index + 1) * size


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1.

    Chosen below the kernel's ephemeral range (32768+), so that the sockets
    clients, proxies and gRPC open meanwhile cannot take it before the node
    binds it; from this worker's own share, and never the same one twice in
    a run, so that ports handed out but not yet bound do not collide.
    """
    low, high = _port_range()
    for _ in range(200):
        port = _PORTS.randrange(low, high)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind((HOST, port))
            except OSError:
                continue
            _HANDED_OUT.add(port)
            return port
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def unique_name(prefix: str = "t") -> str:
    """A queue/exchange name no other test (or xdist worker) uses."""
    return f"{prefix}.{os.getpid()}.{uuid.uuid4().hex[:10]}"


def wait_until(pred, timeout: float = 5.0, interval: float = 0.05, message: str = ""):
    """Poll ``pred()`` until it returns a truthy value; return it or fail."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = pred()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(message or f"condition not met within {timeout}s (last {last!r})")
        time.sleep(interval)


def haremq_command() -> list[str]:
    """argv prefix for the broker: $HAREMQ_BIN, the `haremq` script, or the module."""
    if os.environ.get("HAREMQ_BIN"):
        return os.environ["HAREMQ_BIN"].split()
    exe = shutil.which("haremq")
    if exe:
        return [exe]
    return [sys.executable, "-c", "import sys; from haremq.cluster.cli import main; sys.exit(main())"]


def port_open(port: int, timeout: float = 0.5, host: str = HOST) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------- the node

class Node:
    """One broker. Either a ``haremq node`` subprocess or the external reference."""

    def __init__(self, name: str, workdir: Path, port: int | None = None, external: bool = False):
        self.name = name
        self.workdir = Path(workdir)
        self.data_dir = self.workdir / "data"
        self.log_path = self.workdir / f"{name}.log"
        self.port = port or free_port()
        self.host = HOST           # the address it binds and is reached on (a 127.0.0.x of its own if set)
        self.external = external
        self.env: dict[str, str] = {}     # added to the node process's environment
        self.proc: subprocess.Popen | None = None
        self._log_fh = None

    @classmethod
    def reference(cls, workdir: Path) -> "Node":
        return cls("ref", workdir, port=int(REF_PORT), external=True)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{self.host}:{self.port}/%2F"

    def argv(self) -> list[str]:
        # small segments: every node start zeroes a spare segment ahead of the writes, and a run
        # starts hundreds of nodes; tests that care give --segment-size again (the last one counts)
        # the management API and /metrics are off unless a test asks for them (their default
        # ports, 15672 and 15692, would be shared by every node of the run)
        return [*haremq_command(), "node", "--name", self.name, "--data-dir", str(self.data_dir),
                "--amqp-port", str(self.port), "--bind", self.host, "--segment-size", str(TEST_SEGMENT_SIZE),
                "--management-port", "0", "--prometheus-port", "0"]

    def start(self, timeout: float = 30.0) -> "Node":
        if self.external:
            if not port_open(self.port, 2.0):
                raise RuntimeError(f"reference broker not listening on {HOST}:{self.port}")
            return self
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log_fh = open(self.log_path, "ab")
        env = {**os.environ, **self.env} if self.env else None
        self.proc = subprocess.Popen(self.argv(), stdout=self._log_fh, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     cwd=str(PROJECT_ROOT), env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"node {self.name} exited with {self.proc.returncode} before "
                                   f"opening port {self.port}:\n{self.log_tail()}")
            if port_open(self.port, 0.2, self.host):
                return self
            time.sleep(0.05)
        self.kill9()
        raise RuntimeError(f"node {self.name} did not open port {self.port} within {timeout}s:\n"
                           f"{self.log_tail()}")

    def is_running(self) -> bool:
        if self.external:
            return port_open(self.port)
        return self.proc is not None and self.proc.poll() is None

    def assert_alive(self):
        if not self.external:
            assert self.is_running(), f"node exited with {self.proc.returncode}:\n{self.log_tail()}"

    def kill9(self):
        if self.external:
            pytest.skip("cannot kill the reference broker")
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(10)
        self._close_log()

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM and wait; returns the exit code (SIGKILL after ``timeout``)."""
        if self.external:
            return None
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill9()
        self._close_log()
        return self.proc.returncode

    def _close_log(self):
        if self._log_fh is not None:
            self._log_fh.close()
            self._log_fh = None

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:]) or "(no output)"

    def __repr__(self):
        return f"<Node {self.name} port={self.port} external={self.external}>"


def _make_node(workdir: Path, name: str) -> Node:
    if IS_REF:
        return Node.reference(workdir).start()
    last = None
    for _ in range(3):  # free_port() can race with another xdist worker
        n = Node(name, workdir)
        try:
            return n.start()
        except RuntimeError as e:
            last = e
            n.kill9()
            if "in use" not in str(e).lower():
                raise
    raise last


@pytest.fixture(scope="module")
def node(tmp_path_factory, request):
    """One broker per test module (own port, own data dir)."""
    mod = request.module.__name__.rsplit(".", 1)[-1]
    n = _make_node(tmp_path_factory.mktemp(mod), f"hare-{mod.replace('_', '-')}")
    yield n
    n.stop()


@pytest.fixture(scope="module", params=["node", "cluster"], ids=["single-node", "cluster"])
def node_or_cluster_member(tmp_path_factory, request):
    """The per-client modules' `node`, twice: one broker for the module, then a three-node
    cluster's member that is not the Raft metadata leader, with every queue mirrored on all three
    members (queues are mastered where the client declares them, so both the master's and the
    mirrors' paths run). One cluster per module; skipped in reference mode."""
    mod = request.module.__name__.rsplit(".", 1)[-1]
    if request.param == "node":
        n = _make_node(tmp_path_factory.mktemp(mod), f"hare-{mod.replace('_', '-')}")
        yield n
        n.stop()
        return
    if IS_REF:
        pytest.skip("starts a three-node cluster; the reference broker is one node")
    from tests.clusters import mirror_every_queue, not_the_leader, plain_cluster, stop_cluster
    members = plain_cluster(tmp_path_factory.mktemp(f"{mod}-cluster"))
    try:
        member = not_the_leader(members)
        mirror_every_queue(member)
        yield member
    finally:
        stop_cluster(members)


@pytest.fixture(scope="module")
def _module_clusters():
    """Clusters shared by a module's tests (`pytest.mark.cluster(shared=True)`), stopped at its end."""
    with ExitStack() as stack:
        yield stack, {}


@pytest.fixture
def cluster(request, tmp_path, _module_clusters):
    """Three cluster members as real processes, hare1's links through proxies that can be cut
    (tests/clusters.py: Cluster, running_cluster), stopped after the test. A module or test says
    how with `pytest.mark.cluster(failure_timeout=3.0, management=False, shared=False)`:
    `management` gives each member the management API and /metrics, `shared` starts one cluster
    for every test of the module (tests that kill no member). Skipped in reference mode."""
    if IS_REF:
        pytest.skip("starts and kills cluster node processes")
    from tests.clusters import running_cluster
    marker = request.node.get_closest_marker("cluster")
    options = dict(marker.kwargs) if marker is not None else {}
    if options.pop("shared", False):
        stack, started = _module_clusters
        if "cluster" not in started:
            workdir = request.getfixturevalue("tmp_path_factory").mktemp("cluster")
            started["cluster"] = stack.enter_context(running_cluster(workdir, **options))
        yield started["cluster"]
        _print_logs_if_failed(request, started["cluster"])
        return
    with running_cluster(tmp_path, **options) as members:
        yield members
        _print_logs_if_failed(request, members)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the item: a fixture's teardown can tell the test failed."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)


def _print_logs_if_failed(request, members, lines: int = 60) -> None:
    """A failed cluster test shows what its members logged last (on CI, the only trace left)."""
    report = getattr(request.node, "report_call", None)
    if report is None or not report.failed:
        return
    for member in members:
        print(f"----- {member.name} log (last {lines} lines) -----\n{member.log_tail(lines)}", file=sys.stderr)


@pytest.fixture
def fresh_node(tmp_path):
    """A broker for this test only (the shared reference broker in ref mode)."""
    n = _make_node(tmp_path, "hare-fresh")
    yield n
    n.stop()


@pytest.fixture
def own_node(tmp_path):
    """A broker process the test may stop or kill; skipped in reference mode."""
    if IS_REF:
        pytest.skip("needs to control the node process")
    n = _make_node(tmp_path, "hare-own")
    yield n
    n.kill9()


# --------------------------------------------------------------------------- clients

_open_clients: list = []


@pytest.fixture(autouse=True)
def _close_clients():
    """Close every connection a test opened, even when it failed."""
    yield
    while _open_clients:
        c = _open_clients.pop()
        try:
            if isinstance(c, pika.BlockingConnection):
                if c.is_open:
                    c.close()
            else:
                c.close()
        except Exception:
            pass


def conn_params(node: Node, heartbeat: int = 30, **params) -> pika.ConnectionParameters:
    params.setdefault("virtual_host", "/")
    params.setdefault("credentials", pika.PlainCredentials("guest", "guest"))
    params.setdefault("connection_attempts", 1)
    params.setdefault("socket_timeout", 5)
    params.setdefault("blocked_connection_timeout", 30)
    return pika.ConnectionParameters(host=node.host, port=node.port, heartbeat=heartbeat, **params)


def pika_conn(node: Node, heartbeat: int = 30, **params) -> pika.BlockingConnection:
    """A pika BlockingConnection to ``node`` (guest/guest, vhost '/')."""
    c = pika.BlockingConnection(conn_params(node, heartbeat=heartbeat, **params))
    _open_clients.append(c)
    return c


@pytest.fixture
def conn(node):
    return pika_conn(node)


@pytest.fixture
def ch(conn):
    """A channel in confirm mode on the module's node."""
    c = conn.channel()
    c.confirm_delivery()
    return c


def message_count(ch, queue: str) -> int:
    return ch.queue_declare(queue, passive=True).method.message_count


def assert_node_healthy(node: Node, timeout: float = 10.0):
    """A brand-new client can still declare, publish and get."""
    node.assert_alive()
    c = pika_conn(node)
    try:
        ch = c.channel()
        q = unique_name("health")
        ch.queue_declare(q, auto_delete=False, exclusive=True)
        ch.confirm_delivery()
        ch.basic_publish("", q, b"ping")
        m, _, b = ch.basic_get(q, auto_ack=True)
        assert m is not None and b == b"ping", "health check: message not returned by basic.get"
    finally:
        c.close()
    node.assert_alive()


class PeerClosed(Exception):
    """The broker closed the TCP connection."""


class RawClient:
    """An AMQP client at the frame level (pamqp encodes/decodes).

    ``send_frame(frame, channel)`` / ``send_bytes(data)`` write; ``recv_frame()``
    returns ``(channel, frame)``, raising ``PeerClosed`` at EOF and
    ``socket.timeout`` when nothing arrives in time. Heartbeat frames are
    returned like any other frame unless ``skip_heartbeats``.
    """

    def __init__(self, node: Node, rcvbuf: int | None = None, timeout: float = 10.0):
        self.node = node
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect((HOST, node.port))
        self.buf = bytearray()
        self.pos = 0
        self.record = True  # keep every frame in .received (turn off for bulk reads)
        self.start = None
        self.tune = None
        self.frame_max = 131072
        self.received: list = []
        _open_clients.append(self)

    # ---- transport
    def send_bytes(self, data: bytes):
        self.sock.sendall(data)

    def send_frame(self, frame, channel: int = 0):
        self.sock.sendall(pframe.marshal(frame, channel))

    def send_frames(self, frames, channel: int = 1):
        self.sock.sendall(b"".join(pframe.marshal(f, channel) for f in frames))

    def _fill(self, deadline: float):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise socket.timeout("no frame before the deadline")
        self.sock.settimeout(remaining)
        try:
            data = self.sock.recv(1 << 20)
        except ConnectionResetError as e:
            raise PeerClosed("connection reset") from e
        if not data:
            raise PeerClosed("EOF")
        if self.pos > (1 << 20):
            del self.buf[:self.pos]
            self.pos = 0
        self.buf += data

    def _available(self) -> int:
        return len(self.buf) - self.pos

    def recv_bytes(self, n: int, timeout: float = 5.0) -> bytes:
        deadline = time.monotonic() + timeout
        while self._available() < n:
            self._fill(deadline)
        out = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return out

    def recv_frame(self, timeout: float = 5.0, skip_heartbeats: bool = True):
        deadline = time.monotonic() + timeout
        while True:
            avail = self._available()
            p = self.pos
            if avail >= 8 and self.buf[p:p + 4] == b"AMQP":
                self.pos += 8
                return 0, bytes(self.buf[p:p + 8])
            if avail >= 7:
                size = struct.unpack_from(">I", self.buf, p + 3)[0]
                if avail >= size + 8:
                    raw = bytes(self.buf[p:p + size + 8])
                    try:
                        used, channel, frame = pframe.unmarshal(raw)
                    except pexc.UnmarshalingException as e:
                        raise AssertionError(f"undecodable frame from broker: {e}") from e
                    self.pos += used
                    if skip_heartbeats and isinstance(frame, pheartbeat.Heartbeat):
                        continue
                    if self.record:
                        self.received.append((channel, frame))
                    return channel, frame
            self._fill(deadline)

    def expect(self, cls, channel: int | None = None, timeout: float = 5.0):
        """Next non-heartbeat frame; assert its type (and channel)."""
        ch, frame = self.recv_frame(timeout)
        assert isinstance(frame, cls), f"expected {cls.__name__}, got {frame!r} on channel {ch}"
        if channel is not None:
            assert ch == channel, f"{cls.__name__} on channel {ch}, expected {channel}"
        return frame

    def recv_until(self, cls, timeout: float = 5.0):
        """Skip frames until one of type ``cls``; returns (channel, frame, skipped)."""
        deadline = time.monotonic() + timeout
        skipped = []
        while True:
            ch, frame = self.recv_frame(max(0.01, deadline - time.monotonic()))
            if isinstance(frame, cls):
                return ch, frame, skipped
            skipped.append((ch, frame))

    def expect_connection_close(self, timeout: float = 10.0) -> spec.Connection.Close:
        """Read until connection.close (answering close-ok); then EOF must follow."""
        _, frame, _ = self.recv_until(spec.Connection.Close, timeout)
        try:
            self.send_frame(spec.Connection.CloseOk())
        except OSError:
            pass
        self.expect_eof(timeout)
        return frame

    def expect_eof(self, timeout: float = 10.0) -> list:
        """Read (and return) frames until the broker closes the socket."""
        frames = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                frames.append(self.recv_frame(max(0.01, deadline - time.monotonic()),
                                              skip_heartbeats=False))
            except PeerClosed:
                return frames
            except socket.timeout:
                raise AssertionError(f"broker did not close the socket within {timeout}s; "
                                     f"got {frames!r}") from None

    def expect_channel_close(self, channel: int, timeout: float = 5.0) -> spec.Channel.Close:
        _, frame, _ = self.recv_until(spec.Channel.Close, timeout)
        self.send_frame(spec.Channel.CloseOk(), channel)
        return frame

    # ---- handshake and common methods
    def handshake(self, heartbeat: int = 0, frame_max: int = 131072, channel_max: int = 2047,
                  vhost: str = "/", user: str = "guest", password: str = "guest",
                  mechanism: str = "PLAIN", response: str | None = None):
        self.send_bytes(b"AMQP\x00\x00\x09\x01")
        self.start = self.expect(spec.Connection.Start, 0)
        if response is None:
            response = f"\x00{user}\x00{password}"
        props = {"product": "haremq-tests", "capabilities": dict(CLIENT_CAPABILITIES)}
        self.send_frame(spec.Connection.StartOk(client_properties=props, mechanism=mechanism,
                                                response=response))
        self.tune = self.expect(spec.Connection.Tune, 0)
        self.frame_max = frame_max
        self.send_frame(spec.Connection.TuneOk(channel_max=channel_max, frame_max=frame_max,
                                               heartbeat=heartbeat))
        self.send_frame(spec.Connection.Open(virtual_host=vhost))
        self.expect(spec.Connection.OpenOk, 0)
        return self

    def open_channel(self, channel: int = 1):
        self.send_frame(spec.Channel.Open(), channel)
        self.expect(spec.Channel.OpenOk, channel)
        return channel

    def rpc(self, method, channel: int, reply_cls, timeout: float = 5.0):
        self.send_frame(method, channel)
        return self.expect(reply_cls, channel, timeout)

    def publish(self, channel: int, exchange: str, routing_key: str, body: bytes,
                properties: spec.Basic.Properties | None = None, mandatory: bool = False,
                immediate: bool = False):
        self.sock.sendall(self.publish_bytes(channel, exchange, routing_key, body, properties,
                                             mandatory, immediate))

    def publish_bytes(self, channel: int, exchange: str, routing_key: str, body: bytes,
                      properties=None, mandatory=False, immediate=False) -> bytes:
        out = [pframe.marshal(spec.Basic.Publish(exchange=exchange, routing_key=routing_key,
                                                 mandatory=mandatory, immediate=immediate),
                              channel),
               pframe.marshal(pheader.ContentHeader(0, len(body),
                                                    properties or spec.Basic.Properties()),
                              channel)]
        step = max(1, self.frame_max - 8)
        for i in range(0, len(body), step):
            out.append(pframe.marshal(pbody.ContentBody(body[i:i + step]), channel))
        return b"".join(out)

    def read_message(self, timeout: float = 5.0):
        """After a deliver/get-ok/return: read the header and body frames; returns bytes."""
        hdr = self.expect(pheader.ContentHeader, timeout=timeout)
        data = b""
        while len(data) < hdr.body_size:
            data += self.expect(pbody.ContentBody, timeout=timeout).value
        return hdr, data

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def abort(self):
        """Drop the TCP connection abruptly (RST, no connection.close)."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.close()


def raw_socket(node: Node, handshake: bool = True, rcvbuf: int | None = None, **kw) -> RawClient:
    """A RawClient; with ``handshake`` the AMQP handshake has been done by hand
    (protocol header, start-ok PLAIN guest/guest, tune-ok, connection.open)."""
    c = RawClient(node, rcvbuf=rcvbuf)
    if handshake:
        c.handshake(**kw)
    return c
