"""Raft for the cluster's metadata: one total order of changes, agreed by a majority.

Why Raft: the metadata (vhosts, users, exchanges, queues and their home
nodes, bindings, policies) must be the same on every node, in the same
order, and must survive the loss of a minority without two nodes ever
disagreeing about a queue's home. Raft gives exactly that with a leader
that commits an entry once a majority has it on disk; it is small enough to
read in one sitting, and its election rule (only a node with every committed
entry can win) is what makes a failover safe. Log compaction is not needed
yet: metadata changes are few.

A node that comes back (restarted, resumed after a stop, or out of a
partition) must not depose a leader the majority still follows, so an
election goes in two rounds (pre-vote, Raft thesis 9.6): a node first asks
whether it would be elected, without raising its term, and only with a
majority of yeses starts the real election. A node says no while it hears
from a leader (leader stickiness, thesis 4.2.3), and ignores even a real
vote request then, so a returning node never inflates the term. A leader
that cannot see a majority any more steps down (check-quorum).

The log and the vote live in DATA_DIR/raft: `state.json` (term, vote) and
`log.jsonl` (one entry per line), appended and fsynced off the event loop
before a vote or an append is answered.

This module is the shell: state, gRPC, tasks and timers. The rules it
follows (whom to vote for, which entries to accept, what is committed, when
to stand) are pure functions in cluster/raft_core.py; the term, vote and log
are written and fsynced by cluster/raft_storage.py.
"""
from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Callable

import grpc
import structlog

from haremq.node.tasks import TaskGroup

from . import raft_core as rules
from .raft_storage import RaftStorage
from .rpc import cluster_pb2 as pb

HEARTBEAT = 0.15
ELECTION_MIN, ELECTION_MAX = 0.6, 1.2
PROPOSE_TIMEOUT = 10.0


class NotLeader(Exception):
    """No leader is known (an election is under way, or no majority)."""


class Raft:
    def __init__(self, name: str, membership, storage: RaftStorage,
                 apply: Callable[[int, bytes], object]):
        self.name = name
        self.membership = membership
        self.storage = storage
        self.apply = apply
        self.role = "follower"
        self.leader: str | None = None
        self.commit_index = 0
        self.last_applied = 0
        self.next_index: dict[str, int] = {}
        self.match_index: dict[str, int] = {}
        self.log = structlog.get_logger("haremq.raft").bind(node=name)
        self._deadline = self._new_deadline()
        self._leader_heard = 0.0         # when an AppendEntries from the leader was last accepted
        self._voted_at = 0.0             # when this node last granted its vote to another
        self._waiters: dict[int, asyncio.Future] = {}
        self._io = asyncio.Lock()
        self._tasks = TaskGroup(f"raft {name}")     # the consensus loop, one replication loop per follower
        self._replicating: set[str] = set()
        self.told_commit: dict[str, int] = {}   # per follower: commit index it has applied (acknowledged)

    # ---- lifetime -----------------------------------------------------------------------
    async def start(self) -> None:
        if not self.membership.peers:        # a cluster of one commits on its own
            await self._become_leader()
        self._tasks.spawn(self._run())

    async def stop(self) -> None:
        await self._tasks.close()

    @property
    def term(self) -> int:
        return self.storage.term

    def _new_deadline(self) -> float:
        return time.monotonic() + random.uniform(ELECTION_MIN, ELECTION_MAX)

    def _majority(self) -> int:
        return rules.majority(self.membership.size)

    async def _run(self) -> None:
        while True:
            if self.role == "leader":
                await asyncio.sleep(HEARTBEAT)
            elif self.leader and self.leader != self.name and not self.membership.is_up(self.leader):
                await asyncio.sleep(0.01)       # the leader is gone: stand as soon as it is our turn
            else:
                await asyncio.sleep(HEARTBEAT / 3)
            try:
                if self.role == "leader" and self.membership.has_majority is False:
                    # check-quorum: cut off from the majority, which may elect another leader
                    self.log.warning("raft leader cannot see a majority: stepping down", term=self.term)
                    self.leader = None
                    await self._step_down(self.term)
                    self._deadline = self._new_deadline()
                elif self.role == "leader":
                    self._start_replication()
                else:
                    now = time.monotonic()
                    if self.leader and self.leader != self.name and not self.membership.is_up(self.leader):
                        # the leader is gone (its port refuses us): no need to sit out a full timeout.
                        # Every survivor sees that at once, so they go in turn (by name) rather than
                        # at random: two candidates within one vote's round trip split the vote, and
                        # the retry would wait a full election timeout (the slow failovers, issue 16)
                        self._deadline = min(self._deadline, now + self._stagger(self.leader))
                    if now > self._deadline and self.membership.has_majority:
                        await self._elect()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - keep the consensus loop alive whatever one round did
                self.log.exception("raft round failed")

    def _start_replication(self) -> None:
        for peer in list(self.membership.peers.values()):
            if peer.name not in self._replicating:
                self._replicating.add(peer.name)
                self._tasks.spawn(self._replicate(peer))

    def _stagger(self, dead: str) -> float:
        """This node's turn to stand when the leader died: 0.1 s apart by name among the members
        that are up, with a little jitter."""
        return rules.stagger(self.name, self.membership.up_members(), dead, random.uniform(0.0, 0.02))

    # ---- elections ------------------------------------------------------------------------
    async def _persist_state(self) -> None:
        async with self._io:
            await asyncio.to_thread(self.storage.save_state)

    async def _step_down(self, term: int) -> None:
        if term > self.storage.term:
            self.storage.term = term
            self.storage.voted_for = None
            await self._persist_state()
        if self.role != "follower":
            self.log.info("raft follower", term=term)
        self.role = "follower"
        self._fail_waiters("leadership lost")

    def hears_from_leader(self) -> bool:
        """Leader stickiness: a leader is in charge and reachable, so no election is called for.
        The leader itself while it sees a majority; a follower within the minimum election
        timeout of an AppendEntries from a leader its failure detector still sees up."""
        return rules.hears_from_leader(self.role, self.membership.has_majority, self.leader, time.monotonic(),
                                       self._leader_heard, ELECTION_MIN, self.membership.is_up)

    async def _elect(self) -> None:
        """Pre-vote, then (with a majority of yeses) the election proper in term + 1."""
        self._deadline = self._new_deadline()
        started = time.monotonic()
        if not await self._poll(pre_vote=True):
            return
        if max(self._voted_at, self._leader_heard) >= started:
            return       # meanwhile we voted for another candidate, or heard from a leader
        self.role = "candidate"
        self.storage.term += 1
        self.storage.voted_for = self.name
        self.leader = None
        self.log.info("raft election", term=self.storage.term)
        await self._persist_state()
        self._deadline = self._new_deadline()
        if await self._poll(pre_vote=False):
            await self._become_leader()

    async def _poll(self, pre_vote: bool) -> bool:
        """Ask every peer for its vote in term + 1 (pre-vote) or in this term; True on a majority."""
        term = self.storage.term + 1 if pre_vote else self.storage.term
        request = pb.VoteRequest(term=term, candidate=self.name, last_log_index=self.storage.last_index,
                                 last_log_term=self.storage.last_term, pre_vote=pre_vote)
        votes = 1
        calls = [peer.stub.RequestVote(request, timeout=0.5, metadata=self.membership.metadata())
                 for peer in self.membership.peers.values()]
        for reply in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(reply, BaseException):
                continue
            if reply.term > self.storage.term and not reply.granted:
                await self._step_down(reply.term)     # behind: learn the term, do not raise it
                return False
            if reply.granted:
                votes += 1
        won = rules.won(votes, self._majority())
        if pre_vote:
            if not won:
                self.log.debug("raft pre-vote lost: a leader is still followed", term=term, votes=votes)
            return won and self.role != "leader" and self.storage.term + 1 == term
        return won and self.role == "candidate" and self.storage.term == term

    async def _become_leader(self) -> None:
        self.role = "leader"
        self.leader = self.name
        self.next_index = {p: self.storage.last_index + 1 for p in self.membership.peers}
        self.match_index = {p: 0 for p in self.membership.peers}
        self.log.info("raft leader", term=self.storage.term)
        # An entry of our own term lets earlier entries commit (Raft's commitment rule).
        await self._append_local(json.dumps({"op": "noop", "leader": self.name}).encode())
        self._advance_commit()
        self._start_replication()     # the followers hear of us now, not a heartbeat later

    async def on_request_vote(self, request) -> pb.VoteReply:
        if request.candidate not in self.membership.peers:
            # a forgotten member started on its old data: its elections must not disturb ours
            return pb.VoteReply(term=self.storage.term, granted=False)
        up_to_date = rules.up_to_date(request.last_log_term, request.last_log_index, self.storage.last_term,
                                      self.storage.last_index)
        if self.hears_from_leader() and (self.role == "leader" or not request.pre_vote
                                         or await self.membership.reachable(self.leader)):
            # a node coming back must not depose a leader we follow: no vote, and our term stays.
            # (A leader that has just died would hold up the failover until our lease ran out:
            # a pre-vote has it pinged now, and its refused port ends the lease at once.)
            return pb.VoteReply(term=self.storage.term, granted=False)
        if request.pre_vote:
            granted = rules.grant_pre_vote(request.term, self.storage.term, up_to_date)
            return pb.VoteReply(term=self.storage.term, granted=granted)
        if request.term > self.storage.term:
            await self._step_down(request.term)
        granted = False
        if rules.grant_vote(request.term, self.storage.term, up_to_date, self.storage.voted_for,
                            request.candidate):
            self.storage.voted_for = request.candidate
            self.leader = None       # an election is on: the old leader is not waited for any more
            # the candidate gets its election timeout from now, not from when our write ends
            # (our own timer, expired meanwhile, would start a rival election in term + 1)
            self._deadline = self._new_deadline()
            self._voted_at = time.monotonic()
            self.log.info("raft vote", candidate=request.candidate, term=request.term)
            await self._persist_state()
            granted = True
        return pb.VoteReply(term=self.storage.term, granted=granted)

    def member_added(self, name: str) -> None:
        """A member joined (member.add applied): the leader sends it the log from the start."""
        if self.role == "leader":
            self.next_index.setdefault(name, 1)
            self.match_index.setdefault(name, 0)
            self._start_replication()

    # ---- replication ------------------------------------------------------------------------
    async def _append_local(self, command: bytes, waiter: asyncio.Future | None = None) -> int:
        async with self._io:
            index = self.storage.last_index + 1
            if waiter is not None:     # before the entry exists: a reply may commit it during the write
                self._waiters[index] = waiter
            await asyncio.to_thread(self.storage.append, index, [(self.storage.term, command)])
        return index

    async def _replicate(self, peer) -> None:
        try:
            while self.role == "leader":
                term = self.storage.term
                next_index = self.next_index.get(peer.name, self.storage.last_index + 1)
                prev = next_index - 1
                entries = [pb.LogEntry(index=i, term=t, command=c) for i, (t, c) in
                           enumerate(self.storage.entries[prev:prev + 256], start=next_index)]
                request = pb.AppendRequest(term=term, leader=self.name, prev_log_index=prev,
                                           prev_log_term=self.storage.term_at(prev), entries=entries,
                                           leader_commit=self.commit_index)
                try:
                    reply = await peer.stub.AppendEntries(request, timeout=1.0, metadata=self.membership.metadata())
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(HEARTBEAT)
                    continue
                if reply.term > self.storage.term:
                    await self._step_down(reply.term)
                    return
                if self.role != "leader" or self.storage.term != term:
                    return
                if reply.success:
                    self.told_commit[peer.name] = min(request.leader_commit, reply.match_index)
                    self.match_index[peer.name] = reply.match_index
                    self.next_index[peer.name] = reply.match_index + 1
                    self._advance_commit()
                    if self.next_index[peer.name] <= self.storage.last_index or \
                            self.told_commit[peer.name] < self.commit_index:
                        continue      # more to send, or a commit this reply made: tell it now
                else:
                    self.next_index[peer.name] = rules.next_index_after_refusal(next_index, reply.match_index)
                    continue
                await self._wait_for_work()
        finally:
            self._replicating.discard(peer.name)

    async def _wait_for_work(self) -> None:
        """Until there is a new entry to send, or the next heartbeat is due."""
        event = self._new_entry_event()
        try:
            await asyncio.wait_for(event.wait(), HEARTBEAT)
        except asyncio.TimeoutError:
            pass

    def _new_entry_event(self) -> asyncio.Event:
        if not hasattr(self, "_entry_event") or self._entry_event.is_set():
            self._entry_event = asyncio.Event()
        return self._entry_event

    def _notify_new_entry(self) -> None:
        if hasattr(self, "_entry_event"):
            self._entry_event.set()

    def _advance_commit(self) -> None:
        commit = rules.leader_commit(self.storage.last_index, self.match_index.values(), self._majority(),
                                     self.storage.term_at, self.storage.term, self.commit_index)
        if commit != self.commit_index:
            self.commit_index = commit
            self._apply_committed()
            self._notify_new_entry()     # tell the followers now, not at the next heartbeat

    async def on_append_entries(self, request) -> pb.AppendReply:
        if request.term < self.storage.term or request.leader not in self.membership.peers:
            return pb.AppendReply(term=self.storage.term, success=False, match_index=0)
        if request.term > self.storage.term or self.role != "follower":
            await self._step_down(request.term)
        if self.leader != request.leader:
            self.log.info("raft leader is", leader=request.leader, term=request.term)
        self.leader = request.leader
        self._leader_heard = time.monotonic()
        self._deadline = self._new_deadline()
        prev = request.prev_log_index
        if not rules.consistent(prev, request.prev_log_term, self.storage.last_index, self.storage.term_at):
            return pb.AppendReply(term=self.storage.term, success=False,
                                  match_index=rules.refusal_hint(prev, self.storage.last_index))
        new = rules.new_entries(request.entries, self.storage.last_index, self.storage.term_at)
        if new:
            async with self._io:
                await asyncio.to_thread(self.storage.append, new[0].index,
                                        [(e.term, bytes(e.command)) for e in new])
        last = prev + len(request.entries)
        if request.leader_commit > self.commit_index:
            self.commit_index = rules.follower_commit(request.leader_commit, last, self.commit_index)
            self._apply_committed()
        return pb.AppendReply(term=self.storage.term, success=True, match_index=last)

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

    async def _lead(self, data: bytes) -> tuple[int, object]:
        """As the leader: append, replicate, commit, apply here; (index, result of applying)."""
        future = asyncio.get_running_loop().create_future()
        index = await self._append_local(data, future)
        self._notify_new_entry()
        self._advance_commit()
        result = await asyncio.wait_for(future, PROPOSE_TIMEOUT)
        await self._followers_applied(index)
        return index, result

    async def propose(self, command: dict, forward_if_deposed: bool = True) -> object:
        """Commit a command cluster-wide; return what applying it here returned.

        A follower hands it to the leader; while there is none (an election after the
        leader died) it waits and tries again, up to PROPOSE_TIMEOUT.
        """
        data = json.dumps(command).encode()
        deadline = time.monotonic() + PROPOSE_TIMEOUT
        while True:
            if self.role == "leader":
                try:
                    return (await self._lead(data))[1]
                except NotLeader:
                    if time.monotonic() > deadline or not forward_if_deposed:
                        raise
                    continue     # deposed by a newer election: hand it to the new leader
            leader = self.membership.peers.get(self.leader or "")
            if leader is not None and self.membership.is_up(leader.name):
                try:
                    reply = await leader.stub.Propose(
                        pb.ProposeRequest(command=data), metadata=self.membership.metadata(),
                        timeout=max(0.1, min(2.0, deadline - time.monotonic())))
                    if reply.ok:
                        await self.wait_applied(reply.index)
                        return json.loads(reply.result) if reply.result else None
                except grpc.aio.AioRpcError:
                    pass
            if time.monotonic() > deadline:
                raise NotLeader("no metadata leader answered")
            await asyncio.sleep(0.05)

    async def wait_applied(self, index: int, timeout: float = PROPOSE_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while self.last_applied < index:
            if time.monotonic() > deadline:
                raise NotLeader(f"entry {index} not applied here within {timeout} s")
            await asyncio.sleep(0.01)

    async def on_propose(self, request) -> pb.ProposeReply:
        if self.role != "leader":
            return pb.ProposeReply(ok=False, error="not the leader")
        try:
            index, result = await self._lead(bytes(request.command))
        except (asyncio.TimeoutError, NotLeader) as exc:
            return pb.ProposeReply(ok=False, error=str(exc) or "not committed in time")
        return pb.ProposeReply(ok=True, index=index, result=json.dumps(result).encode())

    def _apply_committed(self) -> None:
        while self.last_applied < self.commit_index:
            self.last_applied += 1
            index = self.last_applied
            _term, command = self.storage.entries[index - 1]
            try:
                result = self.apply(index, command)
            except Exception as exc:  # noqa: BLE001 - one bad entry must not stop the log
                self.log.exception("applying metadata entry failed", index=index)
                result = {"error": [541, f"INTERNAL_ERROR - {type(exc).__name__}", 0, 0]}
            waiter = self._waiters.pop(index, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(result)

    def _fail_waiters(self, reason: str) -> None:
        for future in self._waiters.values():
            if not future.done():
                future.set_exception(NotLeader(reason))
        self._waiters.clear()
