"""PySpark Structured Streaming source and sink for HareMQ, registered as format "haremq".

    from haremq.pipeline import register
    register(spark)                                   # spark.dataSource.register(HareMQDataSource)
    df = (spark.readStream.format("haremq")
          .option("uri", "amqp://guest:guest@127.0.0.1:5672/%2F").option("queue", "in").load())
    (df.select("body").writeStream.format("haremq").option("uri", ...)
       .option("exchange", "").option("routingKey", "out")
       .option("checkpointLocation", "/tmp/ck").start())

Guarantees: at-least-once both ways. A message is acked to HareMQ only after Spark has committed
the micro-batch that holds it; a row is counted as written only once HareMQ confirmed it.

Theory of operation
===================

Where Spark 4.3 runs each method of a Python streaming source (traced with process ids per
call) decides where the consumer may live:

* One long-lived Python process on the driver, `python_streaming_source_runner` (a child of the
  driver JVM), creates the reader once per query and calls `initialOffset`, `read(start)` (for
  a simple reader, through Spark's prefetching wrapper) and `commit(end)` on that one object
  for the whole query. It is the only process that sees both the reads and the commits, so the
  consumer lives here: `HareMQStreamReader` opens it lazily on the first `initialOffset`/`read`
  and keeps it in a daemon I/O thread (`amqp.QueueConsumer`) that also answers heartbeats while
  the runner is blocked waiting for the JVM.
* A planner process builds a second reader at query start and pickles it to the executors, so
  the reader must not open anything in `__init__` (a pika connection holds a `_thread.lock`
  and cannot be pickled) and `__getstate__` drops the consumer. Opening lazily also keeps a
  planner (or a reused Python worker) from ever holding deliveries it cannot ack.
* `read(start)` runs in the runner, so we use `SimpleDataSourceStreamReader`: the rows it
  returns travel to the JVM with the plan (stored as a MEMORY_AND_DISK_SER block) and executors
  read that block; the rows are built directly as one `pyarrow.RecordBatch` per micro-batch.
  `readBetweenOffsets` runs in an executor worker on the pickled copy, with no consumer; Spark
  calls it only when the prefetched rows are not in its cache, which in practice means a batch
  planned by a previous (dead) run of the query being replayed from the checkpoint.
* Delivery tags belong to one channel: an ack from any other connection is a channel error
  (406 PRECONDITION_FAILED - unknown delivery tag) and cannot settle anything. Hence acks are sent only by the runner's consumer, in `commit`.

Offsets name the consumer session. Every consumer connection+channel is a session with a random
id; an offset is `{"session": id, "tag": last delivery tag handed to Spark}`. Delivery tags on a
channel grow one by one, and Spark's batches are contiguous, so `commit(end)` is a single
`basic.ack(tag, multiple=true)` on the channel that received them, if `end["session"]` is still
the live session. If it is not (the run died, or the connection was lost and the consumer moved
to another node), there is nothing to ack: the broker requeued that session's unacked messages
when its connection closed, and they come back with redelivered=true (duplicates, never loss).

Commit order. For batch N Spark runs: sink commit(N), writes commits/N, asks latestOffset for
N+1, writes offsets/N+1, and only then calls the source's commit(end of N). So an ack always
follows the sink's commit of the same rows (the sink waited for publisher confirms in its
tasks). But batch N is committed only once Spark plans N+1, and Spark plans a batch only when
latestOffset moves.

The idle last batch. When the queue goes quiet the last batch with data would never be
committed: its messages would stay unacked (and a prefetch-limited consumer would stall when
all its credit sits in that batch). So when `read` finds no new message and the last offset it
handed out carried data that has not been flushed yet, it returns a *flush* offset
`{"session", "tag", "flush": 1}`: no rows, but a different offset, so Spark plans one empty batch
and commits the previous one. The flush batch itself holds nothing to ack, so the next idle
`read` returns `start` unchanged and Spark stops planning: one extra empty batch per burst,
no busy loop. The same rule keeps a consumer whose prefetch is exhausted moving.

Replays after a crash. After SIGKILL of the driver and restart from the checkpoint Spark
replays the planned-but-uncommitted batch with its logged offsets, without calling
initialOffset/latestOffset first: `readBetweenOffsets` runs in an executor, then `commit`
with the dead run's end offset. The dead session's messages were requeued by the broker when
its connection dropped, so the replayed batch must be empty. `readBetweenOffsets` does not just
assume that: each live session holds an exclusive marker queue `haremq.spark.session.<id>`,
and the executor asks the broker whether it still exists (passive queue.declare: 404 means the
session is gone and the broker has its messages back). A session whose node died goes as soon
as the other members agree that node is down: they delete the exclusive queues of its
connections and requeue what its channels had not acked, so a job restarted while that node
stays down is not held up by it. If the session is still alive (which would mean Spark lost
prefetched rows of the live run, or the old connection is half-open and not yet timed out, or
its node is down and the cluster has not noticed yet) it waits up to `sessionCheckTimeout`
seconds for it to go, then fails the task, with what each node answered, rather than return an
empty batch whose commit would ack unread messages. Nodes that refuse the connection are passed
over; if none answers for `reconnectTimeout` seconds the task fails naming each one's failure.

Trigger.AvailableNow: `prepareForTriggerAvailableNow` (runner) counts the backlog (buffered
plus ready in the queue) and `read` stops handing out rows after that many; the idle flush then
commits the last batch and Spark ends the query. Trigger.Once runs exactly one batch and never
commits it, so its messages return to the queue when the query ends: use AvailableNow.

`reader.stop()` was never called in six traced query stops, so nothing depends on it: when the
runner process exits its sockets close and the broker requeues whatever was not acked.

Failover. `uri` may list several nodes, comma-separated. The source's first connection makes
one pass over them and fails the query with one clause per node (refused, login refused,
vhost, queue missing). A lost connection (reset, closed with 320 CONNECTION_FORCED, missed
heartbeats, a closed channel, a cancelled consumer) is replaced by one to the next node of the
list, then the others in turn, for `reconnectTimeout` seconds before the query fails; each new
connection is a new session, and what the lost one had not acked comes back redelivered (the
batch Spark planned from it still runs, and its commit acks nothing: duplicates, never loss).
The sink does the same inside a task: see below.

Sink. `write()` runs in executor tasks: each task publishes its rows on its own connection with
publisher confirms (a window of unconfirmed messages), mandatory=true and delivery_mode=2 by
default, and raises (failing the task, so Spark retries and does not commit the batch) on a
basic.nack, a basic.return, a channel closed for a reason every node would repeat (404, 403,
406, ...), or no confirm progress for `confirmTimeout` seconds. A lost connection does not fail
the task: it connects to the next node and publishes again, unchanged, the messages the lost
one had not confirmed (a deduplicating queue drops the copies that had arrived: same ids), then
goes on; only when no node takes a connection for `reconnectTimeout` seconds does it fail. `commit`/`abort` run on the driver and have nothing left to do.
`streamWriter()` runs on the driver at query start and again for every batch's commit: it
fails the query on a refused login or a missing exchange, but an unreachable node is left to
the tasks (which try the URIs in order), so an outage at commit time cannot fail a batch whose
rows were already confirmed. In
local mode Spark does not retry tasks unless the master is `local[N,maxFailures]`; a failed
task then fails the query, and restarting it from the checkpoint replays the batch.

Source options: uri, queue, maxRowsPerBatch (10000), maxBytesPerBatch (64 MiB of bodies; an
Arrow binary column holds at most 2 GiB), prefetch (2 x maxRowsPerBatch, at most 65535),
connectTimeout (10 s), reconnectTimeout (60 s), heartbeat (server's), sessionCheckTimeout
(150 s). Sink options: uri, exchange (""), routingKey (""), persistent (true), mandatory
(true), confirmWindow (2000), confirmTimeout (30 s), connectTimeout (10 s), reconnectTimeout
(60 s), heartbeat (server's), deduplication (false).

Effectively once. With `deduplication=true` the sink puts an id on every row, in the header
`x-deduplication-header` that a deduplicating HareMQ queue (x-message-deduplication) drops
repeats by. The id must name the same message every time Spark writes it again, and two
distinct messages never:

* The row's `dedup_id` column when the frame has one. The source's is the message_id property,
  or null without one. AMQP 0-9-1 has nothing else that follows a message through its
  redeliveries: a delivery tag belongs to one channel (the restarted job's consumer gets new
  ones), `redelivered` only says the message was delivered before, and the content does not
  tell two messages apart that were published alike on purpose (a "tick" sent twice): an id
  made from it would make the second tick a duplicate of the first. So exactly-once from
  a queue needs a message_id set by the producer (or an id the job derives into `dedup_id`),
  and a row whose `dedup_id` is null or empty fails the task with that said (`NO_DEDUP_ID`):
  publishing it without an id would break the promise the option makes without a word.
* Without that column (a streaming query from a source Spark replays identically per batch:
  files, Kafka, `rate`), `row_id`: `spark:<query id>:<batch id>:<partition>:<digest>:<n>`, the
  first three read from the task's local properties, the digest a hash of what the row
  publishes (routing key, body, headers, properties) and n how many rows of the task published
  the same before it. A retried task may see its rows in another order, or fewer or more of
  them; each row still gets the id it had (a row's place alone named another row then), and
  identical rows get one id each. A batch that Spark moves to another partition when it runs it
  again gets new ids (duplicates, never a loss).

A batch replayed after a crash is then published again and dropped by the queue, each row
confirmed.
"""
from __future__ import annotations

import collections
import hashlib
import logging
from dataclasses import dataclass
from typing import Iterator, List, Optional

import pika
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    SimpleDataSourceStreamReader,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .amqp import (
    ConfirmingPublisher,
    Delivery,
    HareMQError,
    Outgoing,
    QueueConsumer,
    check_target,
    parse_uris,
    wait_session_gone,
)

log = logging.getLogger("pipeline.haremq")

DEDUP_HEADER = "x-deduplication-header"    # what a deduplicating HareMQ queue reads (sink option deduplication)

PROPERTIES_TYPE = StructType([
    StructField("content_type", StringType()),
    StructField("correlation_id", StringType()),
    StructField("message_id", StringType()),
    StructField("timestamp", TimestampType()),
    StructField("priority", IntegerType()),
    StructField("delivery_mode", IntegerType()),
])

SOURCE_SCHEMA = StructType([
    StructField("body", BinaryType()),
    StructField("routing_key", StringType()),
    StructField("exchange", StringType()),
    StructField("headers", MapType(StringType(), StringType())),
    StructField("properties", PROPERTIES_TYPE),
    StructField("redelivered", BooleanType()),
    StructField("dedup_id", StringType()),
])


# --------------------------------------------------------------------------- options

def _get(options, name: str, default=None):
    """Spark hands options over case-insensitively; look them up the same way."""
    low = name.lower()
    for k, v in options.items():
        if k.lower() == low:
            return v
    return default


def _number(options, name: str, default, role: str, conv=int, minimum=None):
    raw = _get(options, name)
    if raw is None:
        return default
    try:
        value = conv(raw)
    except (TypeError, ValueError):
        raise HareMQError(f"haremq {role}: option {name!r} must be a number, got {raw!r}") from None
    if minimum is not None and value < minimum:
        raise HareMQError(f"haremq {role}: option {name!r} must be at least {minimum}, got {raw!r}")
    return value


def _flag(options, name: str, default: bool, role: str) -> bool:
    raw = _get(options, name)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise HareMQError(f"haremq {role}: option {name!r} must be true or false, got {raw!r}")


@dataclass
class SourceOptions:
    uri: str
    queue: str
    max_rows: int
    max_bytes: int
    prefetch: int
    connect_timeout: float
    reconnect_timeout: float
    heartbeat: Optional[int]
    session_check_timeout: float

    @classmethod
    def parse(cls, options) -> "SourceOptions":
        role = "source"
        uri = _get(options, "uri")
        parse_uris(uri, role)  # fail early with the offending uri named
        queue = _get(options, "queue")
        if not queue:
            raise HareMQError("haremq source: option 'queue' is required")
        max_rows = _number(options, "maxRowsPerBatch", 10000, role, minimum=1)
        prefetch = _number(options, "prefetch", min(2 * max_rows, 65535), role, minimum=1)
        if prefetch > 65535:
            raise HareMQError("haremq source: option 'prefetch' is an AMQP short: at most 65535")
        return cls(uri=uri, queue=queue, max_rows=max_rows, prefetch=prefetch,
                   max_bytes=_number(options, "maxBytesPerBatch", 64 << 20, role, minimum=1),
                   connect_timeout=_number(options, "connectTimeout", 10.0, role, float, 0.1),
                   reconnect_timeout=_number(options, "reconnectTimeout", 60.0, role, float, 0),
                   heartbeat=_number(options, "heartbeat", None, role, int, 0),
                   session_check_timeout=_number(options, "sessionCheckTimeout", 150.0, role, float, 0))


@dataclass
class SinkOptions:
    uri: str
    exchange: str
    routing_key: str
    persistent: bool
    mandatory: bool
    window: int
    confirm_timeout: float
    connect_timeout: float
    deduplication: bool = False
    reconnect_timeout: float = 60.0
    heartbeat: Optional[int] = None

    @classmethod
    def parse(cls, options) -> "SinkOptions":
        role = "sink"
        uri = _get(options, "uri")
        parse_uris(uri, role)
        return cls(uri=uri, exchange=_get(options, "exchange", "") or "",
                   routing_key=_get(options, "routingKey", "") or "",
                   persistent=_flag(options, "persistent", True, role),
                   mandatory=_flag(options, "mandatory", True, role),
                   window=_number(options, "confirmWindow", 2000, role, minimum=1),
                   confirm_timeout=_number(options, "confirmTimeout", 30.0, role, float, 0.1),
                   connect_timeout=_number(options, "connectTimeout", 10.0, role, float, 0.1),
                   deduplication=_flag(options, "deduplication", False, role),
                   reconnect_timeout=_number(options, "reconnectTimeout", 60.0, role, float, 0),
                   heartbeat=_number(options, "heartbeat", None, role, int, 0))


# --------------------------------------------------------------------------- the data source

class HareMQDataSource(DataSource):
    """Format "haremq": a streaming source (one queue) and a streaming/batch sink (one exchange)."""

    @classmethod
    def name(cls) -> str:
        return "haremq"

    def schema(self) -> StructType:
        return SOURCE_SCHEMA

    def simpleStreamReader(self, schema: StructType) -> "HareMQStreamReader":
        return HareMQStreamReader(SourceOptions.parse(self.options))

    def streamWriter(self, schema: StructType, overwrite: bool) -> "HareMQStreamWriter":
        return HareMQStreamWriter(self._sink_options(), schema)

    def writer(self, schema: StructType, overwrite: bool) -> "HareMQBatchWriter":
        return HareMQBatchWriter(self._sink_options(), schema)

    def _sink_options(self) -> "SinkOptions":
        # Runs on the driver when the query starts and again for every batch's commit/abort: a
        # refused login or a missing exchange fails the query at once, not only once rows arrive.
        options = SinkOptions.parse(self.options)
        check_target(parse_uris(options.uri, "sink"), options.exchange, options.connect_timeout)
        return options


# --------------------------------------------------------------------------- source

class HareMQStreamReader(SimpleDataSourceStreamReader, SupportsTriggerAvailableNow):
    """See the module docstring: the consumer exists only in the driver-side runner process."""

    def __init__(self, options: SourceOptions):
        self.options = options
        self._consumer: Optional[QueueConsumer] = None
        self._last_end: Optional[dict] = None     # last end offset handed out with rows
        self._flushed: Optional[tuple] = None     # (session, tag) a flush offset was issued for
        self._arrow_schema: Optional[pa.Schema] = None
        self._budget: Optional[int] = None        # Trigger.AvailableNow: messages still to read

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_consumer"] = None  # never ship a connection (or its deliveries) to a worker
        state["_arrow_schema"] = None
        return state

    # -- runner side

    def _running_consumer(self) -> QueueConsumer:
        if self._consumer is None:
            o = self.options
            c = QueueConsumer(parse_uris(o.uri, "source"), o.queue, o.prefetch,
                              connect_timeout=o.connect_timeout, reconnect_timeout=o.reconnect_timeout,
                              heartbeat=o.heartbeat)
            c.start()  # raises HareMQError naming the node/user/queue at fault
            self._consumer = c
        self._consumer.check()
        return self._consumer

    def initialOffset(self) -> dict:
        self._running_consumer()
        return {"session": "", "tag": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        # Read what is in the queue now, not what arrives later; the idle flush below still
        # runs, so the last batch is committed and acked before the query ends.
        self._budget = self._running_consumer().backlog()

    def read(self, start: dict):
        c = self._running_consumer()
        limit = self.options.max_rows if self._budget is None else min(self.options.max_rows, self._budget)
        session, deliveries = c.take(limit, self.options.max_bytes) if limit > 0 else (None, [])
        if deliveries:
            if self._budget is not None:
                self._budget -= len(deliveries)
            end = {"session": session, "tag": deliveries[-1].tag}
            self._last_end = end
            return iter([self._record_batch(deliveries)]), end
        last = self._last_end
        if (last is not None and last["session"] == c.live_session()
                and self._flushed != (last["session"], last["tag"])):
            # Idle with the last batch still uncommitted: one empty batch makes Spark commit it.
            self._flushed = (last["session"], last["tag"])
            return iter([]), {"session": last["session"], "tag": last["tag"], "flush": 1}
        return iter([]), start

    def commit(self, end: dict) -> None:
        session = end.get("session")
        if not session or self._consumer is None:
            return
        if not self._consumer.ack_through(session, int(end.get("tag", 0))):
            log.warning("haremq source: batch ending at %s belongs to a session that is gone; "
                        "the broker redelivers its messages", end)

    def stop(self) -> None:
        if self._consumer is not None:
            self._consumer.stop()
            self._consumer = None

    # -- executor side

    def readBetweenOffsets(self, start: dict, end: dict) -> Iterator:
        session = end.get("session")
        if not session or end.get("flush"):
            return iter([])
        if start.get("session") == session and int(start.get("tag", 0)) >= int(end.get("tag", 0)):
            return iter([])
        o = self.options
        held = wait_session_gone(parse_uris(o.uri, "source"), session, timeout=o.session_check_timeout,
                                 unreachable_timeout=o.reconnect_timeout, connect_timeout=o.connect_timeout)
        if held is not None:
            raise HareMQError(
                f"haremq source: Spark asked an executor to re-read the batch {start} -> {end}, but "
                f"consumer session {session} is still connected after {o.session_check_timeout:g}s "
                f"(sessionCheckTimeout), so its messages are not back in queue {o.queue!r}; refusing to "
                f"return an empty batch whose commit would ack them. The nodes answered: {held}")
        log.warning("haremq source: replayed batch %s -> %s came from a dead session; the broker "
                    "redelivers its messages, so the batch is empty", start, end)
        return iter([])

    # -- rows

    def _record_batch(self, deliveries: List[Delivery]) -> pa.RecordBatch:
        if self._arrow_schema is None:
            self._arrow_schema = to_arrow_schema(SOURCE_SCHEMA, timezone="UTC")
        return deliveries_to_arrow(deliveries, self._arrow_schema)


def _header_text(v) -> Optional[str]:
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def dedup_id(d: Delivery) -> Optional[str]:
    """The message_id property, or None: see "Effectively once" in the module docstring for
    why nothing else can stand in for it."""
    return d.properties.message_id or None


def deliveries_to_arrow(deliveries: List[Delivery], schema: pa.Schema) -> pa.RecordBatch:
    n = len(deliveries)
    body, rk, ex, hdrs, red, ids = [None] * n, [None] * n, [None] * n, [None] * n, [None] * n, [None] * n
    ct, cid, mid, ts, prio, dm = [None] * n, [None] * n, [None] * n, [None] * n, [None] * n, [None] * n
    for i, d in enumerate(deliveries):
        p = d.properties
        h = p.headers
        body[i] = d.body
        rk[i] = d.routing_key
        ex[i] = d.exchange
        hdrs[i] = [(str(k), _header_text(v)) for k, v in h.items()] if h else []
        red[i] = d.redelivered
        ct[i] = p.content_type
        cid[i] = p.correlation_id
        mid[i] = p.message_id
        ts[i] = p.timestamp * 1_000_000 if p.timestamp is not None else None
        prio[i] = p.priority
        dm[i] = p.delivery_mode
        ids[i] = dedup_id(d)
    ptype = schema.field("properties").type
    pfields = [ptype.field(i) for i in range(ptype.num_fields)]
    props = pa.StructArray.from_arrays(
        [pa.array(col, type=f.type) for col, f in zip((ct, cid, mid, ts, prio, dm), pfields)],
        fields=pfields)
    cols = [body, rk, ex, hdrs, None, red, ids]
    arrays = [props if col is None else pa.array(col, type=schema.field(i).type)
              for i, col in enumerate(cols)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# --------------------------------------------------------------------------- sink

@dataclass
class HareMQCommitMessage(WriterCommitMessage):
    published: int


class _Publishing:
    """Turns Arrow batches into confirmed publishes; shared by the stream and batch writers."""

    streaming = False

    def __init__(self, options: SinkOptions, schema: StructType):
        self.options = options
        names = {f.name: f for f in schema.fields}
        body = names.get("body")
        if body is None or not isinstance(body.dataType, (BinaryType, StringType)):
            raise HareMQError("haremq sink: the DataFrame needs a 'body' column of type binary or string "
                              f"(columns: {', '.join(names) or 'none'})")
        rk = names.get("routingKey")
        if rk is not None and not isinstance(rk.dataType, StringType):
            raise HareMQError("haremq sink: column 'routingKey' must be a string")
        self.has_rk = rk is not None
        self.has_headers = isinstance(getattr(names.get("headers"), "dataType", None), MapType)
        self.has_props = isinstance(getattr(names.get("properties"), "dataType", None), StructType)
        self.has_dedup_id = isinstance(getattr(names.get("dedup_id"), "dataType", None), StringType)
        if options.deduplication and not self.has_dedup_id and not self.streaming:
            raise HareMQError("haremq sink: option 'deduplication' on a batch write needs a 'dedup_id' column "
                              "(a streaming query can name each row by its micro-batch and content instead)")

    def write(self, batches: Iterator[pa.RecordBatch]) -> HareMQCommitMessage:
        o = self.options
        pub = ConfirmingPublisher(parse_uris(o.uri, "sink"), o.exchange, mandatory=o.mandatory,
                                  window=o.window, confirm_timeout=o.confirm_timeout,
                                  connect_timeout=o.connect_timeout, reconnect_timeout=o.reconnect_timeout,
                                  heartbeat=o.heartbeat)
        return HareMQCommitMessage(published=pub.publish(self._messages(batches)))

    def _messages(self, batches: Iterator[pa.RecordBatch]) -> Iterator[Outgoing]:
        o = self.options
        mode = 2 if o.persistent else None
        shared = pika.BasicProperties(delivery_mode=mode)
        if o.deduplication:
            yield from self._identified(batches, mode)
            return
        for batch in batches:
            bodies = batch.column("body").to_pylist()
            keys = batch.column("routingKey").to_pylist() if self.has_rk else None
            headers = batch.column("headers").to_pylist() if self.has_headers else None
            props = batch.column("properties").to_pylist() if self.has_props else None
            for i, b in enumerate(bodies):
                if isinstance(b, str):
                    b = b.encode("utf-8")
                elif b is None:
                    b = b""
                key = o.routing_key
                if keys is not None and keys[i] is not None:
                    key = keys[i]
                p = shared
                if (headers is not None and headers[i]) or (props is not None and props[i]):
                    p = _properties(headers[i] if headers is not None else None,
                                    props[i] if props is not None else None, mode)
                yield Outgoing(key, b, p)

    def _identified(self, batches: Iterator[pa.RecordBatch], mode) -> Iterator[Outgoing]:
        """Option deduplication: every row with its id in the header x-deduplication-header,
        the dedup_id column's, or without that column `row_id`'s."""
        o = self.options
        place = None if self.has_dedup_id else _place_prefix()
        occurrences: collections.Counter = collections.Counter()   # row digest -> rows so far
        for batch in batches:
            bodies = batch.column("body").to_pylist()
            keys = batch.column("routingKey").to_pylist() if self.has_rk else None
            headers = batch.column("headers").to_pylist() if self.has_headers else None
            props = batch.column("properties").to_pylist() if self.has_props else None
            ids = batch.column("dedup_id").to_pylist() if self.has_dedup_id else None
            if ids is not None and not all(ids):
                raise HareMQError(NO_DEDUP_ID)
            for i, b in enumerate(bodies):
                body = b.encode("utf-8") if isinstance(b, str) else (b or b"")
                key = keys[i] if keys is not None and keys[i] is not None else o.routing_key
                h = dict(headers[i]) if headers is not None and headers[i] else {}
                p = props[i] if props is not None else None
                if ids is not None:
                    ident = ids[i]
                else:
                    ident = row_id(place, key, body, h, p, occurrences)
                h[DEDUP_HEADER] = ident
                yield Outgoing(key, body, _properties(h, p, mode))


NO_DEDUP_ID = (
    "haremq sink: option 'deduplication' is on and a row's dedup_id is null or empty. From the "
    "HareMQ source that is a message published without a message_id: nothing in AMQP 0-9-1 tells a "
    "redelivered message from another with the same content, so such a row cannot be deduplicated. "
    "Have the producer set a message_id on every message, or put an id of your own in the dedup_id "
    "column (stable across a restart of the job), or drop the option")


def row_id(place: str, routing_key: str, body: bytes, headers: dict, props, occurrences) -> str:
    """`place` (`spark:<query id>:<batch id>:<partition>:`), then a digest of what the row
    publishes and how many rows of this task published the same before it. A task run again
    (retried, or its micro-batch replayed from the checkpoint) names each row as before,
    whatever order or number its rows come in, and two rows share an id only when they publish
    the same message: then each copy has its own count."""
    h = hashlib.blake2b(digest_size=16)
    for part in (routing_key.encode(), body, repr(sorted(headers.items())).encode(),
                 repr(sorted(props.items()) if props else None).encode()):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    digest = h.hexdigest()
    n = occurrences[digest]
    occurrences[digest] = n + 1
    return f"{place}{digest}:{n}"


def _place_prefix() -> str:
    """`spark:<query id>:<batch id>:<partition>:` of the task writing: Spark gives a task the
    same three when it runs a micro-batch again (a retried task, or a replay from the
    checkpoint)."""
    from pyspark import TaskContext
    tc = TaskContext.get()
    query = tc.getLocalProperty("sql.streaming.queryId") if tc is not None else None
    batch = tc.getLocalProperty("streaming.sql.batchId") if tc is not None else None
    if query is None or batch is None:
        raise HareMQError("haremq sink: option 'deduplication' without a 'dedup_id' column needs a streaming "
                          "query (its query id and micro-batch id name each row)")
    return f"spark:{query}:{batch}:{tc.partitionId()}:"


def _properties(headers, props, mode) -> pika.BasicProperties:
    kw = {}
    if headers:
        kw["headers"] = dict(headers)
    if props:
        for name in ("content_type", "correlation_id", "message_id", "priority"):
            if props.get(name) is not None:
                kw[name] = props[name]
        t = props.get("timestamp")
        if t is not None:
            kw["timestamp"] = int(t.timestamp()) if hasattr(t, "timestamp") else int(t)
        if mode is None and props.get("delivery_mode") is not None:
            mode = props["delivery_mode"]
    return pika.BasicProperties(delivery_mode=mode, **kw)


class HareMQStreamWriter(_Publishing, DataSourceStreamArrowWriter):
    """Streaming sink: each task publishes its rows with confirms; see the module docstring."""

    streaming = True

    def commit(self, messages, batchId: int) -> None:
        n = sum(m.published for m in messages if m is not None)
        log.info("haremq sink: batch %d: %d messages confirmed", batchId, n)

    def abort(self, messages, batchId: int) -> None:
        log.warning("haremq sink: batch %d aborted; Spark will run it again (at-least-once)", batchId)


class HareMQBatchWriter(_Publishing, DataSourceArrowWriter):
    """`df.write.format("haremq")`: the same confirmed publishing for a batch DataFrame."""
