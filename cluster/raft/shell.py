"""Raft for the cluster's metadata: one total order of changes, agreed by a majority.

Why Raft: the metadata (vhosts, users, exchanges, queues and their home
nodes, bindings, policies) must be the same on every node, in the same
order, and must survive the loss of a minority without two nodes ever
disagreeing about a queue's home. Raft gives exactly that with a leader
that commits an entry once a majority has it on disk; it is small enough to
read in one sitting, and its election rule (only a node with every committed
entry can win) is what makes a failover safe.

The log is compacted (Raft's section 7): once SNAPSHOT_ENTRIES entries (or as
many as the last snapshot held records, if more) were applied since the last
snapshot, the state machine's state is captured on the loop (plain values),
encoded and written off it (cluster/raft/storage.py: write, fsync, rename,
directory fsync), and the log file is cut before it. A restart loads the
snapshot and replays only the entries after it. A follower whose next entry
the leader has compacted away gets the snapshot (InstallSnapshot); one that
is still replaying its log after a start loads it as history, as it would
have replayed those entries. A node serving clients cannot swap its state
under them: it stops, with the snapshot on its disk, to be started again and
load it then (cluster/metadata.py `restore`). The threshold is
HAREMQ_RAFT_SNAPSHOT_ENTRIES in the environment (default 10,000).

A node that comes back (restarted, resumed after a stop, or out of a
partition) must not depose a leader the majority still follows, so an
election goes in two rounds (pre-vote, Raft thesis 9.6): a node first asks
whether it would be elected, without raising its term, and only with a
majority of yeses starts the real election. A node says no while it hears
from a leader (leader stickiness, thesis 4.2.3), and ignores even a real
vote request then, so a returning node never inflates the term. A leader
that cannot see a majority any more steps down (check-quorum). A follower
stands only once the failure detector counts its silent leader down (at once
if its port refuses us, else within the failure timeout): a leader whose loop
was held up for a second (a full garbage collection at 100,000 queues) is
not deposed while it still answers.

The writes of every step waiting for the write lock go together, in step
order, with one fsync (group commit); each step is applied and answered in
its own turn. The leader may send followers entries it has not written yet,
and counts itself towards their commit only once it has (the machine's
`log_durable`).

The log and the vote live in DATA_DIR/raft: `state.json` (term, vote) and
`log.jsonl` (one entry per line), appended and fsynced off the event loop
before a vote or an append is answered. A write or fsync that fails stops
this node's Raft for good (fail-stop): the log in memory is then ahead of
the log on disk, and answering from it would promise what a restart loses
(a retried append found "already held", a commit counted on our own copy).
Nothing is answered, sent or applied after it, and the node is stopped
(`on_failure`) with the reason, to be started again once the disk is fixed.

This module is the shell. The consensus state and its transitions are
cluster/raft/machine.py's RaftMachine, pure (time passed in, messages and
writes handed back); its rules are cluster/raft/rules.py's functions. The
shell does what the machine cannot: the timer (a tick with the time), the
gRPC calls and their answers (the machine's messages are plain values,
converted at the wire), the writes and fsyncs of term, vote and log
(cluster/raft/storage.py, off the event loop, before anything that depends
on them is sent), applying what commits, and the proposals waiting for that.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Callable

import grpc
import structlog

from haremq.node.broker.commands import MemberAdd, MemberForget
from haremq.node.tasks import TaskGroup

from haremq.cluster.raft.machine import ELECTION_MIN, HEARTBEAT, VOTE_TIMEOUT, ChangePending, NotLeader, RaftMachine
from haremq.cluster.raft.messages import (AppendReply, AppendRequest, Entry, LogWrite, Ready, SnapshotRequest, VoteReply,
                                         VoteRequest)
from haremq.cluster.raft.storage import RaftStorage, RaftStorageError, snapshot_header
from haremq.cluster.rpc import cluster_pb2 as pb

__all__ = ["ELECTION_MIN", "HEARTBEAT", "NotLeader", "PROPOSE_TIMEOUT", "Raft", "RaftStorage", "StorageFailed"]

PROPOSE_TIMEOUT = 10.0
RELAY_KEY = "haremq-relay"           # call metadata: a proposal the member asked cannot send the leader itself
APPEND_TIMEOUT = 1.0
SNAPSHOT_TIMEOUT = 60.0     # an InstallSnapshot call: the transfer, a write and fsync, loading it
SNAPSHOT_ENTRIES = int(os.environ.get("HAREMQ_RAFT_SNAPSHOT_ENTRIES", "10000"))
STOP_SNAPSHOT_MIN = 1000     # a clean stop snapshots if at least this many entries came after the last one
STOP_SNAPSHOT_TIMEOUT = 30.0
MEMBERSHIP_CHANGES = frozenset({MemberAdd.op, MemberForget.op})   # one at a time (machine.py)


class SnapshotRefused(Exception):
    """The state machine cannot load a snapshot now (it serves clients from its current state)."""


class StorageFailed(NotLeader):
    """This node's Raft storage failed: it takes no part any more (a NotLeader to a proposer,
    who is told the metadata is not available through this node)."""


class Raft:
    def __init__(self, name: str, membership, storage: RaftStorage,
                 apply: Callable[[int, bytes], object], state_machine=None,
                 on_failure: Callable[..., None] | None = None):
        """`state_machine`, for compaction: snapshot() -> (encode, records), where encode() runs
        in a thread and returns the state as bytes and records is its size; restore(index,
        state) loads a decoded snapshot (raising SnapshotRefused if it cannot now)."""
        self.name = name
        self.membership = membership
        self.storage = storage
        self.apply = apply
        self.state_machine = state_machine
        self.snapshot_every = SNAPSHOT_ENTRIES
        self._snapshot_records = 0         # the last snapshot's size: the next waits for as many entries
        self._snapshotting: asyncio.Task | None = None
        self._snapshot_after = 0           # a snapshot failed: none before this index is applied
        self._snapshot_index = storage.snapshot_index    # the last snapshot's (the log may start before it)
        self.snapshots_taken = 0
        self.log = structlog.get_logger("haremq.raft").bind(node=name)
        self.machine = RaftMachine(name, membership, storage, self.log, time.monotonic())
        self.last_applied = storage.snapshot_index
        self._waiters: dict[int, asyncio.Future] = {}
        self._io = asyncio.Lock()       # one step's writes, applying and sending at a time, in order
        self._unwritten: list[Ready] = []   # steps whose writes wait for the lock, in step order
        self._tasks = TaskGroup(f"raft {name}")     # the timer, one task per call to a peer
        self.failed: str | None = None  # why a write of term, vote or log failed: nothing is answered since
        self.on_failure = on_failure    # the node stops with this reason (restart=True: and starts again)

    role = property(lambda self: self.machine.role)
    leader = property(lambda self: self.machine.leader)
    commit_index = property(lambda self: self.machine.commit_index)
    term = property(lambda self: self.machine.term)
    told_commit = property(lambda self: self.machine.told_commit)   # per follower: commit index it applied

    # ---- lifetime -----------------------------------------------------------------------
    async def start(self) -> None:
        await self._load_snapshot()
        try:
            await self._carry_out(self.machine.start(time.monotonic()))
        except StorageFailed:
            return           # no timer: on_failure has the node stop
        self._tasks.spawn(self._run())

    async def stop(self) -> None:
        await self._snapshot_at_stop()
        await self._tasks.close()

    async def _snapshot_at_stop(self) -> None:
        """A clean stop leaves a snapshot of the state as it is (if more than a few entries came
        after the last one), so the next start loads it and replays next to nothing; after a
        crash a start replays the tail, at most about as many entries as the state has records."""
        if self.state_machine is None or self.failed is not None:
            return
        if self._snapshotting is not None:
            await asyncio.gather(self._snapshotting, return_exceptions=True)
        if self.last_applied - self._snapshot_index < min(STOP_SNAPSHOT_MIN, self.snapshot_every):
            return
        task = self._start_snapshot()
        try:
            await asyncio.wait_for(asyncio.shield(task), STOP_SNAPSHOT_TIMEOUT)
        except asyncio.TimeoutError:
            pass     # stopping regardless: the log has it all

    async def _load_snapshot(self) -> None:
        """At start: the state machine loads the snapshot on disk, if any; the log after it
        replays as it commits."""
        body = self.storage.snapshot_body
        if body is None:
            return
        self.storage.snapshot_body = None
        started = time.monotonic()
        state = await asyncio.to_thread(json.loads, body)
        if self.state_machine is not None:
            self.state_machine.restore(self.storage.snapshot_index, state)
        self._snapshot_records = _records(state)
        self.log.info("raft snapshot loaded", index=self.storage.snapshot_index, bytes=len(body),
                      entries_after=len(self.storage.entries), seconds=round(time.monotonic() - started, 3))

    async def _run(self) -> None:
        """The timer: tick the machine, often when the leader is gone (it is our turn soon)."""
        while True:
            await asyncio.sleep(0.01 if self.machine.leader_gone() else HEARTBEAT / 3)
            try:
                await self._carry_out(self.machine.tick(time.monotonic()))
                self._cut_held_back()
            except asyncio.CancelledError:
                raise
            except StorageFailed:
                return
            except Exception:  # noqa: BLE001 - keep the consensus loop alive whatever one round did
                self.log.exception("raft round failed")

    def hears_from_leader(self) -> bool:
        """Leader stickiness, now (see RaftMachine.hears_from_leader)."""
        return self.machine.hears_from_leader(time.monotonic())

    def member_added(self, name: str) -> None:
        """A member joined (member.add applied): the leader sends it the log from the start."""
        if self.failed is not None:
            return
        ready = self.machine.member_added(name, time.monotonic())
        if ready.messages:
            self._tasks.spawn(self._carry_out_quietly(ready))

    # ---- carrying out what the machine asks ----------------------------------------------------
    async def _carry_out(self, ready: Ready) -> list:
        """Write and fsync (off the loop), apply, then send: in the order the steps were taken.
        The replies among the messages are returned, for the call being answered."""
        if ready.leadership_lost:
            self._fail_waiters("leadership lost")
        # The writes and the applying run to their end even if the caller is cancelled (a gRPC
        # deadline on a handler): the machine counts the step taken already, so a later step's
        # write must never land before this one's, nor be acknowledged while it is on no disk.
        await asyncio.shield(self._tasks.spawn(self._persist(ready)))
        replies = []
        for message in ready.messages:
            if isinstance(message, (VoteReply, AppendReply)):
                replies.append(message)
            else:
                self._tasks.spawn(self._call(message))
        return replies

    async def _persist(self, ready: Ready) -> None:
        """Make the step's writes durable, then apply what it committed, in step order. The
        writes of every step waiting its turn go together (group commit): one thread call and
        one fsync for the lot, where 200 clients declaring at once had the leader write and
        fsync each proposal alone, one after another. Writing a later step's entries early is
        safe; nothing it promises goes out before its own turn has come."""
        self._unwritten.append(ready)
        async with self._io:
            # Checked under the lock: a step taken before an earlier step's write failed is
            # carried out after it, and may promise what that write was to make durable.
            self._check_storage()
            if self._unwritten:           # else an earlier step's turn wrote this one's too
                steps, self._unwritten = self._unwritten, []
                try:
                    end = await asyncio.to_thread(self._write_steps, steps)
                except Exception as exc:  # noqa: BLE001 - whatever it was, memory and disk now differ
                    self._storage_failed(exc)
                if end is not None:
                    # what that commits (as the leader) is applied in its own turn, after the
                    # steps waiting now, whose entries were handed out before
                    durable = self.machine.log_durable(end, time.monotonic())
                    if durable.committed or durable.messages:
                        self._tasks.spawn(self._carry_out_quietly(durable))
            if ready.snapshot is not None:
                await self._install(ready.snapshot)
            self._apply(ready.committed)
            self._maybe_snapshot()

    def _write_steps(self, steps: list[Ready]) -> int | None:
        """Each step's term and vote, snapshot and log writes, in order (in a thread); the log
        appends between two term or snapshot writes with one fsync. The log's end on disk
        after them (None if they wrote no entry and no snapshot)."""
        appends: list[LogWrite] = []
        end = None
        for step in steps:
            if step.hard_state is not None or step.snapshot is not None:
                self.storage.write_many(appends)
                appends = []
                if step.hard_state is not None:
                    self.storage.save_state(*step.hard_state)
                if step.snapshot is not None:
                    snap = step.snapshot
                    self.storage.install_snapshot(snap.last_index, snap.last_term, snap.data)
                    end = snap.last_index          # the log emptied after it
            for write in step.log_writes:
                appends.append(write)
                end = write.base + len(write.whole) if write.whole is not None else \
                    write.start + len(write.entries) - 1
        self.storage.write_many(appends)
        return end

    async def _carry_out_quietly(self, ready: Ready) -> None:
        """_carry_out for a step nobody waits on: after a storage failure it is dropped."""
        try:
            await self._carry_out(ready)
        except StorageFailed:
            pass

    def _check_storage(self) -> None:
        if self.failed is not None:
            raise StorageFailed(f"raft storage failed: {self.failed}")

    def _storage_failed(self, exc: BaseException) -> None:
        """Fail-stop: log it, refuse every waiting proposal, have the node stop, and raise."""
        reason = f"{type(exc).__name__}: {exc}"
        self.failed = reason
        self.log.error("raft storage failed: stopping the node", error=str(exc),
                       errno=getattr(exc, "errno", None), directory=str(self.storage.directory),
                       term=self.machine.term, last_index=self.machine.persistent.last_index)
        self._fail_waiters("raft storage failed")
        if self.on_failure is not None:
            self.on_failure(f"raft storage failed in {self.storage.directory}: {reason}")
        raise StorageFailed(f"raft storage failed: {reason}") from exc

    def _apply_failed(self, index: int, exc: BaseException) -> None:
        """Fail-stop, as for a storage failure: an entry every other member applies and this one
        could not would leave this member differing from them for good, silently."""
        reason = f"applying entry {index} failed: {type(exc).__name__}: {exc}"
        self.failed = reason
        self.log.exception("applying a metadata entry failed: stopping the node", index=index)
        self._fail_waiters(reason)
        if self.on_failure is not None:
            self.on_failure(reason)
        raise StorageFailed(reason) from exc

    async def _call(self, request: VoteRequest | AppendRequest | SnapshotRequest) -> None:
        """One request to a peer; its answer (or that there was none) goes back to the machine."""
        peer = self.membership.peers.get(request.to)
        answer = None
        try:
            if peer is None or peer.stub is None:
                pass        # not a member any more
            elif isinstance(request, SnapshotRequest):
                blob = await asyncio.to_thread(self.storage.read_snapshot)
                if blob is not None:
                    index, term, _body = snapshot_header(blob)
                    request = SnapshotRequest(request.to, request.term, request.leader, index, term,
                                              request.leader_commit)
                    self.log.info("raft snapshot sent", to=request.to, index=index, bytes=len(blob))
                    answer = await peer.stub.InstallSnapshot(
                        pb.SnapshotRequest(term=request.term, leader=request.leader, last_index=index, last_term=term,
                                           leader_commit=request.leader_commit, data=blob),
                        timeout=SNAPSHOT_TIMEOUT, metadata=self.membership.metadata())
            elif isinstance(request, VoteRequest):
                answer = await peer.stub.RequestVote(vote_request_pb(request), timeout=VOTE_TIMEOUT,
                                                     metadata=self.membership.metadata())
            else:
                answer = await peer.stub.AppendEntries(append_request_pb(request), timeout=APPEND_TIMEOUT,
                                                       metadata=self.membership.metadata())
        except (grpc.aio.AioRpcError, grpc.aio.UsageError):
            pass        # no answer; a channel closed under the call (redialled, or stopping) is none too
        except Exception:  # noqa: BLE001 - the machine must hear of it whatever went wrong
            self.log.exception("raft call failed", to=request.to)
        now = time.monotonic()
        if answer is None:
            ready = self.machine.on_unreachable(request, now)
        elif isinstance(request, VoteRequest):
            ready = self.machine.on_vote_reply(request, VoteReply(request.to, answer.term, answer.granted), now)
        elif isinstance(request, SnapshotRequest):
            ready = self.machine.on_snapshot_reply(
                request, AppendReply(request.to, answer.term, answer.success, answer.match_index), now)
        else:
            ready = self.machine.on_append_reply(
                request, AppendReply(request.to, answer.term, answer.success, answer.match_index), now)
        await self._carry_out_quietly(ready)

    # ---- answering peers ------------------------------------------------------------------------
    async def on_request_vote(self, request) -> pb.VoteReply:
        self._check_storage()
        vote = VoteRequest(self.name, request.term, request.candidate, request.last_log_index,
                           request.last_log_term, request.pre_vote)
        reachable = True
        leader = self.machine.leader_to_ping(vote, time.monotonic())
        if leader is not None:
            reachable = await self.membership.reachable(leader)
        [reply] = await self._carry_out(self.machine.on_vote_request(vote, time.monotonic(), reachable))
        return pb.VoteReply(term=reply.term, granted=reply.granted)

    async def on_append_entries(self, request) -> pb.AppendReply:
        self._check_storage()
        append = AppendRequest(self.name, request.term, request.leader, request.prev_log_index,
                               request.prev_log_term,
                               tuple(Entry(e.index, e.term, bytes(e.command)) for e in request.entries),
                               request.leader_commit)
        [reply] = await self._carry_out(self.machine.on_append_request(append, time.monotonic()))
        self.machine.answered_leader(append.term, append.leader, time.monotonic())
        return pb.AppendReply(term=reply.term, success=reply.success, match_index=reply.match_index)

    async def on_install_snapshot(self, request) -> pb.AppendReply:
        self._check_storage()
        data = bytes(request.data)
        try:
            index, term, _body = snapshot_header(data)
        except RaftStorageError:
            index, term = -1, -1
        if (index, term) != (request.last_index, request.last_term):
            self.log.warning("raft snapshot refused: its contents are not what the call says",
                             index=request.last_index, found=index)
            return pb.AppendReply(term=self.machine.term, success=False, match_index=0)
        snapshot = SnapshotRequest(self.name, request.term, request.leader, request.last_index, request.last_term,
                                   request.leader_commit, data)
        [reply] = await self._carry_out(self.machine.on_install_snapshot(snapshot, time.monotonic()))
        self.machine.answered_leader(snapshot.term, snapshot.leader, time.monotonic())
        return pb.AppendReply(term=reply.term, success=reply.success, match_index=reply.match_index)

    async def _install(self, snapshot: SnapshotRequest) -> None:
        """A leader's snapshot this node took (on disk now): the state machine loads it. A node
        serving clients cannot (SnapshotRefused): it stops and starts itself again, loading it."""
        _index, _term, body = snapshot_header(snapshot.data)
        state = await asyncio.to_thread(json.loads, body)
        self.last_applied = self._snapshot_index = snapshot.last_index
        self._snapshot_records = _records(state)
        if self.state_machine is None:
            return
        try:
            self.state_machine.restore(snapshot.last_index, state)
        except SnapshotRefused as exc:
            # what this node serves is behind the log, and the snapshot now on its disk brings
            # it up to date at its next start: the node stops and starts itself again at once
            # (a pause past several snapshots, a VM migration: nothing is wrong with the node)
            reason = f"this node fell behind the compacted metadata log and must load a snapshot: {exc}"
            self.failed = reason
            self.log.warning("raft snapshot taken while serving: the node starts again to load it",
                             index=snapshot.last_index)
            self._fail_waiters("raft snapshot taken while serving")
            if self.on_failure is not None:
                self.on_failure(reason, restart=True)
            raise StorageFailed(reason) from None

    # ---- compaction ------------------------------------------------------------------------------
    def _maybe_snapshot(self) -> None:
        """Enough applied since the last snapshot: capture the state now (on the loop, at
        last_applied), and write it and cut the log in the background."""
        if self.state_machine is None or self._snapshotting is not None:
            return
        if self.last_applied - self._snapshot_index < max(self.snapshot_every, self._snapshot_records) \
                or self.last_applied < self._snapshot_after:
            return
        self._start_snapshot()

    def _start_snapshot(self) -> asyncio.Task:
        """Capture the state at last_applied (on the loop, between two entries applied) and write
        it and cut the log in the background."""
        index = self.last_applied
        term = self.storage.term_at(index)
        started = time.monotonic()
        encode, records = self.state_machine.snapshot()
        self._snapshotting = self._tasks.spawn(self._snapshot(index, term, encode, records, started))
        return self._snapshotting

    def _cut_point(self, index: int) -> int:
        """Where the log may be cut under a snapshot at `index`: half a threshold kept before it
        for members a little behind, more for a follower that is up and further behind, at most
        four thresholds (RaftMachine.compaction_point)."""
        return self.machine.compaction_point(index, self.snapshot_every // 2, 4 * self.snapshot_every)

    def _cut_held_back(self) -> None:
        """As the leader, a snapshot's cut may have been held back for a follower then far behind
        (after a start that replayed a long log, or a member slow to catch up): once it has
        caught up, the log is cut where it could be, not at the next snapshot, which an idle
        cluster may never take."""
        if self.state_machine is None or self._snapshotting is not None or self.failed is not None \
                or self.role != "leader":
            return
        keep = self.snapshot_every // 2
        if self._snapshot_index - self.machine.persistent.snapshot_index <= keep:
            return          # cut as far as a snapshot cuts
        cut = self._cut_point(self._snapshot_index)
        # all the way, or by half a threshold at least: a follower catching up slowly does not have
        # the log file rewritten at every tick
        if cut >= min(self._snapshot_index - keep, self.machine.persistent.snapshot_index + keep):
            self._snapshotting = self._tasks.spawn(self._cut_log(self._snapshot_index))

    async def _cut_log(self, index: int) -> None:
        try:
            async with self._io:
                cut = self._cut_point(index)
                if self.failed is not None or cut <= self.machine.persistent.snapshot_index:
                    return
                term = self.storage.term_at(cut)
                await asyncio.to_thread(self.storage.cut_log, cut)
                self.machine.compact(cut, term)
            self.log.info("raft log cut once the followers caught up", snapshot_index=index, cut=cut,
                          entries_kept=len(self.storage.entries))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the log is kept whole: nothing is lost
            self.log.error("raft log cut failed; the log is kept", error=repr(exc))
        finally:
            self._snapshotting = None

    async def _snapshot(self, index: int, term: int, encode, records: int, started: float) -> None:
        captured = time.monotonic() - started       # the loop's share: the rest runs in threads
        try:
            body = await asyncio.to_thread(encode)
            tmp, size = await asyncio.to_thread(self.storage.prepare_snapshot, index, term, body)
            async with self._io:
                if self.failed is not None:
                    return
                cut = self._cut_point(index)
                kept = await asyncio.to_thread(self.storage.commit_snapshot, tmp, index, cut)
                if kept:
                    self.machine.compact(cut, self.storage.term_at(cut))
                    self._snapshot_index = index
                    self._snapshot_records = records
                    self.snapshots_taken += 1
            if kept:
                self.log.info("raft snapshot written", index=index, records=records, bytes=size,
                              entries_kept=len(self.storage.entries), seconds=round(time.monotonic() - started, 3),
                              captured_seconds=round(captured, 3))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the log is kept whole: nothing is lost, a later one retries
            self._snapshot_after = index + self.snapshot_every
            self.log.error("raft snapshot failed; the log is kept", error=repr(exc))
        finally:
            self._snapshotting = None

    # ---- proposals and applying ------------------------------------------------------------------
    async def _followers_applied(self, index: int, timeout: float = 1.0) -> None:
        """Wait (briefly) until every member that is up has applied `index`, so a client told
        "ok" on one node finds the change on any other node it goes to next."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.role == "leader":
            up = set(self.membership.up_members())
            if all(self.told_commit.get(p, 0) >= index for p in self.membership.peers if p in up):
                return
            await asyncio.sleep(0.002)

    async def _change_turn(self, deadline: float) -> None:
        """A membership change waits, until `deadline`, for the previous one to be committed
        and applied here (it takes effect when applied): one at a time, Raft thesis 4.1."""
        while not (self.machine.change_allowed() and self.last_applied >= self.machine.change_index):
            if self.role != "leader" or time.monotonic() >= deadline:
                raise ChangePending("a membership change is still being committed; try again")
            await asyncio.sleep(0.01)

    async def _lead(self, data: bytes, change: bool = False, deadline: float = 0.0) -> tuple[int, object]:
        """As the leader: append, replicate, commit, apply here; (index, result of applying).
        `change`: a membership change, which waits its turn until `deadline`."""
        self._check_storage()
        if change:
            await self._change_turn(deadline)
        future = asyncio.get_running_loop().create_future()
        index, ready = self.machine.propose(data, time.monotonic(), change)
        self._waiters[index] = future      # before the write: a reply may commit it meanwhile
        try:
            await self._carry_out(ready)
        except StorageFailed:
            if future.done():
                future.exception()         # refused with the rest: the failure is raised here instead
            raise
        result = await asyncio.wait_for(future, PROPOSE_TIMEOUT)
        await self._followers_applied(index)
        return index, result

    async def propose(self, command: dict, forward_if_deposed: bool = True) -> object:
        """Commit a command cluster-wide; return what applying it here returned.

        A follower hands it to the leader; while there is none (an election after the
        leader died) it waits and tries again, up to PROPOSE_TIMEOUT.
        """
        data = json.dumps(command).encode()
        change = command.get("op") in MEMBERSHIP_CHANGES
        deadline = time.monotonic() + PROPOSE_TIMEOUT
        while True:
            self._check_storage()
            if self.role == "leader":
                try:
                    return (await self._lead(data, change, deadline))[1]
                except StorageFailed:
                    raise
                except NotLeader:
                    if time.monotonic() > deadline or not forward_if_deposed:
                        raise
                    continue     # deposed by a newer election: hand it to the new leader
            target, relay = self.membership.peers.get(self.leader or ""), False
            if target is None and self.leader:
                # a leader we have no address for (its member.add not applied here yet, or not
                # in our --peer list): a member that has one hands it on
                target = next((p for p in self.membership.peers.values() if self.membership.is_up(p.name)), None)
                relay = True
            if target is not None and self.membership.is_up(target.name):
                reply = await self._ask_leader(target, data, deadline, relay)
                if reply is not None and reply.ok:
                    await self.wait_applied(reply.index)
                    return json.loads(reply.result) if reply.result else None
            if time.monotonic() > deadline:
                raise NotLeader("no metadata leader answered")
            await asyncio.sleep(0.05)

    async def _ask_leader(self, leader, data: bytes, deadline: float, relay: bool = False):
        """The leader's answer to a Propose, or None if the call failed. A call whose channel
        is closed under it (the leader's member.forget and member.add applied here meanwhile,
        as a replay after a rejoin has them) is cancelled by grpc: that is a failed call, not
        our caller's cancellation, which raised on ended it silently (a restarted node that
        never served)."""
        metadata = (*self.membership.metadata(), (RELAY_KEY, "1")) if relay else self.membership.metadata()
        call = asyncio.ensure_future(leader.stub.Propose(
            pb.ProposeRequest(command=data), metadata=metadata,
            timeout=max(0.1, min(2.0, deadline - time.monotonic()))))
        try:
            await asyncio.wait({call})      # raises only if we are cancelled, not if the call is
        except asyncio.CancelledError:
            call.cancel()
            raise
        if call.cancelled():
            return None
        try:
            return call.result()
        except grpc.aio.AioRpcError:
            return None

    async def wait_applied(self, index: int, timeout: float = PROPOSE_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while self.last_applied < index:
            if time.monotonic() > deadline:
                raise NotLeader(f"entry {index} not applied here within {timeout} s")
            await asyncio.sleep(0.01)

    async def on_propose(self, request, relay: bool = False) -> pb.ProposeReply:
        """A member's proposal. `relay`: it has no address for the leader, so a follower that
        has one hands the proposal on (one hop: the leader is not asked to relay)."""
        if self.role != "leader":
            leader = self.membership.peers.get(self.leader or "")
            if relay and leader is not None and self.membership.is_up(leader.name):
                reply = await self._ask_leader(leader, bytes(request.command), time.monotonic() + PROPOSE_TIMEOUT)
                if reply is not None:
                    return reply
            return pb.ProposeReply(ok=False, error="not the leader")
        data = bytes(request.command)
        try:
            change = json.loads(data.decode()).get("op") in MEMBERSHIP_CHANGES
        except (ValueError, AttributeError):
            return pb.ProposeReply(ok=False, error="not a command")
        try:
            # a change not allowed yet is refused at once: the member that forwarded it retries
            index, result = await self._lead(data, change)
        except (asyncio.TimeoutError, NotLeader) as exc:
            return pb.ProposeReply(ok=False, error=str(exc) or "not committed in time")
        return pb.ProposeReply(ok=True, index=index, result=json.dumps(result).encode())

    def _apply(self, committed: list[Entry]) -> None:
        for entry in committed:
            self.last_applied = entry.index
            try:
                result = self.apply(entry.index, entry.command)
            except Exception as exc:
                self._apply_failed(entry.index, exc)
            waiter = self._waiters.pop(entry.index, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(result)

    def _fail_waiters(self, reason: str) -> None:
        for future in self._waiters.values():
            if not future.done():
                future.set_exception(NotLeader(reason))
        self._waiters.clear()


# ---- the wire: the machine's messages as protobuf ------------------------------------------------------
def vote_request_pb(request: VoteRequest) -> pb.VoteRequest:
    return pb.VoteRequest(term=request.term, candidate=request.candidate, last_log_index=request.last_log_index,
                          last_log_term=request.last_log_term, pre_vote=request.pre_vote)


def append_request_pb(request: AppendRequest) -> pb.AppendRequest:
    return pb.AppendRequest(term=request.term, leader=request.leader, prev_log_index=request.prev_log_index,
                            prev_log_term=request.prev_log_term, leader_commit=request.leader_commit,
                            entries=[pb.LogEntry(index=e.index, term=e.term, command=e.command)
                                     for e in request.entries])


def _records(state) -> int:
    """How many records a decoded snapshot holds (what the next snapshot waits for)."""
    return state.get("records", 0) if isinstance(state, dict) else 0

