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


SHA256 = "rabbit_password_hashing_sha256"
ALGORITHMS = {SHA256: hashlib.sha256,
              "rabbit_password_hashing_sha512": hashlib.sha512,
              "rabbit_password_hashing_md5": hashlib.md5}


def hash_password(password: str, salt: bytes | None = None, algorithm: str = SHA256) -> str:
    salt = os.urandom(4) if salt is None else salt
    return base64.b64encode(salt + ALGORITHMS[algorithm](salt + password.encode()).digest()).decode()


def check_password(password: str, password_hash: str, algorithm: str = SHA256) -> bool:
    if not password_hash:
        return False          # a user without a password cannot log in with one (RabbitMQ)
    try:
        raw = base64.b64decode(password_hash)
    except ValueError:
        return False
    salt, digest = raw[:4], raw[4:]
    return hmac.compare_digest(ALGORITHMS[algorithm](salt + password.encode()).digest(), digest)


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
    algorithm: str = SHA256


class Users:
    def __init__(self):
        self._users: dict[str, User] = {}
        self.add("guest", "guest", tags=["administrator"], loopback_only=True)

    def add(self, name: str, password: str | None, tags: list[str] | None = None,
            loopback_only: bool = False) -> User:
        user = User(name, hash_password(password) if password is not None else "", list(tags or []),
                    loopback_only)
        self._users[name] = user
        return user

    def add_hashed(self, name: str, password_hash: str, algorithm: str = SHA256,
                   tags: list[str] | None = None) -> User:
        """A user as a definitions file carries it: the hash, never the password."""
        if algorithm not in ALGORITHMS:
            raise ValueError(f"unsupported hashing algorithm '{algorithm}'")
        user = User(name, password_hash or "", list(tags or []), name == "guest", algorithm)
        self._users[name] = user
        return user

    def remove(self, name: str) -> User | None:
        return self._users.pop(name, None)

    def all(self) -> list[User]:
        return list(self._users.values())

    def clear(self) -> None:
        self._users.clear()

    def get(self, name: str) -> User | None:
        return self._users.get(name)

    def authenticate(self, name: str, password: str, peer_host: str) -> str | None:
        user = self._users.get(name)
        if user is None or password is None or \
                not check_password(password, user.password_hash, user.algorithm):
            return None
        if user.loopback_only and not is_loopback(peer_host):
            return None
        return user.name
