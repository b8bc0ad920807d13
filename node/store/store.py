"""The message store of a node: an append-only segmented log with an in-memory index.

Loop side of the store. Records are appended to an in-memory batch at
offsets assigned here; one writer thread (see `writer.py`) writes and
syncs a batch while the next one fills (group commit, CONF-6): a lone
publisher waits for one sync and no timer, a busy node shares each sync
among every record that arrived meanwhile. A lone small batch (one
waiter, a few records) that finds the writer idle is written and synced
on the loop itself, which then waits for the disk only, not for a thread
hand-off each way. Any sync slower than INLINE_SLOW sends every batch to
the writer thread until a sync there is fast again, so a stalling disk
holds the loop once per stall at most: while the loop is held the node
answers nothing, its pings to the other members included, and a stall of
seconds would look like a dead node and cause a needless failover. The
worst case left is that one sync: a disk that stalls without warning,
just as a lone write is synced on the loop, holds the loop for as long
as that sync takes; a stall longer than the failure timeout (3 s by
default) then still looks like a dead node to the other members. Waiters
registered with `when_durable` run on the loop once everything appended
before them is on disk.

The index maps each live message id to where its ENQUEUE record lies, so a
queue can keep only ids for messages it has paged out and read them back
with `read`. A segment is removed once none of its messages is live and
every segment its ACK and DELIVER records refer to is gone (otherwise a
restart would bring acked messages back); the oldest segment is compacted
(its few live records copied to the head) when its live fraction is low.

Deduplication ids (see node/broker/deduplication.py) outlive their messages:
an ENQUEUE record carries its message's id, and recovery gathers every id in
the log, acked or not. Before a segment holding ids is removed, the store
writes a DEDUP_IDS record of every registered queue's ids as they stand
(`keep_ids`) in the same batch, ahead of the removal: a queue's ids are in
the log for as long as its cache holds them.

Reading the log back into the index at start is `recovery.py`.
"""
from __future__ import annotations

import asyncio
import bisect
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable

import structlog

from ..tasks import TaskGroup
from . import meta as meta_log
from . import records as rec
from .recovery import Recovered, StoreRecovery
from .recovery import segment_of as _segment_of
from .recovery import StoreError as StoreError     # what open() raises; callers import it from here
from .writer import Batch, SegmentWriter, segment_path

SEGMENT_SIZE = 64 << 20
COMPACT_LIVE_FRACTION = 0.5
COMPACT_INTERVAL = 5.0
RETRY_INTERVAL = 1.0
# a batch of at most this many records and bytes, with one waiter, may be synced on the loop
INLINE_RECORDS = 4
INLINE_BYTES = 64 << 10
INLINE_SLOW = 0.02         # a sync slower than this (seconds) sends every batch to the writer
                           # thread until one synced there is no slower than it
# upper bounds (seconds) of the group-commit time histogram
SYNC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


# Where a logged message lies, packed into one int (the index holds one per live message): the
# segment above 40 bits of offset, 32 of record length and the delivered flag (the lowest bit).
def _pack(segment: int, offset: int, length: int, delivered: bool) -> int:
    return (((segment << 40 | offset) << 32 | length) << 1) | (1 if delivered else 0)


def _unpack(loc: int) -> tuple[int, int, int, bool]:
    delivered = bool(loc & 1)
    loc >>= 1
    length = loc & 0xFFFFFFFF
    loc >>= 32
    return loc >> 40, loc & ((1 << 40) - 1), length, delivered


class MessageStore(StoreRecovery):
    def __init__(self, data_dir: Path, node: str = "", segment_size: int = SEGMENT_SIZE,
                 skip_corrupt: bool = False):
        self.directory = Path(data_dir) / "msgs"
        self.data_dir = Path(data_dir)
        self.node = node
        self.segment_size = segment_size
        self.skip_corrupt = skip_corrupt
        self.log = structlog.get_logger("haremq.store").bind(node=node)
        self.next_msg_id = 1
        self.segment = 1
        self.position = 0
        self.index: dict[int, int] = {}
        self.live: dict[int, int] = defaultdict(int)
        self.live_bytes: dict[int, int] = defaultdict(int)
        self.refs: dict[int, set[int]] = defaultdict(set)
        self.segments: set[int] = set()
        self.durable_upto = (1, 0)
        self.failed: OSError | None = None
        self.on_failure: Callable[[OSError | None], None] | None = None
        self.after_batch: Callable[[], None] | None = None   # the waiters of a batch have run
        self.stats = {"batches": 0, "fsyncs": 0, "records": 0, "bytes": 0, "sync_seconds": 0.0,
                      "compacted": 0, "segments_removed": 0, "synced_on_loop": 0}
        # group commits by how long their write and fsync took (SYNC_BUCKETS, then longer): /metrics
        self.sync_histogram = [0] * (len(SYNC_BUCKETS) + 1)
        self._pending: list[list] = []          # [[segment, offset, [chunks], size]]
        self._pending_waiters: list = []
        self._pending_meta: list[bytes] = []     # framed metadata change records
        self._meta_recovery: meta_log.Recovery | None = None
        self._snapshots: meta_log.Snapshotter | None = None
        self._pending_remove: list[int] = []
        self._inflight: list | None = None       # waiters of the batch being written
        self._retry: Batch | None = None
        self.written_upto = (1, 0)               # handed to the OS (survives a kill -9, not power loss)
        self._written_waiters: list = []
        self._inflight_end = (1, 0)
        self._kick_handle = None
        self._inline_ok = True                   # the last sync was fast: a lone batch may be synced inline
        self._pending_overlaps = False           # a waiter of the pending batch waits on more than it
        self._read_fds: dict[int, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._writer: SegmentWriter | None = None
        self.tasks = TaskGroup(f"store {node}")   # the periodic compaction
        # deduplication ids: each queue's cache (its `entries()` are written before a segment
        # holding ids goes), the segments holding ids, and the ids recovered at start
        self.id_caches: dict[int, object] = {}
        self.id_segments: set[int] = set()
        self.recovered_ids: dict[int, dict[bytes, int]] = {}
        self._closed = False

    # ---- lifetime ----------------------------------------------------------------------
    def open(self) -> Recovered:
        """Recover from disk (before serving; blocking is fine here) and start the writer."""
        self.directory.mkdir(parents=True, exist_ok=True)
        recovered = self._recover()
        self._loop = asyncio.get_running_loop()
        found = self._meta_recovery
        self._snapshots = meta_log.Snapshotter(self.data_dir, found, self.node)
        metadata = meta_log.MetaLog(self.data_dir, found.number, found.size, self._snapshots)
        self._meta_recovery = None
        self._writer = SegmentWriter(self.directory, self.segment_size, metadata,
                                     self._batch_done, self._loop, self._batch_written)
        self._snapshots.start()
        self._writer.start(self.segment, self.position)
        self.tasks.spawn(self._compact_periodically())
        return recovered

    async def close(self) -> None:
        if self._closed or self._writer is None:
            return
        self._closed = True
        await self.tasks.close()
        deadline = time.monotonic() + 10
        while (self._inflight is not None or self._pending or self._pending_meta) \
                and time.monotonic() < deadline:
            self._kick()
            await asyncio.sleep(0.005)
        await asyncio.to_thread(self._writer.stop)
        await asyncio.to_thread(self._snapshots.stop)
        self.log.info("store closed", **{k: round(v, 3) if isinstance(v, float) else v
                                          for k, v in self.stats.items()})
        for fd in self._read_fds.values():
            os.close(fd)
        self._read_fds.clear()

    # ---- appending -----------------------------------------------------------------------
    def _append(self, record: bytes) -> tuple[int, int]:
        size = len(record)
        if self.position and self.position + size > self.segment_size:
            self.segment += 1
            self.position = 0
        segment, offset = self.segment, self.position
        self.position += size
        self.segments.add(segment)
        pending = self._pending
        if pending and pending[-1][0] == segment:
            last = pending[-1]
            last[2].append(record)
            last[3] += size
        else:
            pending.append([segment, offset, [record], size])
        self.stats["records"] += 1
        self.stats["bytes"] += size
        if self._kick_handle is None and self._inflight is None:
            self._kick_handle = self._loop.call_soon(self._kick)
        return segment, offset

    def enqueue(self, queue_id: int, exchange_raw: bytes, routing_key_raw: bytes, props_raw: bytes,
                body: bytes, delivered: bool = False, transient: bool = False,
                dedup: tuple[bytes, int] | None = None) -> int:
        """Log a message; `dedup` is its deduplication id and when the queue first saw it."""
        msg_id = self.next_msg_id
        self.next_msg_id += 1
        flags = (rec.FLAG_DELIVERED if delivered else 0) | (rec.FLAG_TRANSIENT if transient else 0)
        record = rec.enqueue(queue_id, msg_id, flags, exchange_raw, routing_key_raw, props_raw, body, dedup)
        segment, offset = self._append(record)
        if dedup is not None:
            self.id_segments.add(segment)
        self.index[msg_id] = _pack(segment, offset, len(record), delivered)
        self.live[segment] += 1
        self.live_bytes[segment] += len(record)
        return msg_id

    def deliver(self, queue_id: int, msg_id: int) -> None:
        loc = self.index.get(msg_id)
        if loc is None or loc & 1:
            return
        self.index[msg_id] = loc | 1
        segment, _off = self._append(rec.deliver(queue_id, msg_id))
        enq_segment = _unpack(loc)[0]
        if enq_segment != segment:
            self.refs[segment].add(enq_segment)

    def ack(self, queue_id: int, msg_ids: list[int]) -> None:
        live_ids = []
        enq_segments = set()
        for msg_id in msg_ids:
            loc = self.index.pop(msg_id, None)
            if loc is None:
                continue
            segment, _off, length, _d = _unpack(loc)
            self.live[segment] -= 1
            self.live_bytes[segment] -= length
            enq_segments.add(segment)
            live_ids.append(msg_id)
        if not live_ids:
            return
        segment, _off = self._append(rec.acks(queue_id, live_ids))
        enq_segments.discard(segment)
        self.refs[segment].update(enq_segments)

    # ---- deduplication ids ----------------------------------------------------------------------
    def keep_ids(self, queue_id: int, cache) -> list[tuple[bytes, int]]:
        """Register a queue's id cache (anything with `entries()`: [(id, seen-at ms)]) so its
        ids are written again before the segments holding them go; returns the ids recovered
        for that queue, oldest first (handed over once: the cache holds them from then on)."""
        self.id_caches[queue_id] = cache
        return list(self.recovered_ids.pop(queue_id, {}).items())

    def forget_ids(self, queue_id: int, cache) -> None:
        if self.id_caches.get(queue_id) is cache:
            del self.id_caches[queue_id]
        self.recovered_ids.pop(queue_id, None)

    def give_back_ids(self, queue_id: int, cache) -> None:
        """A queue let go without deleting it (its node replays the log): its ids count as
        recovered again, for whichever queue takes the store id next (keep_ids)."""
        if self.id_caches.get(queue_id) is cache:
            del self.id_caches[queue_id]
        self.recovered_ids[queue_id] = dict(cache.entries())

    def save_ids(self, queue_id: int, entries, replace: bool) -> None:
        """Log a queue's ids: all of them (replace) or more of them (a mirror's reset)."""
        segment, _off = self._append(rec.dedup_ids(queue_id, entries, replace))
        self.id_segments.add(segment)

    def _rewrite_ids(self) -> None:
        for queue_id, cache in list(self.id_caches.items()):
            self.save_ids(queue_id, cache.entries(), True)

    def log_meta(self, change: bytes) -> None:
        """Log one metadata change (meta.record), in order with the records around it: the
        writer appends it to the metadata log with the batch. Its cost does not depend on how
        much metadata there is; snapshots are taken off the loop (node/store/meta.py)."""
        self._pending_meta.append(meta_log.frame(change))
        if self._kick_handle is None and self._inflight is None:
            self._kick_handle = self._loop.call_soon(self._kick)

    @property
    def meta_stats(self) -> dict:
        snapshots = self._snapshots
        return {"snapshots": snapshots.snapshots if snapshots else 0,
                "covered": snapshots.covered if snapshots else 0}

    @property
    def prepared(self) -> bool:
        """The writer has zeroed ahead (a new store spends about a second on it): syncs from
        now on cost what this disk's sync costs."""
        return self._writer is not None and self._writer.prepared

    @property
    def meta_pending(self) -> bool:
        return bool(self._pending_meta)

    def when_durable_meanwhile(self, fn: Callable, *args) -> None:
        """As when_durable, for a caller that also waits on something slower (a mirrored
        publish waits for its mirrors): the sync must not hold the loop, which has the
        mirrors' copies to send, so this batch goes to the writer thread."""
        if self._pending or self._pending_meta:
            self._pending_overlaps = True
        self.when_durable(fn, *args)

    def when_durable(self, fn: Callable, *args) -> None:
        """Call fn(ok, *args) once everything appended so far is on disk (ok=False if it failed)."""
        if self._pending or self._pending_meta:
            self._pending_waiters.append((fn, args))
        elif self._inflight is not None:
            self._inflight.append((fn, args))
        else:
            fn(self.failed is None, *args)

    # ---- group commit --------------------------------------------------------------------------
    def _kick(self) -> None:
        self._kick_handle = None
        if self._inflight is not None or self._writer is None:
            return
        if not self._pending and not self._pending_meta and not self._pending_remove \
                and self._retry is None:
            if self._pending_waiters:
                waiters, self._pending_waiters = self._pending_waiters, []
                for fn, args in waiters:
                    fn(self.failed is None, *args)
            return
        writes = [(seg, off, b"".join(chunks)) for seg, off, chunks, _size in self._pending]
        meta = b"".join(self._pending_meta) if self._pending_meta else None
        remove = self._pending_remove
        retry = self._retry
        if retry is not None:   # a failed batch is written again, before what came after it
            self._retry = None
            writes = retry.writes + writes
            if retry.meta is not None:   # its changes first, then the new ones
                meta = retry.meta + meta if meta is not None else retry.meta
            remove = retry.remove + remove
        batch = Batch(writes=writes, meta=meta, remove=remove, end=(self.segment, self.position),
                      notify_written=bool(self._written_waiters))
        self._inflight_end = (self.segment, self.position)
        self._inflight = self._pending_waiters
        inline = self._lone(meta, remove, retry)
        self._pending_overlaps = False
        self._pending = []
        self._pending_waiters = []
        self._pending_meta = []
        self._pending_remove = []
        if inline and self._writer.apply_here(batch):
            self.stats["synced_on_loop"] += 1
            self._batch_done(batch, inline=True)
        else:
            self._writer.submit(batch)

    def _lone(self, meta, remove, retry) -> bool:
        """Is the batch being made one lone publisher's write, worth syncing on the loop?"""
        pending = self._pending
        return (len(self._pending_waiters) == 1 and not self._pending_overlaps and len(pending) == 1
                and meta is None and not remove and retry is None and len(pending[0][2]) <= INLINE_RECORDS
                and pending[0][3] <= INLINE_BYTES and self._inline_ok)

    def _batch_done(self, batch: Batch, inline: bool = False) -> None:
        waiters, self._inflight = self._inflight, None
        self.stats["batches"] += 1
        self.stats["fsyncs"] += batch.fsyncs
        self.stats["sync_seconds"] += batch.seconds
        self.sync_histogram[bisect.bisect_left(SYNC_BUCKETS, batch.seconds)] += 1
        if batch.seconds > INLINE_SLOW:
            self._inline_ok = False      # the disk may be stalling: keep it off the loop ...
        elif not inline:
            self._inline_ok = True       # ... until the writer thread finds it fast again
        ok = batch.error is None
        if ok:
            self.durable_upto = self._inflight_end
            self._batch_written(self._inflight_end)
            if self.failed is not None:
                self.log.info("store writes succeed again")
                self.failed = None
                if self.on_failure:
                    self.on_failure(None)
        else:
            # Nothing after a failed write may be read back as durable, and nothing may
            # leave a hole in the log: keep the batch and write it again, first, later.
            self._retry = Batch(writes=batch.writes, meta=batch.meta, remove=batch.remove)
            if self.failed is None:
                self.log.error("store write failed; publishes are nacked until it succeeds",
                               error=str(batch.error))
                if self.on_failure:
                    self.on_failure(batch.error)
            self.failed = batch.error
            if self._kick_handle is None:
                self._kick_handle = self._loop.call_later(RETRY_INTERVAL, self._kick)
        for fn, args in waiters:
            fn(ok, *args)
        if waiters and self.after_batch is not None:
            self.after_batch()
        self._remove_dead_segments()
        if ok and (self._pending or self._pending_meta or self._pending_remove
                   or self._pending_waiters):
            if not inline:
                self._kick()
            elif self._kick_handle is None:   # not from inside _kick: no recursion over a backlog
                self._kick_handle = self._loop.call_soon(self._kick)

    @property
    def append_position(self) -> tuple[int, int]:
        return self.segment, self.position

    def when_written(self, position: tuple[int, int], fn: Callable[[], None]) -> bool:
        """True if the log up to position is in the OS already; otherwise call fn() once it is."""
        if position <= self.written_upto or self.failed is not None:
            return True   # a failing disk must not stop deliveries: consumers keep going (ERR-4)
        self._written_waiters.append(fn)
        return False

    def _batch_written(self, end: tuple[int, int]) -> None:
        if end > self.written_upto:
            self.written_upto = end
        if self._written_waiters:
            waiters, self._written_waiters = self._written_waiters, []
            for fn in waiters:
                fn()

    # ---- reading back ---------------------------------------------------------------------------
    def _before(self, msg_id: int, mark: tuple[int, int]) -> bool:
        loc = self.index.get(msg_id)
        if loc is None:
            return False
        segment, offset, _len, _d = _unpack(loc)
        return (segment, offset) < mark

    def is_durable(self, msg_id: int) -> bool:
        return self._before(msg_id, self.durable_upto)

    def is_written(self, msg_id: int) -> bool:
        return self._before(msg_id, self.written_upto)

    def _read_fd(self, segment: int) -> int:
        fd = self._read_fds.get(segment)
        if fd is None:
            fd = self._read_fds[segment] = os.open(segment_path(self.directory, segment), os.O_RDONLY)
        return fd

    def read(self, msg_id: int):
        """(exchange, routing key, properties, body, delivered) of a live message, from disk."""
        segment, offset, length, delivered = _unpack(self.index[msg_id])
        data = os.pread(self._read_fd(segment), length, offset)
        _qid, _mid, _flags, exchange, routing_key, props_raw, body = rec.parse_enqueue(data[rec.HEADER_SIZE:])
        return exchange, routing_key, props_raw, body, delivered

    # ---- space ----------------------------------------------------------------------------------
    def _remove_dead_segments(self) -> None:
        current = self.segment
        ids_rewritten = False
        for segment in sorted(self.segments):
            if segment == current or self.live.get(segment, 0) > 0:
                continue
            if any(ref in self.segments for ref in self.refs.get(segment, ())):
                continue
            if segment in self.id_segments:
                # its ids go with it: write every queue's ids again first (same batch, so they
                # are durable before the file is removed), once for all the segments going now
                self.id_segments.discard(segment)
                if not ids_rewritten:
                    self._rewrite_ids()
                    ids_rewritten = True
            self.segments.discard(segment)
            self.live.pop(segment, None)
            self.live_bytes.pop(segment, None)
            self.refs.pop(segment, None)
            fd = self._read_fds.pop(segment, None)
            if fd is not None:
                os.close(fd)
            self._pending_remove.append(segment)
            self.stats["segments_removed"] += 1

    async def _compact_periodically(self) -> None:
        while True:
            await asyncio.sleep(COMPACT_INTERVAL)
            try:
                self.compact()
            except OSError as exc:
                self.log.warning("compaction skipped", error=str(exc))

    def compact(self) -> int:
        """Copy the live records of the oldest segment to the head if few of them are live."""
        older = sorted(s for s in self.segments if s != self.segment)
        if not older:
            return 0
        oldest = older[0]
        if self.live.get(oldest, 0) == 0:
            return 0
        if self.live_bytes.get(oldest, 0) > COMPACT_LIVE_FRACTION * self.segment_size:
            return 0
        moving = [m for m, loc in self.index.items() if _segment_of(loc) == oldest and self.is_durable(m)]
        for msg_id in moving:
            segment, offset, length, delivered = _unpack(self.index[msg_id])
            record = os.pread(self._read_fd(segment), length, offset)
            flags = record[rec.HEADER_SIZE + 12]
            if flags & rec.FLAG_DEDUP or delivered and not flags & rec.FLAG_DELIVERED:
                # The copy leaves the id out: the ids are written again (DEDUP_IDS) before the
                # original's segment goes, and a copy must not bring back an id evicted since.
                # It says the message was delivered: the DELIVER record goes with that segment.
                record = rec.copied(record, delivered)
                self.live_bytes[segment] += len(record) - length
                length = len(record)
            new_segment, new_offset = self._append(record)
            self.index[msg_id] = _pack(new_segment, new_offset, length, delivered)
            self.live[segment] -= 1
            self.live_bytes[segment] -= length
            self.live[new_segment] += 1
            self.live_bytes[new_segment] += length
            if new_segment != segment:
                # The old copy stays until its segment goes: whatever acks the new copy must
                # outlive it too, and acks refer to the new copy's segment.
                self.refs[new_segment].add(segment)
        if moving:
            self.stats["compacted"] += len(moving)
            self.log.info("compacted segment", segment=oldest, moved=len(moving))
        return len(moving)
