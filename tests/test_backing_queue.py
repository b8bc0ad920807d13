"""The backing-queue seam: the paged queue and the mirrored wrapper each have every member of
the port (node/broker/backing_queue.py), and the wrapper reports each change a queue makes to
its replicator, in the order and with the keys the mirrors expect (no sockets, no store)."""
from __future__ import annotations

import inspect

import pytest

from haremq.cluster.mirroring.mirrored_queue import MirroredQueue, mirror_queue, unmirror_queue
from haremq.node.broker.backing_queue import BackingQueue
from haremq.node.broker.message import Message
from haremq.node.broker.paged_queue import LOGGED, SAFE, PagedQueue
from haremq.node.broker.queue import Consumer, Queue

MISSING = object()


@pytest.mark.parametrize("cls", [PagedQueue, MirroredQueue])
def test_an_implementation_has_every_member_of_the_port(cls: type) -> None:
    for name, wanted in vars(BackingQueue).items():
        if not (inspect.isfunction(wanted) or isinstance(wanted, property)):
            continue
        found = inspect.getattr_static(cls, name, MISSING)
        if found is MISSING and isinstance(wanted, property):
            assert name in cls.__init__.__code__.co_names, f"{cls.__name__} lacks {name}"
            continue
        assert found is not MISSING, f"{cls.__name__} lacks {name}"
        if inspect.isfunction(wanted):
            assert callable(found) and not isinstance(found, property), f"{cls.__name__}.{name} is not a method"
    assert "next_seq" in BackingQueue.__annotations__


class Recorder:
    """What a Replicator hears from its master's queue, as (kind, keys)."""

    def __init__(self) -> None:
        self.ops: list[tuple[str, list[int]]] = []
        self.seq = 0
        self.queue: Queue | None = None

    def start(self, queue: Queue) -> None:
        self.queue = queue

    def enqueue(self, seq: int, message: Message, redelivered: bool, expires: float, seen: object = None) -> None:
        self.ops.append(("enqueue", [seq]))

    def deliver(self, entry) -> None:
        self.ops.append(("deliver", [entry.seq]))

    def remove(self, entries) -> None:
        keys = [e.seq for e in entries]
        if keys:
            self.ops.append(("remove", keys))

    def remove_keys(self, keys: list[int]) -> None:
        self.ops.append(("remove", list(keys)))

    def requeue(self, entries) -> None:
        self.ops.append(("requeue", [e.seq for e in entries]))

    def when_replicated(self, seq: int, ok: bool, fn, args) -> None:
        fn(ok, *args)


class Taker:
    """A consumer's channel that always has room."""

    closed = False

    def __init__(self) -> None:
        self.got: list = []

    def can_deliver(self) -> bool:
        return True

    def deliver(self, consumer, entry) -> None:
        consumer.unacked += 1
        self.got.append(entry)


def message(body: bytes) -> Message:
    return Message("", "q", b"\x00\x00", body)


def test_a_mirrored_master_reports_each_change_and_unwraps_unchanged() -> None:
    queue = Queue("q", "/")
    assert queue.publish(message(b"plain")) == SAFE
    recorder = Recorder()
    mirror_queue(queue, recorder)
    assert isinstance(queue.backing, MirroredQueue) and recorder.queue is queue
    assert queue.publish(message(b"a")) == LOGGED
    assert queue.publish(message(b"b")) == LOGGED
    channel = Taker()
    consumer = Consumer("c", channel, queue, False, False, 2, {})
    queue.add_consumer(consumer)
    assert [e.seq for e in channel.got] == [1, 2]
    queue.requeue([channel.got[1]])
    queue.settle([channel.got[0]])
    assert queue.purge() == 2
    assert recorder.ops == [("enqueue", [2]), ("enqueue", [3]), ("deliver", [1]), ("deliver", [2]),
                            ("requeue", [2]), ("remove", [1]), ("remove", [2, 3])]
    unmirror_queue(queue, recorder)
    assert isinstance(queue.backing, PagedQueue)
    assert queue.publish(message(b"c")) == SAFE
