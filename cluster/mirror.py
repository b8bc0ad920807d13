"""A mirrored queue's mirror side: the master's changes applied in order (MIR-2, MIR-5).

A `MirrorQueue` holds what the master holds: every message still in the
queue, in order, each flagged if it was ever delivered, so that on promotion
(MIR-4) delivered-but-unacked messages come back with redelivered=true. What
the master logs (persistent messages of a durable queue) the mirror logs too,
in its own store under the same queue id, and it acknowledges a sequence only
once those writes are fsynced.

The stream is fenced (MIR-5): it is taken only from the node the metadata
log names as the master, with the log's current epoch, and it stops being
acknowledged the moment the log moves on.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque

import structlog

from .remote_queue import message_from_pb
from .rpc import cluster_pb2 as pb

REMOVED_IDS = 10_000

ENQUEUE, DELIVER, REMOVE, REQUEUE = (pb.MirrorOp.ENQUEUE, pb.MirrorOp.DELIVER, pb.MirrorOp.REMOVE,
                                     pb.MirrorOp.REQUEUE)


class MirrorQueue:
    def __init__(self, vhost: str, name: str, store=None, store_id: int = 0):
        self.vhost = vhost
        self.name = name
        self.store = store if store_id else None
        self.store_id = store_id
        self.entries: dict[int, list] = {}   # key -> [Message, delivered, msg_id, expires], in key order
        self.stream = None                    # the stream now feeding it; an older one stops
        # publish ids of the messages removed lately (consumed, maybe before their publisher saw
        # the confirm): a publisher's node sends those again to a promoted mirror (issue 16)
        self.removed_ids: deque = deque(maxlen=REMOVED_IDS)

    def discard(self) -> None:
        """Forget every message (a reset, the queue deleted, or this node no longer a mirror)."""
        if self.store is not None:
            ids = [e[2] for e in self.entries.values() if e[2]]
            if ids:
                self.store.ack(self.store_id, ids)
        self.entries.clear()

    def apply(self, op) -> None:
        kind = op.kind
        entries = self.entries
        if kind == ENQUEUE:
            message = message_from_pb(op.message)
            msg_id = 0
            if self.store is not None and message.persistent:
                msg_id = self.store.enqueue(self.store_id, message.exchange_raw, message.routing_key_raw,
                                            message.props_raw, message.body, delivered=op.redelivered)
            old = entries.pop(op.key, None)      # a snapshot may repeat a message it already holds
            if old is not None and old[2]:
                self.store.ack(self.store_id, [old[2]])
            expires = time.monotonic() + op.ttl_left_ms / 1000.0 if op.ttl_left_ms else 0.0
            entries[op.key] = [message, op.redelivered, msg_id, expires]
            return
        if kind == REMOVE:
            ids = []
            for key in op.keys:
                entry = entries.pop(key, None)
                if entry is not None and entry[0].publish_id:
                    self.removed_ids.append(entry[0].publish_id)
                if entry is not None and entry[2]:
                    ids.append(entry[2])
            if ids:
                self.store.ack(self.store_id, ids)
            return
        for key in op.keys:     # DELIVER, REQUEUE: either way it counts as redelivered from now on
            entry = entries.get(key)
            if entry is not None and not entry[1]:
                entry[1] = True
                if entry[2] and kind == DELIVER:
                    self.store.deliver(self.store_id, entry[2])

    @property
    def message_count(self) -> int:
        return len(self.entries)

    def contents(self) -> list[tuple[int, object, bool, int, float]]:
        """(key, Message, delivered, msg_id, TTL deadline or 0), oldest first: what a promoted
        mirror starts from."""
        return [(key, *e) for key, e in sorted(self.entries.items())]


async def serve_mirror(mirroring, request_iterator, context):
    """The Mirror handler: apply batches, answer with the highest sequence safely applied."""
    log = structlog.get_logger("haremq.mirror").bind(node=mirroring.node)
    try:
        first = await request_iterator.__anext__()
    except StopAsyncIteration:
        return
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
            acks.put_nowait(seq)

    async def apply_batches():
        batch = first
        in_snapshot, next_seq = True, 0
        try:
            while True:
                if fenced():
                    acks.put_nowait("fenced: the metadata log has moved on")
                    return
                if batch.reset:
                    mirror.discard()
                    in_snapshot, next_seq = True, batch.base_seq + 1
                elif not in_snapshot and batch.first_seq != next_seq:
                    acks.put_nowait(f"out of order: expected {next_seq}, got {batch.first_seq}")
                    return
                for op in batch.ops:
                    mirror.apply(op)
                if in_snapshot:
                    in_snapshot = not batch.snapshot_done
                else:
                    next_seq += len(batch.ops)
                if not in_snapshot:
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

    task = asyncio.ensure_future(apply_batches())
    try:
        while True:
            item = await acks.get()
            while isinstance(item, int) and not acks.empty():   # only the latest sequence matters
                item = acks.get_nowait()
            if item is None:
                return
            if isinstance(item, str):
                yield pb.MirrorAck(error=item)
                return
            yield pb.MirrorAck(seq=item)
    finally:
        task.cancel()
        mirroring.probe(first.master)     # the master may be gone: find out now, not at the next ping
