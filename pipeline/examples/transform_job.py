"""Example job: read a HareMQ queue, transform each message, publish to another queue.

    python -m pipeline.examples.transform_job --uri amqp://guest:guest@127.0.0.1:5672/%2F \
        --source orders.in --target orders.out --checkpoint /tmp/orders-ck

The transform upper-cases the body, adds the header x-processed-by=spark and sets the
message_id property of each output message to the input's dedup_id (its message_id), so a
consumer of the target queue can drop the duplicates that at-least-once delivery allows (after
a crash, the batch in flight is delivered again). Runs until stopped; kill it at any point and
start it again with the same --checkpoint: nothing is lost.

With --deduplication the sink sends each row's dedup_id in the header x-deduplication-header;
into a target queue declared with x-message-deduplication (and an x-cache-size at least what can
be in flight across a restart) nothing arrives twice either. Every input message then needs a
message_id: one without fails the batch (see "Effectively once" in pipeline/README.md).
"""
from __future__ import annotations

import argparse
import os
import sys


def build(spark, uri: str, source: str, target: str, checkpoint: str, max_rows: int,
          deduplication: bool = False):
    from pyspark.sql import functions as F

    from haremq.pipeline import register

    register(spark)
    messages = (spark.readStream.format("haremq")
                .option("uri", uri).option("queue", source)
                .option("maxRowsPerBatch", str(max_rows))
                .load())
    out = messages.select(
        F.upper(F.col("body").cast("string")).alias("body"),
        F.map_concat(F.col("headers"), F.create_map(F.lit("x-processed-by"), F.lit("spark"))).alias("headers"),
        F.struct(F.lit("text/plain").alias("content_type"),
                 F.col("dedup_id").alias("message_id")).alias("properties"),
        F.col("dedup_id"),
    )
    return (out.writeStream.format("haremq")
            .option("uri", uri).option("exchange", "").option("routingKey", target)
            .option("deduplication", str(deduplication).lower())
            .option("checkpointLocation", checkpoint)
            .queryName(f"haremq {source} -> {target}")
            .start())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--uri", required=True, help="amqp://user:password@host:port/vhost (several: comma-separated)")
    p.add_argument("--source", required=True, help="queue to read")
    p.add_argument("--target", required=True, help="queue to publish to (through the default exchange)")
    p.add_argument("--checkpoint", required=True, help="Spark checkpoint directory")
    p.add_argument("--master", default=None, help="Spark master when not run by spark-submit (default local[2])")
    p.add_argument("--max-rows", type=int, default=10000, help="maxRowsPerBatch (default 10000)")
    p.add_argument("--deduplication", action="store_true",
                   help="publish each row's dedup_id for a deduplicating target queue (effectively once)")
    a = p.parse_args(argv)

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    from haremq.pipeline.session import use_this_python

    builder = (SparkSession.builder.appName("haremq-transform")
               .config("spark.ui.showConsoleProgress", "false"))
    if a.master or "PYSPARK_GATEWAY_PORT" not in os.environ:  # not launched by spark-submit
        builder = use_this_python(builder.master(a.master or "local[2]"))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    query = build(spark, a.uri, a.source, a.target, a.checkpoint, a.max_rows, a.deduplication)
    print(f"running: {a.source} -> {a.target}, checkpoint {a.checkpoint}", flush=True)
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
