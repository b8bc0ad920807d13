"""A mirror's copy is a PagedQueue filled by position, and a promotion hands it to the new
master's Queue as it is (MIR-2, MIR-4): messages placed at their keys (older ones among those
held), removed and flagged delivered anywhere, never read back from the store on the mirror; and
once taken over, the order, the redelivered flags, the TTL deadlines and a priority queue's
levels are as the old master had them. A real store in a temporary directory; no sockets."""
from __future__ import annotations

import asyncio

import pytest
from pamqp import commands

from haremq.cluster.mirroring.mirror import MirrorQueue
from haremq.cluster.mirroring.replicator import enqueue_op
from haremq.cluster.rpc import cluster_pb2 as pb
from haremq.node.broker.expiry import monotonic
from haremq.node.broker.message import Message
from haremq.node.broker.paged_queue import HEAD_LIMIT, PagedQueue
from haremq.node.broker.queue import Consumer, Queue
from haremq.node.protocol.properties import encode_properties
from haremq.node.store.store import MessageStore
from tests.test_backing_queue import Taker

STORE_ID = 7


def message(body: str, persistent: bool = True, priority: int | None = None) -> Message:
    props = commands.Basic.Properties(delivery_mode=2 if persistent else 1, priority=priority)
    return Message("", "q", encode_properties(props), body.encode(), persistent, priority)


def no_deadline(_message: Message, _at: float) -> float:
    return 0.0


def copy(store=None, max_priority=None) -> PagedQueue:
    return PagedQueue(store, STORE_ID if store is not None else 0, max_priority, False, no_deadline)


def held(queue: PagedQueue) -> list[int]:
    """Positions in memory, then paged out: the order the queue would serve them in."""
    return [entry.seq for entry in queue.ready] + list(queue.tail_keys)


def consume_all(queue: Queue) -> list:
    channel = Taker()
    queue.add_consumer(Consumer("c", channel, queue, False, False, 0, {}))
    return channel.got


def with_store(test):
    """Run `test(store)` on a running loop with a store in tmp_path, then close the store."""
    def run(tmp_path):
        async def main():
            store = MessageStore(tmp_path, "hare-test")
            store.open()
            try:
                await test(store)
            finally:
                await store.close()
        asyncio.run(main())
    run.__name__ = test.__name__
    run.__doc__ = test.__doc__
    return run


async def durable(store: MessageStore) -> None:
    done = asyncio.get_running_loop().create_future()
    store.when_durable(lambda ok: done.set_result(ok))
    assert await done


def never_read(monkeypatch, store: MessageStore) -> None:
    def read(msg_id):
        raise AssertionError(f"a mirror read message {msg_id} back from its store")
    monkeypatch.setattr(store, "read", read)


# ---- placing, removing and flagging by position ---------------------------------------------
def test_without_a_store_every_message_is_held_in_memory_at_its_key() -> None:
    queue = copy()
    for key in (1, 2, 4, 6):
        queue.place(key, message(str(key)), False, 0.0, None)
    queue.place(3, message("3"), True, 0.0, None)         # a fill: among those held
    queue.place(4, message("4 again"), False, 0.0, None)  # a snapshot repeating one: replaced
    assert held(queue) == [1, 2, 3, 4, 6] and queue.message_count == 5
    assert queue.entry_at(4).message.body == b"4 again" and queue.entry_at(3).redelivered
    queue.remove_keys([1, 4, 9])                           # head, middle, and one not held
    queue.flag_delivered([6, 9])
    assert held(queue) == [2, 3, 6] and [e.redelivered for e in queue.ready] == [False, True, True]
    assert queue.next_seq == 7 and queue.positions() == {2, 3, 6}
    assert queue.message_bytes == len(b"2") + len(b"3") + len(b"6")


def test_a_priority_copy_keeps_each_level_in_key_order() -> None:
    queue = copy(max_priority=5)
    for key, priority in ((1, 1), (2, 5), (4, 1), (5, 5)):
        queue.place(key, message(str(key), priority=priority), False, 0.0, None)
    queue.place(3, message("3", priority=1), False, 0.0, None)
    queue.remove_keys([5])
    queue.flag_delivered([4])
    assert [entry.seq for entry in queue.ready] == [2, 1, 3, 4]       # level 5 first, then level 1
    assert queue.entry_at(4).redelivered and queue.entry_at(5) is None


@with_store
async def test_a_durable_copy_keeps_persistent_messages_by_id_alone(store) -> None:
    """Transient messages are held in memory until something is paged out; persistent ones are
    only in the store, and a transient one after them is logged as transient, as the master's
    paging does. Nothing is read back."""
    queue = copy(store)
    with pytest.MonkeyPatch.context() as mp:
        never_read(mp, store)
        queue.place(1, message("t1", persistent=False), False, 0.0, None)
        queue.place(2, message("p2"), False, 0.0, None)
        queue.place(3, message("t3", persistent=False), False, 0.0, None)
        queue.place(4, message("p4"), False, 0.0, None)
        assert [entry.seq for entry in queue.ready] == [1] and list(queue.tail_keys) == [2, 3, 4]
        assert len(store.index) == 3
        queue.remove_keys([3])                 # in the middle of those paged out: acked
        queue.flag_delivered([4, 1])
        assert list(queue.tail_keys) == [2, 4] and len(store.index) == 2
        assert queue.ready[0].redelivered
    await durable(store)
    assert [store.read(msg_id)[4] for msg_id in queue.tail] == [False, True]


@with_store
async def test_an_older_message_placed_among_held_ones_pages_the_newer_out(store) -> None:
    """Every paged-out message stays newer than the head: a fill of an older persistent message
    logs the transient ones held past it (their delivered flags and deadlines kept)."""
    queue = copy(store)
    deadline = monotonic() + 60
    with pytest.MonkeyPatch.context() as mp:
        never_read(mp, store)
        queue.place(1, message("t1", persistent=False), False, 0.0, None)
        queue.place(3, message("t3", persistent=False), True, deadline, None)
        queue.place(4, message("t4", persistent=False), False, 0.0, None)
        queue.place(2, message("p2"), False, 0.0, None)
        assert [entry.seq for entry in queue.ready] == [1] and list(queue.tail_keys) == [2, 3, 4]
        assert queue.tail_deadline(queue.tail[1]) == deadline
    await durable(store)
    assert [store.read(msg_id)[3] for msg_id in queue.tail] == [b"p2", b"t3", b"t4"]
    assert [store.read(msg_id)[4] for msg_id in queue.tail] == [False, True, False]


@with_store
async def test_a_transient_message_past_the_in_memory_limit_is_paged_out(store) -> None:
    queue = copy(store)
    for key in range(1, HEAD_LIMIT + 3):
        queue.place(key, message(str(key), persistent=False), False, 0.0, None)
    assert len(queue.ready) == HEAD_LIMIT and list(queue.tail_keys) == [HEAD_LIMIT + 1, HEAD_LIMIT + 2]
    queue.remove_keys(range(HEAD_LIMIT + 2, 0, -2))       # many keys, any order: taken oldest first
    assert held(queue) == list(range(1, HEAD_LIMIT + 3, 2)) and len(store.index) == 1


# ---- the mirror's ops, and the promotion ---------------------------------------------------
def ops_for(mirror: MirrorQueue, ops) -> None:
    for op in ops:
        mirror.apply(op)


@with_store
async def test_a_promoted_copy_is_the_queue_as_the_master_had_it(store) -> None:
    """Handed over, not copied: order, redelivered flags, deadlines and bodies, held in memory or
    paged out on the mirror; the keys go on past the copy's."""
    mirror = MirrorQueue("/", "q", store, STORE_ID)
    later, soon = monotonic() + 600, 30_000
    with pytest.MonkeyPatch.context() as mp:
        never_read(mp, store)
        ops_for(mirror, [
            enqueue_op(1, message("t1", persistent=False), False, 0.0),
            enqueue_op(2, message("p2"), False, later),
            enqueue_op(3, message("t3", persistent=False), False, 0.0),
            enqueue_op(4, message("p4"), True, 0.0),              # from a snapshot: delivered before
            enqueue_op(5, message("p5"), False, 0.0),
            pb.MirrorOp(kind=pb.MirrorOp.DELIVER, keys=[1, 2]),
            pb.MirrorOp(kind=pb.MirrorOp.REMOVE, keys=[2]),       # acked
            pb.MirrorOp(kind=pb.MirrorOp.DELIVER, keys=[5]),
            pb.MirrorOp(kind=pb.MirrorOp.REQUEUE, keys=[5]),
            enqueue_op(6, message("p6"), False, monotonic() + soon / 1000),
        ])
    await durable(store)
    deadlines = {key: mirror.backing.entry_at(key).expires for key in (3, 6)}
    copied = mirror.backing
    queue = Queue("q", "/", durable=True, store=store, store_id=STORE_ID)
    backing, ids = mirror.hand_over()
    queue.take_over(backing, ids)
    assert queue.backing is copied and mirror.message_count == 0
    got = consume_all(queue)
    assert [(e.seq, e.message.body, e.redelivered) for e in got] == [
        (1, b"t1", True), (3, b"t3", False), (4, b"p4", True), (5, b"p5", True), (6, b"p6", False)]
    assert got[1].expires == deadlines[3] == 0.0 and got[4].expires == deadlines[6] > 0
    assert queue.next_seq == 7


@with_store
async def test_a_promoted_priority_copy_serves_by_priority(store) -> None:
    mirror = MirrorQueue("/", "q", store, STORE_ID, max_priority=5)
    ops_for(mirror, [enqueue_op(key, message(f"{key}/{priority}", persistent=key % 2 == 0, priority=priority),
                                False, 0.0)
                     for key, priority in enumerate([1, 5, 0, 3, 5, 1, 3], start=1)])
    mirror.apply(pb.MirrorOp(kind=pb.MirrorOp.REMOVE, keys=[4]))
    await durable(store)
    queue = Queue("q", "/", durable=True, arguments={"x-max-priority": 5}, store=store, store_id=STORE_ID)
    queue.take_over(*mirror.hand_over())
    assert [e.message.body for e in consume_all(queue)] == [b"2/5", b"5/5", b"7/3", b"1/1", b"6/1", b"3/0"]


@with_store
async def test_a_promoted_copy_waits_for_its_writes_before_it_serves_them(store) -> None:
    """A promotion right after the mirror's writes: the messages not yet durable are read in
    once they are, and a priority queue serves none until all of it is in memory."""
    mirror = MirrorQueue("/", "q", store, STORE_ID, max_priority=5)
    ops_for(mirror, [enqueue_op(1, message("low", priority=1), False, 0.0),
                     enqueue_op(2, message("high", priority=5), False, 0.0)])
    queue = Queue("q", "/", durable=True, arguments={"x-max-priority": 5}, store=store, store_id=STORE_ID)
    queue.take_over(*mirror.hand_over())
    got = consume_all(queue)
    await durable(store)
    assert [e.message.body for e in got] == [b"high", b"low"]


@with_store
async def test_a_policy_ttl_the_old_master_never_told_counts_from_the_promotion(store) -> None:
    mirror = MirrorQueue("/", "q", store, STORE_ID)
    kept = monotonic() + 5
    mirror.backing.place(1, message("gone", persistent=False), False, monotonic() - 1, None)
    ops_for(mirror, [enqueue_op(2, message("no deadline"), False, 0.0),
                     enqueue_op(3, message("its own"), False, kept)])
    await durable(store)
    queue = Queue("q", "/", durable=True, arguments={"x-message-ttl": 60_000}, store=store, store_id=STORE_ID)
    before = monotonic()
    queue.take_over(*mirror.hand_over())
    entries = {entry.seq: entry for entry in queue.backing.ready}
    assert set(entries) == {2, 3}                    # the head past its deadline is gone at once
    assert before + 60 <= entries[2].expires <= monotonic() + 60
    assert entries[3].expires == pytest.approx(kept, abs=0.01)


def test_a_reconcile_drops_what_the_new_master_lacks_and_names_what_it_misses() -> None:
    mirror = MirrorQueue("/", "q")
    ops_for(mirror, [enqueue_op(key, message(str(key), persistent=False), False, 0.0) for key in (1, 2, 3, 5)])
    assert mirror.reconcile({1, 3, 4, 5}, [3]) == [4]
    assert held(mirror.backing) == [1, 3, 5] and mirror.backing.entry_at(3).redelivered
    mirror.apply(pb.MirrorOp(kind=pb.MirrorOp.ENQUEUE, key=4, message=enqueue_op(4, message("4"), False, 0.0).message))
    assert held(mirror.backing) == [1, 3, 4, 5] and mirror.last_key == 5


def test_a_copy_of_another_shape_is_reshaped_for_its_queue() -> None:
    """A copy begun before the queue's arguments were known here keeps its messages and order."""
    queue = copy()
    for key, priority in ((1, 0), (2, 2), (3, 1)):
        queue.place(key, message(str(key), priority=priority), key == 3, 0.0, None)
    prioritised = queue.reshaped(2)
    assert prioritised.max_priority == 2 and queue.max_priority is None
    assert [(e.seq, e.redelivered) for e in prioritised.ready] == [(2, False), (3, True), (1, False)]
    assert [e.seq for e in prioritised.reshaped(None).ready] == [1, 2, 3]
    assert prioritised.message_bytes == 3 and prioritised.next_seq == 4


@with_store
async def test_a_priority_queue_publishing_while_its_copy_is_read_in_keeps_each_level_in_order(store) -> None:
    """Publishes to a priority queue just promoted stay in memory (they never wait behind the
    copy's writes), and the copy's messages are read in among them at their positions."""
    mirror = MirrorQueue("/", "q", store, STORE_ID, max_priority=5)
    ops_for(mirror, [enqueue_op(1, message("old low", priority=1), False, 0.0),
                     enqueue_op(2, message("old high", priority=5), False, 0.0)])
    queue = Queue("q", "/", durable=True, arguments={"x-max-priority": 5}, store=store, store_id=STORE_ID)
    queue.take_over(*mirror.hand_over())
    queue.publish(message("new high", persistent=False, priority=5))
    queue.publish(message("new low", persistent=False, priority=1))
    assert queue.paged_out == 2 and len(queue.backing.ready) == 2
    got = consume_all(queue)
    await durable(store)
    assert [e.message.body for e in got] == [b"old high", b"new high", b"old low", b"new low"]
