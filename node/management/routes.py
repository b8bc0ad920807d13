"""What every group of the management API's routes shares: the node's broker, its cluster view
and statistics, and the caller's view of them (what a user may see, the vhost a path names,
a direct AMQP connection as the caller, a checked request body, a change made as `haremq ctl`
makes it)."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

import structlog

from . import auth
from . import inputs
from .cluster_view import AdminRefused
from .direct import DirectConnection
from .responses import bad_request, not_found

if TYPE_CHECKING:
    from .cluster_view import ClusterView
    from .stats import Sampler

log = structlog.get_logger("haremq.management")


class Routes:
    def __init__(self, broker, view: ClusterView, sampler: Sampler):
        self.broker = broker
        self.view = view
        self.sampler = sampler

    async def rows(self, kind: str) -> list[dict]:
        """Cluster-wide rows of one kind (every member that is up answers for itself)."""
        return await self.view.rows(kind)

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
        try:
            return await self.view.admin_call(method, *args)
        except AdminRefused as exc:
            raise bad_request(str(exc)) from None
