"""/api/definitions: RabbitMQ's definitions document, exported from the replicated metadata and
imported live (checked whole first, so a bad item refuses all of it)."""
from __future__ import annotations

from aiohttp import web
from pamqp import commands as spec

from ..broker.definitions import export_definitions
from . import auth
from . import inputs
from . import serializers as js
from .access import HASHING
from .policies import parse_policy
from .responses import as_json, bad_request, no_content
from .routes import Routes, log


class DefinitionRoutes(Routes):
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
            pattern, definition, apply_to, priority = parse_policy(p)
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
        parse_policy(p)
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
