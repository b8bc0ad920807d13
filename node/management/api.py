"""The management HTTP API: RabbitMQ's paths, JSON field names and status codes.

The subset of RabbitMQ 3.10's management API that tools use (rabbitmqadmin,
KEDA's RabbitMQ scaler, Terraform's provider, Flower), served with aiohttp on
the node's event loop. Reads come from the node's replicated metadata and, in
a cluster, from every member over the control call `management_rows`
(queues are counted by their home node), through the node's cluster view
(cluster_view.py). Changes take the paths AMQP and `haremq ctl` take:
declares, deletes, purges, gets and publishes go through a direct AMQP
connection as the calling user (`direct.py`), so its permissions apply and a
cluster commits them through the metadata log; users, vhosts, permissions and
policies are the broker calls `haremq ctl` makes (through the metadata log
when clustered).

This module holds the routing table, the error handling every request goes
through, and the page at /; the routes themselves are in one module per
concept:

    overview.py     overview, cluster name, whoami, nodes; the web view's timeline and history
    queues.py       queues: listing, declare, delete, purge, get, a queue's bindings
    exchanges.py    exchanges: listing, declare, delete, publish
    bindings.py     bindings between exchanges and queues or exchanges
    connections.py  connections, channels, consumers
    access.py       users, vhosts, permissions
    policies.py     policies
    absent.py       what HareMQ has none of, listed empty: feature flags, limits, operator
                    policies, runtime parameters, topic permissions
    ui.py           what RabbitMQ's own management UI asks beside the objects (/api/auth, unauthenticated)
    definitions.py  the definitions document, exported and imported
    health.py       health checks and the aliveness test
    routes.py       what they share (the caller's view, request bodies, admin calls)
    pagination.py   RabbitMQ's sorting and paging of a listing; samples.py, the samples in
                    `*_details` that a UI's charts ask for
    responses.py    answers and refusals, and the check against forged requests
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from . import auth
from . import inputs
from .absent import AbsentRoutes
from .access import AccessRoutes
from .bindings import BindingRoutes
from .connections import ConnectionRoutes
from .definitions import DefinitionRoutes
from .direct import AMQPClosed
from .exchanges import ExchangeRoutes
from .health import HealthRoutes
from .overview import OverviewRoutes
from .policies import PolicyRoutes
from .queues import QueueRoutes
from .responses import SAFE_METHODS, HTTPError, as_json, refuse_forgery
from .routes import log
from .ui import PUBLIC, UIRoutes

if TYPE_CHECKING:
    from .cluster_view import ClusterView
    from .stats import Sampler

STATIC = Path(__file__).resolve().parent / "static"


class ManagementAPI:
    def __init__(self, broker, view: ClusterView, sampler: Sampler, listeners: list[dict]):
        """`listeners`: this node's management and Prometheus listeners (for /api/overview)."""
        self.broker = broker
        self.view = view
        self.sampler = sampler
        self.listeners = listeners

    # ---- the application --------------------------------------------------------------------
    def app(self) -> web.Application:
        # `/api/users/` is `/api/users`, as in RabbitMQ (its UI asks for both): a redirect
        slashes = web.normalize_path_middleware(append_slash=False, remove_slash=True)
        app = web.Application(middlewares=[slashes, self._errors], client_max_size=64 << 20)
        r = app.router
        shared = (self.broker, self.view, self.sampler)
        overview, queues, exchanges = OverviewRoutes(*shared, self.listeners), QueueRoutes(*shared), ExchangeRoutes(*shared)
        bindings, connections, access = BindingRoutes(*shared), ConnectionRoutes(*shared), AccessRoutes(*shared)
        policies, definitions, health = PolicyRoutes(*shared), DefinitionRoutes(*shared), HealthRoutes(*shared)
        ui, absent = UIRoutes(*shared), AbsentRoutes(*shared)
        r.add_get("/", self.page)
        r.add_get("/index.html", self.page)
        r.add_static("/static/", STATIC)
        get, put, delete, post = r.add_get, r.add_put, r.add_delete, r.add_post
        get("/api/auth", ui.auth_settings)
        get("/api/extensions", ui.extensions)
        get("/api/overview", overview.overview)
        get("/api/cluster-name", overview.cluster_name)
        get("/api/whoami", overview.whoami)
        get("/api/nodes", overview.nodes)
        get("/api/nodes/{node}", overview.node)
        get("/api/queues", queues.queues)
        get("/api/queues/{vhost}", queues.queues)
        get("/api/queues/{vhost}/{name}", queues.queue)
        put("/api/queues/{vhost}/{name}", queues.declare_queue)
        delete("/api/queues/{vhost}/{name}", queues.delete_queue)
        delete("/api/queues/{vhost}/{name}/contents", queues.purge_queue)
        post("/api/queues/{vhost}/{name}/get", queues.get_messages)
        get("/api/queues/{vhost}/{name}/bindings", queues.queue_bindings)
        get("/api/exchanges", exchanges.exchanges)
        get("/api/exchanges/{vhost}", exchanges.exchanges)
        get("/api/exchanges/{vhost}/{name}", exchanges.exchange)
        put("/api/exchanges/{vhost}/{name}", exchanges.declare_exchange)
        delete("/api/exchanges/{vhost}/{name}", exchanges.delete_exchange)
        post("/api/exchanges/{vhost}/{name}/publish", exchanges.publish)
        get("/api/exchanges/{vhost}/{name}/bindings/{end:source|destination}", bindings.exchange_bindings)
        get("/api/bindings", bindings.bindings)
        get("/api/bindings/{vhost}", bindings.bindings)
        get("/api/bindings/{vhost}/e/{source}/{dtype:[qe]}/{destination}", bindings.binding_list)
        post("/api/bindings/{vhost}/e/{source}/{dtype:[qe]}/{destination}", bindings.bind)
        delete("/api/bindings/{vhost}/e/{source}/{dtype:[qe]}/{destination}/{props}", bindings.unbind)
        get("/api/connections", connections.connections)
        get("/api/connections/{name}", connections.connection)
        delete("/api/connections/{name}", connections.close_connection)
        get("/api/connections/{name}/channels", connections.connection_channels)
        get("/api/channels", connections.channels)
        get("/api/channels/{name}", connections.channel)
        get("/api/consumers", connections.consumers)
        get("/api/consumers/{vhost}", connections.consumers)
        get("/api/users", access.users)
        get("/api/users/{name}", access.user)
        put("/api/users/{name}", access.put_user)
        delete("/api/users/{name}", access.delete_user)
        get("/api/users/{user}/permissions", access.permissions)
        get("/api/vhosts", access.vhosts)
        get("/api/vhosts/{name}", access.vhost)
        put("/api/vhosts/{name}", access.put_vhost)
        delete("/api/vhosts/{name}", access.delete_vhost)
        get("/api/vhosts/{vhost}/permissions", access.permissions)
        get("/api/permissions", access.permissions)
        get("/api/permissions/{vhost}/{user}", access.permission)
        put("/api/permissions/{vhost}/{user}", access.put_permission)
        delete("/api/permissions/{vhost}/{user}", access.delete_permission)
        get("/api/policies", policies.policies)
        get("/api/policies/{vhost}", policies.policies)
        get("/api/policies/{vhost}/{name}", policies.policy)
        put("/api/policies/{vhost}/{name}", policies.put_policy)
        delete("/api/policies/{vhost}/{name}", policies.delete_policy)
        for path in ("/api/feature-flags", "/api/vhost-limits", "/api/vhost-limits/{vhost}", "/api/user-limits",
                     "/api/user-limits/{user}", "/api/operator-policies", "/api/operator-policies/{vhost}",
                     "/api/parameters", "/api/parameters/{component}", "/api/parameters/{component}/{vhost}",
                     "/api/global-parameters", "/api/topic-permissions", "/api/vhosts/{vhost}/topic-permissions",
                     "/api/users/{user}/topic-permissions"):
            get(path, absent.empty(path))
        for path in ("/api/feature-flags/{name}/enable", "/api/vhost-limits/{vhost}/{name}",
                     "/api/user-limits/{user}/{name}", "/api/operator-policies/{vhost}/{name}",
                     "/api/parameters/{component}/{vhost}/{name}", "/api/global-parameters/{name}",
                     "/api/topic-permissions/{vhost}/{user}"):
            put(path, absent.refuse)
            delete(path, absent.refuse)
        get("/api/definitions", definitions.definitions)
        post("/api/definitions", definitions.import_definitions)
        get("/api/health/checks/alarms", health.alarms)
        get("/api/health/checks/local-alarms", health.local_alarms)
        get("/api/health/checks/node-is-quorum-critical", health.ok_check)
        get("/api/health/checks/virtual-hosts", health.ok_check)
        get("/api/aliveness-test/{vhost}", health.aliveness)
        get("/api/haremq/events", overview.events)
        get("/api/haremq/history", overview.history)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler):
        try:
            if request.path.startswith("/api/"):
                if request.method not in SAFE_METHODS:
                    refuse_forgery(request)
                if request.path not in PUBLIC:
                    request["caller"] = auth.authenticate(self.broker, request)
            return await handler(request)
        except auth.Refused as exc:
            if exc.reason == "Login failed":
                log.info("management login refused", peer=auth.peer_of(request)[0], path=request.path)
            return auth.error(401, exc.kind, exc.reason, exc.challenge)
        except HTTPError as exc:
            return as_json({"error": exc.kind, "reason": exc.reason}, exc.status)
        except inputs.BadInput as exc:
            return as_json({"error": "bad_request", "reason": str(exc)}, 400)
        except AMQPClosed as exc:
            return self._amqp_error(exc)
        except web.HTTPException:
            raise
        except Exception:  # noqa: BLE001 - one bad request must not take the API down
            log.exception("management request failed", path=request.path, method=request.method)
            return as_json({"error": "internal_server_error", "reason": "see the node's log"}, 500)

    @staticmethod
    def _amqp_error(exc: AMQPClosed) -> web.Response:
        if exc.code == 404:
            return as_json({"error": "Object Not Found", "reason": "Not Found"}, 404)
        if exc.code in (403, 530):
            return auth.error(401, "not_authorised", exc.reason)
        if exc.code in (405, 406, 501, 502, 503, 504, 505):    # the request's fault, as AMQP says
            return as_json({"error": "bad_request", "reason": exc.reason}, 400)
        if exc.code in (320, 506):
            return as_json({"error": "service_unavailable", "reason": exc.reason}, 503)
        return as_json({"error": "internal_server_error", "reason": exc.reason}, 500)

    # ---- the page -----------------------------------------------------------------------------
    async def page(self, request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html", headers={"Content-Type": "text/html; charset=utf-8"})
