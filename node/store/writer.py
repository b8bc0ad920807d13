"""The store's writer thread: the only place that writes, syncs or removes files.

The event loop hands it batches; it writes each batch (records at the
offsets the loop assigned, metadata changes to append to the metadata log,
segments to remove), makes it durable with one fdatasync per touched file,
and reports back on the loop. A lone small batch may instead be applied on
the loop's own thread (`apply_here`) when the writer is idle: one
publisher waiting for each confirm then pays for the disk only, not for
two thread hand-offs. A lock keeps the two from writing at once (the idle
writer zero-fills the segment in use). New segment files are preallocated
(posix_fallocate) so that a sync after an append need not update the
file's size, and their directory entry is synced once; the directory is
synced again after the segments a batch removes are unlinked.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


@dataclass
class Batch:
    writes: list = field(default_factory=list)      # [(segment, offset, bytes)]
    meta: bytes | None = None                        # framed metadata changes (node/store/meta.py)
    remove: list = field(default_factory=list)      # segments to delete
    end: tuple = (0, 0)                              # log position after the last write
    notify_written: bool = False                     # someone waits for "in the OS", before the sync
    error: OSError | None = None
    fsyncs: int = 0
    seconds: float = 0.0


def segment_path(directory: Path, segment: int) -> Path:
    return directory / f"{segment:08d}.seg"


def sync_directory(directory: Path) -> None:
    """Make the names in `directory` (a file created, renamed or removed) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SegmentWriter:
    def __init__(self, directory: Path, segment_size: int, meta_log,
                 done: Callable[[Batch], None], loop, written: Callable[[tuple], None] | None = None):
        self.directory = directory
        self.segment_size = segment_size
        self.meta_log = meta_log            # node/store/meta.py MetaLog: appended to here only
        self._done = done
        self._written = written
        self._loop = loop
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._fds: dict[int, int] = {}
        self._newest = 0
        self._spare: tuple[int, int, int] | None = None   # (segment, fd, bytes zeroed so far)
        self._fill: list[int] | None = None   # [segment, offset]: zero the rest of the segment in use
        self._written_end: dict[int, int] = {}
        self._lock = threading.Lock()    # held while a file is written, by this thread or the loop's
        self._thread = threading.Thread(target=self._run, name="haremq-store-writer", daemon=True)

    def start(self, segment: int = 1, position: int = 0) -> None:
        """Begin; while idle, zero the unwritten rest of the segment writes continue in."""
        self._fill = [segment, position]
        self._newest = segment
        self._thread.start()

    @property
    def prepared(self) -> bool:
        """The segment in use is zeroed to its end and the next one is ready."""
        return self._fill is None and self._spare_done()

    def submit(self, batch: Batch) -> None:
        self._jobs.put(batch)

    def stop(self) -> None:
        """Finish what was submitted, close files, end the thread."""
        self._jobs.put(None)
        self._thread.join()

    def _run(self) -> None:
        while True:
            try:
                batch = self._jobs.get(timeout=None if self._spare_done() and self._fill is None else 0.001)
            except queue.Empty:
                with self._lock:
                    if self._fill is not None:
                        self._fill_current()
                    else:
                        self._prepare_spare()
                continue
            if batch is None:
                break
            with self._lock:
                self._apply_timed(batch, True)
            try:
                self._loop.call_soon_threadsafe(self._done, batch)
            except RuntimeError:   # the loop is closed: the node is going away
                break
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        self.meta_log.close()
        if self._spare is not None:
            os.close(self._spare[1])
            try:   # an unused spare is only zeros: leave no empty segment behind
                os.unlink(segment_path(self.directory, self._spare[0]))
            except OSError:
                pass
            self._spare = None

    def apply_here(self, batch: Batch) -> bool:
        """Write and sync `batch` on the caller's thread, if the writer is not busy with a file.

        Only for the store's loop, with no batch submitted and not yet done: then nothing
        can be ordered before this one. False: the writer is busy, submit it instead."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            self._apply_timed(batch, False)
        finally:
            self._lock.release()
        return True

    def _apply_timed(self, batch: Batch, notify: bool) -> None:
        started = time.perf_counter()
        try:
            self._apply(batch, notify)
        except OSError as exc:
            batch.error = exc
        batch.seconds = time.perf_counter() - started

    def _apply(self, batch: Batch, notify: bool) -> None:
        touched = []
        for segment, offset, data in batch.writes:
            self._written_end[segment] = max(self._written_end.get(segment, 0), offset + len(data))
            fd = self._fd(segment)
            view = memoryview(data)
            while view:
                n = os.pwrite(fd, view, offset)
                view = view[n:]
                offset += n
            if segment not in touched:
                touched.append(segment)
        if touched and notify and batch.notify_written and self._written is not None:
            # In the OS now: it survives a kill of this process even before the sync.
            self._loop.call_soon_threadsafe(self._written, batch.end)
        for segment in touched:
            os.fdatasync(self._fds[segment])
            batch.fsyncs += 1
        if batch.meta is not None:
            batch.fsyncs += self.meta_log.append(batch.meta)
        for segment in batch.remove:
            fd = self._fds.pop(segment, None)
            if fd is not None:
                os.close(fd)
            try:
                os.unlink(segment_path(self.directory, segment))
            except FileNotFoundError:
                pass
        if batch.remove:
            # gone for good before the batch is done: a later batch may remove the segment
            # holding the acks of their messages, and should that removal survive a power
            # loss and this one not, acked messages would come back
            sync_directory(self.directory)
            batch.fsyncs += 1

    # A sync after an append to a file whose blocks are already written (zeros) need not
    # update any metadata: it is markedly faster than appending to, or writing into
    # fallocated space of, a file. The idle writer zeroes the next segment ahead of time.
    _ZERO_CHUNK = bytes(1 << 20)

    def _spare_done(self) -> bool:
        spare = self._spare
        return self._newest == 0 or (spare is not None and spare[2] >= self.segment_size)

    def _prepare_spare(self) -> None:
        try:
            if self._spare is None:
                segment = self._newest + 1
                path = segment_path(self.directory, segment)
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                self._spare = (segment, fd, 0)
            segment, fd, done = self._spare
            n = min(len(self._ZERO_CHUNK), self.segment_size - done)
            os.pwrite(fd, self._ZERO_CHUNK[:n], done)
            done += n
            if done >= self.segment_size:
                os.fsync(fd)
                sync_directory(self.directory)
            self._spare = (segment, fd, done)
        except OSError:
            if self._spare is not None:
                os.close(self._spare[1])
            self._spare = None
            self._newest = 0   # no spare then (disk full?): segments get fallocated when needed

    _FILL_CHUNK = 256 << 10

    def _fill_current(self) -> None:
        """Zero, ahead of the writes, the part of the current segment they have not reached."""
        segment, offset = self._fill
        offset = max(offset, self._written_end.get(segment, 0))
        if segment != self._newest or offset >= self.segment_size:
            self._fill = None
            return
        try:
            fd = self._fd(segment)
            n = min(self._FILL_CHUNK, self.segment_size - offset)
            os.pwrite(fd, self._ZERO_CHUNK[:n], offset)
            os.fdatasync(fd)
            self._fill = [segment, offset + n]
        except OSError:
            self._fill = None

    def _fd(self, segment: int) -> int:
        self._newest = max(self._newest, segment)
        fd = self._fds.get(segment)
        if fd is None and self._spare is not None and self._spare[0] == segment:
            spare_segment, spare_fd, done = self._spare
            self._spare = None
            if done >= self.segment_size:
                self._fds[segment] = fd = spare_fd
            else:   # half-made: start that file afresh below
                os.close(spare_fd)
                os.unlink(segment_path(self.directory, spare_segment))
        if fd is None:
            path = segment_path(self.directory, segment)
            existed = path.exists()
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            if os.fstat(fd).st_size < self.segment_size:
                try:
                    os.posix_fallocate(fd, 0, self.segment_size)
                except OSError:
                    os.close(fd)
                    if not existed:
                        os.unlink(path)
                    raise
            if not existed:
                os.fsync(fd)
                sync_directory(self.directory)
            self._fds[segment] = fd
        return fd

