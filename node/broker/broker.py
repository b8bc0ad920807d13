"""The broker of one node: virtual hosts, users and the direct reply-to registry."""
from __future__ import annotations

import structlog

from ..protocol.replies import AMQPError, ReplyCode
from .auth import Users
from .vhost import VHost, server_name

VERSION = "0.1.0"


class Broker:
    def __init__(self, node_name: str):
        self.node_name = node_name
        self.vhosts: dict[str, VHost] = {"/": VHost("/")}
        self.users = Users()
        self.sessions: set = set()
        self._reply_to: dict[str, object] = {}
        self.log = structlog.get_logger("haremq.broker").bind(node=node_name)

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

    # ---- direct reply-to ---------------------------------------------------------------
    def register_reply_to(self, channel) -> str:
        token = server_name("amq.rabbitmq.reply-to.")
        self._reply_to[token] = channel
        return token

    def unregister_reply_to(self, token: str) -> None:
        self._reply_to.pop(token, None)

    def reply_to_channel(self, routing_key: str):
        return self._reply_to.get(routing_key)
