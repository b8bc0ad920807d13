"""Prometheus metrics (`--prometheus-port`, default 15692 as RabbitMQ's rabbitmq_prometheus).

A prometheus_client collector that reads the node's counters and state when
scraped; nothing is computed on the data path. Names are RabbitMQ's where the
meaning is the same (`rabbitmq_queue_messages_ready`, `rabbitmq_connections`,
`rabbitmq_global_messages_confirmed_total`, `rabbitmq_alarms_*`, ...), so
existing dashboards and alerts carry over, and `haremq_*` for what is
HareMQ's own: mirrors and synchronised mirrors per queue, the members of a
quorum queue and how many are online (RabbitMQ 3.10's plugin has no such
series: `haremq_queue_members`, `haremq_queue_members_online`), epochs and
failovers, sync progress, the store's group commits and fsync time, Raft
term and leader, and which members this node sees up (the cluster's series
come from its view: cluster/control/management_view.py).

Each node exports the queues whose messages live on it, as each RabbitMQ node
does. `/metrics` has one series per queue (labels `vhost`, `queue`) unless the
node runs with `--prometheus-per-queue off`, when queue series are summed
without labels (RabbitMQ's default aggregated form); `/metrics/per-object`
always has them per queue.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily,
                                   SummaryMetricFamily)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..broker.ports import QueuePort
from .stats import local_queues, node_totals
from .views import client_sessions

if TYPE_CHECKING:
    from .cluster_view import ClusterView

QUEUE_GAUGES = (
    ("rabbitmq_queue_messages_ready", "Messages ready to be delivered to consumers", "ready"),
    ("rabbitmq_queue_messages_unacked", "Messages delivered to consumers but not yet acknowledged", "unacked"),
    ("rabbitmq_queue_messages", "Sum of ready and unacknowledged messages - total queue depth", "messages"),
    ("rabbitmq_queue_messages_ready_bytes", "Size in bytes of ready messages", "ready_bytes"),
    ("rabbitmq_queue_messages_paged_out", "Messages paged out to disk", "paged_out"),
    ("rabbitmq_queue_consumers", "Consumers on a queue", "consumers"),
)
QUEUE_COUNTERS = (
    ("rabbitmq_queue_messages_published", "Total number of messages published to queues", "published"),
    ("haremq_queue_messages_delivered", "Total number of messages delivered from a queue (consume and get)",
     "delivered"),
    ("haremq_queue_messages_acked", "Total number of deliveries of a queue acknowledged", "acked"),
)


def _queue_values(queue: QueuePort) -> dict:
    ready, unacked = queue.message_count, queue.unacked
    return {"ready": ready, "unacked": unacked, "messages": ready + unacked,
            "ready_bytes": queue.message_bytes, "paged_out": queue.paged_out, "consumers": queue.consumer_count,
            "published": queue.published_total, "delivered": queue.delivered_total, "acked": queue.acked_total}


def store_module():
    from ..store import store
    return store


class BrokerCollector:
    def __init__(self, broker, view: ClusterView, per_queue: bool):
        self.broker = broker
        self.view = view
        self.per_queue = per_queue

    def collect(self, per_queue: bool | None = None):
        per_queue = self.per_queue if per_queue is None else per_queue
        broker = self.broker
        node = broker.node_name
        info = InfoMetricFamily("rabbitmq_identity", "RabbitMQ node & cluster identity info")
        info.add_metric([], {"rabbitmq_node": node, "rabbitmq_cluster": broker.server_properties()["cluster_name"]})
        yield info

        sessions = list(client_sessions(broker))
        channels = sum(len(s.channels) for s in sessions)
        consumers = sum(len(c.consumers) for s in sessions for c in s.channels.values())
        yield GaugeMetricFamily("rabbitmq_connections", "Connections currently open", value=len(sessions))
        yield GaugeMetricFamily("rabbitmq_channels", "Channels currently open", value=channels)
        yield GaugeMetricFamily("rabbitmq_consumers", "Consumers currently connected", value=consumers)

        totals = node_totals(broker)
        for name, help_text, key in (
                ("rabbitmq_global_messages_received", "Total number of messages received from publishers",
                 "publish"),
                ("rabbitmq_global_messages_confirmed", "Total number of messages confirmed to publishers",
                 "confirm"),
                ("rabbitmq_global_messages_delivered", "Total number of messages delivered to consumers",
                 "deliver_get"),
                ("rabbitmq_global_messages_acknowledged", "Total number of messages acknowledged by consumers",
                 "ack")):
            yield CounterMetricFamily(name, help_text, value=totals[key])

        alarms = set(broker.alarms)
        yield GaugeMetricFamily("rabbitmq_alarms_memory_used_watermark",
                                "is 1 if VM memory watermark alarm is in effect", value=int("memory" in alarms))
        yield GaugeMetricFamily("rabbitmq_alarms_free_disk_space_watermark",
                                "is 1 if free disk space watermark alarm is in effect",
                                value=int(any(a.startswith("disk") for a in alarms)))
        status = broker.resource_status()
        for name, help_text, key in (
                ("rabbitmq_process_resident_memory_bytes", "Memory used in bytes", "memory_used"),
                ("rabbitmq_resident_memory_limit_bytes", "Memory high watermark in bytes", "memory_limit"),
                ("rabbitmq_disk_space_available_bytes", "Disk space available in bytes", "disk_free"),
                ("rabbitmq_disk_space_available_limit_bytes", "Free disk space low watermark in bytes",
                 "disk_free_limit")):
            if status.get(key) is not None:
                yield GaugeMetricFamily(name, help_text, value=status[key])

        queues = list(local_queues(broker))
        yield GaugeMetricFamily("rabbitmq_queues", "Queues available", value=len(queues))
        yield from self._queues(queues, per_queue)
        yield from self._store()
        yield from self.view.metric_families(queues, per_queue)     # the cluster's own series

    def _queues(self, queues, per_queue: bool):
        labels = ["vhost", "queue"] if per_queue else []
        values = [(vname, queue.name, _queue_values(queue)) for vname, queue in queues]
        for family, specs in ((GaugeMetricFamily, QUEUE_GAUGES), (CounterMetricFamily, QUEUE_COUNTERS)):
            for name, help_text, key in specs:
                metric = family(name, help_text, labels=labels)
                if per_queue:
                    for vname, qname, v in values:
                        metric.add_metric([vname, qname], v[key])
                else:
                    metric.add_metric([], sum(v[key] for _, _, v in values))
                yield metric

    def _store(self):
        store = self.broker.store
        stats = getattr(store, "stats", None)
        if not stats:
            return
        histogram = getattr(store, "sync_histogram", None)
        bounds = getattr(store_module(), "SYNC_BUCKETS", ())
        if histogram and len(histogram) == len(bounds) + 1:
            buckets, total = [], 0
            for bound, count in zip([*map(str, bounds), "+Inf"], histogram):
                total += count
                buckets.append((bound, total))
            yield HistogramMetricFamily("haremq_store_group_commit_seconds",
                                        "Time the message store took to write and fsync each group commit",
                                        buckets=buckets, sum_value=stats.get("sync_seconds", 0.0))
        else:
            yield SummaryMetricFamily("haremq_store_group_commit_seconds",
                                      "Time the message store took to write and fsync its group commits",
                                      count_value=stats.get("batches", 0), sum_value=stats.get("sync_seconds", 0.0))
        yield CounterMetricFamily("haremq_store_fsyncs", "fsync calls made by the message store",
                                  value=stats.get("fsyncs", 0))
        yield CounterMetricFamily("haremq_store_records", "Records written to the message store",
                                  value=stats.get("records", 0))
        yield CounterMetricFamily("haremq_store_written_bytes", "Bytes written to the message store",
                                  value=stats.get("bytes", 0))


class PerObject:
    """The same collector with per-queue series whatever the flag says (/metrics/per-object)."""

    def __init__(self, collector: BrokerCollector):
        self.collector = collector

    def collect(self):
        return self.collector.collect(per_queue=True)


class Metrics:
    def __init__(self, broker, view: ClusterView, per_queue: bool = True):
        self.broker = broker
        self.view = view
        collector = BrokerCollector(broker, view, per_queue)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self.per_object = CollectorRegistry(auto_describe=False)
        self.per_object.register(PerObject(collector))

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/metrics/per-object", self.metrics_per_object)
        app.router.add_get("/health", self.health)
        app.router.add_get("/", self.index)
        return app

    @staticmethod
    def _answer(registry) -> web.Response:
        response = web.Response(body=generate_latest(registry))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def metrics(self, request) -> web.Response:
        return self._answer(self.registry)

    async def metrics_per_object(self, request) -> web.Response:
        return self._answer(self.per_object)

    async def health(self, request) -> web.Response:
        """For probes, without credentials: 200 while the node serves, 503 while it pauses
        (it cannot see a majority of the cluster). Alarms do not count: see /api/health/checks."""
        if self.view.paused:
            return web.json_response({"status": "failed", "reason": "paused: this node cannot see a majority"},
                                     status=503)
        return web.json_response({"status": "ok"})

    async def index(self, request) -> web.Response:
        return web.Response(text="HareMQ metrics: /metrics, /metrics/per-object; probes: /health\n")
