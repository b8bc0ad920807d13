"""The message store (node/store/) in-process: what it keeps across a crash, a restart and
compaction, and what it will not guess about (PUB-3, CONF-4)."""
from __future__ import annotations

import asyncio
import struct
import time
from pathlib import Path

import pytest

from haremq.node.store import records as rec
from haremq.node.store.store import MessageStore, StoreError, _unpack
from haremq.node.store.writer import segment_path

QUEUE = 7


async def durable(store: MessageStore) -> None:
    done = asyncio.get_running_loop().create_future()
    store.when_durable(lambda ok: done.set_result(ok))
    assert await done


def fill(directory: Path, bodies, segment_size: int = 1 << 20) -> dict[int, tuple[int, int, int]]:
    """Enqueue one message per body, synced; msg id -> (segment, offset, length) of its record."""
    async def run():
        store = MessageStore(directory, segment_size=segment_size)
        store.open()
        ids = [store.enqueue(QUEUE, b"\x00", b"\x01q", b"", body) for body in bodies]
        await durable(store)
        where = {m: _unpack(store.index[m])[:3] for m in ids}
        await store.close()
        return where
    return asyncio.run(run())


def recover(directory: Path, segment_size: int = 1 << 20):
    """(bodies of the queue's live messages in order, delivered flags, the Recovered) after a restart."""
    async def run():
        store = MessageStore(directory, segment_size=segment_size)
        recovered = store.open()
        got = [store.read(m) for m in recovered.queues[QUEUE]]
        await store.close()
        return [g[3] for g in got], [g[4] for g in got], recovered
    return asyncio.run(run())


# ---- a bad record: torn tail or corruption ------------------------------------------------------------
@pytest.mark.parametrize("claimed", ["past the end of the file", "over the records after it"])
def test_a_corrupt_length_with_records_after_it_refuses_to_start_and_zeroes_nothing(tmp_path, claimed):
    bodies = [b"m%03d" % i * 20 for i in range(40)]
    where = fill(tmp_path, bodies)
    segment, offset, _length = where[20]
    path = segment_path(tmp_path / "msgs", segment)
    data = bytearray(path.read_bytes())
    end = len(data.rstrip(b"\x00"))
    # the record's length field damaged: its claimed end lies beyond every record after it
    length = 0xFFFFFF00 if claimed.startswith("past") else end - offset + 100
    struct.pack_into(">I", data, offset + 4, length)
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="corrupt record"):
        recover(tmp_path)
    assert path.read_bytes() == bytes(data)          # the fsynced records after it are still there


@pytest.mark.parametrize("claimed", ["past the end of the file", "within the file"])
def test_a_torn_last_record_is_dropped_and_the_others_kept(tmp_path, claimed):
    bodies = [b"m%03d" % i * 20 for i in range(10)]
    where = fill(tmp_path, bodies)
    segment, offset, length = where[10]
    path = segment_path(tmp_path / "msgs", segment)
    data = bytearray(path.read_bytes())
    data[offset + length - 30:offset + length] = bytes(30)      # its last bytes never reached the disk
    if claimed.startswith("past"):
        struct.pack_into(">I", data, offset + 4, 0xFFFFFF00)   # nor did its length, as written
    path.write_bytes(bytes(data))
    got, _delivered, recovered = recover(tmp_path)
    assert got == bodies[:9] and recovered.torn_tail == (segment, offset)
    assert not any(path.read_bytes()[offset:])                # zeroed: the next write starts clean


# ---- directory syncs -------------------------------------------------------------------------------------
def test_a_removed_segment_is_gone_for_good_before_its_batch_is_done(tmp_path, monkeypatch):
    # A segment removed but still named in the directory after a power loss brings its acked
    # messages back, and once a later segment holding their acks goes too, for good.
    import os
    import stat

    from haremq.node.store import writer

    events = []
    fsync, unlink, apply = os.fsync, os.unlink, writer.SegmentWriter._apply

    def spy_fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            events.append(("dir", os.fstat(fd).st_ino))
        fsync(fd)

    def spy_unlink(path, *args, **kwargs):
        unlink(path, *args, **kwargs)
        events.append(("unlink", Path(path).name))

    def spy_apply(self, batch, notify):
        apply(self, batch, notify)
        events.append(("applied",))

    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "unlink", spy_unlink)
    monkeypatch.setattr(writer.SegmentWriter, "_apply", spy_apply)

    async def run():
        store = MessageStore(tmp_path, segment_size=64 << 10)
        store.open()
        ids = [store.enqueue(QUEUE, b"\x00", b"\x01q", b"", bytes(1000)) for _ in range(150)]
        await durable(store)
        first = [m for m in ids if _unpack(store.index[m])[0] == 1]
        store.ack(QUEUE, first)
        await durable(store)
        path = segment_path(tmp_path / "msgs", 1)
        for _ in range(500):
            if not path.exists():
                break
            await asyncio.sleep(0.01)
        await store.close()
        return path

    path = asyncio.run(run())
    assert not path.exists()
    directory = os.stat(tmp_path / "msgs").st_ino
    at = events.index(("unlink", path.name))
    this_batch = events[at:events.index(("applied",), at)]
    assert ("dir", directory) in this_batch, events[at:]


# ---- compaction ----------------------------------------------------------------------------------------
def test_a_delivered_message_moved_by_compaction_comes_back_redelivered(tmp_path):
    # delivered, then requeued (the store keeps it, flagged delivered): after compaction moved
    # it and a restart, it must come back redelivered, as it does without compaction
    async def run():
        store = MessageStore(tmp_path, segment_size=64 << 10)
        store.open()
        kept = store.enqueue(QUEUE, b"\x00", b"\x01q", b"", b"kept")
        store.enqueue(QUEUE, b"\x00", b"\x01q", b"", b"plain")
        store.deliver(QUEUE, kept)
        filler = [store.enqueue(QUEUE, b"\x00", b"\x01q", b"", bytes(1000)) for _ in range(100)]
        await durable(store)
        store.ack(QUEUE, filler)
        await durable(store)
        assert store.compact() == 2 and _unpack(store.index[kept])[0] > 1
        await durable(store)
        for _ in range(500):       # the first segment goes, with the DELIVER record in it
            if not segment_path(tmp_path / "msgs", 1).exists():
                break
            await asyncio.sleep(0.01)
        await store.close()

    asyncio.run(run())
    assert not segment_path(tmp_path / "msgs", 1).exists()
    got, delivered, _recovered = recover(tmp_path, 64 << 10)
    assert got == [b"kept", b"plain"] and delivered == [True, False]


def test_a_copy_from_an_older_log_keeps_the_delivered_flag_of_what_it_copies(tmp_path):
    # a log compacted before copies were flagged: the DELIVER record is still there, before the copy
    async def run():
        store = MessageStore(tmp_path, segment_size=64 << 10)
        store.open()
        kept = store.enqueue(QUEUE, b"\x00", b"\x01q", b"", b"kept")
        store.deliver(QUEUE, kept)
        store._append(rec.enqueue(QUEUE, kept, 0, b"\x00", b"\x01q", b"", b"kept"))    # an unflagged copy
        await durable(store)
        await store.close()

    asyncio.run(run())
    assert recover(tmp_path, 64 << 10)[:2] == ([b"kept"], [True])


# ---- the metadata log ----------------------------------------------------------------------------------
def test_a_short_write_of_the_metadata_log_is_written_on_to_its_end(tmp_path, monkeypatch):
    import os

    from haremq.node.store import meta

    pwrite = os.pwrite
    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: pwrite(fd, bytes(data[:100]), offset))
    change = meta.record({"op": "queue", "vhost": "/", "queue": {"name": "q" * 10_000, "id": 1,
                                                                 "auto_delete": False, "arguments": ""}})

    async def run():
        store = MessageStore(tmp_path)
        store.open()
        store.log_meta(change)
        await durable(store)
        await store.close()

    asyncio.run(run())
    assert meta.log_path(tmp_path, 1).read_bytes() == meta.frame(change)
    assert recover(tmp_path)[2].meta["vhosts"]["/"]["queues"][0]["name"] == "q" * 10_000


# ---- syncing on the loop ---------------------------------------------------------------------------------
def test_after_a_slow_sync_nothing_is_synced_on_the_loop_until_the_writer_thread_syncs_fast(tmp_path, monkeypatch):
    # A stalled disk must not stall the loop again and again (its pings stop: a needless
    # failover); only the first sync of a stall can be on the loop.
    import os

    from haremq.node.store import writer

    stall = {"seconds": 0.0}
    fdatasync = os.fdatasync

    def slow_fdatasync(fd):
        time.sleep(stall["seconds"])
        fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", slow_fdatasync)
    # the idle writer zero-fills ahead under its lock; here it stays idle, so only the batches sync
    monkeypatch.setattr(writer.SegmentWriter, "_fill_current", lambda self: setattr(self, "_fill", None))
    monkeypatch.setattr(writer.SegmentWriter, "_spare_done", lambda self: True)

    async def run():
        store = MessageStore(tmp_path)
        store.open()

        async def lone() -> bool:
            """One lone publisher's write; True if it was synced on the loop."""
            before = store.stats["synced_on_loop"]
            store.enqueue(QUEUE, b"\x00", b"\x01q", b"", b"x")
            await durable(store)
            return store.stats["synced_on_loop"] > before

        await lone()               # the first write makes the segment (slow): warm up past it
        await asyncio.sleep(1.1)
        await lone()
        seen = [await lone()]                     # a fast disk: on the loop
        stall["seconds"] = 0.05
        seen.append(await lone())                 # the first sync of the stall (it could not know)
        await asyncio.sleep(1.2)
        seen += [await lone(), await lone()]      # still stalling, however long since
        stall["seconds"] = 0.0
        seen += [await lone(), await lone()]      # fast again, as the writer thread finds first
        await store.close()
        return seen

    assert asyncio.run(run()) == [True, True, False, False, False, True]
