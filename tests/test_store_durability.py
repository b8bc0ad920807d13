"""The message store (node/store/) in-process: what it keeps across a crash, a restart and
compaction, and what it will not guess about (PUB-3, CONF-4)."""
from __future__ import annotations

import asyncio
import struct
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
