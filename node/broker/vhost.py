"""A virtual host: its exchanges, queues and bindings, and the rules for changing them.

Every declare, bind and delete is checked here the way RabbitMQ checks it,
and refused with RabbitMQ's reply code and text, so a client's error
handling written against RabbitMQ behaves the same.
"""
from __future__ import annotations

import base64
import os
from typing import Callable

from ..protocol.replies import AMQPError, ReplyCode
from . import deadletter
from .exchange import BindingArgumentError, Exchange, ExchangeType, route
from .deduplication import check_args as check_dedup_args
from .expiry import MAX_TTL_MS
from .policy import Policy, winning
from .priority import MAX_PRIORITY
from .queue import OVERFLOWS, Queue, _field_type, is_quorum

PREDECLARED = (
    ("", ExchangeType.DIRECT),
    ("amq.direct", ExchangeType.DIRECT),
    ("amq.fanout", ExchangeType.FANOUT),
    ("amq.topic", ExchangeType.TOPIC),
    ("amq.headers", ExchangeType.HEADERS),
    ("amq.match", ExchangeType.HEADERS),
    ("amq.rabbitmq.trace", ExchangeType.TOPIC),
)
EXCHANGE_ARGS_CHECKED = ("alternate-exchange",)
# the queue_arguments of RabbitMQ 3.10's queue types: each type checks its own on redeclare and
# refuses the others' (rabbit_amqqueue:check_declare_arguments)
QUORUM_ARGS = ("x-dead-letter-exchange", "x-dead-letter-routing-key", "x-dead-letter-strategy", "x-expires",
               "x-max-length", "x-max-length-bytes", "x-max-in-memory-length", "x-max-in-memory-bytes",
               "x-overflow", "x-single-active-consumer", "x-queue-type", "x-quorum-initial-group-size",
               "x-delivery-limit", "x-message-ttl", "x-queue-leader-locator", "x-consumer-timeout")
CLASSIC_ARGS = ("x-expires", "x-message-ttl", "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-max-length",
                "x-max-length-bytes", "x-max-priority", "x-overflow", "x-queue-mode", "x-queue-version",
                "x-single-active-consumer", "x-queue-type", "x-queue-master-locator",
                "x-delivery-limit",     # HareMQ's own: x-delivery-limit on every queue (README)
                "x-consumer-timeout")   # RabbitMQ 3.12's
STREAM_ARGS = ("x-max-length-bytes", "x-queue-type", "x-max-age", "x-stream-max-segment-size-bytes",
               "x-initial-cluster-size", "x-queue-leader-locator")
TYPE_ARGS = {"classic": CLASSIC_ARGS, "quorum": QUORUM_ARGS}
ANY_TYPE_ARGS = frozenset(QUORUM_ARGS + CLASSIC_ARGS + STREAM_ARGS)
LEADER_LOCATORS = ("client-local", "balanced", "random", "least-leaders")
QUEUE_ARGS_CHECKED = ("x-message-ttl", "x-expires", "x-max-length", "x-max-length-bytes", "x-overflow",
                      "x-dead-letter-exchange", "x-dead-letter-routing-key", "x-max-priority",
                      "x-single-active-consumer", "x-queue-type", "x-queue-mode", "x-delivery-limit",
                      "x-dead-letter-strategy")


def server_name(prefix: str) -> str:
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class Persistence:
    """What a vhost needs from the node's store: each change to a durable exchange, queue or
    binding, as it happens (node/broker/broker.py logs it); the default keeps nothing."""

    store = None

    def exchange_saved(self, vhost: "VHost", exchange: Exchange) -> None:
        """A durable exchange was declared."""

    def exchange_removed(self, vhost: "VHost", exchange: Exchange) -> None:
        """A durable exchange went, and every binding from or to it with it."""

    def queue_saved(self, vhost: "VHost", queue: Queue) -> None:
        """A durable queue was declared."""

    def queue_removed(self, vhost: "VHost", queue: Queue) -> None:
        """A durable queue went, and every binding to it with it."""

    def binding_changed(self, vhost: "VHost", source: Exchange, destination, routing_key: str, arguments: dict,
                        added: bool) -> None:
        """A binding between a durable exchange and a durable queue or exchange was added or removed."""

    def new_queue_id(self) -> int:
        return 0

    def queue_unused(self, vhost: "VHost", queue: Queue) -> None:
        vhost.remove_queue(queue)


class VHost:
    def __init__(self, name: str, persistence: Persistence | None = None):
        self.name = name
        self.persistence = persistence or Persistence()
        self.exchanges: dict[str, Exchange] = {}
        self.queues: dict[str, Queue] = {}
        self.policies: dict[str, Policy] = {}
        self._headers_exchanges: list[Exchange] = []
        self.on_queue_deleted: Callable[[Queue], None] | None = None
        self._dead_letter_workers: dict[Queue, deadletter.DeadLetterWorker] = {}   # at-least-once
        # one bound method each, handed to every queue: one per queue was one more object for the
        # garbage collector's full pass to walk, which at 100,000 queues stops the node a second
        self._queue_unused = self._auto_delete_queue
        self._queue_dead_letter = self.dead_letter
        for xname, xtype in PREDECLARED:
            self._add_exchange(Exchange(xname, xtype, durable=True, internal=xname == "amq.rabbitmq.trace"))

    def _add_exchange(self, exchange: Exchange) -> None:
        self.exchanges[exchange.name] = exchange
        if exchange.type == ExchangeType.HEADERS:
            self._headers_exchanges.append(exchange)

    def _where(self, kind: str, name: str) -> str:
        return f"{kind} '{name}' in vhost '{self.name}'"

    # ---- exchanges ---------------------------------------------------------------------
    def exchange(self, name: str, method=None) -> Exchange:
        exchange = self.exchanges.get(name)
        if exchange is None:
            raise _err(ReplyCode.NOT_FOUND, f"no {self._where('exchange', name)}", method)
        return exchange

    def exchange_for_publish(self, name: str, method=None) -> Exchange:
        exchange = self.exchanges.get(name)
        if exchange is None:
            raise _err(ReplyCode.NOT_FOUND, f"no {self._where('exchange', name)}", method)
        if exchange.internal:
            raise _err(ReplyCode.ACCESS_REFUSED,
                       f"cannot publish to internal {self._where('exchange', name)}", method)
        return exchange

    def declare_exchange(self, name: str, type_: str, passive: bool, durable: bool, auto_delete: bool,
                         internal: bool, arguments: dict, method=None) -> Exchange:
        if name == "":
            raise _err(ReplyCode.ACCESS_REFUSED, "operation not permitted on the default exchange", method)
        existing = self.exchanges.get(name)
        if passive:
            if existing is None:
                raise _err(ReplyCode.NOT_FOUND, f"no {self._where('exchange', name)}", method)
            return existing
        try:
            xtype = ExchangeType(type_)
        except ValueError:
            raise _err(ReplyCode.COMMAND_INVALID, f"unknown exchange type '{type_}'", method) from None
        if existing is None:
            if name.startswith("amq."):
                raise _err(ReplyCode.ACCESS_REFUSED,
                           f"exchange name '{name}' contains reserved prefix 'amq.*'", method)
            exchange = Exchange(name, xtype, durable=durable, auto_delete=auto_delete, internal=internal,
                                arguments=dict(arguments or {}))
            self._add_exchange(exchange)
            if durable:
                self.persistence.exchange_saved(self, exchange)
            return exchange
        what = self._where("exchange", name)
        for field, received, current in (("type", xtype.value, existing.type.value),
                                         ("durable", durable, existing.durable),
                                         ("auto_delete", auto_delete, existing.auto_delete),
                                         ("internal", internal, existing.internal)):
            if received != current:
                raise _err(ReplyCode.PRECONDITION_FAILED,
                           f"inequivalent arg '{field}' for {what}: received '{_fmt(received)}' "
                           f"but current is '{_fmt(current)}'", method)
        _check_args(what, arguments or {}, existing.arguments, EXCHANGE_ARGS_CHECKED, method)
        return existing

    def delete_exchange(self, name: str, if_unused: bool, method=None) -> None:
        if name == "":
            raise _err(ReplyCode.ACCESS_REFUSED, "operation not permitted on the default exchange", method)
        if name.startswith("amq."):
            raise _err(ReplyCode.ACCESS_REFUSED,
                       f"deletion of system {self._where('exchange', name)} not allowed", method)
        exchange = self.exchanges.get(name)
        if exchange is None:
            return
        if if_unused and exchange.has_bindings():
            raise _err(ReplyCode.PRECONDITION_FAILED, f"{self._where('exchange', name)} in use", method)
        self._remove_exchange(exchange)

    def _remove_exchange(self, exchange: Exchange) -> None:
        del self.exchanges[exchange.name]
        if exchange.durable:
            self.persistence.exchange_removed(self, exchange)
        if exchange in self._headers_exchanges:
            self._headers_exchanges.remove(exchange)
        for source in list(self.exchanges.values()):
            if source.unbind_all(exchange):
                self._maybe_auto_delete(source)

    def _maybe_auto_delete(self, exchange: Exchange) -> None:
        if exchange.auto_delete and not exchange.has_bindings() and self.exchanges.get(exchange.name) is exchange:
            self._remove_exchange(exchange)

    # ---- bindings ----------------------------------------------------------------------
    def _binding_source(self, name: str, method) -> Exchange:
        if name == "":
            raise _err(ReplyCode.ACCESS_REFUSED, "operation not permitted on the default exchange", method)
        return self.exchange(name, method)

    def _bind(self, source: Exchange, destination, routing_key: str, arguments: dict, method) -> None:
        try:
            added = source.bind(destination, routing_key, arguments or {})
        except BindingArgumentError as exc:
            raise _err(ReplyCode.PRECONDITION_FAILED, str(exc), method) from None
        if added:
            self._binding_changed(source, destination, routing_key, arguments, True)

    def _binding_changed(self, source: Exchange, destination, routing_key: str, arguments: dict,
                         added: bool) -> None:
        if source.durable and is_durable(destination):
            self.persistence.binding_changed(self, source, destination, routing_key, arguments or {}, added)

    def bind_queue(self, queue: Queue, exchange_name: str, routing_key: str, arguments: dict, method=None):
        self._bind(self._binding_source(exchange_name, method), queue, routing_key, arguments, method)

    def unbind_queue(self, queue: Queue, exchange_name: str, routing_key: str, arguments: dict, method=None):
        exchange = self._binding_source(exchange_name, method)
        if exchange.unbind(queue, routing_key, arguments or {}):
            self._binding_changed(exchange, queue, routing_key, arguments, False)
            self._maybe_auto_delete(exchange)

    def bind_exchange(self, destination: str, source: str, routing_key: str, arguments: dict, method=None):
        src = self._binding_source(source, method)
        dst = self._binding_source(destination, method)
        self._bind(src, dst, routing_key, arguments, method)

    def unbind_exchange(self, destination: str, source: str, routing_key: str, arguments: dict, method=None):
        """As RabbitMQ: unbinding from or to an exchange that is gone is unbind-ok (an auto-delete
        source may have gone with its last binding, e.g. when its destination was deleted)."""
        for name in (source, destination):
            if name == "":
                raise _err(ReplyCode.ACCESS_REFUSED, "operation not permitted on the default exchange", method)
        src, dst = self.exchanges.get(source), self.exchanges.get(destination)
        if src is None or dst is None:
            return
        if src.unbind(dst, routing_key, arguments or {}):
            self._binding_changed(src, dst, routing_key, arguments, False)
            self._maybe_auto_delete(src)

    # ---- routing -------------------------------------------------------------------------
    def needs_headers(self) -> bool:
        return any(x.has_bindings() for x in self._headers_exchanges)

    def route(self, exchange: Exchange, routing_key: str, headers: dict | None) -> list[Queue]:
        if exchange.name == "":
            queue = self.queues.get(routing_key)
            return [queue] if queue is not None else []
        return route(exchange, routing_key, headers, self.exchanges.get)

    # ---- queues --------------------------------------------------------------------------
    def queue(self, name: str, owner=None, method=None) -> Queue:
        """Look a queue up for use by `owner` (a connection): 404 if missing, 405 if exclusive to another."""
        queue = self.queues.get(name)
        if queue is None:
            raise _err(ReplyCode.NOT_FOUND, f"no {self._where('queue', name)}", method)
        if not owned_by(queue, owner):
            raise self._locked(name, method)
        return queue

    def _locked(self, name: str, method) -> AMQPError:
        return _err(ReplyCode.RESOURCE_LOCKED,
                    f"cannot obtain exclusive access to locked {self._where('queue', name)}. It could be "
                    "originally declared on another connection or the exclusive property value does not "
                    "match that of the original declaration.", method)

    def declare_queue(self, name: str, passive: bool, durable: bool, exclusive: bool, auto_delete: bool,
                      arguments: dict, owner, method=None, server_named: bool = False,
                      store_id: int | None = None) -> Queue:
        if passive:
            queue = self.queue(name, owner, method)
            queue.touch()          # a declare renews x-expires, as in RabbitMQ
            return queue
        if name == "":
            name = server_name("amq.gen-")
        elif name.startswith("amq.") and not server_named:
            raise _err(ReplyCode.ACCESS_REFUSED, f"queue name '{name}' contains reserved prefix 'amq.*'", method)
        arguments = dict(arguments or {})
        existing = self.queues.get(name)
        if existing is not None:
            if not owned_by(existing, owner):
                raise self._locked(name, method)
            what = self._where("queue", name)
            for field, received, current in (("durable", durable, existing.durable),
                                             ("auto_delete", auto_delete, existing.auto_delete),
                                             ("exclusive", exclusive, existing.exclusive_owner is not None)):
                if received != current:
                    if field == "exclusive":
                        raise self._locked(name, method)
                    raise _err(ReplyCode.PRECONDITION_FAILED,
                               f"inequivalent arg '{field}' for {what}: received '{_fmt(received)}' "
                               f"but current is '{_fmt(current)}'", method)
            checked = QUORUM_ARGS if is_quorum(existing.arguments) else QUEUE_ARGS_CHECKED
            _check_args(what, arguments, existing.arguments, checked, method)
            existing.touch()
            return existing
        _validate_queue_args(self._where("queue", name), arguments, method, durable, exclusive, auto_delete)
        logged = durable and not exclusive
        if store_id is None:
            store_id = self.persistence.new_queue_id() if logged else 0
        try:
            queue = self.add_queue(name, durable, owner if exclusive else None, auto_delete, arguments, store_id)
        except AMQPError as err:
            raise _err(err.code, err.text.split(" - ", 1)[-1], method) from None
        if logged:
            self.persistence.queue_saved(self, queue)
        return queue

    def validate_new_queue(self, name: str, arguments: dict, durable: bool, exclusive: bool, auto_delete: bool,
                           method=None) -> None:
        """The checks a new queue's declaration must pass (for a queue homed on another node)."""
        _validate_queue_args(self._where("queue", name), dict(arguments or {}), method, durable, exclusive,
                             auto_delete)

    def add_queue(self, name: str, durable: bool, owner, auto_delete: bool, arguments: dict,
                  store_id: int) -> Queue:
        queue = Queue(name, self.name, durable=durable, exclusive_owner=owner, auto_delete=auto_delete,
                      arguments=arguments, on_unused=self._queue_unused,
                      store=self.persistence.store if store_id else None, store_id=store_id)
        queue.set_dead_letter_handler(self._queue_dead_letter)
        self.queues[name] = queue
        definition = self.policy_definition(name)
        if definition is not None:
            queue.apply_policy(definition)
        queue.touch()
        return queue

    def policy_definition(self, queue_name: str) -> dict | None:
        """The definition of the policy that wins for this queue name, if any."""
        policy = winning(self.policies.values(), "queue", queue_name)
        return policy.definition if policy is not None else None

    def apply_policies(self) -> None:
        """The vhost's policies changed: give every queue the definition that now wins."""
        for queue in list(self.queues.values()):
            queue.apply_policy(self.policy_definition(queue.name))

    def dead_letter(self, queue: Queue, messages: list, reason: str, held: list | None = None) -> None:
        """Republish messages a queue lets go (rejected, maxlen, expired, delivery_limit) to its
        dead-letter exchange, with x-death as RabbitMQ writes it (node/broker/deadletter.py). With
        `held` (the entries, at-least-once) the queue keeps them until every target has them."""
        if held is None:
            deadletter.at_most_once(self, queue, messages, reason)
            return
        worker = self._dead_letter_workers.get(queue)
        if worker is None:
            worker = self._dead_letter_workers[queue] = deadletter.DeadLetterWorker(self, queue,
                                                                                    self._dead_letter_idle)
        worker.take(held, reason)

    def _dead_letter_idle(self, worker: deadletter.DeadLetterWorker) -> None:
        if self._dead_letter_workers.get(worker.queue) is worker:
            del self._dead_letter_workers[worker.queue]

    def _auto_delete_queue(self, queue: Queue) -> None:
        """auto-delete (last consumer gone) or x-expires: the queue goes, cluster-wide if clustered."""
        if self.queues.get(queue.name) is queue:
            self.persistence.queue_unused(self, queue)

    def delete_queue(self, name: str, if_unused: bool, if_empty: bool, owner, method=None) -> int:
        queue = self.queues.get(name)
        if queue is None:
            return 0
        self.check_delete(queue, if_unused, if_empty, owner, queue.message_count, queue.consumer_count, method)
        count = queue.message_count
        self.remove_queue(queue)
        return count

    def check_delete(self, queue, if_unused: bool, if_empty: bool, owner, messages: int, consumers: int,
                     method=None) -> None:
        """queue.delete's preconditions, with the counts of the queue's home node."""
        if not owned_by(queue, owner):
            raise self._locked(queue.name, method)
        if if_unused and consumers:
            raise _err(ReplyCode.PRECONDITION_FAILED, f"{self._where('queue', queue.name)} in use", method)
        if if_empty and messages:
            raise _err(ReplyCode.PRECONDITION_FAILED, f"{self._where('queue', queue.name)} not empty", method)

    def rebind(self, old, new) -> None:
        """A queue's handle changed (its master moved): its bindings follow."""
        for exchange in self.exchanges.values():
            for destination, key, arguments in exchange.bindings():
                if destination is old:
                    exchange.unbind(old, key, arguments)
                    exchange.bind(new, key, arguments)

    def remove_queue(self, queue: Queue) -> None:
        """Delete a queue: drop its bindings, tell its consumers, forget its messages."""
        self.queues.pop(queue.name, None)
        if queue.store is not None:
            self.persistence.queue_removed(self, queue)
        for exchange in list(self.exchanges.values()):
            if exchange.unbind_all(queue):
                self._maybe_auto_delete(exchange)
        consumers = queue.mark_deleted()
        worker = self._dead_letter_workers.get(queue)
        if worker is not None:
            worker.stop()
        for consumer in consumers:
            consumer.channel.consumer_cancelled_by_broker(consumer)
        if self.on_queue_deleted is not None:
            self.on_queue_deleted(queue)


def owned_by(queue, owner) -> bool:
    """May `owner` (a connection) use this queue? Exclusive queues belong to one connection,
    known by object here and by key across the cluster."""
    held = queue.exclusive_owner
    if held is None or held is owner:
        return True
    key = getattr(held, "key", None)
    return key is not None and key == getattr(owner, "key", None)


def is_durable(destination) -> bool:
    if isinstance(destination, Exchange):
        return destination.durable
    return destination.store is not None


def _err(code: ReplyCode, text: str, method) -> AMQPError:
    index = getattr(method, "index", 0) or 0
    return AMQPError(code, text, index >> 16, index & 0xFFFF)


def _check_args(what: str, received: dict, current: dict, checked, method) -> None:
    for key in checked:
        new, old = received.get(key), current.get(key)
        if isinstance(new, bytes):
            new = new.decode()
        if isinstance(old, bytes):
            old = old.decode()
        if new != old:
            if key == "x-queue-type" and {new, old} == {None, "classic"}:
                continue        # a classic queue may or may not say so (rabbit_misc)
            if new is None or old is None:      # rabbit_misc:val/1 names the type then
                got, cur = (_typed(v) for v in (new, old))
            else:
                got, cur = f"'{_fmt(new)}'", f"'{_fmt(old)}'"
            raise _err(ReplyCode.PRECONDITION_FAILED,
                       f"inequivalent arg '{key}' for {what}: received {got} but current is {cur}", method)


def _typed(value) -> str:
    return "none" if value is None else f"the value '{_fmt(value)}' of type '{_field_type(value)}'"


def _validate_queue_type(what: str, arguments: dict, method) -> str:
    """x-queue-type. "quorum" is a queue replicated with no policy (cluster/mirroring/policy.py), with a quorum
    queue's declaration rules so that clients written for RabbitMQ see the same answers;
    streams are not supported."""
    kind = arguments.get("x-queue-type")
    if kind is None:
        kind = "classic"
    if isinstance(kind, bytes):
        kind = kind.decode()
    if not isinstance(kind, str):
        raise _err(ReplyCode.PRECONDITION_FAILED, f"invalid arg 'x-queue-type' for {what}: "
                   f"{{unacceptable_type,{_field_type(kind)}}}", method)
    if kind not in ("classic", "quorum"):
        raise _err(ReplyCode.PRECONDITION_FAILED,
                   f"invalid arg 'x-queue-type' for {what}: \"unsupported queue type '{kind}'\"", method)
    return kind


def _validate_queue_kind(what: str, kind: str, arguments: dict, method, durable: bool, exclusive: bool,
                         auto_delete: bool) -> None:
    """After the values: another type's arguments are refused (unknown ones pass), then a quorum
    queue's properties, in RabbitMQ's order and with its texts."""
    for key in arguments:
        if key in ANY_TYPE_ARGS and key not in TYPE_ARGS[kind]:
            raise _err(ReplyCode.PRECONDITION_FAILED,
                       f"invalid arg '{key}' for {what} of queue type rabbit_{kind}_queue", method)
    if kind == "quorum":
        for broken, prop in ((not durable, "non-durable"), (exclusive, "exclusive-owner"),
                             (auto_delete, "auto-delete")):
            if broken:
                raise _err(ReplyCode.PRECONDITION_FAILED, f"invalid property '{prop}' for {what}", method)


def _validate_queue_args(what: str, arguments: dict, method, durable: bool, exclusive: bool,
                         auto_delete: bool) -> None:
    """rabbit_amqqueue:declare_args/0, with RabbitMQ's texts."""
    kind = _validate_queue_type(what, arguments, method)
    own = TYPE_ARGS[kind]     # only the queue type's own arguments have their values checked
    for key in ("x-max-length", "x-max-length-bytes", "x-message-ttl", "x-expires", "x-max-priority",
                "x-delivery-limit", "x-quorum-initial-group-size", "x-max-in-memory-length", "x-max-in-memory-bytes",
                "x-consumer-timeout"):
        value = arguments.get(key)
        if value is None or key not in own:
            continue
        problem = None
        if isinstance(value, bool) or not isinstance(value, int):
            problem = f'"expected integer, got {_field_type(value)}"'
        elif value < 0:
            problem = f"{{value_negative,{value}}}"
        elif key in ("x-expires", "x-quorum-initial-group-size") and value == 0:
            problem = f"{{value_zero,{value}}}"
        elif key in ("x-message-ttl", "x-expires") and value > MAX_TTL_MS:
            problem = f"{{value_too_large,{value}}}"
        elif key == "x-max-priority" and value > MAX_PRIORITY:
            problem = f"{{max_value_exceeded,{value}}}"
        if problem is not None:
            raise _err(ReplyCode.PRECONDITION_FAILED, f"invalid arg '{key}' for {what}: {problem}", method)
    sac = arguments.get("x-single-active-consumer")
    if sac is not None and not isinstance(sac, bool):
        raise _err(ReplyCode.PRECONDITION_FAILED, f"invalid arg 'x-single-active-consumer' for {what}: "
                   f"{{unacceptable_type,{_field_type(sac)}}}", method)
    dlx = arguments.get("x-dead-letter-exchange")
    if dlx is not None and not isinstance(dlx, (str, bytes)):
        raise _err(ReplyCode.PRECONDITION_FAILED, f"invalid type '{_field_type(dlx)}' for arg "
                   f"'x-dead-letter-exchange' in {what}", method)
    if arguments.get("x-dead-letter-routing-key") is not None and dlx is None:
        raise _err(ReplyCode.PRECONDITION_FAILED, f"invalid arg 'x-dead-letter-routing-key' for {what}: "
                   "routing_key_but_no_dlx_defined", method)
    strategy = arguments.get("x-dead-letter-strategy")
    if strategy is not None and "x-dead-letter-strategy" in own:
        if not isinstance(strategy, (str, bytes)):
            raise _err(ReplyCode.PRECONDITION_FAILED, f"invalid arg 'x-dead-letter-strategy' for {what}: "
                       f"{{unacceptable_type,{_field_type(strategy)}}}", method)
        if (strategy.decode() if isinstance(strategy, bytes) else strategy) not in deadletter.STRATEGIES:
            raise _err(ReplyCode.PRECONDITION_FAILED,
                       f"invalid arg 'x-dead-letter-strategy' for {what}: invalid_dlx_strategy", method)
    refused = check_dedup_args(arguments)
    if refused is not None:
        raise _err(ReplyCode.PRECONDITION_FAILED, f"invalid arg '{refused[0]}' for {what}: {refused[1]}", method)
    overflow = arguments.get("x-overflow")
    if isinstance(overflow, bytes):
        overflow = overflow.decode()
    if overflow is not None and overflow not in OVERFLOWS:
        raise _err(ReplyCode.PRECONDITION_FAILED, f"invalid arg 'x-overflow' for {what}: invalid_overflow", method)
    locator = arguments.get("x-queue-leader-locator")
    if locator is not None and "x-queue-leader-locator" in own:
        if not isinstance(locator, (str, bytes)):
            raise _err(ReplyCode.PRECONDITION_FAILED, f"invalid arg 'x-queue-leader-locator' for {what}: "
                       f"{{unacceptable_type,{_field_type(locator)}}}", method)
        if (locator.decode() if isinstance(locator, bytes) else locator) not in LEADER_LOCATORS:
            raise _err(ReplyCode.PRECONDITION_FAILED,
                       f"invalid arg 'x-queue-leader-locator' for {what}: invalid_queue_locator_arg", method)
    _validate_queue_kind(what, kind, arguments, method, durable, exclusive, auto_delete)
