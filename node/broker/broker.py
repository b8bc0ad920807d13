"""The broker of one node: virtual hosts, users, the direct reply-to registry,
and what of them the store keeps across restarts."""
from __future__ import annotations

import structlog

from ..protocol.replies import AMQPError, ReplyCode
from ..store import meta
from .auth import Users
from .exchange import Exchange, ExchangeType
from .vhost import Persistence, VHost, is_durable, server_name

VERSION = "0.1.0"


class Broker(Persistence):
    def __init__(self, node_name: str, store=None):
        self.node_name = node_name
        self.store = store
        self.next_queue_id = 1
        self.vhosts: dict[str, VHost] = {"/": VHost("/", self)}
        self.users = Users()
        self.sessions: set = set()
        self._reply_to: dict[str, object] = {}
        self.alarms: set[str] = set()
        self.log = structlog.get_logger("haremq.broker").bind(node=node_name)
        if store is not None:
            store.on_failure = self._store_failure

    def server_properties(self) -> dict:
        return {
            "product": "HareMQ",
            "version": VERSION,
            "platform": "Python",
            "cluster_name": self.node_name,
            "copyright": "HareMQ contributors",
            "information": "AMQP 0-9-1 broker with mirrored queues",
        }

    def authenticate(self, user: str, password: str, peer_host: str) -> str | None:
        accepted = self.users.authenticate(user, password, peer_host)
        if accepted is None:
            self.log.warning("login refused", user=user, peer=peer_host)
        return accepted

    def check_vhost(self, user: str, vhost: str) -> AMQPError | None:
        if vhost not in self.vhosts:
            return AMQPError(ReplyCode.NOT_ALLOWED, f"vhost {vhost} not found", 10, 40)
        return None

    def vhost(self, name: str) -> VHost:
        return self.vhosts[name]

    # ---- resource alarms (ERR-4) ------------------------------------------------------------
    def set_alarm(self, name: str, active: bool) -> None:
        before = bool(self.alarms)
        if active:
            self.alarms.add(name)
        else:
            self.alarms.discard(name)
        if bool(self.alarms) != before:
            self.log.warning("resource alarm", alarm=name, active=active)
            for session in list(self.sessions):
                session.alarm_changed(bool(self.alarms))

    def alarm_reason(self) -> str:
        return " & ".join(f"low on {name}" for name in sorted(self.alarms))

    def _store_failure(self, error) -> None:
        self.set_alarm("disk", error is not None)

    # ---- direct reply-to ---------------------------------------------------------------
    def register_reply_to(self, channel) -> str:
        token = server_name("amq.rabbitmq.reply-to.")
        self._reply_to[token] = channel
        return token

    def unregister_reply_to(self, token: str) -> None:
        self._reply_to.pop(token, None)

    def reply_to_channel(self, routing_key: str):
        return self._reply_to.get(routing_key)

    # ---- persistence (durable metadata) -------------------------------------------------
    def changed(self) -> None:
        if self.store is not None:
            self.store.save_meta(self._snapshot)

    def new_queue_id(self) -> int:
        queue_id = self.next_queue_id
        self.next_queue_id += 1
        return queue_id

    def metadata_pending(self) -> bool:
        return self.store is not None and self.store.meta_pending

    def _snapshot(self) -> bytes:
        vhosts = {}
        for vname, vhost in self.vhosts.items():
            exchanges, queues, bindings = [], [], []
            for exchange in vhost.exchanges.values():
                if not exchange.durable:
                    continue
                if exchange.name and not exchange.name.startswith("amq."):
                    exchanges.append({"name": exchange.name, "type": exchange.type.value,
                                      "auto_delete": exchange.auto_delete, "internal": exchange.internal,
                                      "arguments": meta.encode_table(exchange.arguments)})
                for destination, key, args in exchange.bindings():
                    if is_durable(destination):
                        bindings.append({"source": exchange.name, "destination": destination.name,
                                         "kind": "exchange" if isinstance(destination, Exchange) else "queue",
                                         "routing_key": key, "arguments": meta.encode_table(args)})
            for queue in vhost.queues.values():
                if queue.store is not None:
                    queues.append({"name": queue.name, "id": queue.store_id, "auto_delete": queue.auto_delete,
                                   "arguments": meta.encode_table(queue.arguments)})
            vhosts[vname] = {"exchanges": exchanges, "queues": queues, "bindings": bindings}
        return meta.dumps({"vhosts": vhosts, "next_queue_id": self.next_queue_id})

    def restore(self, recovered) -> None:
        """Rebuild durable exchanges, queues and bindings, and put recovered messages back."""
        snapshot = meta.loads(recovered.meta)
        self.next_queue_id = snapshot.get("next_queue_id", 1)
        known_ids = set()
        for vname, data in snapshot["vhosts"].items():
            vhost = self.vhosts.get(vname)
            if vhost is None:
                vhost = self.vhosts[vname] = VHost(vname, self)
            for x in data["exchanges"]:
                vhost._add_exchange(Exchange(x["name"], ExchangeType(x["type"]), durable=True,
                                             auto_delete=x["auto_delete"], internal=x["internal"],
                                             arguments=meta.decode_table(x["arguments"])))
            for q in data["queues"]:
                queue = vhost.add_queue(q["name"], True, None, q["auto_delete"], meta.decode_table(q["arguments"]),
                                        q["id"])
                queue.restore(recovered.queues.get(q["id"], []))
                known_ids.add(q["id"])
            for b in data["bindings"]:
                source = vhost.exchanges.get(b["source"])
                if b["kind"] == "queue":
                    destination = vhost.queues.get(b["destination"])
                else:
                    destination = vhost.exchanges.get(b["destination"])
                if source is not None and destination is not None:
                    source.bind(destination, b["routing_key"], meta.decode_table(b["arguments"]))
        for queue_id, messages in recovered.queues.items():
            if queue_id not in known_ids:   # the queue was deleted: let its segments go
                self.store.ack(queue_id, [msg_id for msg_id, _d in messages])
        self.log.info("restored", vhosts=len(self.vhosts),
                      queues=sum(len(v.queues) for v in self.vhosts.values()), messages=recovered.messages)
