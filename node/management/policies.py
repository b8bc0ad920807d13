"""/api/policies: listing, setting and clearing a vhost's policies (policymakers)."""
from __future__ import annotations

from aiohttp import web

from . import auth
from . import inputs
from .responses import as_json, created, no_content, not_found
from .routes import Routes, log


class PolicyRoutes(Routes):
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
        pattern, definition, apply_to, priority = parse_policy(data)
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


def parse_policy(data: dict) -> tuple[str, dict, str, int]:
    """A policy's pattern, definition, apply-to and priority, as the API and definitions give them."""
    pattern = inputs.regex(data, "pattern")
    definition = data.get("definition")
    if definition is None:
        raise inputs.BadInput("[{error,{key_missing,definition}}]")
    if not isinstance(definition, dict):
        raise inputs.BadInput("definition must be an object")
    inputs.table(data, "definition")
    return (pattern, definition, inputs.text(data, "apply-to", "all"),
            inputs.whole(data, "priority", 0, -(1 << 31), (1 << 31) - 1) or 0)     # never None: it has a default
