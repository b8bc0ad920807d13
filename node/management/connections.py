"""/api/connections, /api/channels and /api/consumers: each member lists the clients connected
to it; a connection is closed by the member it is on."""
from __future__ import annotations

from aiohttp import web

from . import auth
from .pagination import listing
from .responses import as_json, no_content, not_found
from .routes import Routes, log
from .samples import with_samples


class ConnectionRoutes(Routes):
    async def connections(self, request) -> web.Response:
        rows = self.own(request, self.visible(request, await self.rows("connections")))
        return as_json(listing(request, with_samples(request, rows)))

    async def connection(self, request) -> web.Response:
        for row in self.own(request, await self.rows("connections")):
            if row["name"] == request.match_info["name"]:
                return as_json(with_samples(request, row))
        raise not_found()

    async def connection_channels(self, request) -> web.Response:
        name = request.match_info["name"]
        if not any(row["name"] == name for row in self.own(request, await self.rows("connections"))):
            raise not_found()
        rows = [r for r in self.own(request, await self.rows("channels")) if r["connection_details"]["name"] == name]
        return as_json(listing(request, rows, ("number",)))

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
        if not await self.view.close_connection(name, reason):
            raise not_found()
        log.info("connection closed through the management API", connection=name, user=caller.name)
        return no_content()

    async def channels(self, request) -> web.Response:
        rows = self.own(request, self.visible(request, await self.rows("channels")))
        return as_json(listing(request, with_samples(request, rows)))

    async def channel(self, request) -> web.Response:
        name = request.match_info["name"]
        for row in self.own(request, await self.rows("channels")):
            if row["name"] == name:
                row["consumer_details"] = [c for c in self.own(request, await self.rows("consumers"))
                                           if c["channel_details"]["name"] == name]
                return as_json(with_samples(request, row))
        raise not_found()

    async def consumers(self, request) -> web.Response:
        rows = self.own(request, await self.rows("consumers"))
        caller = request["caller"]
        wanted = request.match_info.get("vhost")
        if wanted is not None and wanted not in self.broker.vhosts:
            raise not_found()
        rows = [r for r in rows if (wanted is None or r["queue"]["vhost"] == wanted)
                and auth.can_see_vhost(self.broker, caller, r["queue"]["vhost"])]
        return as_json(rows)
