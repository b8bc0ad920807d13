"""Definitions: RabbitMQ's JSON export of a broker's users, vhosts, permissions,
policies, queues, exchanges and bindings (ERR-3).

`import_definitions` takes what `rabbitmqctl export_definitions` (or the
management UI) writes, so a RabbitMQ setup carries over: users come with
their salted password hashes (`hashing_algorithm`
`rabbit_password_hashing_sha256`, also sha512 and md5), never passwords.
`haremq node --definitions FILE` imports a file at every start, as
RabbitMQ's `load_definitions` does; what exists already is updated, nothing
is removed. `export_definitions` writes the same format back.
"""
from __future__ import annotations

import json
from pathlib import Path

from .auth import SHA256
from .exchange import Exchange
from .queue_arguments import is_quorum
from ..version import __version__

RABBIT_VERSION = "3.10.8"


async def read_file(path: Path | str) -> dict:
    """A definitions file, read for the event loop: aiofiles reads in a worker thread, so a large file (or a slow
    volume, a ConfigMap on a network disk) never holds up connections, Raft or the store."""
    import aiofiles
    try:
        async with aiofiles.open(path) as f:
            data = json.loads(await f.read())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read definitions file {path}: {exc}") from None
    return _checked(data, path)


def _checked(data, path) -> dict:
    if not isinstance(data, dict):
        raise ValueError(f"definitions file {path} does not hold a JSON object")
    return data


def _tags(value) -> list[str]:
    if isinstance(value, list):
        return [str(t) for t in value if t]
    return [t for t in str(value or "").replace(",", " ").split() if t]


def import_definitions(broker, data: dict) -> None:
    for user in data.get("users", []):
        name = user["name"]
        existing = broker.users.get(name)
        algorithm = user.get("hashing_algorithm", SHA256)
        if existing is None:
            broker.users.add_hashed(name, user.get("password_hash", ""), algorithm, _tags(user.get("tags")))
        else:
            existing.password_hash, existing.algorithm = user.get("password_hash", ""), algorithm
            existing.tags = _tags(user.get("tags"))
    for vhost in data.get("vhosts", []):
        if vhost["name"] not in broker.vhosts:
            broker.add_vhost(vhost["name"])
    for p in data.get("permissions", []):
        broker.set_permissions(p["user"], p["vhost"], p.get("configure", ""), p.get("write", ""),
                               p.get("read", ""))
    for p in data.get("policies", []):
        broker.set_policy(p.get("vhost", "/"), p["name"], p["pattern"], p.get("definition", {}),
                          p.get("apply-to", "all"), p.get("priority", 0))
    for x in data.get("exchanges", []):
        vhost = broker._vhost(x.get("vhost", "/"))
        existing = vhost.exchanges.get(x["name"])
        if existing is None:
            vhost.declare_exchange(x["name"], x.get("type", "direct"), False, x.get("durable", True),
                                   x.get("auto_delete", False), x.get("internal", False), x.get("arguments") or {})
    for q in data.get("queues", []):
        vhost = broker._vhost(q.get("vhost", "/"))
        if q["name"] not in vhost.queues:
            vhost.declare_queue(q["name"], False, q.get("durable", True), False, q.get("auto_delete", False),
                                q.get("arguments") or {}, None)
    for b in data.get("bindings", []):
        vhost = broker._vhost(b.get("vhost", "/"))
        arguments = b.get("arguments") or {}
        if b.get("destination_type", "queue") == "queue":
            queue = vhost.queues.get(b["destination"])
            if queue is not None and b["source"]:
                vhost.bind_queue(queue, b["source"], b.get("routing_key", ""), arguments)
        else:
            vhost.bind_exchange(b["destination"], b["source"], b.get("routing_key", ""), arguments)
    broker.users_changed()     # the rest was logged change by change as it was made


def _plain(table: dict) -> dict:
    """AMQP argument tables as JSON values."""
    out = {}
    for key, value in (table or {}).items():
        if isinstance(value, bytes):
            value = value.decode(errors="replace")
        elif isinstance(value, dict):
            value = _plain(value)
        elif not isinstance(value, (str, int, float, bool, list)) and value is not None:
            value = str(value)
        out[key] = value
    return out


def _exported(destination) -> bool:
    """A binding is exported if its destination is: a durable exchange, or a durable queue that is
    not exclusive, whichever member masters it (a handle of a queue mastered elsewhere has no
    store here, and testing the store left out every binding of another member's queues)."""
    if isinstance(destination, Exchange):
        return destination.durable
    return bool(destination.durable) and destination.exclusive_owner is None


def export_definitions(broker) -> dict:
    queues, exchanges, bindings = [], [], []
    for vname, vhost in broker.vhosts.items():
        for queue in vhost.queues.values():
            if queue.exclusive_owner is None:
                queues.append({"name": queue.name, "vhost": vname, "durable": queue.durable,
                               "auto_delete": queue.auto_delete, "arguments": _plain(queue.arguments),
                               "type": "quorum" if is_quorum(queue.arguments) else "classic"})
        for exchange in vhost.exchanges.values():
            if exchange.name and not exchange.name.startswith("amq.") and exchange.durable:
                exchanges.append({"name": exchange.name, "vhost": vname, "type": exchange.type.value,
                                  "durable": True, "auto_delete": exchange.auto_delete,
                                  "internal": exchange.internal, "arguments": _plain(exchange.arguments)})
            if not exchange.name or not exchange.durable:
                continue
            for destination, key, arguments in exchange.bindings():
                if not _exported(destination):
                    continue
                bindings.append({"source": exchange.name, "vhost": vname, "destination": destination.name,
                                 "destination_type": "exchange" if isinstance(destination, Exchange) else "queue",
                                 "routing_key": key, "arguments": _plain(arguments)})
    return {
        "rabbit_version": RABBIT_VERSION,
        "rabbitmq_version": RABBIT_VERSION,
        "product_name": "HareMQ",
        "product_version": __version__,
        "users": [{"name": u.name, "password_hash": u.password_hash, "hashing_algorithm": u.algorithm,
                   "tags": list(u.tags), "limits": {}} for u in broker.users.all()],
        "vhosts": [{"name": name, "limits": [],
                    "metadata": {"description": "Default virtual host" if name == "/" else "", "tags": []}}
                   for name in broker.vhosts],
        "permissions": broker.list_permissions(),
        "topic_permissions": [],
        "parameters": [],
        "global_parameters": [],
        "policies": broker.list_policies(),
        "queues": queues,
        "exchanges": exchanges,
        "bindings": bindings,
    }
