"""Rows/s through the source alone, the sink alone and both, in local mode.

    python -m pipeline.examples.throughput --uri amqp://guest:guest@127.0.0.1:5672/%2F [--rows 100000]

Source alone: `--rows` messages of `--size` bytes are put in a fresh queue, then a query reads
them with format "haremq" into Spark's `noop` sink. Sink alone: Spark's `rate-micro-batch`
source makes `--batch` rows per micro-batch (two partitions, so two publishing tasks) and
format "haremq" publishes them into a fresh queue. Then both: queue -> Spark -> queue (one
partition per batch, as the source makes it). Reported: steady-state rows/s (batches
after the first, from Spark's progress reports) and wall-clock rows/s including the first
batch. The queues are deleted afterwards.

Then the sink alone and queue -> Spark -> queue again, each with the sink's `deduplication`
option off and on (input messages with a message_id, output queue declared with
x-message-deduplication and an x-cache-size above `--rows`), printed side by side: what
effectively-once output costs. Off and on alternate for `--rounds` rounds (the first run pays
for warming up, so neither should always go first); the medians are printed. `--skip-plain`
leaves out the first three.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid

import pika


def _run_until(q, rows: int) -> float:
    """Wait until the query has taken `rows` rows (or failed); the seconds it took."""
    t = time.monotonic()
    while sum(p["numInputRows"] for p in q.recentProgress) < rows:
        if q.exception():
            raise SystemExit(str(q.exception()))
        time.sleep(0.05)
    return time.monotonic() - t


def _progress_rate(query) -> float:
    batches = [p for p in query.recentProgress if p["numInputRows"]][1:]
    rows = sum(p["numInputRows"] for p in batches)
    ms = sum(p["durationMs"]["triggerExecution"] for p in batches)
    return rows * 1000.0 / ms if ms else 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uri", required=True)
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--size", type=int, default=100, help="message body size in bytes")
    ap.add_argument("--batch", type=int, default=10_000, help="rows per micro-batch")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--skip-plain", action="store_true", help="only the deduplication off/on comparison")
    ap.add_argument("--rounds", type=int, default=2, help="deduplication off/on rounds, alternating")
    a = ap.parse_args(argv)

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from haremq.pipeline import register
    from haremq.pipeline.session import use_this_python

    spark = (use_this_python(SparkSession.builder).master(a.master).appName("haremq-throughput")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    conn = pika.BlockingConnection(pika.URLParameters(a.uri.split(",")[0]))
    ch = conn.channel()

    if not a.skip_plain:
        _plain(spark, ch, a)
    _deduplication(spark, ch, a)
    conn.close()
    spark.stop()
    return 0


def _plain(spark, ch, a) -> None:
    from pyspark.sql import functions as F

    from haremq.pipeline.amqp import ConfirmingPublisher, Outgoing, parse_uris

    # -- source alone
    src = f"bench.src.{uuid.uuid4().hex[:8]}"
    ch.queue_declare(src, durable=True)
    body = b"x" * a.size
    props = pika.BasicProperties(delivery_mode=2)
    t = time.monotonic()
    ConfirmingPublisher(parse_uris(a.uri, "bench"), "").publish(Outgoing(src, body, props) for _ in range(a.rows))
    print(f"filled {a.rows} x {a.size} B in {time.monotonic() - t:.1f}s")
    q = (spark.readStream.format("haremq").option("uri", a.uri).option("queue", src)
         .option("maxRowsPerBatch", str(a.batch)).load()
         .writeStream.format("noop").option("checkpointLocation", tempfile.mkdtemp()).start())
    wall = _run_until(q, a.rows)
    print(f"source alone: {_progress_rate(q):,.0f} rows/s steady, {a.rows / wall:,.0f} rows/s wall "
          f"({a.rows} rows in {wall:.1f}s incl. query start)")
    q.stop()

    # -- sink alone
    dst = f"bench.dst.{uuid.uuid4().hex[:8]}"
    ch.queue_declare(dst, durable=True)
    rows = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", str(a.batch))
            .option("numPartitions", "2").load()
            .select(F.lpad(F.col("value").cast("string"), a.size, "x").alias("body")))
    q = (rows.writeStream.format("haremq").option("uri", a.uri).option("routingKey", dst)
         .option("checkpointLocation", tempfile.mkdtemp()).start())
    wall = _run_until(q, a.rows)
    done = sum(p["numInputRows"] for p in q.recentProgress)
    rate = _progress_rate(q)
    q.stop()
    n = ch.queue_declare(dst, passive=True).method.message_count
    print(f"sink alone: {rate:,.0f} rows/s steady, {done / wall:,.0f} rows/s wall "
          f"({done} rows in {wall:.1f}s incl. query start; {n} messages in {dst})")
    # -- queue -> Spark -> queue
    mid = f"bench.mid.{uuid.uuid4().hex[:8]}"
    ch.queue_declare(mid, durable=True)
    ch.queue_purge(dst)
    ConfirmingPublisher(parse_uris(a.uri, "bench"), "").publish(Outgoing(mid, body, props) for _ in range(a.rows))
    q = (spark.readStream.format("haremq").option("uri", a.uri).option("queue", mid)
         .option("maxRowsPerBatch", str(a.batch)).load().select("body")
         .writeStream.format("haremq").option("uri", a.uri).option("routingKey", dst)
         .option("checkpointLocation", tempfile.mkdtemp()).start())
    wall = _run_until(q, a.rows)
    print(f"queue -> Spark -> queue: {_progress_rate(q):,.0f} rows/s steady, {a.rows / wall:,.0f} rows/s wall "
          f"({a.rows} rows in {wall:.1f}s incl. query start)")
    q.stop()
    for name in (src, dst, mid):
        ch.queue_delete(name)


def _deduplication(spark, ch, a) -> None:
    """The sink alone and queue -> Spark -> queue with the sink's deduplication off, then on."""
    from pyspark.sql import functions as F

    from haremq.pipeline.amqp import ConfirmingPublisher, Outgoing, parse_uris

    body = b"x" * a.size
    results = {False: [], True: []}
    order = [(False, True) if r % 2 == 0 else (True, False) for r in range(a.rounds)]
    for dedup in (d for pair in order for d in pair):
        args = {"x-message-deduplication": True, "x-cache-size": 2 * a.rows} if dedup else {}
        dst = f"bench.dd.{uuid.uuid4().hex[:8]}"
        ch.queue_declare(dst, durable=True, arguments=args)
        rows = (spark.readStream.format("rate-micro-batch").option("rowsPerBatch", str(a.batch))
                .option("numPartitions", "2").load()
                .select(F.lpad(F.col("value").cast("string"), a.size, "x").alias("body")))
        q = (rows.writeStream.format("haremq").option("uri", a.uri).option("routingKey", dst)
             .option("deduplication", str(dedup).lower())
             .option("checkpointLocation", tempfile.mkdtemp()).start())
        wall = _run_until(q, a.rows)
        done = sum(p["numInputRows"] for p in q.recentProgress)
        sink = (_progress_rate(q), done / wall)
        q.stop()
        ch.queue_delete(dst)

        mid = f"bench.ddin.{uuid.uuid4().hex[:8]}"
        dst = f"bench.dd.{uuid.uuid4().hex[:8]}"
        ch.queue_declare(mid, durable=True)
        ch.queue_declare(dst, durable=True, arguments=args)
        ConfirmingPublisher(parse_uris(a.uri, "bench"), "").publish(
            Outgoing(mid, body, pika.BasicProperties(delivery_mode=2, message_id=f"m-{i}")) for i in range(a.rows))
        q = (spark.readStream.format("haremq").option("uri", a.uri).option("queue", mid)
             .option("maxRowsPerBatch", str(a.batch)).load().select("body", "dedup_id")
             .writeStream.format("haremq").option("uri", a.uri).option("routingKey", dst)
             .option("deduplication", str(dedup).lower())
             .option("checkpointLocation", tempfile.mkdtemp()).start())
        wall = _run_until(q, a.rows)
        relay = (_progress_rate(q), a.rows / wall)
        q.stop()
        n = ch.queue_declare(dst, passive=True).method.message_count
        for name in (mid, dst):
            ch.queue_delete(name)
        results[dedup].append((sink, relay, n))
        print(f"  deduplication {'on ' if dedup else 'off'}: sink alone {sink[0]:,.0f} rows/s steady, "
              f"queue -> Spark -> queue {relay[0]:,.0f} rows/s steady ({n} messages out)")
    print(f"deduplication ({a.rows} rows of {a.size} B, medians of {a.rounds})      off"
          "                      on                       cost (steady)")
    for label, i in (("sink alone", 0), ("queue -> Spark -> queue", 1)):
        off = [statistics.median(r[i][k] for r in results[False]) for k in (0, 1)]
        on = [statistics.median(r[i][k] for r in results[True]) for k in (0, 1)]
        cost = 100.0 * (1 - on[0] / off[0]) if off[0] else 0.0
        print(f"  {label:<25} {off[0]:>8,.0f} steady {off[1]:>7,.0f} wall   {on[0]:>8,.0f} steady "
              f"{on[1]:>7,.0f} wall   {cost:+.0f}%")
    print(f"  (queue -> Spark -> queue delivered {[r[2] for r in results[False]]} messages off, "
          f"{[r[2] for r in results[True]]} on)")


if __name__ == "__main__":
    sys.exit(main())
