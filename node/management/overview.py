"""/api/overview, /api/cluster-name, /api/whoami and /api/nodes, and the web view's own
timeline and history (/api/haremq/events, /api/haremq/history)."""
from __future__ import annotations

import platform
from typing import TYPE_CHECKING

from aiohttp import web

from ..version import __version__
from . import auth
from . import serializers as js
from .responses import as_json, not_found
from .routes import Routes
from .samples import with_samples

if TYPE_CHECKING:
    from .cluster_view import ClusterView
    from .stats import Sampler


PYTHON = platform.python_version()


class OverviewRoutes(Routes):
    def __init__(self, broker, view: ClusterView, sampler: Sampler, listeners: list[dict]):
        """`listeners`: this node's management and Prometheus listeners as /api/overview lists
        them, filled in by Management as each one opens."""
        super().__init__(broker, view, sampler)
        self.listeners = listeners

    async def overview(self, request) -> web.Response:
        caller = request["caller"]
        queues = self.visible(request, await self.rows("queues"))
        connections = self.own(request, await self.rows("connections"))
        channels = self.own(request, await self.rows("channels"))
        consumers = sum(q.get("consumers") or 0 for q in queues)
        ready = sum(q.get("messages_ready") or 0 for q in queues)
        unacked = sum(q.get("messages_unacknowledged") or 0 for q in queues)
        exchanges = sum(len(v.exchanges) for n, v in self.broker.vhosts.items()
                        if auth.can_see_vhost(self.broker, caller, n))
        rates = [0.0, 0.0, 0.0]
        totals = [0, 0, 0]
        for q in queues:
            stats = q.get("message_stats") or {}
            for i, key in enumerate(("publish", "deliver_get", "ack")):
                totals[i] += stats.get(key, 0)
                rates[i] += stats.get(key + "_details", {}).get("rate", 0.0)
        publish, deliver_get, ack = totals
        return as_json(with_samples(request, {
            "management_version": "3.10.8", "rates_mode": "basic", "product_name": "HareMQ",
            "product_version": __version__, "rabbitmq_version": "3.10.8", "erlang_version": "n/a",
            "cluster_name": self.broker.server_properties()["cluster_name"], "node": self.broker.node_name,
            "exchange_types": js.EXCHANGE_TYPES,
            "message_stats": {k: round(v, 1) if isinstance(v, float) else v for k, v in
                              js.message_stats(publish, deliver_get, ack, [round(r, 1) for r in rates]).items()},
            "queue_totals": {"messages": ready + unacked, "messages_details": js.details(0.0),
                             "messages_ready": ready, "messages_ready_details": js.details(0.0),
                             "messages_unacknowledged": unacked,
                             "messages_unacknowledged_details": js.details(0.0)},
            "object_totals": {"connections": len(connections), "channels": len(channels),
                              "consumers": consumers, "exchanges": exchanges, "queues": len(queues)},
            "listeners": self.listeners, "contexts": [], "statistics_db_event_queue": 0, "disable_stats": False,
            "enable_queue_totals": True, "erlang_full_version": f"none: HareMQ runs on Python {PYTHON}",
            # the history HareMQ keeps (stats.py: ten minutes), for the ranges a UI offers its charts
            "sample_retention_policies": {"global": [600], "basic": [600], "detailed": [600]},
        }))

    async def cluster_name(self, request) -> web.Response:
        return as_json({"name": self.broker.server_properties()["cluster_name"]})

    async def whoami(self, request) -> web.Response:
        caller = request["caller"]
        return as_json({"name": caller.name, "tags": sorted(caller.tags)})

    async def _node_rows(self) -> list[dict]:
        """The members' rows; RabbitMQ lists a node's links to the others even when it has none
        (a single node: an empty list, which its UI reads)."""
        rows = await self.view.node_rows()
        for row in rows:
            row.setdefault("cluster_links", [])
        return rows

    async def nodes(self, request) -> web.Response:
        auth.require_monitor(request["caller"])
        return as_json(with_samples(request, await self._node_rows()))

    async def node(self, request) -> web.Response:
        auth.require_monitor(request["caller"])
        for row in await self._node_rows():
            if row["name"] == request.match_info["node"]:
                return as_json(with_samples(request, row))
        raise not_found()

    # ---- HareMQ's own, for the web view -----------------------------------------------------------
    async def events(self, request) -> web.Response:
        """The timeline, filtered by the caller's vhosts (administrators and monitoring see all)."""
        self.sampler.watch()
        caller = request["caller"]
        return as_json(self.sampler.visible_events(
            caller.is_monitor, lambda vhost: auth.can_see_vhost(self.broker, caller, vhost)))

    async def history(self, request) -> web.Response:
        caller = request["caller"]
        return as_json(self.sampler.visible_history(
            caller.is_monitor, lambda vhost: auth.can_see_vhost(self.broker, caller, vhost)))
