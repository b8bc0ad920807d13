"""Who may use the management API, as RabbitMQ's management plugin decides it.

HTTP basic authentication against HareMQ's users (the same salted hashes AMQP
checks; `guest` only from loopback). The user's tags decide what it may do:

    administrator   everything
    monitoring      see every vhost's objects, connections and the nodes
    policymaker     set and clear policies in the vhosts it has permissions in
    management      see and act on the vhosts it has permissions in

A user with none of them cannot log in to the API. Every refusal is a 401
with RabbitMQ's JSON body, e.g. `{"error":"not_authorised","reason":"Not
administrator user"}`; what a user may do inside a vhost is then AMQP's
configure/write/read permissions, checked by the broker itself.
"""
from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass

from aiohttp import web

REALM = 'Basic realm="HareMQ Management"'
MANAGEMENT_TAGS = {"administrator", "monitoring", "policymaker", "management"}


@dataclass
class Caller:
    name: str
    password: str
    tags: frozenset
    peer: tuple[str, int]

    @property
    def is_admin(self) -> bool:
        return "administrator" in self.tags

    @property
    def is_monitor(self) -> bool:
        return bool(self.tags & {"administrator", "monitoring"})

    @property
    def is_policymaker(self) -> bool:
        return bool(self.tags & {"administrator", "policymaker"})


def error(status: int, kind: str, reason: str, challenge: bool = False) -> web.Response:
    """RabbitMQ's refusal body; `challenge` adds `WWW-Authenticate` (see Refused)."""
    headers = {"WWW-Authenticate": REALM} if challenge else None
    return web.Response(status=status, text=json.dumps({"error": kind, "reason": reason}),
                        content_type="application/json", headers=headers)


class Refused(Exception):
    """Raised by a route: answered as RabbitMQ's 401 with this reason (RabbitMQ spells the
    error `not_authorized` for a failed login and `not_authorised` for a missing right).

    `challenge`: only a request that carried no credentials is asked for them with
    `WWW-Authenticate: Basic`, as RabbitMQ's management plugin decides it. A browser answers a
    challenge with its own password dialog, even to a script's request, so a refusal of
    credentials that were given (a wrong password typed into a UI's sign-in form, a user
    without the right) must not carry one: the UI shows its own message instead."""

    def __init__(self, reason: str, kind: str = "not_authorised", challenge: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.kind = kind
        self.challenge = challenge


def credentials(request: web.Request) -> tuple[str, str] | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic" or not value:
        return None
    try:
        user, sep, password = base64.b64decode(value.strip()).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return (user, password) if sep else None


def peer_of(request: web.Request) -> tuple[str, int]:
    peer = request.transport.get_extra_info("peername") if request.transport is not None else None
    if not peer:
        return ("?", 0)
    return (str(peer[0]), int(peer[1]))


def authenticate(broker, request: web.Request) -> Caller:
    """The caller, or Refused("Login failed") / Refused("Not management user")."""
    given = credentials(request)
    if given is None:
        raise Refused("Login failed", "not_authorized", challenge=True)
    name, password = given
    peer = peer_of(request)
    if broker.authenticate(name, password, peer[0]) is None:
        raise Refused("Login failed", "not_authorized")
    user = broker.users.get(name)
    tags = frozenset(getattr(user, "tags", ()) or ())
    if not tags & MANAGEMENT_TAGS:
        raise Refused("Not management user")
    return Caller(name, password, tags, peer)


def can_see_vhost(broker, caller: Caller, vhost: str) -> bool:
    return caller.is_monitor or (caller.name, vhost) in broker.permissions


def require_vhost(broker, caller: Caller, vhost: str) -> None:
    """Acting in a vhost needs permissions there (administrators need them too, as in RabbitMQ)."""
    if (caller.name, vhost) not in broker.permissions:
        raise Refused("User not authorised to access virtual host")


def require_admin(caller: Caller) -> None:
    if not caller.is_admin:
        raise Refused("Not administrator user")


def require_monitor(caller: Caller) -> None:
    if not caller.is_monitor:
        raise Refused("Not monitor user")


def require_policymaker(caller: Caller) -> None:
    if not caller.is_policymaker:
        raise Refused("Not policymaker user")
