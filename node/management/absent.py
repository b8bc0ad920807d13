"""RabbitMQ objects that HareMQ has none of, asked for by RabbitMQ's management UI on its pages:
feature flags (HareMQ's behaviour is fixed by its version, not switched on flag by flag),
vhost and user limits, operator policies, runtime and global parameters (shovels, federation)
and topic permissions. Each listing is empty, in RabbitMQ's shape (a JSON list) and behind the
right RabbitMQ asks for it, so that a tool reading it sees "none" rather than an error; a
change is refused with a 400 saying why, which the UI shows in its popup."""
from __future__ import annotations

from aiohttp import web

from . import auth
from .responses import as_json, bad_request, not_found
from .routes import Routes

# who may list each kind, as RabbitMQ's rabbit_mgmt_wm_* modules decide it
RIGHTS = {"feature-flags": auth.require_admin, "topic-permissions": auth.require_admin,
          "parameters": auth.require_policymaker, "global-parameters": auth.require_policymaker,
          "vhost-limits": None, "user-limits": None, "operator-policies": None}


class AbsentRoutes(Routes):
    def empty(self, path: str):
        """The handler for one of the paths above: an empty list, once the caller may see it and
        the vhost or user the path names exists."""
        kind = path.split("/")[-1] if path.endswith("topic-permissions") else path.split("/")[2]
        right = RIGHTS[kind]

        async def handler(request) -> web.Response:
            if right is not None:
                right(request["caller"])
            if "vhost" in request.match_info:
                self.vhost_of(request, act=False)
            if "user" in request.match_info and self.broker.users.get(request.match_info["user"]) is None:
                raise not_found()
            return as_json([])
        return handler

    async def refuse(self, request) -> web.Response:
        raise bad_request(f"HareMQ has no {request.path.split('/')[2].replace('-', ' ')}")
