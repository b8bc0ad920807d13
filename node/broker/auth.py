"""Users with salted password hashes, and who may log in from where.

Hashes follow RabbitMQ's default scheme (SHA-256 over a 4-byte salt and the
password, stored as base64(salt + digest)), so exported definitions carry
over. `guest` may only log in from loopback, as in RabbitMQ.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import os
from dataclasses import dataclass, field


def hash_password(password: str, salt: bytes | None = None) -> str:
    salt = os.urandom(4) if salt is None else salt
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def check_password(password: str, password_hash: str) -> bool:
    raw = base64.b64decode(password_hash)
    salt, digest = raw[:4], raw[4:]
    return hmac.compare_digest(hashlib.sha256(salt + password.encode()).digest(), digest)


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return host in ("localhost", "")


@dataclass
class User:
    name: str
    password_hash: str
    tags: list[str] = field(default_factory=list)
    loopback_only: bool = False


class Users:
    def __init__(self):
        self._users: dict[str, User] = {}
        self.add("guest", "guest", tags=["administrator"], loopback_only=True)

    def add(self, name: str, password: str, tags: list[str] | None = None, loopback_only: bool = False) -> User:
        user = User(name, hash_password(password), list(tags or []), loopback_only)
        self._users[name] = user
        return user

    def get(self, name: str) -> User | None:
        return self._users.get(name)

    def authenticate(self, name: str, password: str, peer_host: str) -> str | None:
        user = self._users.get(name)
        if user is None or password is None or not check_password(password, user.password_hash):
            return None
        if user.loopback_only and not is_loopback(peer_host):
            return None
        return user.name
