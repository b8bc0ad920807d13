"""The management side of a node: the HTTP API and web view, and Prometheus metrics.

    api.py          RabbitMQ's management API paths (aiohttp), and the page at /; the routes
                    are in one module per concept (overview, queues, exchanges, bindings,
                    connections, access, policies, definitions, health), over routes.py
                    and responses.py
    auth.py         HTTP basic auth with HareMQ's users and RabbitMQ's tags
    direct.py       a direct AMQP connection inside the node, for the API's actions
    inputs.py       request bodies checked field by field (a 400 naming the field, never a 500)
    serializers.py  HareMQ's objects as RabbitMQ's JSON
    cluster_view.py what management reads of the cluster (ClusterView); single_node.py is a
                    node on its own, cluster/control/management_view.py a member of a cluster
    views.py        what one node contributes to cluster-wide listings
    stats.py        counters read when asked; rates, history and the timeline
    metrics.py      the Prometheus collector and /metrics
    static/         the web view (plain HTML and JavaScript, no build step)

`Management` is built with the node's ClusterView by the assembly
(cluster/assembly.py) and starts and stops them with the node (node/app.py).
Both listeners run on the node's event loop.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from aiohttp import web

    from .cluster_view import ClusterView
    from .stats import Sampler


class Management:
    def __init__(self, broker, view: ClusterView, bind: str, management_port: int | None,
                 prometheus_port: int | None, per_queue: bool = True, ssl=None, optional=()):
        """`view`: the cluster as management reads it (cluster_view.py), a single node's own
        (single_node.py) or a member's (cluster/control/management_view.py)."""
        self.broker = broker
        self.view = view
        self.bind = bind
        self.management_port = management_port or None
        self.prometheus_port = prometheus_port or None
        self.per_queue = per_queue
        self.ssl = ssl
        self.optional = set(optional)   # ports left at their default: skipped with a warning if taken
        self.log = structlog.get_logger("haremq.management").bind(node=broker.node_name)
        self.sampler: Sampler | None = None
        self.listeners: list[dict] = []     # this node's management and Prometheus listeners (/api/overview)
        self._runners: list[web.AppRunner] = []

    async def start(self) -> None:
        from .api import ManagementAPI
        from .metrics import Metrics
        from .stats import Sampler
        sampler = self.sampler = Sampler(self.broker, self.view)
        sampler.start()
        listeners = []
        if self.management_port:
            self.management_port = await self._serve(ManagementAPI(self.broker, self.view, sampler,
                                                                   self.listeners).app(),
                                                     self.management_port, "management", self.ssl)
            if self.management_port:
                listeners.append({"node": self.broker.node_name, "protocol": "https" if self.ssl else "http",
                                  "ip_address": self.bind, "port": self.management_port})
        if self.prometheus_port:
            self.prometheus_port = await self._serve(Metrics(self.broker, self.view, self.per_queue).app(),
                                                     self.prometheus_port, "prometheus", None)
            if self.prometheus_port:
                listeners.append({"node": self.broker.node_name, "protocol": "http/prometheus",
                                  "ip_address": self.bind, "port": self.prometheus_port})
        self.listeners.extend(listeners)

    async def _serve(self, app, port: int, what: str, ssl) -> int | None:
        from aiohttp import web
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.bind, port, ssl_context=ssl, reuse_address=True)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            if what not in self.optional:
                raise OSError(f"cannot listen on {self.bind}:{port} for the {what} port: "
                              f"{exc.strerror or exc}") from None
            self.log.warning(f"{what} port in use: not serving it", port=port, reason=exc.strerror or str(exc))
            return None
        self._runners.append(runner)
        bound = port
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            bound = server.sockets[0].getsockname()[1]
        self.log.info(f"{what} listener started", address=f"{self.bind}:{bound}",
                      tls=bool(ssl) if what == "management" else None)
        return bound

    async def stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        self._runners = []
        if self.sampler is not None:
            await self.sampler.stop()
