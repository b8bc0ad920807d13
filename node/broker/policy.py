"""Policies (PUB-4): queue features set from outside the declaring client.

A policy has a name, a regex pattern matched against queue (and exchange)
names in its vhost, what it applies to (`queues`, `exchanges`, `all`), a
priority and a definition such as `{"message-ttl": 60000,
"dead-letter-exchange": "dlx"}`. Of the policies matching a queue, the one
with the highest priority applies. Where a queue has both the `x-` argument
and the policy key, RabbitMQ's rule decides (rabbit_amqqueue_process,
`process_args_policy`): the lower of the two for `expires`, `message-ttl`,
`max-length`, `max-length-bytes`, `delivery-limit` and `consumer-timeout`; the queue's own
argument for `dead-letter-exchange`, `dead-letter-routing-key`,
`dead-letter-strategy` and `overflow` (and for the deduplication keys `message-deduplication`,
`cache-size` and `cache-ttl`).

Pure data: the vhost keeps its policies and calls `Queue.apply_policy` with
the winning definition whenever a queue is declared or the policies change.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

# policy key -> how a queue argument and the policy value combine
_MIN = "min"
_ARG = "arg"
QUEUE_KEYS = {
    "message-ttl": _MIN,
    "expires": _MIN,
    "max-length": _MIN,
    "max-length-bytes": _MIN,
    "delivery-limit": _MIN,
    "consumer-timeout": _MIN,
    "overflow": _ARG,
    "dead-letter-exchange": _ARG,
    "dead-letter-routing-key": _ARG,
    "dead-letter-strategy": _ARG,      # quorum queues: node/broker/deadletter.py
    "message-deduplication": _ARG,     # node/broker/deduplication.py
    "cache-size": _ARG,
    "cache-ttl": _ARG,
}
EXCHANGE_KEYS = {"alternate-exchange"}
# keys RabbitMQ accepts that belong to features HareMQ handles elsewhere (mirroring) or not at all
OTHER_KEYS = {"ha-mode", "ha-params", "ha-sync-mode", "ha-promote-on-shutdown", "ha-promote-on-failure",
              "ha-min-in-sync-mirrors",
              "ha-sync-batch-size", "queue-mode", "queue-master-locator", "federation-upstream",
              "federation-upstream-set", "max-age", "stream-max-segment-size-bytes", "queue-version",
              "max-in-memory-length", "max-in-memory-bytes"}
APPLY_TO = ("all", "queues", "exchanges")
HA_MODES = ("all", "exactly", "nodes")
HA_SYNC_MODES = ("manual", "automatic")
HA_PROMOTE = ("when-synced", "always")
_INT_KEYS = {"message-ttl", "expires", "max-length", "max-length-bytes", "delivery-limit", "cache-size",
             "cache-ttl", "consumer-timeout"}


class PolicyError(ValueError):
    """A policy RabbitMQ would refuse; the text is RabbitMQ's validation message."""


@dataclass
class Policy:
    name: str
    pattern: str
    definition: dict
    priority: int = 0
    apply_to: str = "all"
    _regex: re.Pattern = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        self._regex = re.compile(self.pattern)

    def matches(self, kind: str, name: str) -> bool:
        if self.apply_to not in ("all", kind + "s"):
            return False
        return self._regex.search(name) is not None

    def as_json(self, vhost: str) -> dict:
        return {"vhost": vhost, "name": self.name, "pattern": self.pattern, "apply-to": self.apply_to,
                "definition": dict(self.definition), "priority": self.priority}


def validate(name: str, pattern: str, definition: dict, priority: int, apply_to: str) -> Policy:
    if apply_to not in APPLY_TO:
        raise PolicyError(f"Validation failed\n\n'{apply_to}' is not a valid apply-to value")
    if not isinstance(definition, dict) or not definition:
        raise PolicyError("Validation failed\n\nno policy definition given")
    unknown = [k for k in definition if k not in QUEUE_KEYS and k not in EXCHANGE_KEYS and k not in OTHER_KEYS]
    if unknown:
        raise PolicyError(f"Validation failed\n\n{unknown} are not recognised policy settings")
    for key in _INT_KEYS & definition.keys():
        value = definition[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0 or \
                (key in ("expires", "cache-size", "cache-ttl") and value == 0):
            raise PolicyError(f"Validation failed\n\n{key} must be a positive integer (got {value!r})")
    if not isinstance(definition.get("message-deduplication", False), bool):
        raise PolicyError("Validation failed\n\nmessage-deduplication must be a boolean "
                          f"(got {definition['message-deduplication']!r})")
    strategy = definition.get("dead-letter-strategy")
    if strategy is not None and strategy not in ("at-most-once", "at-least-once"):
        raise PolicyError(f"Validation failed\n\n{strategy!r} is not a valid dead letter strategy")
    overflow = definition.get("overflow")
    if overflow is not None and overflow not in ("drop-head", "reject-publish", "reject-publish-dlx"):
        raise PolicyError(f"Validation failed\n\n{overflow!r} is not a valid overflow value")
    try:
        validate_ha(definition)
    except ValueError as exc:
        raise PolicyError(f"Validation failed\n\n{exc}") from None
    try:
        return Policy(name, pattern, dict(definition), int(priority), apply_to)
    except re.error as exc:
        raise PolicyError(f"Validation failed\n\ninvalid pattern {pattern!r}: {exc}") from None


def validate_ha(definition: dict) -> None:
    """Mirroring keys (cluster/mirroring/policy.py places the mirrors): ValueError if they do not make sense."""
    mode = definition.get("ha-mode")
    params = definition.get("ha-params")
    if mode is None:
        if any(k.startswith("ha-") for k in definition):
            raise ValueError("ha-mode must be given with other ha-* keys")
        return
    if mode not in HA_MODES:
        raise ValueError(f"ha-mode {mode!r} is not one of {', '.join(HA_MODES)}")
    if mode == "all" and params is not None:
        raise ValueError("ha-params must not be given with ha-mode all")
    if mode == "exactly" and (isinstance(params, bool) or not isinstance(params, int) or params < 1):
        raise ValueError(f"ha-params must be a positive integer with ha-mode exactly (got {params!r})")
    if mode == "nodes" and (not isinstance(params, list) or not params
                            or not all(isinstance(n, str) for n in params)):
        raise ValueError(f"ha-params must be a list of node names with ha-mode nodes (got {params!r})")
    if definition.get("ha-sync-mode", "manual") not in HA_SYNC_MODES:
        raise ValueError(f"ha-sync-mode {definition['ha-sync-mode']!r} is not one of {', '.join(HA_SYNC_MODES)}")
    for key in ("ha-promote-on-failure", "ha-promote-on-shutdown"):
        if definition.get(key, "when-synced") not in HA_PROMOTE:
            raise ValueError(f"{key} {definition[key]!r} is not one of {', '.join(HA_PROMOTE)}")
    minimum = definition.get("ha-min-in-sync-mirrors", 0)
    if isinstance(minimum, bool) or not isinstance(minimum, int) or minimum < 0:
        raise ValueError(f"ha-min-in-sync-mirrors must be a non-negative integer (got {minimum!r})")


def winning(policies, kind: str, name: str) -> Policy | None:
    """The matching policy with the highest priority (None if no policy matches)."""
    best = None
    for policy in policies:
        if policy.matches(kind, name) and (best is None or policy.priority > best.priority):
            best = policy
    return best


def _text(value):
    return value.decode() if isinstance(value, (bytes, bytearray)) else value


def effective(arguments: dict, policy: dict, key: str):
    """A queue setting from its `x-` argument and its policy, combined as RabbitMQ does."""
    arg = _text(arguments.get("x-" + key))
    pol = policy.get(key) if policy else None
    if pol is None:
        return arg
    if arg is None:
        return pol
    return min(pol, arg) if QUEUE_KEYS[key] == _MIN else arg
