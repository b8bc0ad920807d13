"""Reading a message store back at start: every segment, in order, into the index.

Each segment's records are applied in log order (an ENQUEUE adds a message, a
DELIVER flags it, an ACK removes it, DEDUP_IDS replace or add a queue's ids); what
is left are the live messages, by queue. A bad record at the very end of the last
segment is a torn write and is dropped; anywhere else it is damage to confirmed
data, and the store refuses to start unless told to skip it.
"""
from __future__ import annotations

import os
import time
import zlib
from collections import defaultdict
from pathlib import Path
from typing import Any

from . import meta as meta_log
from . import records as rec
from .writer import segment_path

PROGRESS_EVERY = 256 << 20     # bytes read between two "recovery progress" lines
QUEUE_SHIFT = 1 + 32 + 40 + 40      # above a packed location (store.py's _pack): the queue id, while recovering
LOC_MASK = (1 << QUEUE_SHIFT) - 1


def segment_of(loc: int) -> int:
    """The segment a packed location is in (with or without a queue id above it)."""
    return (loc & LOC_MASK) >> 73


class StoreError(Exception):
    """The store cannot be opened as it is (for example a corrupt record mid-log)."""


class Recovered:
    """What a store held at start: the metadata (as node/broker/broker.py restores it, None if
    there was none) and each queue's live messages."""

    def __init__(self):
        self.meta: dict | None = None
        self.meta_replayed = 0          # metadata changes replayed from the log after the snapshot
        self.queues: dict[int, list[int]] = defaultdict(list)   # queue id -> live msg ids, in order
        self.messages = 0
        self.torn_tail: tuple[int, int] | None = None
        self.skipped: list[tuple[int, int]] = []


class StoreRecovery:
    """The part of MessageStore that reads its log back (what it fills in is declared here)."""

    data_dir: Path
    directory: Path
    skip_corrupt: bool
    log: Any
    index: dict[int, int]
    live: dict[int, int]
    live_bytes: dict[int, int]
    refs: dict[int, set[int]]
    segments: set[int]
    id_segments: set[int]
    recovered_ids: dict[int, dict[bytes, int]]
    next_msg_id: int
    segment: int
    position: int
    durable_upto: tuple[int, int]
    written_upto: tuple[int, int]
    _inflight_end: tuple[int, int]
    _meta_recovery: meta_log.Recovery | None

    def _recover(self) -> Recovered:
        recovered = Recovered()
        try:
            found = meta_log.recover(self.data_dir, self.skip_corrupt, self.log)
        except meta_log.MetaError as exc:
            raise StoreError(str(exc)) from None
        self._meta_recovery = found
        if found.found:
            recovered.meta = found.state.as_snapshot()
            recovered.meta_replayed = found.replayed
            self.log.info("metadata recovered", snapshot_covers=found.covered, replayed=found.replayed)
        segments = sorted(int(p.stem) for p in self.directory.glob("*.seg") if p.stem.isdigit())
        while segments and self._holds_no_record(segment_path(self.directory, segments[-1])):
            segment_path(self.directory, segments.pop()).unlink()   # a spare made ahead of time
        if not segments:
            return recovered
        started = time.monotonic()
        total = sum(segment_path(self.directory, s).stat().st_size for s in segments)
        self.log.info("recovering store", segments=len(segments), bytes=total)
        # The index itself, with each message's queue id above its packed location while the log
        # is read (one int a message: recovering a long queue takes about what holding it does).
        where = self.index
        done_bytes = 0
        next_report = PROGRESS_EVERY
        max_id = 0
        last_end = (segments[-1], 0)
        for n, segment in enumerate(segments):
            path = segment_path(self.directory, segment)
            data = path.read_bytes()
            is_last = n == len(segments) - 1
            pos, max_id = self._scan_segment(data, segment, max_id)
            if pos < len(data):      # not a valid record here: the end of the log, a torn tail or corruption
                record = rec.check(data, pos)
                if record is None:
                    if is_last and self._is_torn_tail(data, pos):
                        self.log.warning("dropping torn record at the tail", segment=segment, offset=pos)
                        recovered.torn_tail = (segment, pos)
                        self._zero_tail(path, pos, data)
                    elif not self.skip_corrupt:
                        raise StoreError(f"corrupt record in segment {path.name} at offset {pos}; "
                                         "start with --skip-corrupt to drop the rest of that segment")
                    else:
                        self.log.error("skipping corrupt rest of segment", segment=segment, offset=pos)
                        recovered.skipped.append((segment, pos))
            if is_last:
                last_end = (segment, pos)
            self.segments.add(segment)
            done_bytes += len(data)
            if done_bytes >= next_report:
                next_report += PROGRESS_EVERY
                self.log.info("recovery progress", done=f"{100 * done_bytes // max(total, 1)}%",
                              messages=len(where))
        recovered.messages = len(where)
        live, live_bytes, queues = self.live, self.live_bytes, recovered.queues
        for msg_id, loc in sorted(where.items()):
            queue_id = loc >> QUEUE_SHIFT
            loc &= LOC_MASK
            where[msg_id] = loc
            segment = segment_of(loc)
            live[segment] += 1
            live_bytes[segment] += (loc >> 1) & 0xFFFFFFFF
            queues[queue_id].append(msg_id)
        self.next_msg_id = max_id + 1
        self.segment, self.position = last_end
        self.durable_upto = last_end
        self.written_upto = last_end
        self._inflight_end = last_end
        self.log.info("store recovered", messages=recovered.messages, queues=len(recovered.queues),
                      seconds=round(time.monotonic() - started, 2))
        return recovered

    def _scan_segment(self, data: bytes, segment: int, max_id: int) -> tuple[int, int]:
        """Apply one segment's valid records to the index (each message's queue id above its
        packed location); (where the valid records end, the highest message id seen). The loop
        is written out by hand: it runs once a record, a million times for a long queue."""
        where, refs = self.index, self.refs
        view = memoryview(data)
        size = len(data)
        header, header_size = rec.HEADER.unpack_from, rec.HEADER_SIZE
        enqueue_head = rec.ENQUEUE_HEAD.unpack_from
        seeds, crc32 = rec.CRC_SEEDS, zlib.crc32
        enqueue, deliver, ack, transient = rec.ENQUEUE, rec.DELIVER, rec.ACK, rec.FLAG_TRANSIENT
        flag_dedup = rec.FLAG_DEDUP
        seg_of = segment_of
        seg_bits = segment << 40
        pos = 0
        while pos + header_size <= size:
            crc, length, rtype = header(data, pos)
            start = pos + header_size
            end = start + length
            seed = seeds.get(rtype)
            if seed is None or end > size or crc32(view[start:end], seed) != crc:
                break
            if rtype == enqueue:
                queue_id, msg_id, flags = enqueue_head(data, start)
                if msg_id > max_id:
                    max_id = msg_id
                if flags & flag_dedup:
                    self._recover_id(queue_id, *rec.parse_enqueue_dedup(data, start))
                    self.id_segments.add(segment)
                if not flags & transient:
                    earlier = where.get(msg_id)
                    delivered = flags & 1
                    if earlier is not None:        # a copy made by compaction: delivered if the original was
                        delivered |= earlier & 1
                        other = seg_of(earlier)
                        if other != segment:
                            refs[segment].add(other)
                    where[msg_id] = queue_id << QUEUE_SHIFT | (((seg_bits | pos) << 32 | (end - pos)) << 1) \
                        | delivered
            elif rtype == deliver:
                _queue_id, msg_id = rec.parse_ids(view[start:end])
                hit = where.get(msg_id)
                if hit is not None:
                    where[msg_id] = hit | 1
                    other = seg_of(hit)
                    if other != segment:
                        refs[segment].add(other)
            elif rtype == ack:
                _queue_id, msg_ids = rec.parse_acks(view[start:end])
                for msg_id in msg_ids:
                    hit = where.pop(msg_id, None)
                    if hit is not None:
                        other = seg_of(hit)
                        if other != segment:
                            refs[segment].add(other)
            else:
                queue_id, replace, entries = rec.parse_dedup_ids(view[start:end])
                if replace:
                    self.recovered_ids[queue_id] = {}
                for key, at in entries:
                    self._recover_id(queue_id, key, at)
                self.id_segments.add(segment)
            pos = end
        return pos, max_id

    def _recover_id(self, queue_id: int, key: bytes, at: int) -> None:
        """An id in log order. Seen again with another time (it had expired or been evicted
        and came back) it is the newest; the same time is a copy made by compaction."""
        ids = self.recovered_ids.get(queue_id)
        if ids is None:
            ids = self.recovered_ids[queue_id] = {}
        before = ids.get(key)
        if before != at:
            if before is not None:
                del ids[key]
            ids[key] = at

    @staticmethod
    def _holds_no_record(path: Path) -> bool:
        with open(path, "rb") as fh:
            head = fh.read(rec.HEADER_SIZE)
        return not any(head)

    @staticmethod
    def _is_torn_tail(data: bytes, pos: int) -> bool:
        """Is the bad record at `pos` of the last segment the torn last write, to be dropped?

        Only the last write can be torn, and a segment holds only zeros past it (segments are
        zero-filled ahead of the writes), so: yes if no valid record begins anywhere after it,
        and nothing but zeros follows the end its header claims (a claimed end past the file
        proves nothing: the length may be what was damaged). A bad record with a valid one
        after it is damage to data that was synced and confirmed: dropping or zeroing from
        there would lose confirmed messages silently, so the store refuses to start
        (--skip-corrupt drops the rest of that segment, and says so).

        RabbitMQ's message store, finding garbage, tries the next byte until a message parses
        and carries on from there. That is safe for it, as a message counts only if a queue
        index names its random id; here the log is the queues' state, and a record found by
        guessing where one starts could be bytes inside a message body, so it is not acted on.
        The cost: a power loss that persisted a later page of the last write but not an
        earlier one also stops the start (an operator's --skip-corrupt then drops that write).
        """
        if pos + rec.HEADER_SIZE > len(data):
            return True
        end = len(data.rstrip(b"\x00"))
        if rec.find_record(data, pos + 1, end) is not None:
            return False
        _crc, length, _t = rec.HEADER.unpack_from(data, pos)
        after = pos + rec.HEADER_SIZE + length
        return after >= end

    @staticmethod
    def _zero_tail(path: Path, pos: int, data: bytes) -> None:
        end = len(data.rstrip(b"\x00"))
        if end > pos:
            fd = os.open(path, os.O_WRONLY)
            try:
                os.pwrite(fd, bytes(end - pos), pos)
                os.fsync(fd)
            finally:
                os.close(fd)
