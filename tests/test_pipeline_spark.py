"""The PySpark connector (pipeline/) against a real `haremq node`: at-least-once, both ways.

Run apart from xdist (one SparkSession per module takes ~10-16 s to start):

    SPARK_LOCAL_IP=127.0.0.1 python -m pytest -m spark -p no:xdist tests/test_pipeline_spark.py -s

Needs `pip install -e '.[spark]'` and Java 17; the module is skipped, saying which, when
pyspark or java is missing. Every module starts its own node on a free port. With
HAREMQ_TEST_REF_PORT=PORT the same tests run against a RabbitMQ on 127.0.0.1:PORT instead.
"""
from __future__ import annotations

import collections
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

pytest.importorskip("pyspark", reason="pyspark is not installed: pip install -e '.[spark]'")
if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
    pytest.skip("no Java runtime for Spark: apt-get install -y openjdk-17-jre-headless",
                allow_module_level=True)

import pika  # noqa: E402

from haremq.pipeline.amqp import ConfirmingPublisher, Outgoing, parse_uris  # noqa: E402
from tests.conftest import wait_until  # noqa: E402

PROJECT_ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
REF_PORT = os.environ.get("HAREMQ_TEST_REF_PORT")


# --------------------------------------------------------------------------- a node and Spark

def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.3):
            return True
    except OSError:
        return False


class HareNode:
    def __init__(self, workdir: Path):
        self.port = int(REF_PORT) if REF_PORT else _free_port()
        self.workdir = workdir
        self.proc = None

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{HOST}:{self.port}/%2F"

    def start(self) -> "HareNode":
        if REF_PORT:
            return self
        exe = shutil.which("haremq")
        argv = [exe] if exe else [sys.executable, "-c", "import sys; from haremq.cluster.cli import main; sys.exit(main())"]
        self.log = open(self.workdir / "node.log", "ab")
        self.proc = subprocess.Popen(
            [*argv, "node", "--name", "spark", "--data-dir", str(self.workdir / "data"),
             "--amqp-port", str(self.port)],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while not _port_open(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"haremq node did not start: {(self.workdir / 'node.log').read_text()[-500:]}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = HareNode(tmp_path_factory.mktemp("hare")).start()
    yield n
    n.stop()


@pytest.fixture(scope="module")
def spark():
    os.environ.setdefault("SPARK_LOCAL_IP", HOST)
    # Spark's Python workers import `pipeline` themselves: make sure they can find it.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    from pyspark.sql import SparkSession

    from haremq.pipeline import register
    from haremq.pipeline.session import use_this_python

    # The workers run this interpreter (the one with pika), never `python3` from PATH.
    builder = use_this_python(SparkSession.builder, sys.executable)
    session = (builder.master("local[2]").appName("haremq-pipeline-tests")
               .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


# --------------------------------------------------------------------------- helpers

def _name(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


def _channel(url: str):
    conn = pika.BlockingConnection(pika.URLParameters(url))
    return conn, conn.channel()


def _declare(url: str, *queues: str) -> None:
    conn, ch = _channel(url)
    for q in queues:
        ch.queue_declare(q, durable=True)
    conn.close()


def _counts(url: str, queue: str):
    """(ready messages, consumers) of `queue`."""
    conn, ch = _channel(url)
    try:
        ok = ch.queue_declare(queue, passive=True).method
        return ok.message_count, ok.consumer_count
    finally:
        conn.close()


def _fill(url: str, queue: str, bodies, ids: bool = False) -> int:
    """Publish `bodies`, each with message_id = its body's text if `ids`."""
    def props(body):
        return pika.BasicProperties(delivery_mode=2, message_id=body.decode() if ids else None)
    return ConfirmingPublisher(parse_uris(url, "test"), "").publish(Outgoing(queue, b, props(b)) for b in bodies)


class Drain:
    """Consumes a queue (auto-ack) in the test process, counting bodies and message ids."""

    def __init__(self, url: str, queue: str):
        self.conn, self.ch = _channel(url)
        self.ch.basic_qos(prefetch_count=2000)
        self.bodies = collections.Counter()
        self.ids = collections.Counter()
        self.ch.basic_consume(queue, self._on_message, auto_ack=True)

    def _on_message(self, _ch, _method, props, body):
        self.bodies[body] += 1
        self.ids[props.message_id] += 1

    def pump(self, seconds: float) -> None:
        self.conn.process_data_events(time_limit=seconds)

    def until(self, pred, timeout: float, on_idle=None) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pump(0.2)
            if pred():
                return True
            if on_idle is not None:
                on_idle()
        return pred()

    def close(self) -> None:
        self.conn.close()

    @property
    def total(self) -> int:
        return sum(self.bodies.values())


def _wait_consumers_gone(url: str, queue: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    ready, consumers = _counts(url, queue)
    while consumers and time.monotonic() < deadline:
        time.sleep(0.2)
        ready, consumers = _counts(url, queue)
    return ready, consumers


# --------------------------------------------------------------------------- (a) 50,000 through

def test_50k_messages_flow_queue_to_spark_to_queue(spark, node, tmp_path):
    n = 50_000
    src, dst = _name("spark.in"), _name("spark.out")
    _declare(node.url, src, dst)
    expected = {f"m-{i:06d}".encode() for i in range(n)}
    assert _fill(node.url, src, sorted(expected)) == n

    drain = Drain(node.url, dst)
    t0 = time.monotonic()
    df = spark.readStream.format("haremq").option("uri", node.url).option("queue", src).load()
    q = (df.select("body").writeStream.format("haremq").option("uri", node.url)
         .option("exchange", "").option("routingKey", dst)
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        def failed():
            if q.exception() is not None:
                raise AssertionError(f"query failed: {q.exception()}")
        done = drain.until(lambda: expected <= set(drain.bodies), 240, on_idle=failed)
        elapsed = time.monotonic() - t0
        missing = len(expected - set(drain.bodies))
        print(f"\n50k: {len(expected) - missing}/{n} distinct in {elapsed:.1f}s "
              f"({n / elapsed:.0f} rows/s incl. query start), {drain.total - len(set(drain.bodies))} duplicates")
        assert done, f"{missing} of {n} messages never arrived"
        # The last batch is acked only once Spark commits it; the idle flush makes that happen.
        time.sleep(3)
    finally:
        q.stop()
    ready, consumers = _wait_consumers_gone(node.url, src)
    drain.pump(1)
    drain.close()
    assert consumers == 0, "the source's consumer outlived the query"
    assert ready == 0, f"{ready} messages came back to {src}: acks were missing"
    assert drain.total == n, f"{drain.total - n} duplicates without any failure"


# --------------------------------------------------------------------------- (b) SIGKILL mid-stream

def _start_job(url, src, dst, checkpoint: Path, log: Path) -> subprocess.Popen:
    env = dict(os.environ, SPARK_LOCAL_IP=HOST,
               PYTHONPATH=os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p))
    return subprocess.Popen(
        [sys.executable, "-m", "haremq.pipeline.examples.transform_job", "--uri", url, "--source", src,
         "--target", dst, "--checkpoint", str(checkpoint), "--max-rows", "500"],
        stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True, env=env)


def _kill_job(proc: subprocess.Popen, sig=signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)  # the driver, its JVM and the JVM's Python workers
    except ProcessLookupError:
        pass
    proc.wait(30)


def test_job_sigkilled_mid_stream_and_restarted_loses_nothing(node, tmp_path):
    n = 20_000
    src, dst = _name("kill.in"), _name("kill.out")
    _declare(node.url, src, dst)
    bodies = [f"k-{i:06d}".encode() for i in range(n)]
    assert _fill(node.url, src, bodies, ids=True) == n     # the job's output message_id is the input's
    expected = {b.upper() for b in bodies}  # the example job upper-cases bodies
    ck, log = tmp_path / "ck", tmp_path / "job.log"
    drain = Drain(node.url, dst)

    def job_alive(proc):
        def check():
            if proc.poll() is not None:
                raise AssertionError(f"job exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        return check

    job = _start_job(node.url, src, dst, ck, log)
    try:
        assert drain.until(lambda: drain.total >= 3000, 180, on_idle=job_alive(job)), \
            f"the job produced nothing:\n{log.read_text()[-3000:]}"
        _kill_job(job)
        at_kill = drain.total
        drain.pump(1)
        print(f"\nSIGKILL after {at_kill} output messages ({len(set(drain.bodies))} distinct)")
        assert len(set(drain.bodies)) < n, "the job finished before it could be killed mid-stream"

        job = _start_job(node.url, src, dst, ck, log)
        done = drain.until(lambda: expected <= set(drain.bodies), 300, on_idle=job_alive(job))
        time.sleep(5)  # the idle flush lets Spark commit, and the source ack, the last batch
    finally:
        _kill_job(job, signal.SIGTERM)
    ready, consumers = _wait_consumers_gone(node.url, src)
    drain.pump(2)
    drain.close()
    missing = len(expected - set(drain.bodies))
    duplicates = drain.total - len(set(drain.bodies))
    dup_ids = sum(c - 1 for c in drain.ids.values() if c > 1)
    print(f"after restart: {drain.total} output messages, {len(expected) - missing}/{n} distinct, "
          f"{duplicates} duplicates ({dup_ids} by message_id = dedup_id), {ready} left in the input")
    assert done and missing == 0, f"{missing} messages lost"
    assert dup_ids == duplicates, "dedup_id is not stable across redelivery"
    assert ready == 0, f"{ready} messages came back to the input after the restarted job stopped"


# --------------------------------------------------------------------------- (c) clear failures

def _query_error(spark, tmp_path, source: dict, sink: dict | None = None, wait: float = 60) -> str:
    """Start a query; return the text of the exception it fails with (load(), start() or later)."""
    q = None
    try:
        r = spark.readStream.format("haremq")
        for k, v in source.items():
            r = r.option(k, v)
        df = r.load()
        if sink is None:
            w = df.writeStream.format("noop")
        else:
            w = df.select("body").writeStream.format("haremq")
            for k, v in sink.items():
                w = w.option(k, v)
        q = w.option("checkpointLocation", str(tmp_path / uuid.uuid4().hex)).start()
        q.awaitTermination(wait)
    except Exception as e:  # noqa: BLE001 - the point is the text
        return str(e)
    finally:
        if q is not None:
            q.stop()
    pytest.fail("the query did not fail")


@pytest.fixture(scope="module")
def inq(node):
    q = _name("err.in")
    _declare(node.url, q)
    return q


def test_bad_uri_fails_the_query_naming_it(spark, node, inq, tmp_path):
    text = _query_error(spark, tmp_path, {"uri": "amqp://guest:guest@127.0.0.1:notaport/", "queue": inq})
    assert "haremq source: bad uri 'amqp://guest:***@127.0.0.1:notaport/'" in text
    assert "guest:guest" not in text, "the password leaked into the error"


def test_unreachable_node_fails_the_query_naming_it(spark, node, inq, tmp_path):
    port = _free_port()
    text = _query_error(spark, tmp_path, {"uri": f"amqp://guest:guest@127.0.0.1:{port}/%2F", "queue": inq})
    assert f"cannot connect to 127.0.0.1:{port}: connection refused" in text


def test_missing_queue_fails_the_query_naming_it(spark, node, tmp_path):
    text = _query_error(spark, tmp_path, {"uri": node.url, "queue": "no.such.queue"})
    assert "queue 'no.such.queue' not found in vhost '/'" in text and "404 NOT_FOUND" in text


def test_wrong_credentials_fail_the_query_naming_the_user(spark, node, inq, tmp_path):
    bad = node.url.replace("guest:guest@", "guest:wrong@")
    text = _query_error(spark, tmp_path, {"uri": bad, "queue": inq})
    assert "login refused for user 'guest'" in text and "403 ACCESS_REFUSED" in text
    assert "wrong" not in text.replace("(wrong user name or password)", ""), "the password leaked"


def test_failover_uses_the_next_uri(spark, node, tmp_path):
    src, dst = _name("fo.in"), _name("fo.out")
    _declare(node.url, src, dst)
    _fill(node.url, src, [b"a", b"b", b"c"])
    dead = f"amqp://guest:guest@127.0.0.1:{_free_port()}/%2F"
    drain = Drain(node.url, dst)
    df = spark.readStream.format("haremq").option("uri", f"{dead},{node.url}").option("queue", src).load()
    q = (df.select("body").writeStream.format("haremq").option("uri", f"{dead}, {node.url}")
         .option("routingKey", dst).option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        assert drain.until(lambda: set(drain.bodies) == {b"a", b"b", b"c"}, 60), q.exception()
    finally:
        q.stop()
        drain.close()


def test_sink_missing_exchange_fails_the_query(spark, node, inq, tmp_path):
    text = _query_error(spark, tmp_path, {"uri": node.url, "queue": inq},
                        {"uri": node.url, "exchange": "no.such.exchange"})
    assert "exchange 'no.such.exchange' not found" in text


def test_sink_wrong_credentials_fail_the_query(spark, node, inq, tmp_path):
    bad = node.url.replace("guest:guest@", "guest:wrong@")
    text = _query_error(spark, tmp_path, {"uri": node.url, "queue": inq}, {"uri": bad, "exchange": ""})
    assert "haremq sink" in text and "login refused for user 'guest'" in text


def test_sink_nack_fails_the_batch(spark, node, tmp_path):
    src, full = _name("nack.in"), _name("nack.full")
    _declare(node.url, src)
    conn, ch = _channel(node.url)
    ch.queue_declare(full, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    conn.close()
    _fill(node.url, src, [b"1", b"2", b"3"])
    text = _query_error(spark, tmp_path, {"uri": node.url, "queue": src},
                        {"uri": node.url, "exchange": "", "routingKey": full})
    assert "nacked message" in text
    ready, _ = _wait_consumers_gone(node.url, src)
    assert ready == 3, "the source acked messages the sink could not deliver"


def test_sink_unroutable_message_fails_the_batch_and_nothing_is_acked(spark, node, tmp_path):
    src = _name("ret.in")
    _declare(node.url, src)
    _fill(node.url, src, [b"x"])
    text = _query_error(spark, tmp_path, {"uri": node.url, "queue": src},
                        {"uri": node.url, "exchange": "", "routingKey": "no.such.queue"})
    assert "312 NO_ROUTE" in text and "'no.such.queue'" in text
    ready, consumers = _wait_consumers_gone(node.url, src)
    assert ready == 1, "the source acked a message the sink never delivered"


# --------------------------------------------------------------------------- (d) node killed

def _relay(spark, src_uri: str, src: str, dst_uri: str, dst: str, checkpoint, drain_uri: str | None = None):
    """A query copying src to dst, batches of 1000, reconnecting for up to 60 s; a drain of dst
    (through `drain_uri`, default `dst_uri`) and a check that raises if the query failed."""
    drain = Drain(drain_uri or dst_uri, dst)
    df = (spark.readStream.format("haremq").option("uri", src_uri).option("queue", src)
          .option("maxRowsPerBatch", "1000").option("reconnectTimeout", "60").load())
    q = (df.select("body").writeStream.format("haremq").option("uri", dst_uri)
         .option("routingKey", dst).option("reconnectTimeout", "60")
         .option("checkpointLocation", str(checkpoint)).start())

    def failed():
        if q.exception() is not None:
            raise AssertionError(f"query failed: {q.exception()}")
    return drain, q, failed


def test_source_node_sigkilled_mid_stream_loses_nothing(spark, node, tmp_path):
    """The source's node dies (SIGKILL) and comes back from its data dir: the consumer
    reconnects as a new session, the batch in flight is redelivered, nothing is lost."""
    if REF_PORT:
        pytest.skip("controls a node process")
    n = 20_000
    victim = HareNode(tmp_path / "victim")
    victim.workdir.mkdir()
    victim.start()
    src, dst = _name("nk.in"), _name("nk.out")
    _declare(victim.url, src)
    _declare(node.url, dst)
    expected = {f"n-{i:06d}".encode() for i in range(n)}
    assert _fill(victim.url, src, sorted(expected)) == n
    drain, q, failed = _relay(spark, victim.url, src, node.url, dst, tmp_path / "ck")
    try:
        assert drain.until(lambda: drain.total >= 5000, 120, on_idle=failed), "nothing flowed"
        os.killpg(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait()
        at_kill = len(set(drain.bodies))
        time.sleep(1)
        victim.start()
        done = drain.until(lambda: expected <= set(drain.bodies), 180, on_idle=failed)
        time.sleep(3)
    finally:
        q.stop()
    ready, consumers = _wait_consumers_gone(victim.url, src)
    drain.pump(1)
    drain.close()
    victim.stop()
    missing = len(expected - set(drain.bodies))
    print(f"\nnode SIGKILL after {at_kill} distinct; after restart {len(expected) - missing}/{n} distinct, "
          f"{drain.total - len(set(drain.bodies))} duplicates, {ready} left in the input")
    assert done and missing == 0, f"{missing} messages lost"
    assert ready == 0, f"{ready} messages came back to the input after the query stopped"


def _kill_amid_a_sink_task(member, timeout: float = 60.0) -> bool:
    """SIGKILL `member` while a sink task of a running query has a channel open on it (is
    publishing its rows or waiting for their confirms)."""
    from tests.clusters import control
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = control(member, "management_rows", kind="connections", local=True)
        if any(r["channels"] and (r.get("client_properties") or {}).get("connection_name") == "haremq-spark sink"
               for r in rows):
            member.kill9()
            return True
        time.sleep(0.01)
    return False


def test_node_of_the_source_and_sink_killed_mid_stream_and_left_down_loses_nothing(spark, tmp_path):
    """Three nodes, both queues mirrored on all of them. hare1 masters the input and holds the
    query's consumer and its sink tasks' connections; it is SIGKILLed mid-stream and never comes
    back. In local mode a failed task fails the query: the source and the sink move to the next
    node inside the running query, a mirror takes over the input, nothing is lost and the
    input ends empty."""
    if REF_PORT:
        pytest.skip("controls node processes")
    members = _ha_cluster(tmp_path)
    hare1, hare2, hare3 = members
    try:
        n = 12_000
        src, dst = _name("ha.in"), _name("ha.out")
        _declare(hare1.url, src)
        _declare(hare3.url, dst)
        expected = {f"m-{i:06d}".encode() for i in range(n)}
        assert _fill(hare1.url, src, sorted(expected)) == n
        _synchronised(members, src, dst)
        drain, q, failed = _relay(spark, f"{hare1.url},{hare2.url},{hare3.url}", src,
                                  f"{hare1.url},{hare3.url},{hare2.url}", dst, tmp_path / "ck", drain_uri=hare3.url)
        try:
            assert drain.until(lambda: drain.total >= 4000, 120, on_idle=failed), "nothing flowed"
            assert _kill_amid_a_sink_task(hare1), "no sink task connected to hare1"
            at_kill = len(set(drain.bodies))
            done = drain.until(lambda: expected <= set(drain.bodies), 180, on_idle=failed)
            time.sleep(3)      # the idle flush lets Spark commit, and the source ack, the last batch
        finally:
            q.stop()
        ready, consumers = _wait_consumers_gone(hare2.url, src)
        drain.pump(1)
        drain.close()
        missing = len(expected - set(drain.bodies))
        print(f"\nhare1 SIGKILL after {at_kill} distinct; {len(expected) - missing}/{n} distinct in the end, "
              f"{drain.total - len(set(drain.bodies))} duplicates, {ready} left in the input")
        assert done and missing == 0, f"{missing} messages lost"
        assert ready == 0, f"{ready} messages came back to the input after the query stopped"
    finally:
        _stop_members(members)


# The connector's consumer and publisher, and the source's replay check, with their node killed
# (or hung) and left down, without Spark: what a Spark task and the source's runner do.

def _ha_cluster(tmp_path):
    """Three members, every queue mirrored on all of them, synchronised automatically."""
    from tests.clusters import mirror_every_queue, plain_cluster
    members = plain_cluster(tmp_path / "cluster", failure_timeout=3.0)
    mirror_every_queue(members[0])
    return members


def _synchronised(members, *queues, timeout=30.0):
    from tests.clusters import control
    deadline = time.monotonic() + timeout
    while True:
        rows = {r["name"]: r for r in control(members[-1], "list_queues")}
        if all(len(rows.get(q, {}).get("synchronised_mirrors") or []) == len(members) - 1 for q in queues):
            return
        assert time.monotonic() < deadline, f"mirrors never synchronised: {[rows.get(q) for q in queues]}"
        time.sleep(0.2)


def _stop_members(members):
    for m in members:
        if m.proc is not None and m.proc.poll() is None:
            try:
                os.killpg(m.proc.pid, signal.SIGCONT)     # a stopped member must wake to die
            except ProcessLookupError:
                pass
        m.kill9()


def _dedup_queue(url: str, queue: str) -> None:
    conn, ch = _channel(url)
    ch.queue_declare(queue, durable=True, arguments={"x-message-deduplication": True, "x-cache-size": 50_000})
    conn.close()


def _ids_out(queue: str, n: int, yielded: list, prefix: str = "id"):
    """n messages for `queue`, each with its own x-deduplication-header; counts them in `yielded`."""
    for i in range(n):
        yielded[0] += 1
        yield Outgoing(queue, f"{prefix}-{i:06d}".encode(), pika.BasicProperties(
            delivery_mode=2, headers={"x-deduplication-header": f"{prefix}-{i:06d}"}))


def _take_all(consumer, want: int, timeout: float):
    """Deliveries taken from `consumer` until `want` (of any sessions), as [(session, Delivery)]."""
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        consumer.check()
        session, deliveries = consumer.take(want - len(got))
        got += [(session, d) for d in deliveries]
        if not deliveries:
            time.sleep(0.05)
    return got


def test_publisher_and_consumer_ride_through_their_node_killed_and_left_down(tmp_path, caplog):
    """The sink's publisher and the source's consumer are connected to hare1, which masters both
    queues; hare1 is SIGKILLed mid-stream and never comes back. The publisher goes on on hare2
    and publishes again what hare1 had not confirmed (same ids: the deduplicating output holds
    each message once); the consumer moves to hare2 as a new session and gets back, redelivered,
    what it had not acked."""
    if REF_PORT:
        pytest.skip("controls node processes")
    import logging
    import threading

    from haremq.pipeline.amqp import QueueConsumer
    caplog.set_level(logging.WARNING, logger="pipeline.haremq")
    members = _ha_cluster(tmp_path)
    hare1, hare2, hare3 = members
    try:
        src, dst = _name("ride.in"), _name("ride.out")
        _declare(hare1.url, src)
        _dedup_queue(hare1.url, dst)
        m = 2000
        _fill(hare1.url, src, [f"in-{i:05d}".encode() for i in range(m)], ids=True)
        _synchronised(members, src, dst)
        uris = parse_uris(f"{hare1.url},{hare2.url},{hare3.url}", "test")

        consumer = QueueConsumer(uris, src, prefetch=m, connect_timeout=5, reconnect_timeout=30)
        consumer.start()
        held = _take_all(consumer, 500, 30)      # taken (all delivered), never acked
        first = consumer.live_session()
        assert len(held) == 500 and {s for s, _ in held} == {first}

        n, yielded, outcome = 20_000, [0], {}
        publisher = ConfirmingPublisher(uris, "", window=2000, connect_timeout=5)

        def publish():
            try:
                outcome["confirmed"] = publisher.publish(_ids_out(dst, n, yielded))
            except Exception as e:  # noqa: BLE001 - reported below
                outcome["error"] = e
        thread = threading.Thread(target=publish, daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while yielded[0] < 6000:
            assert thread.is_alive() and time.monotonic() < deadline, f"publishing stalled: {outcome}"
            time.sleep(0.01)
        hare1.kill9()
        killed_at, t0 = yielded[0], time.monotonic()
        thread.join(120)
        assert not thread.is_alive(), "the publisher never finished"
        assert "error" not in outcome, f"the publisher gave up: {outcome['error']}"
        assert outcome["confirmed"] == n
        lost = [r.getMessage() for r in caplog.records if "publishing its" in r.getMessage()]
        assert lost, "the kill did not land while the publisher had a connection to hare1"

        rest = _take_all(consumer, m, 60)        # everything comes back: the 500 redelivered
        again = [d for s, d in rest if s != first]
        assert consumer.live_session() not in (None, first)
        assert {d.properties.message_id for d in again} == {f"in-{i:05d}" for i in range(m)}
        redelivered = {d.properties.message_id for d in again if d.redelivered}
        assert {d.properties.message_id for _, d in held} <= redelivered
        session = consumer.live_session()
        assert consumer.ack_through(session, max(d.tag for s, d in rest if s == session))
        consumer.stop()
        ready = wait_until(lambda: _count([hare2.url, hare3.url], dst) == n, 30)
        left, _ = _wait_consumers_gone(hare2.url, src)
        print(f"\nhare1 SIGKILLed at {killed_at} messages yielded; publisher done {time.monotonic() - t0:.1f}s "
              f"later ({lost[0]}); consumer moved to a new session, {len(redelivered)} redelivered; "
              f"output {n} exactly, input {left} left")
        assert ready and left == 0
    finally:
        _stop_members(members)


def test_consumer_and_publisher_leave_a_hung_node_for_the_next(tmp_path):
    """hare1 stops answering (SIGSTOP: its sockets stay open, nothing comes back). Missed
    heartbeats end both connections; each goes to the next node of the list, not back to the
    hung one (whose connection attempts would only time out), and carries on there."""
    if REF_PORT:
        pytest.skip("controls node processes")
    import threading

    from haremq.pipeline.amqp import QueueConsumer
    members = _ha_cluster(tmp_path)
    hare1, hare2, hare3 = members
    try:
        src, dst = _name("hung.in"), _name("hung.out")
        _declare(hare2.url, src)                         # mastered on hare2, read through hare1
        _dedup_queue(hare2.url, dst)
        _fill(hare2.url, src, [f"h-{i}".encode() for i in range(300)], ids=True)
        _synchronised(members, src, dst)
        uris = parse_uris(f"{hare1.url},{hare2.url},{hare3.url}", "test")
        consumer = QueueConsumer(uris, src, prefetch=100, connect_timeout=20, reconnect_timeout=60, heartbeat=1)
        consumer.start()
        first = consumer.live_session()
        assert len(_take_all(consumer, 100, 30)) == 100

        stopped = threading.Event()
        yielded, outcome = [0], {}

        def rows():
            yield from _ids_out(dst, 100, yielded, "a")
            stopped.wait(30)                             # the rest only once hare1 hangs
            yield from _ids_out(dst, 100, yielded, "b")
        publisher = ConfirmingPublisher(uris, "", connect_timeout=20, confirm_timeout=120, heartbeat=1)

        def publish():
            try:
                outcome["confirmed"] = publisher.publish(rows())
            except Exception as e:  # noqa: BLE001 - reported below
                outcome["error"] = e
        thread = threading.Thread(target=publish, daemon=True)
        thread.start()
        wait_until(lambda: yielded[0] >= 100, 30)
        time.sleep(0.5)
        os.killpg(hare1.proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        stopped.set()
        wait_until(lambda: consumer.live_session() not in (None, first), 40,
                   message="the consumer never left the hung node")
        moved = time.monotonic() - t0
        thread.join(60)
        published = time.monotonic() - t0
        assert not thread.is_alive() and "error" not in outcome, outcome
        assert outcome["confirmed"] == 200
        print(f"\nhung hare1: consumer on {consumer._session.node} after {moved:.1f}s, publisher done "
              f"after {published:.1f}s")
        assert consumer._session.node == uris[1][0], "the consumer did not move to the next node"
        # Missed heartbeats (1 s) are noticed within 6-12 s; going back to the hung node first
        # would add a connection attempt that times out (20 s) before the next node is tried.
        assert moved < 30, f"took {moved:.1f}s to move"
        assert wait_until(lambda: _count([hare2.url, hare3.url], dst) == 200, 30)
        consumer.stop()
    finally:
        _stop_members(members)


def _stale_reader(uri: str, queue: str, **options):
    """The source's reader as Spark ships it to an executor (pickled, no consumer)."""
    import pickle

    from haremq.pipeline.datasource import HareMQStreamReader, SourceOptions
    opts = {"uri": uri, "queue": queue, **{k: str(v) for k, v in options.items()}}
    return pickle.loads(pickle.dumps(HareMQStreamReader(SourceOptions.parse(opts))))


def test_replay_of_a_batch_whose_session_died_with_its_node_is_empty_once_the_node_is_down(tmp_path):
    """A job and the node its consumer was connected to die together; the node stays down. The
    restarted job's replay of the dead session's batch must find the session gone (404 for its
    marker queue) as soon as the others agree the node is down, not wait for the node's return
    (a passive declare of an exclusive queue of a dead node's connection answered 405 forever)."""
    if REF_PORT:
        pytest.skip("controls node processes")
    from haremq.pipeline.amqp import QueueConsumer
    members = _ha_cluster(tmp_path)
    hare1, hare2, hare3 = members
    try:
        src = _name("replay.in")
        _declare(hare2.url, src)                         # mastered on hare2, read through hare1
        _fill(hare2.url, src, [f"r-{i}".encode() for i in range(50)])
        _synchronised(members, src)
        consumer = QueueConsumer(parse_uris(hare1.url, "test"), src, prefetch=50, connect_timeout=2,
                                 reconnect_timeout=0)
        consumer.start()
        session = consumer.live_session()
        taken = _take_all(consumer, 50, 30)
        assert len(taken) == 50
        hare1.kill9()
        t0 = time.monotonic()
        reader = _stale_reader(f"{hare1.url},{hare2.url},{hare3.url}", src, sessionCheckTimeout=30,
                               connectTimeout=2)
        rows = list(reader.readBetweenOffsets({"session": "", "tag": 0},
                                              {"session": session, "tag": taken[-1][1].tag}))
        took = time.monotonic() - t0
        back = wait_until(lambda: _count([hare2.url], src) == 50, 30)
        print(f"\nreplayed batch of a session on a dead node: empty after {took:.1f}s; its 50 messages back")
        assert rows == [] and back
        assert took < 15, f"the replay check took {took:.1f}s"
    finally:
        _stop_members(members)


def test_replay_check_tells_what_each_node_answered(node, tmp_path):
    """A live session's batch re-read (its marker queue held: 405) and a first node that refuses
    the connection: after sessionCheckTimeout the task fails naming both answers. With no node
    answering at all it fails after reconnectTimeout (not sessionCheckTimeout), naming why."""
    from haremq.pipeline.amqp import HareMQError, QueueConsumer
    src = _name("check.in")
    _declare(node.url, src)
    consumer = QueueConsumer(parse_uris(node.url, "test"), src, prefetch=10)
    consumer.start()
    dead = f"amqp://guest:guest@127.0.0.1:{_free_port()}/%2F"
    try:
        end = {"session": consumer.live_session(), "tag": 5}
        with pytest.raises(HareMQError) as held:
            _stale_reader(f"{dead},{node.url}", src, sessionCheckTimeout=2).readBetweenOffsets(
                {"session": "", "tag": 0}, end)
        text = str(held.value)
        assert "is still connected after 2s (sessionCheckTimeout)" in text, text
        assert "connection refused" in text and ("405" in text or "exists" in text), text
    finally:
        consumer.stop()
    t0 = time.monotonic()
    with pytest.raises(HareMQError) as unreachable:
        _stale_reader(dead, src, reconnectTimeout=2, connectTimeout=1).readBetweenOffsets(
            {"session": "", "tag": 0}, {"session": "0123abcd", "tag": 5})
    took = time.monotonic() - t0
    text = str(unreachable.value)
    assert "cannot ask any node whether consumer session 0123abcd is gone" in text, text
    assert "connection refused" in text and "guest:guest" not in text, text
    assert took < 15, f"gave up after {took:.1f}s, not reconnectTimeout (2 s)"


# --------------------------------------------------------------------------- rows and routing

def test_rows_carry_the_message_and_routing_key_column_overrides(spark, node, tmp_path):
    src, a, b = _name("rows.in"), _name("rows.a"), _name("rows.b")
    _declare(node.url, src, a, b)
    conn, ch = _channel(node.url)
    ch.exchange_declare("rows.x." + src, "direct")
    ch.queue_bind(src, "rows.x." + src, "k1")
    ch.confirm_delivery()
    ch.basic_publish("rows.x." + src, "k1", b"first", pika.BasicProperties(
        content_type="text/plain", correlation_id="c-1", message_id="m-1", timestamp=1700000000,
        priority=3, delivery_mode=2, headers={"n": 7, "s": "v", "b": b"raw"}))
    ch.basic_publish("rows.x." + src, "k1", b"second")
    conn.close()
    name = "rows_" + uuid.uuid4().hex[:8]
    q = (spark.readStream.format("haremq").option("uri", node.url).option("queue", src).load()
         .writeStream.format("memory").queryName(name)
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        deadline = time.monotonic() + 60
        while spark.table(name).count() < 2 and time.monotonic() < deadline:
            assert q.exception() is None, q.exception()
            time.sleep(0.2)
        rows = {r.body: r for r in spark.table(name).collect()}
    finally:
        q.stop()
    first, second = rows[b"first"], rows[b"second"]
    assert (first.routing_key, first.exchange, first.redelivered) == ("k1", "rows.x." + src, False)
    assert first.headers == {"n": "7", "s": "v", "b": "raw"}
    p = first.properties
    assert (p.content_type, p.correlation_id, p.message_id, p.priority, p.delivery_mode) == \
        ("text/plain", "c-1", "m-1", 3, 2)
    assert int(p.timestamp.timestamp()) == 1700000000
    assert first.dedup_id == "m-1"
    assert second.dedup_id is None and second.headers == {}     # no message_id: no id

    # The batch writer, with a routingKey column overriding the routingKey option.
    out = spark.createDataFrame([("to-a", a), ("to-b", b), ("default", None)], "body string, routingKey string")
    out.write.format("haremq").option("uri", node.url).option("routingKey", a).mode("append").save()
    assert _counts(node.url, a)[0] == 2 and _counts(node.url, b)[0] == 1


def test_trigger_available_now_reads_the_backlog_acks_it_and_ends(spark, node, tmp_path):
    src, dst = _name("an.in"), _name("an.out")
    _declare(node.url, src, dst)
    _fill(node.url, src, [f"a-{i}".encode() for i in range(25)])
    q = (spark.readStream.format("haremq").option("uri", node.url).option("queue", src)
         .option("maxRowsPerBatch", "10").load()
         .select("body").writeStream.format("haremq").option("uri", node.url).option("routingKey", dst)
         .trigger(availableNow=True).option("checkpointLocation", str(tmp_path / "ck")).start())
    assert q.awaitTermination(120), "an availableNow query should end by itself"
    assert q.exception() is None, q.exception()
    assert [p["numInputRows"] for p in q.recentProgress] == [10, 10, 5, 0]  # the last one is the flush
    ready, _ = _wait_consumers_gone(node.url, src)
    assert ready == 0 and _counts(node.url, dst)[0] == 25


# --------------------------------------------------------------------------- effectively once

# The ids the connector gives rows for a deduplicating queue, without Spark.

def _delivery(tag: int, message_id=None):
    from haremq.pipeline.amqp import Delivery
    return Delivery(tag, "", "ticks", False, pika.BasicProperties(delivery_mode=2, message_id=message_id), b"tick")


def test_source_gives_two_identical_messages_without_a_message_id_no_shared_id():
    """Two ticks published alike on purpose are two messages: the source must not give them one
    dedup_id (a content hash did, and a deduplicating sink kept one). With no message_id there is
    nothing stable to name them by, so they have none."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from haremq.pipeline.datasource import SOURCE_SCHEMA, deliveries_to_arrow
    batch = deliveries_to_arrow([_delivery(1), _delivery(2), _delivery(3, "m-1"), _delivery(4, "")],
                                to_arrow_schema(SOURCE_SCHEMA, timezone="UTC"))
    ids = batch.column("dedup_id").to_pylist()
    assert ids[0] is None or ids[0] != ids[1], f"two ticks share the dedup_id {ids[0]}"
    assert ids == [None, None, "m-1", None]


def _sink(monkeypatch, columns: str, place: str = "spark:q:7:0:"):
    """A streaming writer with deduplication for string `columns` ("body,dedup_id"), its task
    at `place`."""
    from pyspark.sql.types import StringType, StructField, StructType

    from haremq.pipeline import datasource
    monkeypatch.setattr(datasource, "_place_prefix", lambda: place)
    options = datasource.SinkOptions(uri="amqp://guest:guest@127.0.0.1:1/%2F", exchange="", routing_key="out",
                                     persistent=True, mandatory=True, window=10, confirm_timeout=1.0,
                                     connect_timeout=1.0, deduplication=True)
    return datasource.HareMQStreamWriter(options, StructType([StructField(c, StringType()) for c in columns.split(",")]))


def _published(writer, *batches):
    """(body, x-deduplication-header) of each message the writer publishes for these Arrow batches."""
    import pyarrow as pa
    return [(m.body, m.properties.headers["x-deduplication-header"])
            for m in writer._messages(pa.RecordBatch.from_pylist(rows) for rows in batches)]


def test_sink_ids_of_a_retried_task_follow_each_row_not_its_place(monkeypatch):
    """A retried task may see its rows in another order, or fewer of them: each row keeps its id,
    identical rows get one id each, and no id ever names two different rows."""
    writer = _sink(monkeypatch, "body")
    first = _published(writer, [{"body": b} for b in ("a", "b", "a", "c")])
    retry = _published(writer, [{"body": "c"}, {"body": "a"}], [{"body": "b"}, {"body": "a"}])
    fewer = _published(writer, [{"body": b} for b in ("b", "a")])
    for attempt in (first, retry, fewer):
        assert len({ident for _body, ident in attempt}) == len(attempt), attempt     # one id per row
    named = {}
    for body, ident in first + retry + fewer:
        assert named.setdefault(ident, body) == body, f"{ident} names {named[ident]!r} and {body!r}"
    assert sorted(retry) == sorted(first) and set(fewer) <= set(first)
    assert all(ident.startswith("spark:q:7:0:") for _body, ident in first)
    other = _published(_sink(monkeypatch, "body", "spark:q:7:1:"), [{"body": "a"}])
    assert other[0][1] not in {ident for _body, ident in first}               # another partition


def test_sink_refuses_a_row_without_a_dedup_id_when_deduplicating(monkeypatch):
    """The dedup_id column is what names a row; a row that has none (an input message without a
    message_id) fails the task saying so, rather than go out without deduplication."""
    from haremq.pipeline.amqp import HareMQError
    writer = _sink(monkeypatch, "body,dedup_id")
    assert _published(writer, [{"body": "a", "dedup_id": "m-1"}]) == [(b"a", "m-1")]
    for missing in (None, ""):
        with pytest.raises(HareMQError, match="dedup_id is null or empty.*message_id"):
            _published(writer, [{"body": "a", "dedup_id": "m-1"}, {"body": "tick", "dedup_id": missing}])


def test_ticks_without_a_message_id_fail_a_deduplicating_sink_and_stay_in_the_input(spark, node, tmp_path):
    src, dst = _name("tick.in"), _name("tick.out")
    _declare(node.url, src)
    conn, ch = _channel(node.url)
    ch.queue_declare(dst, durable=True, arguments={"x-message-deduplication": True, "x-cache-size": 100})
    conn.close()
    _fill(node.url, src, [b"tick", b"tick"])
    q = (spark.readStream.format("haremq").option("uri", node.url).option("queue", src).load()
         .select("body", "dedup_id").writeStream.format("haremq").option("uri", node.url)
         .option("routingKey", dst).option("deduplication", "true")
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        q.awaitTermination(60)
        pytest.fail("the query did not fail")
    except Exception as e:  # noqa: BLE001 - the point is the text
        text = str(e)
    finally:
        q.stop()
    assert "dedup_id is null or empty" in text and "message_id" in text, text
    ready, _ = _wait_consumers_gone(node.url, src)
    assert ready == 2 and _counts(node.url, dst)[0] == 0



def _count(urls, queue: str):
    """Messages ready in `queue`, asked of the first node that answers (None if none does)."""
    for url in urls:
        try:
            return _counts(url, queue)[0]
        except Exception:  # noqa: BLE001 - a node that is down or failing over: ask the next
            continue
    return None


def test_deduplicating_sink_is_effectively_once_through_job_and_master_kills(tmp_path):
    """20,000 messages, mirrored queue -> Spark (deduplication=true) -> mirrored deduplicating
    queue; the job is SIGKILLed twice and restarted from its checkpoint, and the output queue's
    master node, which the job is connected to, is SIGKILLed once and never restarted. The job
    runs in local mode without task retries: its source and sink move to the next node inside the
    running query (the sink publishing again, with the same ids, what the dead node had not
    confirmed). Every message arrives exactly once, the input ends empty."""
    if REF_PORT:
        pytest.skip("controls node processes")
    import json as json_

    from tests.clusters import ctl, ctl_json, proxied_cluster
    began = time.monotonic()
    members, partition = proxied_cluster(tmp_path / "cluster", failure_timeout=3.0)
    hare1, hare2, hare3 = members
    job = None

    def took() -> str:
        return f"[{time.monotonic() - began:.0f} s]"
    try:
        r = ctl(hare1, "set-policy", "ha", r"^ha\.", json_.dumps({"ha-mode": "all", "ha-sync-mode": "automatic"}),
                "--apply-to", "queues")
        assert r.returncode == 0, r.stderr
        n = 20_000
        src, dst = _name("ha.ddin"), _name("ha.ddout")
        _declare(hare1.url, src)                        # the input's master: hare1
        conn, ch = _channel(hare2.url)                  # the output's: hare2, killed below
        ch.queue_declare(dst, durable=True, arguments={"x-message-deduplication": True, "x-cache-size": 50_000})
        conn.close()
        props = [pika.BasicProperties(delivery_mode=2, message_id=f"in-{i:06d}") for i in range(n)]
        assert ConfirmingPublisher(parse_uris(hare1.url, "test"), "").publish(
            Outgoing(src, f"d-{i:06d}".encode(), props[i]) for i in range(n)) == n
        expected = {f"D-{i:06d}".encode() for i in range(n)}     # the example job upper-cases bodies

        def synced(queue):
            row = next((q for q in ctl_json(hare3, "list-queues") if q["name"] == queue), None)
            return row is not None and len(row["synchronised_mirrors"] or []) == 2
        deadline = time.monotonic() + 30
        while not (synced(src) and synced(dst)):
            assert time.monotonic() < deadline, "mirrors never synchronised"
            time.sleep(0.2)

        uri = f"{hare2.url},{hare3.url},{hare1.url}"    # the job talks to hare2 first: killed below
        urls = [hare3.url, hare1.url, hare2.url]
        ck, log = tmp_path / "ck", tmp_path / "job.log"
        env = dict(os.environ, SPARK_LOCAL_IP=HOST,
                   PYTHONPATH=os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH", "")) if p))

        def start():
            return subprocess.Popen(
                [sys.executable, "-m", "haremq.pipeline.examples.transform_job", "--uri", uri, "--source", src,
                 "--target", dst, "--checkpoint", str(ck), "--max-rows", "1000", "--master", "local[2]",
                 "--deduplication"],
                stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True, env=env)

        def wait_output(at_least, timeout=120):
            deadline = time.monotonic() + timeout
            while True:
                if job.poll() is not None:
                    raise AssertionError(f"job exited with {job.returncode}:\n{log.read_text()[-3000:]}")
                count = _count(urls, dst)
                if count is not None and count >= at_least:
                    return count
                assert time.monotonic() < deadline, \
                    f"output stuck at {count} (wanted {at_least}):\n{log.read_text()[-3000:]}"
                time.sleep(0.2)

        print(f"\ncluster up, input filled and mirrored {took()}")
        job = start()
        print(f"\nfirst job SIGKILLed at {wait_output(3000)} output messages {took()}")
        _kill_job(job)
        job = start()
        wait_output(_count(urls, dst) + 3000)
        assert _kill_amid_a_sink_task(hare2)    # the output's master and the job's node, left down
        print(f"output master {hare2.name} SIGKILLed at {_count(urls, dst)} {took()}")
        # The same job goes on (wait_output fails if it exited): no task failed with the node.
        print(f"second job SIGKILLed at {wait_output(13_000, timeout=150)} output messages {took()}")
        _kill_job(job)
        job = start()
        wait_output(n, timeout=150)
        time.sleep(5)      # the idle flush lets Spark commit, and the source ack, the last batch
        _kill_job(job, signal.SIGTERM)
        job = None
        ready, consumers = _wait_consumers_gone(hare3.url, src)
        print(f"all {n} out, job stopped {took()}")
        drain = Drain(hare3.url, dst)
        drain.until(lambda: drain.total >= n, 60)
        drain.pump(2)
        drain.close()
        rows = {q["name"]: q for q in ctl_json(hare3, "list-queues", "name", "dedup_cache_size", "dedup_dropped")}
        print(f"output: {drain.total} messages, {len(set(drain.bodies))} distinct; the queue dropped "
              f"{rows[dst]['dedup_dropped']} duplicates; {ready} left in the input")
        assert set(drain.bodies) == expected, f"{len(expected - set(drain.bodies))} lost"
        assert drain.total == n and max(drain.bodies.values()) == 1, "a message arrived twice"
        assert max(drain.ids.values()) == 1
        assert ready == 0, f"{ready} messages left in the input"
    finally:
        if job is not None:
            _kill_job(job)
        for m in members:
            m.kill9()
        partition["close"]()
