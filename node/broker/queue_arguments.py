"""A queue's x- arguments: the type they declare and the checks RabbitMQ makes of them."""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import structlog

from ..protocol.replies import AMQPError, ReplyCode
from . import policy as pol

OVERFLOW_DROP_HEAD = "drop-head"
OVERFLOW_REJECT_PUBLISH = "reject-publish"
OVERFLOW_REJECT_PUBLISH_DLX = "reject-publish-dlx"
OVERFLOWS = (OVERFLOW_DROP_HEAD, OVERFLOW_REJECT_PUBLISH, OVERFLOW_REJECT_PUBLISH_DLX)

log = structlog.get_logger("haremq.queue")


def is_quorum(arguments: dict[str, Any] | None) -> bool:
    """Declared with x-queue-type quorum: replicated with no policy, every message persisted."""
    kind = (arguments or {}).get("x-queue-type")
    return (kind.decode() if isinstance(kind, bytes) else kind) == "quorum"


def field_type(value: object) -> str:
    """The AMQP field type a value was sent as, as RabbitMQ's messages name it."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "signedint"
    if isinstance(value, (str, bytes)):
        return "longstr"
    if isinstance(value, float):
        return "double"
    if isinstance(value, dict):
        return "table"
    if isinstance(value, list):
        return "array"
    return "void" if value is None else type(value).__name__


class Limits(NamedTuple):
    """A queue's effective settings, from its x- arguments and its policy (see policy.py)."""
    max_length: int | None
    max_length_bytes: int | None
    overflow: str
    ttl: Any
    expires: Any
    delivery_limit: Any
    dlx: Any
    dlx_routing_key: Any
    dead_letter_strategy: Any
    deduplication: tuple[Any, Any, Any]     # message-deduplication, cache-size, cache-ttl
    consumer_timeout: int | None            # ms (node/broker/consumer_timeout.py)


NO_LIMITS = Limits(None, None, OVERFLOW_DROP_HEAD, None, None, None, None, None, None, (None, None, None), None)
_KEYS = ("max-length", "max-length-bytes", "overflow", "message-ttl", "expires", "delivery-limit",
         "dead-letter-exchange", "dead-letter-routing-key", "dead-letter-strategy", "message-deduplication",
         "cache-size", "cache-ttl", "consumer-timeout")
_ARGUMENTS = frozenset("x-" + key for key in _KEYS)


def limits(arguments: dict[str, Any], policy: dict[str, Any]) -> Limits:
    """The settings in force. Most queues have neither such an argument nor a policy, and get
    NO_LIMITS at once: a node restarting with 100,000 queues builds every one."""
    if not policy and arguments.keys().isdisjoint(_ARGUMENTS):
        return NO_LIMITS
    got = {key: pol.effective(arguments, policy, key) for key in _KEYS}
    return Limits(int_arg({"x-max-length": got["max-length"]}, "x-max-length"),
                  int_arg({"x-max-length-bytes": got["max-length-bytes"]}, "x-max-length-bytes"),
                  got["overflow"] or OVERFLOW_DROP_HEAD, got["message-ttl"], got["expires"], got["delivery-limit"],
                  got["dead-letter-exchange"], got["dead-letter-routing-key"], got["dead-letter-strategy"],
                  (got["message-deduplication"], got["cache-size"], got["cache-ttl"]),
                  int_arg({"x-consumer-timeout": got["consumer-timeout"]}, "x-consumer-timeout"))


def int_arg(arguments: dict[str, Any], name: str) -> int | None:
    """A non-negative integer argument, or None; 406 for anything else."""
    value = arguments.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                        f"invalid arg '{name}' for queue: {value!r}", 50, 10)
    return value


def at_least_once(strategy: object, quorum: bool, dlx: object, overflow: str, described: Callable[[], str]) -> bool:
    """x-dead-letter-strategy at-least-once, as RabbitMQ 3.10 honours it: on a quorum queue with
    a dead-letter exchange and x-overflow reject-publish; else at-most-once, and it says why."""
    if strategy != "at-least-once" or not quorum:
        return False
    if dlx is None:
        log.warning(f"Disabling dead-lettering for {described()} despite configured "
                    f"dead-letter-strategy '{strategy}' because dead-letter-exchange is not configured.")
        return False
    if overflow != OVERFLOW_REJECT_PUBLISH:
        log.warning(f"Falling back to dead-letter-strategy at-most-once for {described()} because "
                    "configured dead-letter-strategy at-least-once is incompatible with effective overflow "
                    "strategy drop-head. To enable dead-letter-strategy at-least-once, set overflow "
                    "strategy to reject-publish.")
        return False
    return True

