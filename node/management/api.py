"""The management HTTP API: RabbitMQ's paths, JSON field names and status codes.

The subset of RabbitMQ 3.10's management API that tools use (rabbitmqadmin,
KEDA's RabbitMQ scaler, Terraform's provider, Flower), served with aiohttp on
the node's event loop. Reads come from the node's replicated metadata and, in
a cluster, from every member over the control call `management_rows`
(queues are counted by their home node). Changes take the paths AMQP and
`haremq ctl` take: declares, deletes, purges, gets and publishes go through a
direct AMQP connection as the calling user (`direct.py`), so its permissions
apply and a cluster commits them through the metadata log; users, vhosts,
permissions and policies are the broker calls `haremq ctl` makes (through the
metadata log when clustered).
"""
from __future__ import annotations

import base64
import json
import urllib.parse
from pathlib import Path

import structlog
import yarl
from aiohttp import web
from pamqp import commands as spec

from ..version import __version__
from ..broker.broker import BrokerError
from ..broker.commands import AdminCallError, admin_method
from ..broker.definitions import export_definitions
from . import auth
from . import inputs
from . import serializers as js
from .direct import AMQPClosed, DirectConnection
from .views import close_local, local_rows, node_json

STATIC = Path(__file__).resolve().parent / "static"
log = structlog.get_logger("haremq.management")

ACKMODES = {"ack_requeue_true": ("reject", True), "ack_requeue_false": ("ack", False),
            "reject_requeue_true": ("reject", True), "reject_requeue_false": ("reject", False)}


class HTTPError(Exception):
    def __init__(self, status: int, kind: str, reason: str):
        super().__init__(reason)
        self.status, self.kind, self.reason = status, kind, reason


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def refuse_forgery(request: web.Request) -> None:
    """What a browser can be made to send by another site's page must not change anything.

    A page elsewhere can post an HTML form (`text/plain`, `multipart/form-data` or
    `application/x-www-form-urlencoded`, no preflight) to the API, and the browser adds the
    basic auth it has cached for it. So a request that changes state (every method but GET
    and HEAD) with a body, and every POST, must say `Content-Type: application/json` (415
    otherwise), which a form cannot send and a script on another origin can send only after a
    CORS preflight that the API never grants. A PUT or DELETE without a body needs none (as
    `curl -X PUT .../api/vhosts/v` in RabbitMQ's guides): only a script can send those methods,
    and only after that preflight. And a request that names its page's origin (`Origin`,
    which browsers send on every such request) is taken only from the API's own origin, the
    scheme, host and port it was asked on (403)."""
    origin = request.headers.get("Origin")
    if origin is not None and not same_origin(origin, request):
        raise HTTPError(403, "forbidden", f"cross-origin request refused: Origin {origin[:200]} "
                        f"is not this API's {request.scheme}://{request.host}")
    if request.method in ("PUT", "DELETE") and not request.body_exists:
        return
    if request.content_type != "application/json":
        given = request.headers.get("Content-Type", "none")[:100]
        raise HTTPError(415, "unsupported_media_type",
                        f"Content-Type must be application/json (was {given})")


def same_origin(origin: str, request: web.Request) -> bool:
    """`Origin` is scheme://host[:port] of the page; the API's own is the scheme and Host it was
    asked with (a proxy that ends TLS in front of it says X-Forwarded-Proto: https)."""
    try:
        given = yarl.URL(origin.strip())
        own_host = yarl.URL(f"http://{request.host}")
    except ValueError:
        return False
    if not given.is_absolute() or given.path not in ("", "/") or given.user is not None:
        return False
    schemes = {request.scheme, request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()}
    scheme = given.scheme.lower()
    if scheme not in schemes - {""}:
        return False
    own_port = own_host.explicit_port or yarl.URL(f"{scheme}://x").port
    return (given.host or "").lower() == (own_host.host or "").lower() and given.port == own_port


def not_found() -> HTTPError:
    return HTTPError(404, "Object Not Found", "Not Found")


def bad_request(reason: str) -> HTTPError:
    return HTTPError(400, "bad_request", reason)


def no_content() -> web.Response:
    return web.Response(status=204)


def created() -> web.Response:
    return web.Response(status=201)


def as_json(data, status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(data), content_type="application/json")


class ManagementAPI:
    def __init__(self, broker, sampler):
        self.broker = broker
        self.sampler = sampler

    # ---- the application --------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors], client_max_size=64 << 20)
        r = app.router
        r.add_get("/", self.page)
        r.add_get("/index.html", self.page)
        r.add_static("/static/", STATIC)
        get, put, delete, post = r.add_get, r.add_put, r.add_delete, r.add_post
        get("/api/overview", self.overview)
        get("/api/cluster-name", self.cluster_name)
        get("/api/whoami", self.whoami)
        get("/api/nodes", self.nodes)
        get("/api/nodes/{node}", self.node)
        get("/api/queues", self.queues)
        get("/api/queues/{vhost}", self.queues)
        get("/api/queues/{vhost}/{name}", self.queue)
        put("/api/queues/{vhost}/{name}", self.declare_queue)
        delete("/api/queues/{vhost}/{name}", self.delete_queue)
        delete("/api/queues/{vhost}/{name}/contents", self.purge_queue)
        post("/api/queues/{vhost}/{name}/get", self.get_messages)
        get("/api/queues/{vhost}/{name}/bindings", self.queue_bindings)
        get("/api/exchanges", self.exchanges)
        get("/api/exchanges/{vhost}", self.exchanges)
        get("/api/exchanges/{vhost}/{name}", self.exchange)
        put("/api/exchanges/{vhost}/{name}", self.declare_exchange)
        delete("/api/exchanges/{vhost}/{name}", self.delete_exchange)
        post("/api/exchanges/{vhost}/{name}/publish", self.publish)
        get("/api/bindings", self.bindings)
        get("/api/bindings/{vhost}", self.bindings)
        get("/api/bindings/{vhost}/e/{source}/{dtype:[qe]}/{destination}", self.binding_list)
        post("/api/bindings/{vhost}/e/{source}/{dtype:[qe]}/{destination}", self.bind)
        delete("/api/bindings/{vhost}/e/{source}/{dtype:[qe]}/{destination}/{props}", self.unbind)
        get("/api/connections", self.connections)
        get("/api/connections/{name}", self.connection)
        delete("/api/connections/{name}", self.close_connection)
        get("/api/channels", self.channels)
        get("/api/consumers", self.consumers)
        get("/api/consumers/{vhost}", self.consumers)
        get("/api/users", self.users)
        get("/api/users/{name}", self.user)
        put("/api/users/{name}", self.put_user)
        delete("/api/users/{name}", self.delete_user)
        get("/api/vhosts", self.vhosts)
        get("/api/vhosts/{name}", self.vhost)
        put("/api/vhosts/{name}", self.put_vhost)
        delete("/api/vhosts/{name}", self.delete_vhost)
        get("/api/permissions", self.permissions)
        get("/api/permissions/{vhost}/{user}", self.permission)
        put("/api/permissions/{vhost}/{user}", self.put_permission)
        delete("/api/permissions/{vhost}/{user}", self.delete_permission)
        get("/api/policies", self.policies)
        get("/api/policies/{vhost}", self.policies)
        get("/api/policies/{vhost}/{name}", self.policy)
        put("/api/policies/{vhost}/{name}", self.put_policy)
        delete("/api/policies/{vhost}/{name}", self.delete_policy)
        get("/api/definitions", self.definitions)
        post("/api/definitions", self.import_definitions)
        get("/api/health/checks/alarms", self.alarms)
        get("/api/health/checks/local-alarms", self.local_alarms)
        get("/api/health/checks/node-is-quorum-critical", self.ok_check)
        get("/api/health/checks/virtual-hosts", self.ok_check)
        get("/api/aliveness-test/{vhost}", self.aliveness)
        get("/api/haremq/events", self.events)
        get("/api/haremq/history", self.history)
        return app

    @web.middleware
    async def _errors(self, request: web.Request, handler):
        try:
            if request.path.startswith("/api/"):
                if request.method not in SAFE_METHODS:
                    refuse_forgery(request)
                request["caller"] = auth.authenticate(self.broker, request)
            return await handler(request)
        except auth.Refused as exc:
            if exc.reason == "Login failed":
                log.info("management login refused", peer=auth.peer_of(request)[0], path=request.path)
            return auth.error(401, exc.kind, exc.reason)
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

    # ---- helpers ------------------------------------------------------------------------------
    @property
    def cluster(self):
        return self.broker.cluster

    async def rows(self, kind: str) -> list[dict]:
        """Cluster-wide rows of one kind (every member that is up answers for itself)."""
        if self.cluster is None:
            return local_rows(self.broker, kind)
        return await self.cluster.control.handle("management_rows", {"kind": kind})

    def visible(self, request, rows, vhost_key: str = "vhost") -> list[dict]:
        caller = request["caller"]
        wanted = request.match_info.get("vhost")
        if wanted is not None and wanted not in self.broker.vhosts:
            raise not_found()
        return [r for r in rows if (wanted is None or r.get(vhost_key) == wanted)
                and auth.can_see_vhost(self.broker, caller, r.get(vhost_key))]

    def own(self, request, rows) -> list[dict]:
        """Connections, channels, consumers: a plain management user sees only its own."""
        caller = request["caller"]
        if caller.is_monitor:
            return rows
        return [r for r in rows if r.get("user", r.get("channel_details", {}).get("user")) == caller.name]

    def vhost_of(self, request, act: bool = True):
        name = request.match_info["vhost"]
        vhost = self.broker.vhosts.get(name)
        if vhost is None:
            raise not_found()
        caller = request["caller"]
        if act:
            auth.require_vhost(self.broker, caller, name)
        elif not auth.can_see_vhost(self.broker, caller, name):
            raise auth.Refused("User not authorised to access virtual host")
        return vhost

    def direct(self, request, vhost: str) -> DirectConnection:
        caller = request["caller"]
        return DirectConnection(self.broker, caller.name, caller.password, vhost, caller.peer)

    async def body(self, request) -> dict:
        if not request.can_read_body:
            return {}
        try:
            data = await request.json(loads=json.loads)
        except ValueError:
            raise bad_request("failed to decode JSON") from None
        return inputs.body_of(data)

    @staticmethod
    def _name(request, key: str = "name", what: str = "name") -> str:
        """A queue, exchange or routing name from the path: an AMQP shortstr."""
        return inputs.shortstr(request.match_info[key], what)

    async def broker_call(self, method: str, *args):
        """A change to users, vhosts, permissions or policies, as `haremq ctl` makes it."""
        if self.cluster is not None:
            try:
                return await self.cluster.control.broker_call({"method": method, "args": list(args)})
            except AdminCallError as exc:
                raise bad_request(str(exc).split(" - ", 1)[-1]) from None
        call = admin_method(self.broker, method)
        if call is None:
            raise bad_request(f"this node does not support '{method}'")
        try:
            return call(*args)
        except (BrokerError, ValueError, KeyError) as exc:
            raise bad_request(str(exc)) from None

    # ---- the page -----------------------------------------------------------------------------
    async def page(self, request) -> web.Response:
        return web.FileResponse(STATIC / "index.html", headers={"Content-Type": "text/html; charset=utf-8"})

    # ---- overview and nodes -----------------------------------------------------------------
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
        amqp = getattr(self.broker, "management_listeners", [])
        return as_json({
            "management_version": "3.10.8", "rates_mode": "basic", "product_name": "HareMQ",
            "product_version": __version__, "rabbitmq_version": "3.10.8", "erlang_version": "n/a",
            "cluster_name": self.broker.server_properties()["cluster_name"], "node": self.broker.node_name,
            "exchange_types": [{"name": t, "description": f"AMQP {t} exchange", "enabled": True}
                               for t in ("direct", "fanout", "headers", "topic")],
            "message_stats": {k: round(v, 1) if isinstance(v, float) else v for k, v in
                              js.message_stats(*totals, [round(r, 1) for r in rates]).items()},
            "queue_totals": {"messages": ready + unacked, "messages_details": js.details(0.0),
                             "messages_ready": ready, "messages_ready_details": js.details(0.0),
                             "messages_unacknowledged": unacked,
                             "messages_unacknowledged_details": js.details(0.0)},
            "object_totals": {"connections": len(connections), "channels": len(channels),
                              "consumers": consumers, "exchanges": exchanges, "queues": len(queues)},
            "listeners": amqp, "contexts": [], "statistics_db_event_queue": 0, "disable_stats": False,
            "enable_queue_totals": True,
        })

    async def cluster_name(self, request) -> web.Response:
        return as_json({"name": self.broker.server_properties()["cluster_name"]})

    async def whoami(self, request) -> web.Response:
        caller = request["caller"]
        return as_json({"name": caller.name, "tags": sorted(caller.tags)})

    async def _nodes(self) -> list[dict]:
        if self.cluster is None:
            return [node_json(self.broker)]
        rows = {r["name"]: r for r in await self.rows("nodes")}
        membership = self.cluster.membership
        for member in membership.status():
            if member["name"] not in rows:
                rows[member["name"]] = {"name": member["name"], "type": "disc", "running": False,
                                        "partitions": [], "alarms": [], "paused": None}
            if member["up"] and member.get("paused"):
                rows[member["name"]]["paused"] = True
        leader = self.cluster.leader_name()
        for row in rows.values():
            row["raft_leader"] = row["name"] == leader
        return sorted(rows.values(), key=lambda r: r["name"])

    async def nodes(self, request) -> web.Response:
        auth.require_monitor(request["caller"])
        return as_json(await self._nodes())

    async def node(self, request) -> web.Response:
        auth.require_monitor(request["caller"])
        for row in await self._nodes():
            if row["name"] == request.match_info["node"]:
                return as_json(row)
        raise not_found()

    # ---- queues ---------------------------------------------------------------------------------
    async def _queue_rows(self) -> list[dict]:
        rows = await self.rows("queues")
        seen = {(r["vhost"], r["name"]) for r in rows}
        mirroring = self.cluster.mirroring if self.cluster is not None else None
        for vname, vhost in list(self.broker.vhosts.items()):
            for queue in list(vhost.queues.values()):
                if (vname, queue.name) not in seen and queue.remote:
                    status = mirroring.status(vname, queue.name) if mirroring is not None else None
                    rows.append(js.down_queue_row(vname, queue, status))
        for row in rows:
            js.with_policy(row, self.broker.vhosts.get(row["vhost"]))
        return sorted(rows, key=lambda r: (r["vhost"], r["name"]))

    async def queues(self, request) -> web.Response:
        return as_json(self.visible(request, await self._queue_rows()))

    async def queue(self, request) -> web.Response:
        vhost = self.vhost_of(request, act=False)
        name = request.match_info["name"]
        if name not in vhost.queues:
            raise not_found()
        for row in await self._queue_rows():
            if row["vhost"] == vhost.name and row["name"] == name:
                return as_json(row)
        raise not_found()

    async def declare_queue(self, request) -> web.Response:
        vhost = self.vhost_of(request)
        name = self._name(request, what="queue name")
        data = await self.body(request)
        durable, auto_delete = inputs.flag(data, "durable", True), inputs.flag(data, "auto_delete", False)
        arguments = inputs.table(data, "arguments")
        existed = name in vhost.queues
        async with self.direct(request, vhost.name) as conn:
            channel = await conn.channel()
            await conn.call(channel, spec.Queue.Declare(
                queue=name, durable=durable, auto_delete=auto_delete, exclusive=False, arguments=arguments),
                spec.Queue.DeclareOk)
        log.info("queue declared through the management API", vhost=vhost.name, queue=name,
                 user=request["caller"].name)
        return no_content() if existed else created()

    async def delete_queue(self, request) -> web.Response:
        vhost = self.vhost_of(request)
        name = request.match_info["name"]
        if name not in vhost.queues:
            raise not_found()
        query = request.query
        async with self.direct(request, vhost.name) as conn:
            channel = await conn.channel()
            await conn.call(channel, spec.Queue.Delete(queue=name, if_unused=query.get("if-unused") == "true",
                                                       if_empty=query.get("if-empty") == "true"),
                            spec.Queue.DeleteOk)
        log.info("queue deleted through the management API", vhost=vhost.name, queue=name,
                 user=request["caller"].name)
        return no_content()

    async def purge_queue(self, request) -> web.Response:
        vhost = self.vhost_of(request)
        name = request.match_info["name"]
        if name not in vhost.queues:
            raise not_found()
        async with self.direct(request, vhost.name) as conn:
            channel = await conn.channel()
            await conn.call(channel, spec.Queue.Purge(queue=name), spec.Queue.PurgeOk)
        return no_content()

    async def get_messages(self, request) -> web.Response:
        vhost = self.vhost_of(request)
        name = request.match_info["name"]
        if name not in vhost.queues:
            raise not_found()
        data = await self.body(request)
        count = inputs.whole(data, "count", 1, 0, MAX_GET)
        requeue = inputs.flag(data, "requeue", True)
        ackmode = inputs.choice(data, "ackmode", "ack_requeue_true" if requeue else "ack_requeue_false",
                                tuple(ACKMODES))
        encoding = inputs.choice(data, "encoding", "auto", ("auto", "base64"))
        truncate = inputs.whole(data, "truncate", None, 0)
        action, requeue = ACKMODES[ackmode]
        out = []
        async with self.direct(request, vhost.name) as conn:
            channel = await conn.channel()
            tags = []
            for _ in range(max(0, count)):
                message = await conn.get(channel, name, no_ack=False)
                if message is None:
                    break
                tags.append(message.method.delivery_tag)
                out.append(js.got_message(message, encoding, truncate))
            if tags:
                if action == "ack":
                    conn._send(spec.Basic.Ack(delivery_tag=tags[-1], multiple=True), channel)
                else:
                    conn._send(spec.Basic.Nack(delivery_tag=tags[-1], multiple=True, requeue=requeue), channel)
                await conn.call(channel, spec.Channel.Close(200, "", 0, 0), spec.Channel.CloseOk)
        return as_json(out)

    async def queue_bindings(self, request) -> web.Response:
        vhost = self.vhost_of(request, act=False)
        name = request.match_info["name"]
        if name not in vhost.queues:
            raise not_found()
        rows = [b for b in js.bindings(vhost.name, vhost)
                if b["destination_type"] == "queue" and b["destination"] == name]
        return as_json(rows)

    # ---- exchanges --------------------------------------------------------------------------------
    async def exchanges(self, request) -> web.Response:
        rows = [js.exchange_json(vname, x) for vname, v in list(self.broker.vhosts.items())
                for x in list(v.exchanges.values())]
        return as_json(self.visible(request, rows))

    def _exchange_name(self, request) -> str:
        name = request.match_info["name"]
        return "" if name == "amq.default" else name

    async def exchange(self, request) -> web.Response:
        vhost = self.vhost_of(request, act=False)
        exchange = vhost.exchanges.get(self._exchange_name(request))
        if exchange is None:
            raise not_found()
        return as_json(js.exchange_json(vhost.name, exchange))

    async def declare_exchange(self, request) -> web.Response:
        vhost = self.vhost_of(request)
        name = self._name(request, what="exchange name")
        data = await self.body(request)
        kind = inputs.text(data, "type", limit=inputs.SHORTSTR)
        durable, auto_delete = inputs.flag(data, "durable", True), inputs.flag(data, "auto_delete", False)
        internal, arguments = inputs.flag(data, "internal", False), inputs.table(data, "arguments")
        existed = name in vhost.exchanges
        async with self.direct(request, vhost.name) as conn:
            channel = await conn.channel()
            await conn.call(channel, spec.Exchange.Declare(
                exchange=name, exchange_type=kind, durable=durable, auto_delete=auto_delete, internal=internal,
                arguments=arguments), spec.Exchange.DeclareOk)
        return no_content() if existed else created()

    async def delete_exchange(self, request) -> web.Response:
        vhost = self.vhost_of(request)
        name = request.match_info["name"]
        if name not in vhost.exchanges:
            raise not_found()
        async with self.direct(request, vhost.name) as conn:
            channel = await conn.channel()
            await conn.call(channel, spec.Exchange.Delete(exchange=name,
                                                          if_unused=request.query.get("if-unused") == "true"),
                            spec.Exchange.DeleteOk)
        return no_content()

    async def publish(self, request) -> web.Response:
        vhost = self.vhost_of(request)
        name = self._exchange_name(request)
        if name not in vhost.exchanges:
            raise not_found()
        data = await self.body(request)
        for key in ("routing_key", "payload", "payload_encoding", "properties"):
            if key not in data:
                raise bad_request(f"[{{error,{{key_missing,{key}}}}}]")
        routing_key = inputs.text(data, "routing_key", limit=inputs.SHORTSTR)
        payload = inputs.text(data, "payload")
        if inputs.choice(data, "payload_encoding", "string", ("string", "base64")) == "base64":
            try:
                body = base64.b64decode(payload, validate=True)
            except ValueError:
                raise bad_request("payload is not base64") from None
        else:
            body = payload.encode()
        try:
            properties = spec.Basic.Properties(**inputs.properties(data))
        except (TypeError, ValueError) as exc:
            raise bad_request(str(exc)) from None
        async with self.direct(request, vhost.name) as conn:
            channel = await conn.channel(confirm=True)
            routed, _confirmed = await conn.publish(channel, name, routing_key, body, properties)
        return as_json({"routed": routed})

    # ---- bindings -----------------------------------------------------------------------------------
    async def bindings(self, request) -> web.Response:
        rows = [b for vname, v in list(self.broker.vhosts.items()) for b in js.bindings(vname, v)]
        return as_json(self.visible(request, rows))

    def _binding_ends(self, request):
        vhost = self.vhost_of(request, act=request.method != "GET")
        source = request.match_info["source"]
        destination = request.match_info["destination"]
        kind = "queue" if request.match_info["dtype"] == "q" else "exchange"
        if source not in vhost.exchanges or \
                destination not in (vhost.queues if kind == "queue" else vhost.exchanges):
            raise not_found()
        return vhost, source, destination, kind

    async def binding_list(self, request) -> web.Response:
        vhost, source, destination, kind = self._binding_ends(request)
        rows = [b for b in js.bindings(vhost.name, vhost) if b["source"] == source
                and b["destination"] == destination and b["destination_type"] == kind]
        return as_json(rows)

    async def bind(self, request) -> web.Response:
        vhost, source, destination, kind = self._binding_ends(request)
        data = await self.body(request)
        key, arguments = inputs.text(data, "routing_key", "", limit=inputs.SHORTSTR), inputs.table(data, "arguments")
        async with self.direct(request, vhost.name) as conn:
            channel = await conn.channel()
            if kind == "queue":
                await conn.call(channel, spec.Queue.Bind(queue=destination, exchange=source, routing_key=key,
                                                         arguments=arguments), spec.Queue.BindOk)
            else:
                await conn.call(channel, spec.Exchange.Bind(destination=destination, source=source,
                                                            routing_key=key, arguments=arguments),
                                spec.Exchange.BindOk)
        # RabbitMQ's Location: relative to the request path, the destination and the quoted properties_key
        location = urllib.parse.quote(destination, safe="") + "/" + \
            urllib.parse.quote(js.properties_key(key, arguments), safe="")
        return web.Response(status=201, headers={"Location": location})

    async def unbind(self, request) -> web.Response:
        vhost, source, destination, kind = self._binding_ends(request)
        props = request.match_info["props"]
        exchange = vhost.exchanges[source]
        target = vhost.queues[destination] if kind == "queue" else vhost.exchanges[destination]
        found = [(key, args) for dest, key, args in exchange.bindings()
                 if dest is target and props in (js.properties_key(key, args),
                                                  urllib.parse.unquote(js.properties_key(key, args)))]
        if not found:
            raise not_found()
        key, arguments = found[0]
        async with self.direct(request, vhost.name) as conn:
            channel = await conn.channel()
            if kind == "queue":
                await conn.call(channel, spec.Queue.Unbind(queue=destination, exchange=source, routing_key=key,
                                                           arguments=js.jsonable(arguments)), spec.Queue.UnbindOk)
            else:
                await conn.call(channel, spec.Exchange.Unbind(destination=destination, source=source,
                                                              routing_key=key, arguments=js.jsonable(arguments)),
                                spec.Exchange.UnbindOk)
        return no_content()

    # ---- connections, channels, consumers -----------------------------------------------------------
    async def connections(self, request) -> web.Response:
        return as_json(self.own(request, self.visible(request, await self.rows("connections"))))

    async def connection(self, request) -> web.Response:
        for row in self.own(request, await self.rows("connections")):
            if row["name"] == request.match_info["name"]:
                return as_json(row)
        raise not_found()

    async def close_connection(self, request) -> web.Response:
        """Close a client connection (320 CONNECTION_FORCED), on whichever member it is connected to."""
        name = request.match_info["name"]
        reason = request.headers.get("X-Reason", "Closed via management plugin")
        caller = request["caller"]
        row = next((r for r in await self.rows("connections") if r["name"] == name), None)
        if row is None:
            raise not_found()
        if not caller.is_admin and row["user"] != caller.name:
            raise auth.Refused("Not administrator user")
        if self.cluster is None:
            closed = close_local(self.broker, name, reason)
        else:
            closed = bool(await self.cluster.control.handle("management_close", {"name": name, "reason": reason}))
        if not closed:
            raise not_found()
        log.info("connection closed through the management API", connection=name, user=caller.name)
        return no_content()

    async def channels(self, request) -> web.Response:
        return as_json(self.own(request, self.visible(request, await self.rows("channels"))))

    async def consumers(self, request) -> web.Response:
        rows = self.own(request, await self.rows("consumers"))
        caller = request["caller"]
        wanted = request.match_info.get("vhost")
        if wanted is not None and wanted not in self.broker.vhosts:
            raise not_found()
        rows = [r for r in rows if (wanted is None or r["queue"]["vhost"] == wanted)
                and auth.can_see_vhost(self.broker, caller, r["queue"]["vhost"])]
        return as_json(rows)

    # ---- users, vhosts, permissions ------------------------------------------------------------------
    @staticmethod
    def _user_json(user) -> dict:
        return {"name": user.name, "password_hash": user.password_hash, "hashing_algorithm": user.algorithm,
                "tags": list(user.tags), "limits": {}}

    async def users(self, request) -> web.Response:
        auth.require_admin(request["caller"])
        return as_json([self._user_json(u) for u in self.broker.users.all()])

    async def user(self, request) -> web.Response:
        auth.require_admin(request["caller"])
        user = self.broker.users.get(request.match_info["name"])
        if user is None:
            raise not_found()
        return as_json(self._user_json(user))

    async def put_user(self, request) -> web.Response:
        auth.require_admin(request["caller"])
        name = request.match_info["name"]
        data = await self.body(request)
        tags = inputs.tags(data)
        existed = self.broker.users.get(name) is not None
        if "password" in data:
            password = inputs.text(data, "password")
            if existed:
                await self.broker_call("change_password", name, password)
            else:
                await self.broker_call("add_user", name, password, tags)
        elif "password_hash" in data:     # as a definitions file carries it (keeps its permissions)
            await self.broker_call("import_definitions", {"users": [{
                "name": name, "password_hash": inputs.password_hash(data), "tags": tags,
                "hashing_algorithm": inputs.choice(data, "hashing_algorithm", HASHING[0], HASHING)}]})
        elif not existed:
            raise bad_request("[{error,{key_missing,password_hash}}]")
        if existed:
            await self.broker_call("set_user_tags", name, tags)
        log.info("user changed through the management API", changed=name, user=request["caller"].name)
        return no_content() if existed else created()

    async def delete_user(self, request) -> web.Response:
        auth.require_admin(request["caller"])
        name = request.match_info["name"]
        if self.broker.users.get(name) is None:
            raise not_found()
        await self.broker_call("delete_user", name)
        return no_content()

    def _vhost_json(self, name: str) -> dict:
        nodes = [self.broker.node_name] if self.cluster is None else \
            [m["name"] for m in self.cluster.membership.status()]
        return {"name": name, "description": "Default virtual host" if name == "/" else "", "tags": [],
                "metadata": {"description": "", "tags": []}, "tracing": False,
                "cluster_state": dict.fromkeys(nodes, "running")}

    async def vhosts(self, request) -> web.Response:
        caller = request["caller"]
        return as_json([self._vhost_json(n) for n in list(self.broker.vhosts)
                        if auth.can_see_vhost(self.broker, caller, n)])

    async def vhost(self, request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.broker.vhosts:
            raise not_found()
        if not auth.can_see_vhost(self.broker, request["caller"], name):
            raise auth.Refused("User not authorised to access virtual host")
        return as_json(self._vhost_json(name))

    async def put_vhost(self, request) -> web.Response:
        auth.require_admin(request["caller"])
        name = self._name(request, what="vhost name")     # connection.open carries it as a shortstr
        data = await self.body(request)
        inputs.text(data, "description", ""), inputs.tags(data), inputs.flag(data, "tracing", False)
        if name in self.broker.vhosts:
            return no_content()
        await self.broker_call("add_vhost", name)
        return created()

    async def delete_vhost(self, request) -> web.Response:
        auth.require_admin(request["caller"])
        name = request.match_info["name"]
        if name not in self.broker.vhosts:
            raise not_found()
        await self.broker_call("delete_vhost", name)
        return no_content()

    async def permissions(self, request) -> web.Response:
        auth.require_admin(request["caller"])
        return as_json(self.broker.list_permissions())

    async def permission(self, request) -> web.Response:
        auth.require_admin(request["caller"])
        key = (request.match_info["user"], request.match_info["vhost"])
        for row in self.broker.list_permissions():
            if (row["user"], row["vhost"]) == key:
                return as_json(row)
        raise not_found()

    async def put_permission(self, request) -> web.Response:
        auth.require_admin(request["caller"])
        user, vhost = request.match_info["user"], request.match_info["vhost"]
        if self.broker.users.get(user) is None or vhost not in self.broker.vhosts:
            raise not_found()
        data = await self.body(request)
        configure, write, read = (inputs.regex(data, key) for key in ("configure", "write", "read"))
        existed = (user, vhost) in self.broker.permissions
        await self.broker_call("set_permissions", user, vhost, configure, write, read)
        return no_content() if existed else created()

    async def delete_permission(self, request) -> web.Response:
        auth.require_admin(request["caller"])
        user, vhost = request.match_info["user"], request.match_info["vhost"]
        if (user, vhost) not in self.broker.permissions:
            raise not_found()
        await self.broker_call("clear_permissions", user, vhost)
        return no_content()

    # ---- policies ---------------------------------------------------------------------------------------
    async def policies(self, request) -> web.Response:
        caller = request["caller"]
        wanted = request.match_info.get("vhost")
        if wanted is not None and wanted not in self.broker.vhosts:
            raise not_found()
        rows = [p for p in self.broker.list_policies(wanted) if auth.can_see_vhost(self.broker, caller, p["vhost"])]
        return as_json(rows)

    async def policy(self, request) -> web.Response:
        vhost = self.vhost_of(request, act=False)
        policy = vhost.policies.get(request.match_info["name"])
        if policy is None:
            raise not_found()
        return as_json(policy.as_json(vhost.name))

    async def put_policy(self, request) -> web.Response:
        caller = request["caller"]
        auth.require_policymaker(caller)
        vhost = self.vhost_of(request)
        name = request.match_info["name"]
        data = await self.body(request)
        pattern, definition, apply_to, priority = _policy(data)
        existed = name in vhost.policies
        await self.broker_call("set_policy", vhost.name, name, pattern, definition, apply_to, priority)
        log.info("policy set through the management API", vhost=vhost.name, policy=name, user=caller.name)
        return no_content() if existed else created()

    async def delete_policy(self, request) -> web.Response:
        auth.require_policymaker(request["caller"])
        vhost = self.vhost_of(request)
        name = request.match_info["name"]
        if name not in vhost.policies:
            raise not_found()
        await self.broker_call("clear_policy", vhost.name, name)
        return no_content()

    # ---- definitions ------------------------------------------------------------------------------------
    async def definitions(self, request) -> web.Response:
        auth.require_admin(request["caller"])
        data = export_definitions(self.broker)
        # what RabbitMQ's export holds: queues homed on any node, from the replicated metadata
        return as_json(js.jsonable(data))

    async def import_definitions(self, request) -> web.Response:
        """Import live: users, vhosts and permissions in one broker call, each policy as a
        `set_policy` call (through the metadata log when clustered), then exchanges, queues
        and bindings declared over a direct AMQP connection per vhost."""
        auth.require_admin(request["caller"])
        data = _checked_definitions(await self.body(request))
        try:
            await self._import(request, data)
        except (KeyError, TypeError, AttributeError) as exc:
            raise bad_request(f"invalid definitions: {exc}") from None
        log.info("definitions imported through the management API", user=request["caller"].name,
                 queues=len(data.get("queues", [])), exchanges=len(data.get("exchanges", [])))
        return no_content()

    async def _import(self, request, data: dict) -> None:
        accounts = {k: data.get(k, []) for k in ("users", "vhosts", "permissions")}
        if any(accounts.values()):
            await self.broker_call("import_definitions", accounts)
        for p in data.get("policies", []):
            pattern, definition, apply_to, priority = _policy(p)
            await self.broker_call("set_policy", p.get("vhost", "/"), p["name"], pattern, definition, apply_to,
                                   priority)
        by_vhost: dict[str, dict[str, list]] = {}
        for kind in ("exchanges", "queues", "bindings"):
            for item in data.get(kind, []):
                by_vhost.setdefault(item.get("vhost", "/"), {}).setdefault(kind, []).append(item)
        for vname, items in by_vhost.items():
            if vname not in self.broker.vhosts:
                raise bad_request(f"vhost '{vname}' does not exist")
            async with self.direct(request, vname) as conn:
                channel = await conn.channel()
                for x in items.get("exchanges", []):
                    await conn.call(channel, spec.Exchange.Declare(
                        exchange=x["name"], exchange_type=x.get("type", "direct"), durable=x.get("durable", True),
                        auto_delete=x.get("auto_delete", False), internal=x.get("internal", False),
                        arguments=x.get("arguments") or {}), spec.Exchange.DeclareOk)
                for q in items.get("queues", []):
                    await conn.call(channel, spec.Queue.Declare(
                        queue=q["name"], durable=q.get("durable", True), auto_delete=q.get("auto_delete", False),
                        arguments=q.get("arguments") or {}), spec.Queue.DeclareOk)
                for b in items.get("bindings", []):
                    if not b.get("source"):
                        continue
                    if b.get("destination_type", "queue") == "queue":
                        await conn.call(channel, spec.Queue.Bind(
                            queue=b["destination"], exchange=b["source"], routing_key=b.get("routing_key", ""),
                            arguments=b.get("arguments") or {}), spec.Queue.BindOk)
                    else:
                        await conn.call(channel, spec.Exchange.Bind(
                            destination=b["destination"], source=b["source"], routing_key=b.get("routing_key", ""),
                            arguments=b.get("arguments") or {}), spec.Exchange.BindOk)

    # ---- health -----------------------------------------------------------------------------------------
    async def alarms(self, request) -> web.Response:
        found = [{"node": self.broker.node_name, "resource": _resource(a)} for a in sorted(self.broker.alarms)]
        for node, names in sorted(self.broker.peer_alarms.items()):
            found += [{"node": node, "resource": _resource(a)} for a in sorted(names)]
        if found:
            return as_json({"status": "failed", "reason": "There are alarms in effect in the cluster",
                            "alarms": found}, 503)
        return as_json({"status": "ok"})

    async def local_alarms(self, request) -> web.Response:
        found = [{"node": self.broker.node_name, "resource": _resource(a)} for a in sorted(self.broker.alarms)]
        if found:
            return as_json({"status": "failed", "reason": "There are alarms in effect on the node",
                            "alarms": found}, 503)
        return as_json({"status": "ok"})

    async def ok_check(self, request) -> web.Response:
        return as_json({"status": "ok"})

    async def aliveness(self, request) -> web.Response:
        """Declare the queue `aliveness-test`, publish a message to it and get it back."""
        vhost = self.vhost_of(request)
        async with self.direct(request, vhost.name) as conn:
            channel = await conn.channel(confirm=True)
            await conn.call(channel, spec.Queue.Declare(queue="aliveness-test", durable=False),
                            spec.Queue.DeclareOk)
            await conn.publish(channel, "", "aliveness-test", b"test_message", spec.Basic.Properties())
            message = await conn.get(channel, "aliveness-test", no_ack=True)
        if message is None or message.body != b"test_message":
            return as_json({"status": "failed", "reason": "the test message did not come back"}, 503)
        return as_json({"status": "ok"})

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


def _resource(alarm: str) -> str:
    return "disk" if alarm.startswith("disk") else alarm


MAX_GET = 1 << 20      # messages one POST .../get may ask for
HASHING = ("rabbit_password_hashing_sha256", "rabbit_password_hashing_sha512", "rabbit_password_hashing_md5")


def _policy(data: dict) -> tuple[str, dict, str, int]:
    """A policy's pattern, definition, apply-to and priority, as the API and definitions give them."""
    pattern = inputs.regex(data, "pattern")
    definition = data.get("definition")
    if definition is None:
        raise inputs.BadInput("[{error,{key_missing,definition}}]")
    if not isinstance(definition, dict):
        raise inputs.BadInput("definition must be an object")
    inputs.table(data, "definition")
    return (pattern, definition, inputs.text(data, "apply-to", "all"),
            inputs.whole(data, "priority", 0, -(1 << 31), (1 << 31) - 1))


def _checked_definitions(data: dict) -> dict:
    """Every item of a definitions document checked before any of it is applied: one bad
    item refuses the whole import (400) rather than half of it going in."""
    for user in inputs.listed(data, "users"):
        inputs.text(user, "name")
        inputs.password_hash(user)
        inputs.tags(user)
        inputs.choice(user, "hashing_algorithm", HASHING[0], HASHING)
    for vhost in inputs.listed(data, "vhosts"):
        inputs.text(vhost, "name", limit=inputs.SHORTSTR, what="vhost name")
    for p in inputs.listed(data, "permissions"):
        inputs.text(p, "user"), inputs.text(p, "vhost")
        for key in ("configure", "write", "read"):
            inputs.regex(p, key, "")
    for p in inputs.listed(data, "policies"):
        inputs.text(p, "name"), inputs.text(p, "vhost", "/")
        _policy(p)
    for x in inputs.listed(data, "exchanges"):
        inputs.text(x, "name", limit=inputs.SHORTSTR, what="exchange name"), inputs.text(x, "vhost", "/")
        inputs.text(x, "type", "direct", limit=inputs.SHORTSTR)
        inputs.flag(x, "durable", True), inputs.flag(x, "auto_delete", False), inputs.flag(x, "internal", False)
        inputs.table(x, "arguments")
    for q in inputs.listed(data, "queues"):
        inputs.text(q, "name", limit=inputs.SHORTSTR, what="queue name"), inputs.text(q, "vhost", "/")
        inputs.flag(q, "durable", True), inputs.flag(q, "auto_delete", False)
        inputs.table(q, "arguments")
    for b in inputs.listed(data, "bindings"):
        inputs.text(b, "source", limit=inputs.SHORTSTR), inputs.text(b, "destination", limit=inputs.SHORTSTR)
        inputs.text(b, "vhost", "/")
        inputs.choice(b, "destination_type", "queue", ("queue", "exchange"))
        inputs.text(b, "routing_key", "", limit=inputs.SHORTSTR)
        inputs.table(b, "arguments")
    return data
