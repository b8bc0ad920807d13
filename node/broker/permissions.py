"""Permissions (ERR-3): what a user may do in a vhost, as RabbitMQ decides it.

A user's permissions in a vhost are three regular expressions matched
against resource (exchange and queue) names: configure (declare, delete),
write (publish to, bind a queue or exchange to) and read (consume, get,
purge, bind from). An empty pattern matches nothing. Which operation needs
which permission on which resource is RabbitMQ's table
(https://www.rabbitmq.com/access-control.html, "How Permissions Work"):

    exchange.declare          configure exchange (+ write alternate-exchange, read exchange)
    exchange.delete           configure exchange
    queue.declare             configure queue (+ write dead-letter-exchange, read queue)
    queue.delete              configure queue
    exchange.bind / unbind    write destination exchange, read source exchange
    queue.bind / unbind       write queue, read exchange
    basic.publish             write exchange ('' is checked as 'amq.default')
    basic.get / consume       read queue
    queue.purge               read queue

Passive declares need nothing. A refusal is `403 ACCESS_REFUSED - access to
queue 'q' in vhost 'v' refused for user 'u'` and closes the channel; a
connection to a vhost the user has no permissions in is refused with
`530 NOT_ALLOWED - access to vhost 'v' refused for user 'u'`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..protocol.replies import AMQPError, ReplyCode

CONFIGURE, WRITE, READ = "configure", "write", "read"
DEFAULT_EXCHANGE = "amq.default"


def _compile(pattern: str) -> re.Pattern | None:
    if pattern == "":
        return None     # RabbitMQ: '' is '^$', which no resource name matches
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"invalid regular expression '{pattern}': {exc}") from None


@dataclass
class Permission:
    configure: str
    write: str
    read: str
    _regex: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        self._regex = {CONFIGURE: _compile(self.configure), WRITE: _compile(self.write),
                       READ: _compile(self.read)}

    @property
    def unrestricted(self) -> bool:
        return self.configure == self.write == self.read == ".*"

    def allows(self, what: str, name: str) -> bool:
        regex = self._regex[what]
        return regex is not None and regex.search(name) is not None


class Access:
    """One connection's rights in its vhost. Answers are cached per resource, as a
    RabbitMQ channel caches them; the broker drops the cache when permissions change."""

    __slots__ = ("user", "vhost", "permission", "unrestricted", "_cache")

    def __init__(self, user: str, vhost: str, permission: Permission | None):
        self.user = user
        self.vhost = vhost
        self.update(permission)

    def update(self, permission: Permission | None) -> None:
        self.permission = permission
        self.unrestricted = permission is not None and permission.unrestricted
        self._cache: dict[tuple[str, str, str], bool] = {}

    def check(self, what: str, kind: str, name: str, method=None) -> None:
        if self.unrestricted:
            return
        if kind == "exchange" and name == "":
            name = DEFAULT_EXCHANGE
        key = (what, kind, name)
        allowed = self._cache.get(key)
        if allowed is None:
            allowed = self.permission is not None and self.permission.allows(what, name)
            if len(self._cache) > 1000:
                self._cache.clear()
            self._cache[key] = allowed
        if not allowed:
            index = getattr(method, "index", 0) or 0
            raise AMQPError(ReplyCode.ACCESS_REFUSED,
                            f"access to {kind} '{name}' in vhost '{self.vhost}' refused for user '{self.user}'",
                            index >> 16, index & 0xFFFF)


def vhost_refused(user: str, vhost: str) -> AMQPError:
    return AMQPError(ReplyCode.NOT_ALLOWED, f"access to vhost '{vhost}' refused for user '{user}'", 10, 40)
