"""/api/bindings: listing, and binding or unbinding a queue or an exchange to an exchange."""
from __future__ import annotations

import urllib.parse

from aiohttp import web
from pamqp import commands as spec

from . import inputs
from . import serializers as js
from .responses import as_json, no_content, not_found
from .routes import Routes


class BindingRoutes(Routes):
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

    async def exchange_bindings(self, request) -> web.Response:
        """/api/exchanges/{vhost}/{name}/bindings/source (bindings from the exchange) or
        .../destination (bindings to it)."""
        vhost = self.vhost_of(request, act=False)
        name = "" if request.match_info["name"] == "amq.default" else request.match_info["name"]
        if name not in vhost.exchanges:
            raise not_found()
        if request.match_info["end"] == "source":
            rows = [b for b in js.bindings(vhost.name, vhost) if b["source"] == name]
        else:
            rows = [b for b in js.bindings(vhost.name, vhost)
                    if b["destination_type"] == "exchange" and b["destination"] == name]
        return as_json(rows)

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
