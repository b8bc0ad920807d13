"""A mirrored queue's mirror side: the master's changes applied in order (MIR-2, MIR-5).

A `MirrorQueue` holds what the master holds, in the same type: a `PagedQueue`
filled by position (the key the master gave each message), each message
flagged if it was ever delivered, so that on promotion (MIR-4) the copy becomes
the new master's queue as it is and delivered-but-unacked messages come back
with redelivered=true. The persistent messages of a durable queue are written
to this node's store under the same queue id and only their ids stay in
memory; a sequence is acknowledged only once those writes are fsynced.

The stream is fenced (MIR-5): it is taken only from the node the metadata
log names as the master, with the log's current epoch, and it stops being
acknowledged the moment the log moves on.
"""
from __future__ import annotations

import asyncio
from collections import deque

import structlog

from haremq.node.broker.deduplication import IdCache
from haremq.node.broker.expiry import monotonic
from haremq.node.broker.message import Message
from haremq.node.broker.paged_queue import PagedQueue
from haremq.node.tasks import TaskGroup

from haremq.cluster.links.codec import message_from_pb
from haremq.cluster.rpc import cluster_pb2 as pb

ENQUEUE, DELIVER, REMOVE, REQUEUE = (pb.MirrorOp.ENQUEUE, pb.MirrorOp.DELIVER, pb.MirrorOp.REMOVE,
                                     pb.MirrorOp.REQUEUE)


REMOVED_IDS = 100_000  # publish ids of messages removed lately, and of the newest ones, kept: as
                       # many as a publisher's node holds for a failover (remote_queue.HELD_MAX)
FILL_LIMIT = 100_000  # a reconcile lacking more than this asks for the whole queue instead
RESYNC = object()     # ack queue item: reconcile refused, the master sends a full snapshot


def _no_deadline(_message: Message, _at: float) -> float:
    return 0.0      # a copy is never restored from its store: its queue is rebuilt from the stream


class MirrorQueue:
    """A mirror's copy, a PagedQueue like the master's: the messages of a durable queue live in
    this node's store and only their ids are kept (transient ones in memory while nothing is
    paged out, up to HEAD_LIMIT, then logged as transient too); a non-durable queue's messages
    are held in memory, as on its master. Nothing is ever read back from the store here."""

    def __init__(self, vhost: str, name: str, store=None, store_id: int = 0, persist_all: bool = False,
                 max_priority: int | None = None):
        self.vhost = vhost
        self.name = name
        self.store = store if store_id else None
        self.store_id = store_id
        self.backing = PagedQueue(self.store, store_id, max_priority, persist_all, _no_deadline)
        self.stream = None                      # the stream now feeding it; an older one stops
        self.whole = False                      # holds a full snapshot and every op after it
        self.position = (0, 0)                  # (epoch, sequence) of the master's last op written durably
        # publish ids of the newest messages, and of those removed lately (consumed, maybe before
        # their publisher saw the confirm): a publisher's node sends those again to a promoted
        # mirror, which must not enqueue them twice
        self.recent_ids: dict[int, int] = {}    # key -> publish id, the newest REMOVED_IDS
        self.removed_ids: deque = deque(maxlen=REMOVED_IDS)
        # the master's deduplication ids: replaced at each reset, added to by ENQUEUE ops, kept in
        # this node's store under the queue's id like the master's, handed over on promotion
        self.dedup: IdCache | None = None

    def reset_ids(self, size: int, ids, seen) -> None:
        """A reset: the master's id cache as of the stream's base (size 0: it keeps none)."""
        self.resize_ids(size)
        if self.dedup is not None:
            entries = list(zip(ids, seen))
            self.dedup.replace(entries)
            if self.store is not None:
                self.store.save_ids(self.store_id, entries, True)

    def resize_ids(self, size: int) -> None:
        """The master's cache size, as every live batch says it (a policy may change it)."""
        cache = self.dedup
        if not size:
            if cache is not None:
                self.forget_ids()
        elif cache is None:
            self.dedup = IdCache(size)     # its TTL counts on the master and when promoted
            if self.store is not None:
                self.store.keep_ids(self.store_id, self.dedup)
        elif cache.size != size:
            cache.configure(size, None)

    def forget_ids(self) -> None:
        if self.dedup is not None and self.store is not None:
            self.store.forget_ids(self.store_id, self.dedup)
        self.dedup = None

    def close(self) -> None:
        """This node no longer mirrors the queue (deleted, or placed elsewhere)."""
        self.discard()
        self.forget_ids()

    def discard(self) -> None:
        """Forget every message (a reset, the queue deleted, or this node no longer a mirror)."""
        self.backing.purge()
        self.backing.next_seq = 1
        self.recent_ids.clear()
        self.whole = False

    def hand_over(self) -> tuple[PagedQueue, list]:
        """Promoted: the copy, to become the new master's queue as it is, and the deduplication
        ids, oldest first. The mirror keeps nothing, and a batch of its stream still in flight
        is fenced off (the stream is no longer this mirror's)."""
        backing = self.backing
        ids = self.dedup.entries() if self.dedup is not None else []
        self.backing = PagedQueue(None, 0, None, False, _no_deadline)
        self.store, self.stream, self.dedup, self.whole = None, None, None, False
        return backing, ids

    @property
    def last_key(self) -> int:
        """The newest key this copy was given (0: none since it started empty)."""
        return self.backing.next_seq - 1

    def reconcile(self, keep: set, delivered) -> list[int]:
        """A promoted master's keys against this copy, both of the same old master: what it does
        not hold is dropped (ops this mirror applied and the new master never saw), what it holds
        and this copy lacks is returned, to be filled in; delivered flags are added."""
        held = self.backing.positions()
        drop = held - keep
        if drop:
            for key in drop:
                self.recent_ids.pop(key, None)
            self.backing.remove_keys(sorted(drop))
        self.backing.flag_delivered(delivered)
        return sorted(keep - held)

    def apply(self, op) -> None:
        kind = op.kind
        if kind == ENQUEUE:
            self._enqueue(op)
        elif kind == REMOVE:
            recent = self.recent_ids
            if recent:
                for key in op.keys:
                    publish_id = recent.pop(key, 0)
                    if publish_id:
                        self.removed_ids.append(publish_id)
            self.backing.remove_keys(op.keys)
        else:       # DELIVER, REQUEUE: either way it counts as redelivered from now on
            self.backing.flag_delivered(op.keys)

    def _enqueue(self, op) -> None:
        key = op.key
        message = message_from_pb(op.message)
        seen = None
        if op.dedup_id and self.dedup is not None:
            seen = (op.dedup_id, op.dedup_seen_ms)
            self.dedup.add(*seen)
        expires = monotonic() + op.ttl_left_ms / 1000.0 if op.ttl_left_ms else 0.0
        self.backing.place(key, message, op.redelivered, expires, seen)
        if message.publish_id:
            recent = self.recent_ids
            recent[key] = message.publish_id
            if len(recent) > REMOVED_IDS:
                del recent[next(iter(recent))]

    @property
    def message_count(self) -> int:
        return self.backing.message_count


async def serve_mirror(mirroring, first, request_iterator, context):
    """The Mirror handler, given the stream's first batch and the rest: apply batches, answer
    with the highest sequence safely applied."""
    log = structlog.get_logger("haremq.mirror").bind(node=mirroring.node)
    refusal = mirroring.check_stream(first.vhost, first.queue, first.epoch, first.master)
    if refusal:
        yield pb.MirrorAck(error=refusal)
        return
    key = (first.vhost, first.queue)
    state = mirroring.states[key]
    mirror = mirroring.mirror_for(state)
    token = object()
    mirror.stream = token
    acks: asyncio.Queue = asyncio.Queue()

    def fenced() -> bool:
        return (mirror.stream is not token or mirroring.states.get(key) is not state
                or state.epoch != first.epoch or state.home != first.master)

    def ack(ok: bool, seq: int) -> None:
        if ok and not fenced():
            mirror.position = (first.epoch, seq)
            acks.put_nowait(seq)

    async def apply_batches():
        batch = first
        in_snapshot, next_seq = True, 0
        keep = None              # reconcile: the master's keys as they come
        awaiting_fill = False    # reconciled, lacking messages: nothing is acked until they come
        try:
            while True:
                if fenced():
                    acks.put_nowait("fenced: the metadata log has moved on")
                    return
                if batch.reset:
                    in_snapshot, next_seq, keep, awaiting_fill = True, batch.base_seq + 1, None, False
                    if batch.reconcile and mirror.whole:
                        keep = set()
                    else:
                        mirror.discard()
                        if batch.reconcile:
                            acks.put_nowait(RESYNC)
                            return
                    mirror.reset_ids(batch.dedup_size, batch.dedup_ids, batch.dedup_seen_ms)
                elif batch.fill:
                    for op in batch.ops:
                        mirror.apply(op)
                    awaiting_fill = False
                elif not in_snapshot and batch.first_seq != next_seq:
                    acks.put_nowait(f"out of order: expected {next_seq}, got {batch.first_seq}")
                    return
                elif not in_snapshot:
                    mirror.resize_ids(batch.dedup_size)
                if not batch.fill:
                    for op in batch.ops:
                        mirror.apply(op)
                if keep is not None:
                    keep.update(batch.keys)
                    keep.update(op.key for op in batch.ops)
                    if batch.delivered_keys:
                        mirror.apply(pb.MirrorOp(kind=DELIVER, keys=batch.delivered_keys))
                if in_snapshot:
                    in_snapshot = not batch.snapshot_done
                    if not in_snapshot:
                        mirror.whole = True
                        if keep is not None:
                            missing = mirror.reconcile(keep, ())
                            keep = None
                            log.info("reconciled with the new master", queue=first.queue, missing=len(missing))
                            if len(missing) > FILL_LIMIT:
                                mirror.discard()
                                acks.put_nowait(RESYNC)
                                return
                            if missing:
                                awaiting_fill = True
                                acks.put_nowait(("missing", missing))
                elif not batch.fill:
                    next_seq += len(batch.ops)
                if not in_snapshot and not awaiting_fill:
                    if mirror.store is not None:     # acked once its writes (and all before) are durable
                        mirror.store.when_durable(ack, next_seq - 1)
                    else:
                        ack(True, next_seq - 1)
                batch = await request_iterator.__anext__()
        except StopAsyncIteration:
            pass
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bad batch ends the stream, never the node
            log.error("mirror stream failed", queue=first.queue, error=repr(exc))
        finally:
            acks.put_nowait(None)

    stream = TaskGroup(f"mirror stream {first.vhost}/{first.queue} from {first.master}")   # applies batches
    stream.spawn(apply_batches())
    try:
        while True:
            item = await acks.get()
            while isinstance(item, int) and not acks.empty():   # only the latest sequence matters
                item = acks.get_nowait()
            if item is None:
                return
            if item is RESYNC:
                yield pb.MirrorAck(resync=True)
                return
            if isinstance(item, str):
                yield pb.MirrorAck(error=item)
                return
            if isinstance(item, tuple):
                yield pb.MirrorAck(missing=item[1])
                continue
            yield pb.MirrorAck(seq=item)
    finally:
        await stream.close()
        mirroring.probe(first.master)     # the master may be gone: find out now, not at the next ping
