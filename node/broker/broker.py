"""The broker of one node: virtual hosts, users, the direct reply-to registry,
and what of them the store keeps across restarts."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import structlog

from ..protocol.replies import AMQPError, ReplyCode
from ..protocol.tables import decode_table, encode_table
from ..store import meta
from . import policy as policies
from .auth import SHA256, Users, hash_password
from .commands import QueueDelete
from .exchange import Exchange, ExchangeType
from .permissions import Access, Permission, vhost_refused
from .metadata import LocalMetadata
from .ports import MetadataPort
from .reply_to import reply_token, token_node
from .vhost import Persistence, VHost, server_name

if TYPE_CHECKING:
    from ..alarms import ResourceMonitor


class BrokerError(ValueError):
    """A management request that cannot be done, in rabbitmqctl's words."""

from ..version import __version__ as VERSION  # noqa: E402  (one place: the package metadata)


class Broker(Persistence):
    def __init__(self, node_name: str, store=None, metadata: MetadataPort | None = None,
                 resources: Callable[[Broker], ResourceMonitor] | None = None):
        """`metadata`: the port its channels propose changes to, a member's cluster side
        (cluster/node.py) when clustered; a node on its own applies them itself (`LocalMetadata`).
        `resources` builds the monitor of this node's memory and disk, which sets its alarms
        (node/alarms.py); without it `haremq ctl` cannot change their limits."""
        self.node_name = node_name
        self.store = store
        self.next_queue_id = 1
        self.vhosts: dict[str, VHost] = {"/": VHost("/", self)}
        self.users = Users()
        self.permissions: dict[tuple[str, str], Permission] = {("guest", "/"): Permission(".*", ".*", ".*")}
        self.sessions: set = set()
        self.sessions_by_key: dict = {}
        self.metadata: MetadataPort = metadata if metadata is not None else LocalMetadata(self)
        self._reply_to: dict[str, object] = {}
        self.alarms: set[str] = set()          # this node's own
        self.peer_alarms: dict[str, frozenset] = {}   # other members' own, as they last reported them
        self._blocking = False
        self.log = structlog.get_logger("haremq.broker").bind(node=node_name)
        self.resources = resources(self) if resources is not None else None
        self.confirming: set = set()   # sessions with confirms to send
        # message counters of channels that have closed (live ones keep their own; see
        # node/management/stats.py): published, delivered, acked, confirmed
        self.retired_totals = [0, 0, 0, 0]
        if store is not None:
            store.on_failure = self._store_failure
            store.after_batch = self.send_confirms

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
        if (user, vhost) not in self.permissions:
            self.log.warning("vhost access refused", user=user, vhost=vhost)
            return vhost_refused(user, vhost)
        return None

    def access(self, user: str, vhost: str) -> Access:
        """A new connection's rights in its vhost (ERR-3)."""
        return Access(user, vhost, self.permissions.get((user, vhost)))

    # ---- users, vhosts, permissions, policies (ERR-3; `haremq ctl`) ---------------------------
    def _user(self, name: str):
        user = self.users.get(name)
        if user is None:
            raise BrokerError(f"user '{name}' does not exist")
        return user

    def _vhost(self, name: str) -> VHost:
        vhost = self.vhosts.get(name)
        if vhost is None:
            raise BrokerError(f"vhost '{name}' does not exist")
        return vhost

    def add_user(self, name: str, password: str | None = None, tags: list[str] | None = None,
                 password_hash: str | None = None, hashing_algorithm: str = SHA256) -> None:
        if not name:
            raise BrokerError("user name must not be empty")
        if self.users.get(name) is not None:
            raise BrokerError(f"user '{name}' already exists")
        if password_hash is not None:
            self.users.add_hashed(name, password_hash, hashing_algorithm, tags)
        else:
            self.users.add(name, password, tags, loopback_only=name == "guest")
        self.users_changed()

    def delete_user(self, name: str) -> None:
        self._user(name)
        self.users.remove(name)
        for key in [k for k in self.permissions if k[0] == name]:
            del self.permissions[key]
        self._refresh_access(name, None)
        self.users_changed()
        self._permissions_changed()

    def change_password(self, name: str, password: str) -> None:
        user = self._user(name)
        user.password_hash, user.algorithm = hash_password(password), SHA256
        self.users_changed()

    def set_user_tags(self, name: str, tags: list[str] | str | None = None) -> None:
        user = self._user(name)
        if isinstance(tags, str):
            tags = [t for t in tags.replace(",", " ").split() if t]
        user.tags = list(tags or [])
        self.users_changed()

    def list_users(self) -> list[dict]:
        return [{"user": u.name, "tags": list(u.tags)} for u in self.users.all()]

    def add_vhost(self, name: str) -> None:
        if not name:
            raise BrokerError("vhost name must not be empty")
        if name in self.vhosts:
            raise BrokerError(f"vhost '{name}' already exists")
        self.vhosts[name] = VHost(name, self)
        self._log_change({"op": "vhost", "vhost": name})

    def delete_vhost(self, name: str) -> None:
        vhost = self._vhost(name)
        for session in list(self.sessions):
            if session.vhost is vhost:
                session.close(AMQPError(ReplyCode.CONNECTION_FORCED, f"vhost '{name}' is deleted"))
                session.wakeup()
        for queue in list(vhost.queues.values()):
            vhost.remove_queue(queue)
        del self.vhosts[name]
        for key in [k for k in self.permissions if k[1] == name]:
            del self.permissions[key]
        self._log_change({"op": "vhost.delete", "vhost": name})
        self._permissions_changed()

    def list_vhosts(self) -> list[dict]:
        return [{"name": name} for name in self.vhosts]

    def set_permissions(self, user: str, vhost: str, configure: str, write: str, read: str) -> None:
        self._user(user)
        self._vhost(vhost)
        permission = Permission(configure, write, read)
        self.permissions[(user, vhost)] = permission
        self._refresh_access(user, vhost)
        self._permissions_changed()

    def clear_permissions(self, user: str, vhost: str = "/") -> None:
        self._user(user)
        self._vhost(vhost)
        self.permissions.pop((user, vhost), None)
        self._refresh_access(user, vhost)
        self._permissions_changed()

    def list_permissions(self, vhost: str | None = None) -> list[dict]:
        return [{"user": u, "vhost": v, "configure": p.configure, "write": p.write, "read": p.read}
                for (u, v), p in self.permissions.items() if vhost is None or v == vhost]

    def _refresh_access(self, user: str, vhost: str | None) -> None:
        for session in list(self.sessions):
            access = getattr(session, "access", None)
            if access is not None and session.user == user and (vhost is None or access.vhost == vhost):
                access.update(self.permissions.get((user, access.vhost)))

    def set_policy(self, vhost: str, name: str, pattern: str, definition: dict, apply_to: str = "all",
                   priority: int = 0) -> None:
        target = self._vhost(vhost)
        try:
            policy = policies.validate(name, pattern, definition, priority, apply_to)
        except policies.PolicyError as exc:
            raise BrokerError(str(exc)) from None
        target.policies[name] = policy
        target.apply_policies()
        self._policies_changed(target)

    def clear_policy(self, vhost: str, name: str) -> None:
        target = self._vhost(vhost)
        if target.policies.pop(name, None) is None:
            raise BrokerError(f"policy '{name}' does not exist in vhost '{vhost}'")
        target.apply_policies()
        self._policies_changed(target)

    def list_policies(self, vhost: str | None = None) -> list[dict]:
        return [policy.as_json(vname) for vname, v in self.vhosts.items() if vhost is None or vname == vhost
                for policy in v.policies.values()]

    def export_definitions(self) -> dict:
        from .definitions import export_definitions
        return export_definitions(self)

    def import_definitions(self, data: dict) -> None:
        from .definitions import import_definitions
        import_definitions(self, data)

    def vhost(self, name: str) -> VHost:
        return self.vhosts[name]

    # ---- resource alarms (ERR-4) ------------------------------------------------------------
    def set_alarm(self, name: str, active: bool) -> None:
        if active:
            self.alarms.add(name)
        else:
            self.alarms.discard(name)
        self._alarms_changed(name)

    def set_peer_alarms(self, node: str, names) -> None:
        """A member's own alarms: in a cluster an alarm anywhere blocks publishers everywhere."""
        names = frozenset(names)
        if self.peer_alarms.get(node, frozenset()) != names:
            self.peer_alarms[node] = names
            self._alarms_changed(f"{sorted(names) or 'none'} on {node}")

    @property
    def blocking(self) -> bool:
        """An alarm is in force here or (clustered) on another member: publishers are blocked."""
        return self._blocking

    @property
    def alarms_in_force(self) -> set[str]:
        found = set(self.alarms)
        for names in self.peer_alarms.values():
            found.update(names)
        return found

    def _alarms_changed(self, what: str) -> None:
        blocking = bool(self.alarms_in_force)
        if blocking != self._blocking:
            self._blocking = blocking
            self.log.warning("resource alarm", alarm=what, active=blocking)
            for session in list(self.sessions):
                session.alarm_changed(blocking)

    def alarm_reason(self) -> str:
        # RabbitMQ's words: "low on memory", "low on disk" (the free-space and write alarms alike)
        kinds = sorted({"disk" if name.startswith("disk") else name for name in self.alarms_in_force})
        return " & ".join(f"low on {kind}" for kind in kinds)

    def set_vm_memory_high_watermark(self, watermark: str) -> dict:
        """As `rabbitmqctl set_vm_memory_high_watermark`: a fraction of RAM or a size; checked at once."""
        if self.resources is None:
            raise BrokerError("this node does not monitor its resources")
        self.resources.set_memory_watermark(watermark)
        self.resources.check()
        return self.resources.status()

    def set_disk_free_limit(self, limit: str) -> dict:
        """As `rabbitmqctl set_disk_free_limit`: bytes or a size with a unit; checked at once."""
        if self.resources is None:
            raise BrokerError("this node does not monitor its resources")
        self.resources.set_disk_free_limit(limit)
        self.resources.check()
        return self.resources.status()

    def resource_status(self) -> dict:
        """Memory and disk figures and the alarms in force (for `ctl cluster-status`)."""
        if self.resources is None:
            return {"alarms": sorted(self.alarms)}
        return self.resources.status()

    def retire_counters(self, channel) -> None:
        """A channel closes: its message counters go on counting in the node's totals."""
        totals = self.retired_totals
        totals[0] += channel.published_total
        totals[1] += channel.delivered_total
        totals[2] += channel.acked_total
        if channel.confirms is not None:
            totals[3] += channel.confirms.confirmed

    def send_confirms(self) -> None:
        """A write is durable, or a mirror has acked: send the confirms it released now, not on
        the next loop pass."""
        sessions, self.confirming = self.confirming, set()
        for session in sessions:
            if not session.closed:
                session.write_out()

    def _store_failure(self, error) -> None:
        self.set_alarm("disk", error is not None)

    # ---- direct reply-to ---------------------------------------------------------------
    def register_reply_to(self, channel) -> str:
        token = reply_token(self.node_name, server_name(""))
        self._reply_to[token] = channel
        return token

    def unregister_reply_to(self, token: str) -> None:
        self._reply_to.pop(token, None)

    def deliver_reply_here(self, routing_key: str, message) -> bool:
        """A direct reply for a requester connected to this node; False if there is none, or if
        its connection cannot take more output now (the reply is dropped: see `deliver_reply`)."""
        channel = self._reply_to.get(routing_key)
        if channel is None:
            return False
        return channel.deliver_reply(message)

    def deliver_reply(self, routing_key: str, message) -> bool:
        """A direct reply: to the requesting channel, on this node or (clustered) on the node
        its token names. False if there is no such channel to send it to."""
        if self.deliver_reply_here(routing_key, message):
            return True
        node = token_node(routing_key)
        if node is None or node == self.node_name:
            return False
        return self.metadata.forward_reply(node, routing_key, message)

    # ---- persistence (durable metadata) -------------------------------------------------
    # On a single node every change to durable metadata is one record on the store's metadata
    # log (node/store/meta.py), whatever else exists. Clustered, the Raft log is the record.
    def _log_change(self, change: dict) -> None:
        if self.store is not None and isinstance(self.metadata, LocalMetadata):
            self.store.log_meta(meta.record(change))

    def exchange_saved(self, vhost: VHost, exchange: Exchange) -> None:
        self._log_change({"op": "exchange", "vhost": vhost.name, "exchange": {
            "name": exchange.name, "type": exchange.type.value, "auto_delete": exchange.auto_delete,
            "internal": exchange.internal, "arguments": encode_table(exchange.arguments)}})

    def exchange_removed(self, vhost: VHost, exchange: Exchange) -> None:
        self._log_change({"op": "exchange.delete", "vhost": vhost.name, "name": exchange.name})

    def queue_saved(self, vhost: VHost, queue) -> None:
        self._log_change({"op": "queue", "vhost": vhost.name, "queue": {
            "name": queue.name, "id": queue.store_id, "auto_delete": queue.auto_delete,
            "arguments": encode_table(queue.arguments)}})

    def queue_removed(self, vhost: VHost, queue) -> None:
        self._log_change({"op": "queue.delete", "vhost": vhost.name, "name": queue.name})

    def binding_changed(self, vhost: VHost, source: Exchange, destination, routing_key: str, arguments: dict,
                        added: bool) -> None:
        self._log_change({"op": "bind" if added else "unbind", "vhost": vhost.name, "binding": {
            "source": source.name, "destination": destination.name,
            "kind": "exchange" if isinstance(destination, Exchange) else "queue",
            "routing_key": routing_key, "arguments": encode_table(arguments)}})

    def users_changed(self) -> None:
        self._log_change({"op": "users", "users": [
            {"name": u.name, "password_hash": u.password_hash, "hashing_algorithm": u.algorithm,
             "tags": list(u.tags)} for u in self.users.all()]})

    def _permissions_changed(self) -> None:
        self._log_change({"op": "permissions", "permissions": self.list_permissions()})

    def _policies_changed(self, vhost: VHost) -> None:
        self._log_change({"op": "policies", "vhost": vhost.name,
                          "policies": [p.as_json(vhost.name) for p in vhost.policies.values()]})

    def queue_unused(self, vhost: VHost, queue) -> None:
        self.metadata.submit(QueueDelete(vhost.name, queue.name, getattr(queue.exclusive_owner, "key", None)),
                             lambda *_: None)

    def new_queue_id(self) -> int:
        queue_id = self.next_queue_id
        self.next_queue_id += 1
        return queue_id

    def metadata_pending(self) -> bool:
        return self.store is not None and self.store.meta_pending

    def restore(self, recovered) -> None:
        """Rebuild durable exchanges, queues and bindings, and put recovered messages back."""
        snapshot = recovered.meta or {"vhosts": {}, "next_queue_id": 1}
        self.next_queue_id = snapshot.get("next_queue_id", 1)
        if "users" in snapshot:
            self.users.clear()
            for u in snapshot["users"]:
                self.users.add_hashed(u["name"], u["password_hash"], u.get("hashing_algorithm", SHA256),
                                      u.get("tags"))
        if "permissions" in snapshot:
            self.permissions = {(p["user"], p["vhost"]): Permission(p["configure"], p["write"], p["read"])
                                for p in snapshot["permissions"]}
        known_ids = set()
        for vname, data in snapshot["vhosts"].items():
            vhost = self.vhosts.get(vname)
            if vhost is None:
                vhost = self.vhosts[vname] = VHost(vname, self)
            for p in data.get("policies", []):
                vhost.policies[p["name"]] = policies.validate(p["name"], p["pattern"], p["definition"],
                                                              p["priority"], p["apply-to"])
            for x in data["exchanges"]:
                vhost._add_exchange(Exchange(x["name"], ExchangeType(x["type"]), durable=True,
                                             auto_delete=x["auto_delete"], internal=x["internal"],
                                             arguments=decode_table(x["arguments"])))
            for q in data["queues"]:
                queue = vhost.add_queue(q["name"], True, None, q["auto_delete"], decode_table(q["arguments"]),
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
                    source.bind(destination, b["routing_key"], decode_table(b["arguments"]))
        for queue_id, messages in recovered.queues.items():
            if queue_id not in known_ids:   # the queue was deleted: let its segments go
                self.store.ack(queue_id, list(messages))
        self.log.info("restored", vhosts=len(self.vhosts),
                      queues=sum(len(v.queues) for v in self.vhosts.values()), messages=recovered.messages)
