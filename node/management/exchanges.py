"""/api/exchanges: listing, declare, delete, and publishing a message to one."""
from __future__ import annotations

import base64

from aiohttp import web
from pamqp import commands as spec

from . import inputs
from . import serializers as js
from .pagination import listing
from .responses import as_json, bad_request, created, no_content, not_found
from .routes import Routes
from .samples import with_samples


class ExchangeRoutes(Routes):
    async def exchanges(self, request) -> web.Response:
        rows = [js.exchange_json(vname, x) for vname, v in list(self.broker.vhosts.items())
                for x in list(v.exchanges.values())]
        return as_json(listing(request, with_samples(request, self.visible(request, rows)), ("vhost", "name")))

    def _exchange_name(self, request) -> str:
        name = request.match_info["name"]
        return "" if name == "amq.default" else name

    async def exchange(self, request) -> web.Response:
        vhost = self.vhost_of(request, act=False)
        exchange = vhost.exchanges.get(self._exchange_name(request))
        if exchange is None:
            raise not_found()
        return as_json(with_samples(request, js.exchange_json(vhost.name, exchange)))

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
