"""Raft's durable state (cluster/raft/storage.py) and what the shell (cluster/raft/shell.py) does
when writing it fails: nothing is promised that is not on disk.

In-process, without sockets: the shell is driven through the handlers the gRPC service
calls, with a membership that does not change.
"""
from __future__ import annotations

import asyncio
import errno
import json
import os
import stat

import pika
import pytest

from haremq.cluster.raft.messages import LogWrite
from haremq.cluster.raft.shell import Raft, RaftStorage, StorageFailed
from haremq.cluster.raft.storage import RaftStorageError
from haremq.cluster.rpc import cluster_pb2 as pb
from tests.conftest import IS_REF, Node, free_port, pika_conn, wait_until


class Members:
    """A membership view that does not change: every peer up."""

    def __init__(self, name, peers):
        self.name = name
        self.peers = {p: object() for p in peers}

    size = property(lambda self: len(self.peers) + 1)
    has_majority = True

    def is_up(self, name):
        return True

    def up_members(self):
        return [self.name, *sorted(self.peers)]

    def metadata(self):
        return ()


class FullDisk(RaftStorage):
    """Appends to the log fail with ENOSPC once `full` is set (term and vote still save)."""

    full = False

    def _append(self, writes):
        if self.full and writes:
            raise OSError(errno.ENOSPC, "No space left on device")
        super()._append(writes)


def entry(index, term, op="x"):
    return pb.LogEntry(index=index, term=term, command=json.dumps({"op": op}).encode())


async def answer(call):
    """The reply a handler sent, or None if the call failed (the caller hears no answer)."""
    try:
        return await call
    except Exception:  # noqa: BLE001 - any failure is "no answer" to the caller
        return None


def test_a_follower_whose_log_write_fails_acknowledges_nothing_after_it(tmp_path):
    async def scenario():
        storage = FullDisk(tmp_path / "raft")
        failures = []
        raft = Raft("hare2", Members("hare2", ["hare1", "hare3"]), storage, lambda i, c: None)
        raft.on_failure = failures.append
        ok = await raft.on_append_entries(pb.AppendRequest(term=1, leader="hare1", prev_log_index=0,
                                                           entries=[entry(1, 1)], leader_commit=0))
        assert ok.success and ok.match_index == 1
        storage.full = True
        append = pb.AppendRequest(term=1, leader="hare1", prev_log_index=1, prev_log_term=1,
                                  entries=[entry(2, 1), entry(3, 1)], leader_commit=1)
        replies = [await answer(raft.on_append_entries(append))]
        # the leader retries (its call failed): the entries are in memory, not on disk
        replies.append(await answer(raft.on_append_entries(append)))
        # nor is anything else answered: an empty append, a vote
        replies.append(await answer(raft.on_append_entries(pb.AppendRequest(
            term=1, leader="hare1", prev_log_index=3, prev_log_term=1, leader_commit=1))))
        vote = await answer(raft.on_request_vote(pb.VoteRequest(term=2, candidate="hare3", last_log_index=3,
                                                                last_log_term=1)))
        return storage, raft, replies, vote, failures

    storage, raft, replies, vote, failures = asyncio.run(scenario())
    assert not any(r is not None and r.success for r in replies), replies
    assert vote is None or not vote.granted
    assert raft.failed and "No space left on device" in raft.failed
    assert len(failures) == 1 and "No space left on device" in failures[0]    # the node is stopped once
    assert RaftStorage(tmp_path / "raft").entries == [(1, b'{"op": "x"}')]


def test_a_leader_whose_log_write_fails_commits_and_applies_nothing_after_it(tmp_path):
    # A cluster of one commits on its own write: a write that failed must not count, and the
    # next proposal (whose write would succeed) must not commit the lost one with it.
    async def scenario():
        storage = FullDisk(tmp_path / "raft")
        applied, failures = [], []
        raft = Raft("hare1", Members("hare1", []), storage, lambda i, c: applied.append((i, json.loads(c))))
        raft.on_failure = failures.append
        await raft.start()
        try:
            await raft.propose({"op": "first"})
            storage.full = True
            with pytest.raises(StorageFailed):
                await raft.propose({"op": "lost"})
            storage.full = False          # the disk has room again: too late, the node is stopping
            with pytest.raises(StorageFailed):
                await raft.propose({"op": "after"})
        finally:
            await raft.stop()
        return applied, failures

    applied, failures = asyncio.run(scenario())
    assert [c["op"] for _i, c in applied] == ["noop", "first"]
    assert len(failures) == 1
    assert [json.loads(c)["op"] for _t, c in RaftStorage(tmp_path / "raft").entries] == ["noop", "first"]


class CountedDisk(RaftStorage):
    """Counts the log appends made (each one fsync)."""

    def __init__(self, directory):
        super().__init__(directory)
        self.appends: list[int] = []

    def _append(self, writes):
        import time
        time.sleep(0.005)                 # an fsync's worth: steps pile up meanwhile
        self.appends.append(sum(len(w.entries) for w in writes))
        super()._append(writes)


def test_proposals_waiting_their_turn_are_written_together_in_order(tmp_path):
    """Group commit: 200 clients declaring at once had the leader write and fsync each proposal
    alone, one after another. The steps waiting for the write lock go in one append and fsync,
    in step order, and each is applied (and answered) only once its entries are on disk."""
    async def scenario():
        storage = CountedDisk(tmp_path / "raft")
        applied = []

        def apply(index, command):
            on_disk = [i for i, _line in enumerate((tmp_path / "raft" / "log.jsonl").read_text().splitlines(), 1)]
            assert index in on_disk, f"entry {index} applied before it was written"
            applied.append(json.loads(command)["op"])
        raft = Raft("hare1", Members("hare1", []), storage, apply)
        await raft.start()
        try:
            await asyncio.gather(*(raft.propose({"op": f"c{i}"}) for i in range(100)))
        finally:
            await raft.stop()
        return storage, applied
    storage, applied = asyncio.run(scenario())
    assert applied == ["noop", *(f"c{i}" for i in range(100))]
    assert sum(storage.appends) == 101 and len(storage.appends) < 20, storage.appends
    assert [json.loads(c)["op"] for _t, c in RaftStorage(tmp_path / "raft").entries] == applied


def test_a_failed_vote_write_gives_no_vote(tmp_path):
    class NoState(RaftStorage):
        def save_state(self, term, voted_for):
            raise OSError(errno.EIO, "Input/output error")

    async def scenario():
        raft = Raft("hare2", Members("hare2", ["hare1", "hare3"]), NoState(tmp_path / "raft"), lambda i, c: None)
        ask = pb.VoteRequest(term=2, candidate="hare3")
        return [await answer(raft.on_request_vote(ask)) for _ in range(2)], raft

    replies, raft = asyncio.run(scenario())
    assert all(r is None or not r.granted for r in replies)
    assert "Input/output error" in raft.failed


# ---- loading the log -----------------------------------------------------------------------------
def line(index, term=1, op="x"):
    return json.dumps({"i": index, "t": term, "c": json.dumps({"op": op})}) + "\n"


def written(directory, *lines, tail=""):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "log.jsonl").write_text("".join(lines) + tail)
    return directory / "log.jsonl"


def test_a_torn_last_line_is_cut_off_so_the_next_append_survives_a_restart(tmp_path):
    path = written(tmp_path / "raft", line(1), line(2), tail='{"i": 3, "t": 1, "c": "{\\"op')
    storage = RaftStorage(tmp_path / "raft")
    assert [json.loads(c)["op"] for _t, c in storage.entries] == ["x", "x"]
    assert path.read_text() == line(1) + line(2)          # the torn bytes are gone from the file
    storage.write(LogWrite(3, ((1, b'{"op": "three"}'),)))
    again = RaftStorage(tmp_path / "raft")
    assert again.last_index == 3 and again.entries[2] == (1, b'{"op": "three"}')


def test_a_whole_last_line_that_does_not_parse_is_cut_off_too(tmp_path):
    # an append cut short where the file's length was updated but its data never written
    path = written(tmp_path / "raft", line(1), "\x00" * 40 + "\n")
    assert RaftStorage(tmp_path / "raft").last_index == 1
    assert path.read_text() == line(1)


def test_a_missing_entry_refuses_to_load_rather_than_shift_later_ones(tmp_path):
    written(tmp_path / "raft", line(1), line(2), line(4))
    with pytest.raises(RaftStorageError, match="entry 4 after entry 2"):
        RaftStorage(tmp_path / "raft")


def test_a_damaged_line_with_entries_after_it_refuses_to_load(tmp_path):
    path = written(tmp_path / "raft", line(1), '{"i": 2, "t": 1, "c": garbage\n', line(3))
    before = path.read_bytes()
    with pytest.raises(RaftStorageError, match="line 2"):
        RaftStorage(tmp_path / "raft")
    assert path.read_bytes() == before                   # nothing is cut off a damaged log


def test_an_index_seen_again_replaces_the_suffix_from_there(tmp_path):
    written(tmp_path / "raft", line(1), line(2), line(3), line(2, term=2, op="y"))
    storage = RaftStorage(tmp_path / "raft")
    assert storage.entries == [(1, b'{"op": "x"}'), (2, b'{"op": "y"}')]


# ---- directory syncs -----------------------------------------------------------------------------
@pytest.fixture
def syncs(monkeypatch):
    """Every fsync (of a file or of a directory, by inode) and rename, in order."""
    events = []
    fsync, replace = os.fsync, os.replace

    def spy_fsync(fd):
        st = os.fstat(fd)
        events.append(("dir" if stat.S_ISDIR(st.st_mode) else "file", st.st_ino))
        fsync(fd)

    def spy_replace(src, dst):
        replace(src, dst)
        events.append(("rename", os.stat(dst).st_ino))

    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "replace", spy_replace)
    return events


def test_the_directory_is_synced_after_a_file_is_created_or_renamed_into_place(tmp_path, syncs):
    directory = tmp_path / "data" / "raft"
    storage = RaftStorage(directory)
    ino = os.stat(directory).st_ino
    assert ("dir", os.stat(directory.parent).st_ino) in syncs          # the new raft directory's name

    del syncs[:]
    storage.save_state(3, "hare2")          # a vote: gone after a power loss without its directory's sync
    assert syncs[-2:] == [("rename", os.stat(directory / "state.json").st_ino), ("dir", ino)]

    del syncs[:]
    storage.write(LogWrite(1, ((3, b"{}"),)))            # creates log.jsonl
    assert syncs == [("file", os.stat(directory / "log.jsonl").st_ino), ("dir", ino)]
    del syncs[:]
    storage.write(LogWrite(2, ((3, b"{}"),)))            # a plain append: the file's sync is enough
    assert syncs == [("file", os.stat(directory / "log.jsonl").st_ino)]

    del syncs[:]
    storage.write(LogWrite(2, ((4, b"{}"),), whole=((3, b"{}"), (4, b"{}"))))     # a suffix replaced
    assert syncs[-2:] == [("rename", os.stat(directory / "log.jsonl").st_ino), ("dir", ino)]
    assert RaftStorage(directory).entries == [(3, b"{}"), (4, b"{}")]


# ---- snapshots and the log cut before them ----------------------------------------------------------------
def snapshot_of(storage, index, term, body=b'{"state": 1}'):
    """As the shell takes one: prepared off the write lock, then put in place and the log cut."""
    tmp, size = storage.prepare_snapshot(index, term, body)
    assert tmp.exists() and size > len(body)
    return storage.commit_snapshot(tmp, index)


def test_a_cut_held_back_at_a_snapshot_is_made_later_and_a_restart_loads_the_rest(tmp_path, syncs):
    """A snapshot at 6 whose cut was held back at 2 for a follower then far behind; once it has
    caught up the shell cuts the log at 5 without a new snapshot (Raft._cut_held_back)."""
    directory = tmp_path / "raft"
    written(directory, *(line(i) for i in range(1, 9)))
    storage = RaftStorage(directory)
    tmp, _size = storage.prepare_snapshot(6, 1, b'{"state": 1}')
    assert storage.commit_snapshot(tmp, 6, cut=2)
    assert (directory / "log.jsonl").read_text() == "".join(line(i) for i in range(3, 9))
    storage.cut_log(5)
    assert (directory / "log.jsonl").read_text() == line(6) + line(7) + line(8)
    again = RaftStorage(directory)
    assert (again.snapshot_index, again.last_index, len(again.entries)) == (6, 8, 2)


def test_a_snapshot_cuts_the_log_and_a_restart_loads_it_with_the_tail(tmp_path, syncs):
    directory = tmp_path / "raft"
    written(directory, *(line(i, term=1 if i <= 3 else 2) for i in range(1, 8)))
    storage = RaftStorage(directory)
    del syncs[:]
    assert snapshot_of(storage, 5, 2)
    ino = os.stat(directory).st_ino
    # the snapshot renamed into place and its directory synced before the log is cut; then the cut's
    assert syncs[:3] == [("file", syncs[0][1]), ("rename", os.stat(directory / "snapshot.json").st_ino),
                         ("dir", ino)]
    assert syncs[-2:] == [("rename", os.stat(directory / "log.jsonl").st_ino), ("dir", ino)]
    assert (directory / "log.jsonl").read_text() == line(6, term=2) + line(7, term=2)
    assert not list(directory.glob("*.tmp"))
    again = RaftStorage(directory)
    assert (again.snapshot_index, again.snapshot_term, again.last_index) == (5, 2, 7)
    assert again.snapshot_body == b'{"state": 1}' and again.entries == [(2, b'{"op": "x"}')] * 2
    again.write(LogWrite(8, ((2, b'{"op": "y"}'),)))
    assert RaftStorage(directory).entries[-1] == (2, b'{"op": "y"}')
    # a suffix replaced after a snapshot: the file is rewritten from the snapshot on
    again.write(LogWrite(7, ((3, b"{}"),), whole=((2, b'{"op": "x"}'), (3, b"{}")), base=5))
    assert RaftStorage(directory).entries == [(2, b'{"op": "x"}'), (3, b"{}")]
    assert snapshot_of(again, 3, 1) is False        # older than the one in place: dropped
    assert RaftStorage(directory).snapshot_index == 5 and not list(directory.glob("*.tmp"))


def test_a_crash_between_the_snapshot_and_the_cut_loads_the_same(tmp_path):
    directory = tmp_path / "raft"
    written(directory, *(line(i) for i in range(1, 6)))
    storage = RaftStorage(directory)
    tmp, _size = storage.prepare_snapshot(3, 1, b"{}")
    os.replace(tmp, directory / "snapshot.json")       # renamed, then the power went: the log is whole
    (directory / "snapshot.json.4.tmp").write_bytes(b"half a snap")      # and one being written
    again = RaftStorage(directory)
    assert (again.snapshot_index, again.last_index, len(again.entries)) == (3, 5, 2)
    assert not (directory / "snapshot.json.4.tmp").exists()


def test_a_log_with_entries_missing_after_the_snapshot_refuses_to_load(tmp_path):
    directory = tmp_path / "raft"
    written(directory, line(1), line(2), line(3))
    storage = RaftStorage(directory)
    assert snapshot_of(storage, 2, 1)
    (directory / "log.jsonl").write_text(line(5))      # 3 and 4 are gone
    with pytest.raises(RaftStorageError, match="entry 5 after entry 2"):
        RaftStorage(directory)


def test_a_leaders_snapshot_empties_the_log_and_a_crash_before_that_drops_a_stale_one(tmp_path):
    directory = tmp_path / "raft"
    written(directory, line(1), line(2), line(3, term=1), line(4, term=1))
    storage = RaftStorage(directory)
    storage.install_snapshot(6, 3, b'{"version":1,"index":6,"term":3}\n{}')
    assert (directory / "log.jsonl").read_bytes() == b""
    again = RaftStorage(directory)
    assert (again.snapshot_index, again.snapshot_term, again.last_index) == (6, 3, 6)
    # the snapshot in place, the log not yet emptied: its entry 6 (if any) is of another term,
    # so what follows it is not the cluster's and is dropped
    written(directory, *(line(i, term=1) for i in range(1, 9)))
    stale = RaftStorage(directory)
    assert (stale.snapshot_index, stale.last_index, stale.entries) == (6, 6, [])


# ---- the shell's compaction: a cluster of one, in-process ---------------------------------------------------
class Counter:
    """A state machine that keeps the ops it applied (its snapshot is that list)."""

    def __init__(self):
        self.ops: list[str] = []
        self.restored: list[int] = []

    def apply(self, index, command):
        self.ops.append(json.loads(command)["op"])

    def snapshot(self):
        ops = list(self.ops)
        return (lambda: json.dumps({"ops": ops, "records": 0}).encode()), len(ops)

    def restore(self, index, state):
        self.restored.append(index)
        self.ops = list(state["ops"])


async def solo(directory, machine: Counter, every: int) -> Raft:
    raft = Raft("hare1", Members("hare1", []), RaftStorage(directory), machine.apply, machine)
    raft.snapshot_every = every
    await raft.start()
    return raft


def test_the_shell_snapshots_in_the_background_and_a_restart_replays_only_the_tail(tmp_path):
    directory = tmp_path / "raft"

    async def first():
        machine = Counter()
        raft = await solo(directory, machine, every=100)
        for i in range(350):
            await raft.propose({"op": f"set{i}"})
        while raft._snapshotting is not None:
            await asyncio.sleep(0.01)
        taken = raft.snapshots_taken
        raft.snapshot_every = 10_000      # no stop snapshot either (fewer entries than it asks for)
        await raft.stop()
        return machine.ops, taken

    ops, taken = asyncio.run(first())
    # at 100 entries, then once as many entries as the last snapshot held records (100 -> 200):
    # the next waits for 400, so that a snapshot costs O(1) per entry however large the state
    assert ops == ["noop", *(f"set{i}" for i in range(350))] and taken == 2
    storage = RaftStorage(directory)
    assert storage.snapshot_index == 200 and len(storage.entries) == 151
    # the file keeps half a threshold before the snapshot too (for members a little behind):
    # a restart skips them
    assert len((directory / "log.jsonl").read_text().splitlines()) == 351 - 150

    async def again():
        machine = Counter()
        raft = await solo(directory, machine, every=10_000)
        await raft.propose({"op": "after"})
        await raft.stop()
        return machine

    machine = asyncio.run(again())
    assert machine.restored == [storage.snapshot_index]
    assert machine.ops == [*ops, "noop", "after"]        # the snapshot, the tail, then what came next


def test_a_clean_stop_leaves_a_snapshot_so_the_next_start_replays_nothing(tmp_path):
    directory = tmp_path / "raft"

    async def run():
        machine = Counter()
        raft = await solo(directory, machine, every=10_000)
        for i in range(1_100):
            await raft.propose({"op": f"set{i}"})
        assert raft.snapshots_taken == 0
        await raft.stop()
        return raft.last_applied

    last = asyncio.run(run())
    storage = RaftStorage(directory)
    assert storage.snapshot_index == last and storage.entries == []
    assert json.loads(storage.snapshot_body)["ops"][-1] == "set1099"


# ---- the node ------------------------------------------------------------------------------------------
@pytest.mark.skipif(IS_REF, reason="starts and breaks a node process")
def test_a_node_whose_raft_log_cannot_be_written_stops_with_status_1(tmp_path):
    class ClusteredNode(Node):
        def argv(self):
            return super().argv() + ["--cluster-port", str(free_port())]     # a cluster of one

    node = ClusteredNode("hare-raftfail", tmp_path).start()
    try:
        log = node.data_dir / "raft" / "log.jsonl"
        wait_until(log.exists, timeout=15)
        log.rename(log.with_suffix(".old"))
        log.mkdir()                            # every append to the log fails from now on (EISDIR)
        ch = pika_conn(node).channel()
        with pytest.raises(pika.exceptions.AMQPError):
            ch.queue_declare("raft.fail", durable=True)
        assert node.proc.wait(15) == 1
        assert "raft storage failed: stopping the node" in node.log_text()
        assert node.log_text().splitlines()[-1].startswith("haremq: raft storage failed in ")
    finally:
        node.kill9()


class SlowDisk(RaftStorage):
    """Each log append takes `delay` seconds in its thread (a slow or busy disk)."""

    delay = 0.0

    def _append(self, writes):
        import time
        time.sleep(self.delay)
        super()._append(writes)


def test_a_follower_append_cancelled_mid_write_leaves_no_gap_and_acknowledges_nothing_off_disk(tmp_path):
    """A gRPC deadline cancels the handler of an AppendEntries while its write is in progress (a
    loaded machine, a slow disk). The machine holds the entry already: the next append (its
    successor) must neither be written before it nor be acknowledged while it is on no disk."""
    async def scenario():
        storage = SlowDisk(tmp_path / "raft")
        raft = Raft("hare2", Members("hare2", ["hare1", "hare3"]), storage, lambda i, c: None)
        ok = await raft.on_append_entries(pb.AppendRequest(term=1, leader="hare1", prev_log_index=0,
                                                           entries=[entry(1, 1)], leader_commit=0))
        assert ok.success
        storage.delay = 0.3
        first = asyncio.ensure_future(raft.on_append_entries(pb.AppendRequest(
            term=1, leader="hare1", prev_log_index=1, prev_log_term=1, entries=[entry(2, 1)], leader_commit=1)))
        await asyncio.sleep(0.05)
        first.cancel()                       # the leader's deadline: the entry is held in memory only
        storage.delay = 0.0
        second = await raft.on_append_entries(pb.AppendRequest(
            term=1, leader="hare1", prev_log_index=2, prev_log_term=1, entries=[entry(3, 1)], leader_commit=1))
        lines = [json.loads(line)["i"] for line in (tmp_path / "raft" / "log.jsonl").read_text().splitlines()]
        return second, lines
    second, lines = asyncio.run(scenario())
    assert lines == [1, 2, 3], f"the log file holds entries {lines}"
    assert second.success and second.match_index == 3
    RaftStorage(tmp_path / "raft")           # and it loads
