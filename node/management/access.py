"""/api/users, /api/vhosts and /api/permissions: who may do what where (administrators only,
but a vhost is listed to those who may see it)."""
from __future__ import annotations

from aiohttp import web

from . import auth
from . import inputs
from . import serializers as js
from .pagination import listing
from .responses import as_json, bad_request, created, no_content, not_found
from .routes import Routes, log
from .samples import with_samples

HASHING = ("rabbit_password_hashing_sha256", "rabbit_password_hashing_sha512", "rabbit_password_hashing_md5")


class AccessRoutes(Routes):
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

    def _vhost_json(self, name: str, totals: dict | None = None) -> dict:
        nodes = [member.name for member in self.view.members()]
        return {"name": name, "description": "Default virtual host" if name == "/" else "", "tags": [],
                "metadata": {"description": "", "tags": []}, "tracing": False,
                "cluster_state": dict.fromkeys(nodes, "running"),
                **(totals or js.vhost_totals([{"vhost": name}])[name])}     # no queues: zeros

    async def _totals(self) -> dict[str, dict]:
        return js.vhost_totals(await self.rows("queues"))

    async def vhosts(self, request) -> web.Response:
        caller = request["caller"]
        totals = await self._totals()
        rows = [self._vhost_json(n, totals.get(n)) for n in list(self.broker.vhosts)
                if auth.can_see_vhost(self.broker, caller, n)]
        return as_json(listing(request, with_samples(request, rows), ("name",)))

    async def vhost(self, request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.broker.vhosts:
            raise not_found()
        if not auth.can_see_vhost(self.broker, request["caller"], name):
            raise auth.Refused("User not authorised to access virtual host")
        return as_json(with_samples(request, self._vhost_json(name, (await self._totals()).get(name))))

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
        """Every permission, or one vhost's (/api/vhosts/{vhost}/permissions) or one user's
        (/api/users/{user}/permissions)."""
        auth.require_admin(request["caller"])
        vhost, user = request.match_info.get("vhost"), request.match_info.get("user")
        if (vhost is not None and vhost not in self.broker.vhosts) or \
                (user is not None and self.broker.users.get(user) is None):
            raise not_found()
        return as_json([p for p in self.broker.list_permissions(vhost) if user is None or p["user"] == user])

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
