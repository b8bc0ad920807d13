"""HareMQ's objects as RabbitMQ's management API writes them: the JSON field names tools read.

Only plain data goes in and out: queues, exchanges, bindings, connections,
channels and consumers become the dicts RabbitMQ 3.10's `/api/...` answers
hold (the subset rabbitmqadmin, KEDA, Terraform and Flower read), with
HareMQ's own mirroring fields where RabbitMQ has classic mirroring's
(`node`, `slave_nodes`, `synchronised_slave_nodes`) plus `epoch` and
`sync_progress`.
"""
from __future__ import annotations

import base64
import datetime
import time
import urllib.parse

from ..broker.exchange import Exchange
from ..broker.policy import winning
from ..broker.ports import QueuePort


def jsonable(value):
    """AMQP values (field tables, arrays, byte strings, timestamps) as JSON holds them: the one
    conversion for the management API and the control commands."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def details(rate: float) -> dict:
    return {"rate": rate}


def message_stats(publish: int, deliver_get: int, ack: int, rates=(0.0, 0.0, 0.0)) -> dict:
    return {"publish": publish, "publish_details": details(rates[0]),
            "deliver_get": deliver_get, "deliver_get_details": details(rates[1]),
            "deliver": deliver_get, "deliver_details": details(rates[1]),
            "ack": ack, "ack_details": details(rates[2])}


# ---- queues ------------------------------------------------------------------------------------
def queue_row(vname: str, queue: QueuePort, node: str, sampler=None, mirroring: dict | None = None) -> dict:
    """A queue whose messages live on this node, as /api/queues lists it."""
    ready, unacked = queue.message_count, queue.unacked
    published, delivered, acked = queue.published_total, queue.delivered_total, queue.acked_total
    rates = sampler.queue_rates(vname, queue.name) if sampler is not None else (0.0, 0.0, 0.0)
    row = {
        "name": queue.name, "vhost": vname, "durable": queue.durable, "auto_delete": queue.auto_delete,
        "exclusive": queue.exclusive_owner is not None, "arguments": jsonable(queue.arguments),
        "node": node, "state": "running", "type": "classic",
        "consumers": queue.consumer_count,
        "messages": ready + unacked, "messages_ready": ready, "messages_unacknowledged": unacked,
        "messages_details": details(0.0), "messages_ready_details": details(0.0),
        "messages_unacknowledged_details": details(0.0),
        "message_bytes": queue.message_bytes, "message_bytes_ready": queue.message_bytes,
        "messages_paged_out": queue.paged_out, "messages_ram": ready + unacked - queue.paged_out,
        "message_stats": message_stats(published, delivered, acked, rates),
        "exclusive_consumer_tag": None, "single_active_consumer_tag": None,
        **queue.dedup_stats,
    }
    row.update(mirroring_fields(node, mirroring))
    return row


def down_queue_row(vname: str, queue, mirroring: dict | None = None) -> dict:
    """A queue whose home node did not answer: what the metadata says, no counts."""
    home = getattr(queue, "home", None)
    row = {"name": queue.name, "vhost": vname, "durable": queue.durable, "auto_delete": queue.auto_delete,
           "exclusive": queue.exclusive_owner is not None, "arguments": jsonable(queue.arguments),
           "node": home, "state": "down", "type": "classic", "consumers": 0, "messages": None,
           "messages_ready": None, "messages_unacknowledged": None,
           "message_stats": message_stats(0, 0, 0)}
    row.update(mirroring_fields(home, mirroring))
    return row


def mirroring_fields(node: str | None, status: dict | None) -> dict:
    """RabbitMQ's classic-mirroring names, and HareMQ's epoch and sync progress."""
    if not status:
        return {"slave_nodes": [], "synchronised_slave_nodes": [], "recoverable_slaves": [],
                "epoch": None, "sync_progress": {}, "mirror_states": {}}
    fields = {"node": status.get("master", node), "slave_nodes": list(status.get("mirrors", [])),
              "synchronised_slave_nodes": list(status.get("synchronised_mirrors", [])),
              "recoverable_slaves": list(status.get("mirrors", [])), "epoch": status.get("epoch"),
              "sync_progress": dict(status.get("sync_progress") or {}),
              "mirror_states": dict(status.get("mirror_states") or {})}
    if status.get("type") == "quorum":      # RabbitMQ's names for a quorum queue's members
        fields.update(type="quorum", members=list(status["members"]), online=list(status["online"]),
                      leader=status["leader"])
    return fields


def vhost_totals(queue_rows: list[dict]) -> dict[str, dict]:
    """Per vhost, its queues' message counts and message counters with their rates, under the
    names RabbitMQ's vhost objects give them (a queue whose home is down counts nothing)."""
    counts: dict[str, list[int]] = {}
    counters: dict[str, list[float]] = {}
    for row in queue_rows:
        c = counts.setdefault(row["vhost"], [0, 0])
        c[0] += row.get("messages_ready") or 0
        c[1] += row.get("messages_unacknowledged") or 0
        stats = row.get("message_stats") or {}
        m = counters.setdefault(row["vhost"], [0, 0, 0, 0.0, 0.0, 0.0])
        for i, key in enumerate(("publish", "deliver_get", "ack")):
            m[i] += stats.get(key, 0)
            m[3 + i] += stats.get(key + "_details", {}).get("rate", 0.0)
    out = {}
    for vname, (ready, unacked) in counts.items():
        m = counters[vname]
        out[vname] = {"messages": ready + unacked, "messages_details": details(0.0),
                      "messages_ready": ready, "messages_ready_details": details(0.0),
                      "messages_unacknowledged": unacked, "messages_unacknowledged_details": details(0.0),
                      "message_stats": message_stats(int(m[0]), int(m[1]), int(m[2]),
                                                     [round(r, 1) for r in m[3:]])}
    return out


def with_policy(row: dict, vhost) -> dict:
    policy = winning(vhost.policies.values(), "queue", row["name"]) if vhost is not None else None
    row["policy"] = policy.name if policy is not None else None
    row["effective_policy_definition"] = dict(policy.definition) if policy is not None else {}
    row["operator_policy"] = None
    return row


# ---- exchanges and bindings -------------------------------------------------------------------
EXCHANGE_TYPES = [{"name": t, "description": f"AMQP {t} exchange", "enabled": True}
                  for t in ("direct", "fanout", "headers", "topic")]


def exchange_json(vname: str, exchange: Exchange) -> dict:
    return {"name": exchange.name, "vhost": vname, "type": exchange.type.value, "durable": exchange.durable,
            "auto_delete": exchange.auto_delete, "internal": exchange.internal,
            "arguments": jsonable(exchange.arguments), "user_who_performed_action": "rmq-internal"}


def properties_key(routing_key: str, arguments: dict) -> str:
    """RabbitMQ's binding `properties_key`: the routing key, or "~" joined with a hash of
    the arguments when there are any."""
    key = urllib.parse.quote(routing_key, safe="") if routing_key else "~"
    if not arguments:
        return key
    digest = base64.urlsafe_b64encode(repr(sorted(jsonable(arguments).items())).encode()).decode()[:22]
    return f"{key}~{digest}"


def bindings(vname: str, vhost) -> list[dict]:
    rows = []
    for queue in list(vhost.queues.values()):   # the default exchange's implicit bindings
        rows.append({"source": "", "vhost": vname, "destination": queue.name, "destination_type": "queue",
                     "routing_key": queue.name, "arguments": {}, "properties_key": queue.name})
    for exchange in list(vhost.exchanges.values()):
        for destination, key, arguments in exchange.bindings():
            rows.append({"source": exchange.name, "vhost": vname, "destination": destination.name,
                         "destination_type": "exchange" if isinstance(destination, Exchange) else "queue",
                         "routing_key": key, "arguments": jsonable(arguments),
                         "properties_key": properties_key(key, arguments)})
    return rows


# ---- connections, channels, consumers --------------------------------------------------------
def connection_name(session) -> str:
    host, port = session.peer
    return f"{host}:{port} -> {session.broker.node_name}"


def connection_json(session, node: str) -> dict:
    conn = session.conn
    props = jsonable(conn.client_properties or {})
    host, port = session.peer
    return {"name": connection_name(session), "node": node, "vhost": session.vhost.name if session.vhost else None,
            "user": session.user, "state": "blocked" if session.blocked else "running",
            "channels": len(session.channels), "peer_host": host, "peer_port": port,
            "host": session.broker.node_name, "protocol": "AMQP 0-9-1", "type": "network",
            "auth_mechanism": "PLAIN", "ssl": False, "frame_max": conn.frame_max, "channel_max": conn.channel_max,
            "timeout": conn.heartbeat, "client_properties": props,
            "connected_at": int(getattr(session, "connected_at", time.time()) * 1000)}


def channel_json(session, channel, node: str) -> dict:
    confirms = channel.confirms
    unconfirmed = confirms.unconfirmed if confirms is not None else 0
    mode = getattr(channel.mode, "value", "normal")
    return {"name": f"{connection_name(session)} ({channel.id})", "node": node, "number": channel.id,
            "vhost": session.vhost.name if session.vhost else None, "user": session.user,
            "connection_details": {"name": connection_name(session), "peer_host": session.peer[0],
                                   "peer_port": session.peer[1]},
            "confirm": mode == "confirm", "transactional": mode == "tx", "state": "running",
            "consumer_count": len(channel.consumers), "messages_unacknowledged": len(channel.deliveries.unacked),
            "messages_unconfirmed": unconfirmed, "prefetch_count": channel.deliveries.prefetch_consumer,
            "global_prefetch_count": channel.deliveries.prefetch_global,
            "message_stats": {**message_stats(channel.published_total, channel.delivered_total,
                                              channel.acked_total),
                              "confirm": confirms.confirmed if confirms is not None else 0}}


def consumer_json(session, channel, consumer, node: str) -> dict:
    queue = consumer.queue
    return {"consumer_tag": consumer.tag, "exclusive": consumer.exclusive, "ack_required": not consumer.no_ack,
            "prefetch_count": consumer.prefetch, "active": True, "activity_status": "up",
            "arguments": jsonable(consumer.arguments or {}),
            "queue": {"name": queue.name, "vhost": session.vhost.name if session.vhost else None},
            "channel_details": {"name": f"{connection_name(session)} ({channel.id})", "number": channel.id,
                                "node": node, "connection_name": connection_name(session),
                                "peer_host": session.peer[0], "peer_port": session.peer[1],
                                "user": session.user}}


# ---- messages ----------------------------------------------------------------------------------
PROPERTY_NAMES = ("content_type", "content_encoding", "headers", "delivery_mode", "priority", "correlation_id",
                  "reply_to", "expiration", "message_id", "timestamp", "type", "user_id", "app_id", "cluster_id")


def properties_json(properties) -> dict:
    out = {}
    for name in PROPERTY_NAMES:
        value = getattr(properties, name, None)
        if value is None or value == {} or value == "":
            continue
        if name == "timestamp" and isinstance(value, datetime.datetime):
            value = int(value.replace(tzinfo=value.tzinfo or datetime.timezone.utc).timestamp())
        out[name] = jsonable(value)
    return out


def got_message(message, encoding: str, truncate: int | None) -> dict:
    """A message from POST /api/queues/{vhost}/{name}/get, as RabbitMQ answers it."""
    body = message.body
    payload_bytes = len(body)
    if truncate is not None and truncate >= 0:
        body = body[:truncate]
    payload, payload_encoding = None, "base64"
    if encoding == "auto":
        try:
            payload, payload_encoding = body.decode("utf-8"), "string"
        except UnicodeDecodeError:
            pass
    if payload is None:
        payload = base64.b64encode(body).decode()
    method = message.method
    return {"payload_bytes": payload_bytes, "redelivered": bool(method.redelivered), "exchange": method.exchange,
            "routing_key": method.routing_key, "message_count": method.message_count,
            "properties": properties_json(message.properties), "payload": payload,
            "payload_encoding": payload_encoding}
