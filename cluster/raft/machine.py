"""Raft's consensus state and its transitions, pure: messages in, messages and writes out.

RaftMachine holds everything Raft decides with (role, term and vote, the log, the commit
index, who leads and when it was last heard, each follower's progress, the election
deadline, an election under way) and changes only when called: tick(now) as time passes,
one method per message that arrives, propose(). Each call returns a Ready, as etcd's raft
does: the term, vote and entries to make durable, the entries newly committed, and the
messages to send once those writes are done. The time is an argument; the failure
detector's view of the members (`peers`, `size`, `has_majority`, `is_up`, `up_members`,
as cluster/membership/members.py has them) and a random source are handed in. It opens no socket
or file, starts no task and reads no clock, so a test can run a whole cluster of them by
hand (tests/test_raft_machine.py).

The rules it applies are cluster/raft/rules.py's; cluster/raft/shell.py carries out what it asks.
Behaviour (pre-vote, leader stickiness, check-quorum, standing in turn after a leader
died) is described in cluster/raft/shell.py's docstring.

Membership changes (a member added or forgotten) take effect when applied, and change the
majority: the leader takes them one at a time (Raft thesis 4.1). It proposes a change only
once the previous one has committed, and as a new leader only once its first entry has
(any entry before it may be a change not yet committed), so at most two memberships, the
old and the new, are ever in use, and any majority of one overlaps any majority of the other.

Log compaction (Raft's section 7): the shell snapshots the state machine now and then and
has the machine forget the entries the snapshot stands in for (compact()). A follower whose
next entry the leader no longer holds gets the snapshot instead (SnapshotRequest); one that
takes it (on_install_snapshot) drops its log, and its state machine loads the snapshot.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from haremq.cluster.raft import rules
from haremq.cluster.raft.messages import AppendReply, AppendRequest, Entry, LogWrite, Ready, SnapshotRequest, VoteReply, VoteRequest
from haremq.cluster.raft.state import PersistentState

HEARTBEAT = 0.15                     # an idle follower hears from the leader this often
ELECTION_MIN, ELECTION_MAX = 0.6, 1.2
VOTE_TIMEOUT = 0.5                   # how long an election waits for one answer (the shell's call timeout)
APPEND_LOST = 3.0                    # an append unanswered this long is taken as lost (the call gave up sooner)
SNAPSHOT_LOST = 120.0                # a snapshot sent, unanswered this long (its call's own timeout is shorter)
BATCH = 256                          # entries per append


class NotLeader(Exception):
    """No leader is known (an election is under way, or no majority)."""


class ChangePending(NotLeader):
    """A membership change while the previous one has not committed: not now (thesis 4.1)."""


@dataclass
class Progress:
    """The leader's view of one follower. One append is in flight at a time: the next goes
    when its reply is in, at once if there is more to send or a commit to tell."""
    next_index: int
    match_index: int = 0
    in_flight: bool = False
    sent_at: float = 0.0
    heartbeat_at: float = 0.0     # idle: when it is due an (empty) append again
    retry_at: float = 0.0         # its last call failed: not before then
    lost_after: float = APPEND_LOST   # the call in flight is taken as lost after this long


@dataclass
class Election:
    """A round of asking for votes: the pre-vote (for term + 1, which nobody takes up yet)
    or the vote proper (in our raised term)."""
    term: int
    pre_vote: bool
    started: float
    granted: set[str] = field(default_factory=set)
    answered: set[str] = field(default_factory=set)


class RaftMachine:
    def __init__(self, name: str, members, persistent: PersistentState, log, now: float,
                 rng: random.Random | None = None):
        self.name = name
        self.members = members
        self.persistent = persistent
        self.log = log
        self.rng = rng or random.Random()  # noqa: S311 - election timeouts, not a secret
        self.role = "follower"
        self.leader: str | None = None
        self.commit_index = persistent.snapshot_index    # a snapshot holds only committed entries
        self.progress: dict[str, Progress] = {}
        self.told_commit: dict[str, int] = {}    # per follower: the commit index it has acknowledged
        self.leader_heard = 0.0                   # when an append from the leader was last accepted
        self.election: Election | None = None
        self.deadline = self._new_deadline(now)
        self._handed_out = persistent.snapshot_index   # committed entries given to the shell to apply
        # the log's end on this node's disk, as the shell last said (log_durable): as the leader we
        # count ourselves towards a commit only up to it. Counted from memory, an entry the leader
        # had sent but not yet written could commit on one follower's copy and be lost with the
        # leader, while that follower applied it.
        self.durable_index = persistent.last_index
        self.change_index = 0                     # as the leader: the last membership change proposed
        self._ready = Ready()

    @property
    def term(self) -> int:
        return self.persistent.term

    def _new_deadline(self, now: float) -> float:
        return now + self.rng.uniform(ELECTION_MIN, ELECTION_MAX)

    def _majority(self) -> int:
        return rules.majority(self.members.size)

    def _take(self) -> Ready:
        ready, self._ready = self._ready, Ready()
        return ready

    # ---- time ---------------------------------------------------------------------------------------
    def start(self, now: float) -> Ready:
        if not self.members.peers:       # a cluster of one commits on its own
            self._become_leader(now)
        return self._take()

    def tick(self, now: float) -> Ready:
        if self.role == "leader":
            if self.members.has_majority is False:
                # check-quorum: cut off from the majority, which may elect another leader
                self.log.warning("raft leader cannot see a majority: stepping down", term=self.term)
                self.leader = None
                self._step_down(self.term)
                self.deadline = self._new_deadline(now)
            else:
                self._heartbeat(now)
            return self._take()
        leader = self._other_leader()
        leader_up = leader is not None and self._leader_up(leader, now)
        if leader is not None and not leader_up:
            # the leader is gone (its port refuses us): no need to sit out a full timeout.
            # Every survivor sees that at once, so they go in turn (by name) rather than
            # at random: two candidates within one vote's round trip split the vote, and
            # the retry would wait a full election timeout (the slow failovers, issue 16)
            self.deadline = min(self.deadline, now + self._stagger(leader))
        elif now > self.deadline and leader_up:
            # silent, but the failure detector still hears it: a leader whose loop was held up
            # (a garbage collection, a long batch to write and apply) is not deposed for it.
            # One that stopped answering is counted down within the failure timeout, and the
            # branch above then has us stand in turn.
            self.deadline = self._new_deadline(now)
        if now > self.deadline and self.members.has_majority and not self._electing(now):
            self._campaign(now, pre_vote=True)
        return self._take()

    def _other_leader(self) -> str | None:
        """The leader this node knows of, when it is another node."""
        return self.leader if self.leader and self.leader != self.name else None

    def leader_gone(self) -> bool:
        """A leader other than us is known, and the failure detector sees it down."""
        leader = self._other_leader()
        return leader is not None and leader in self.members.peers and not self.members.is_up(leader)

    def _leader_up(self, leader: str, now: float) -> bool:
        """The failure detector's word on a leader it knows; one it does not know yet (added
        by an entry this node has not applied) is up while its appends keep coming."""
        if leader in self.members.peers:
            return self.members.is_up(leader)
        return now - self.leader_heard < ELECTION_MAX

    def _stagger(self, dead: str) -> float:
        """This node's turn to stand when the leader died: 0.1 s apart by name among the members
        that are up, with a little jitter."""
        return rules.stagger(self.name, self.members.up_members(), dead, self.rng.uniform(0.0, 0.02))

    def hears_from_leader(self, now: float) -> bool:
        """Leader stickiness: a leader is in charge and reachable, so no election is called for.
        The leader itself while it sees a majority; a follower within the minimum election
        timeout of an append from a leader its failure detector still sees up."""
        return rules.hears_from_leader(self.role, self.members.has_majority, self.leader, now,
                                       self.leader_heard, ELECTION_MIN, lambda n: self._leader_up(n, now))

    # ---- elections ----------------------------------------------------------------------------------
    def _electing(self, now: float) -> bool:
        """A round of votes still waits for answers (a new one would throw its answers away)."""
        return self.election is not None and now - self.election.started < VOTE_TIMEOUT

    def _campaign(self, now: float, pre_vote: bool) -> None:
        """Ask every peer for its vote: the pre-vote for term + 1 first, then, with a majority
        of yeses, the election proper in the raised term."""
        self.deadline = self._new_deadline(now)
        if pre_vote:
            term = self.term + 1
        else:
            self.role = "candidate"
            self.persistent.term += 1
            self.persistent.voted_for = self.name
            self.leader = None
            self.log.info("raft election", term=self.term)
            self._save_hard_state()
            term = self.term
        self.election = Election(term, pre_vote, now, granted={self.name})
        for peer in self.members.peers:
            self._ready.messages.append(VoteRequest(peer, term, self.name, self.persistent.last_index,
                                                    self.persistent.last_term, pre_vote))
        self._count_votes(now)

    def on_vote_reply(self, request: VoteRequest, reply: VoteReply, now: float) -> Ready:
        if reply.term > self.term and not reply.granted:
            self._step_down(reply.term)       # behind: learn the term, do not raise it
            return self._take()
        election = self.election
        if election is not None and (election.term, election.pre_vote) == (request.term, request.pre_vote):
            election.answered.add(request.to)
            if reply.granted:
                election.granted.add(request.to)
            self._count_votes(now)
        return self._take()

    def _count_votes(self, now: float) -> None:
        election = self.election
        if rules.won(len(election.granted), self._majority()):
            self.election = None
            if election.pre_vote and self.role != "leader" and self.term + 1 == election.term:
                self._campaign(now, pre_vote=False)
            elif not election.pre_vote and self.role == "candidate" and self.term == election.term:
                self._become_leader(now)
        elif len(election.answered) >= len(self.members.peers):
            self.election = None
            if election.pre_vote:
                self.log.debug("raft pre-vote lost: a leader is still followed", term=election.term,
                               votes=len(election.granted))

    def _become_leader(self, now: float) -> None:
        self.role = "leader"
        self.leader = self.name
        self.election = None
        self.progress = {p: Progress(self.persistent.last_index + 1) for p in self.members.peers}
        self.log.info("raft leader", term=self.term)
        # An entry of our own term lets earlier entries commit (Raft's commitment rule).
        self._append(self.persistent.last_index + 1,
                     [(self.term, json.dumps({"op": "noop", "leader": self.name,
                                              "members": sorted([self.name, *self.members.peers])}).encode())])
        self.change_index = self.persistent.last_index    # an earlier entry may be a change: wait for this one
        self._advance_commit(now)
        self._replicate(now)          # the followers hear of us now, not a heartbeat later

    def leader_to_ping(self, request: VoteRequest, now: float) -> str | None:
        """The leader to ping before answering this pre-vote: we follow one that our failure
        detector has not seen die yet, and a pre-vote suggests it may have."""
        if request.pre_vote and request.candidate in self.members.peers and self.role != "leader" \
                and self.hears_from_leader(now):
            return self.leader
        return None

    def on_vote_request(self, request: VoteRequest, now: float, leader_reachable: bool = True) -> Ready:
        """`leader_reachable`: what pinging leader_to_ping() found, if it named one."""
        if request.candidate not in self.members.peers:
            # a forgotten member started on its old data: its elections must not disturb ours
            return self._vote_reply(request, False)
        up_to_date = rules.up_to_date(request.last_log_term, request.last_log_index, self.persistent.last_term,
                                      self.persistent.last_index)
        if self.hears_from_leader(now) and (self.role == "leader" or not request.pre_vote or leader_reachable):
            # a node coming back must not depose a leader we follow: no vote, and our term stays.
            # (A leader that has just died would hold up the failover until our lease ran out:
            # a pre-vote has it pinged now, and its refused port ends the lease at once.)
            return self._vote_reply(request, False)
        if request.pre_vote:
            return self._vote_reply(request, rules.grant_pre_vote(request.term, self.term, up_to_date))
        if request.term > self.term:
            self._step_down(request.term)
        granted = rules.grant_vote(request.term, self.term, up_to_date, self.persistent.voted_for,
                                   request.candidate)
        if granted:
            self.persistent.voted_for = request.candidate
            self.leader = None       # an election is on: the old leader is not waited for any more
            self.election = None     # nor is our own pre-vote: we just helped another candidate
            # the candidate gets its election timeout from now (our own timer, expired meanwhile,
            # would start a rival election in term + 1)
            self.deadline = self._new_deadline(now)
            self.log.info("raft vote", candidate=request.candidate, term=request.term)
            self._save_hard_state()
        return self._vote_reply(request, granted)

    def _vote_reply(self, request: VoteRequest, granted: bool) -> Ready:
        self._ready.messages.append(VoteReply(request.candidate, self.term, granted))
        return self._take()

    def _step_down(self, term: int) -> None:
        if term > self.term:
            self.persistent.term = term
            self.persistent.voted_for = None
            self._save_hard_state()
        if self.role != "follower":
            self.log.info("raft follower", term=term)
        self.role = "follower"
        self.election = None
        self._ready.leadership_lost = True

    def _save_hard_state(self) -> None:
        self._ready.hard_state = (self.term, self.persistent.voted_for)

    # ---- replication: the leader ------------------------------------------------------------------
    def propose(self, command: bytes, now: float, change: bool = False) -> tuple[int, Ready]:
        """Append a command as the leader; its index, and what to do about it. `change`: it
        adds or removes a member, so only if change_allowed()."""
        if self.role != "leader":
            raise NotLeader("not the leader")
        if change and not self.change_allowed():
            raise ChangePending(f"membership change at index {self.change_index} not committed yet")
        index = self.persistent.last_index + 1
        self._append(index, [(self.term, command)])
        if change:
            self.change_index = index
        self._replicate(now)
        self._advance_commit(now)
        return index, self._take()

    def change_allowed(self) -> bool:
        """As the leader: the last membership change (or our first entry) has committed."""
        return self.role == "leader" and self.change_index <= self.commit_index

    def member_added(self, name: str, now: float) -> Ready:
        """A member joined (member.add applied): the leader sends it the log from the start."""
        if self.role == "leader":
            self.progress.setdefault(name, Progress(1))
            self._send_append(name, now)
        return self._take()

    def _heartbeat(self, now: float) -> None:
        for peer in self.members.peers:
            progress = self.progress.setdefault(peer, Progress(self.persistent.last_index + 1))
            if progress.in_flight and now - progress.sent_at > progress.lost_after:
                progress.in_flight = False       # its answer will not come (the call was never made)
            if now >= progress.heartbeat_at:
                self._send_append(peer, now)

    def _replicate(self, now: float) -> None:
        """Something new to tell (an entry, a commit): to every follower not busy or failing."""
        for peer in self.progress:
            if peer in self.members.peers:
                self._send_append(peer, now)

    def _send_append(self, peer: str, now: float) -> None:
        progress = self.progress[peer]
        if progress.in_flight or now < progress.retry_at:
            return
        if progress.next_index <= self.persistent.snapshot_index:
            # what it needs next is compacted away: it gets the snapshot instead (the shell reads it)
            self._ready.messages.append(SnapshotRequest(peer, self.term, self.name, self.persistent.snapshot_index,
                                                        self.persistent.snapshot_term, self.commit_index))
            progress.in_flight, progress.sent_at, progress.lost_after = True, now, SNAPSHOT_LOST
            return
        prev = progress.next_index - 1
        entries = tuple(Entry(i, t, c) for i, (t, c) in
                        enumerate(self.persistent.slice(progress.next_index, BATCH), start=progress.next_index))
        self._ready.messages.append(AppendRequest(peer, self.term, self.name, prev, self.persistent.term_at(prev),
                                                  entries, self.commit_index))
        progress.in_flight, progress.sent_at, progress.lost_after = True, now, APPEND_LOST

    def _answered(self, request: AppendRequest | SnapshotRequest, reply: AppendReply) -> Progress | None:
        """The follower's progress, its request no longer in flight, if this reply is to a request
        of ours in this term; None otherwise (a higher term in it deposes us)."""
        if reply.term > self.term:
            self._step_down(reply.term)
            return None
        progress = self.progress.get(request.to)
        if self.role != "leader" or self.term != request.term or progress is None:
            return None
        progress.in_flight = False
        return progress

    def on_append_reply(self, request: AppendRequest, reply: AppendReply, now: float) -> Ready:
        progress = self._answered(request, reply)
        if progress is None:
            return self._take()
        if reply.success:
            self.told_commit[request.to] = min(request.leader_commit, reply.match_index)
            progress.match_index = reply.match_index
            progress.next_index = reply.match_index + 1
            self._advance_commit(now)
            if progress.next_index <= self.persistent.last_index or self.told_commit[request.to] < self.commit_index:
                self._send_append(request.to, now)     # more to send, or a commit this reply made: tell it now
            else:
                progress.heartbeat_at = now + HEARTBEAT
        else:
            progress.next_index = rules.next_index_after_refusal(request.prev_log_index + 1, reply.match_index)
            self._send_append(request.to, now)
        return self._take()

    def on_snapshot_reply(self, request: SnapshotRequest, reply: AppendReply, now: float) -> Ready:
        """The follower took the snapshot (or held its entries already): it matches the leader
        up to the snapshot's last index, and the entries after it follow."""
        progress = self._answered(request, reply)
        if progress is None:
            return self._take()
        if not reply.success:
            progress.retry_at = progress.heartbeat_at = now + HEARTBEAT
            return self._take()
        self.told_commit[request.to] = min(request.leader_commit, reply.match_index)
        progress.match_index = max(progress.match_index, reply.match_index)
        progress.next_index = progress.match_index + 1
        self._advance_commit(now)
        self._send_append(request.to, now)
        return self._take()

    def on_unreachable(self, request: VoteRequest | AppendRequest | SnapshotRequest, now: float) -> Ready:
        """A request found no answer (the peer is down, slow or gone)."""
        if isinstance(request, VoteRequest):
            election = self.election
            if election is not None and (election.term, election.pre_vote) == (request.term, request.pre_vote):
                election.answered.add(request.to)
                self._count_votes(now)
        else:
            progress = self.progress.get(request.to)
            if self.role == "leader" and self.term == request.term and progress is not None:
                progress.in_flight = False
                progress.retry_at = progress.heartbeat_at = now + HEARTBEAT
        return self._take()

    def _advance_commit(self, now: float) -> None:
        ours = min(self.persistent.last_index, self.durable_index)    # what we hold counts once on disk
        commit = rules.leader_commit(ours, [p.match_index for p in self.progress.values()],
                                     self._majority(), self.persistent.term_at, self.term, self.commit_index)
        if commit != self.commit_index:
            self.commit_index = commit
            self._hand_out_committed()
            self._replicate(now)     # tell the followers now, not at the next heartbeat

    # ---- replication: a follower ------------------------------------------------------------------
    def _follow(self, term: int, leader: str, now: float) -> bool:
        """A leader spoke (appends or a snapshot): follow it, unless its term is stale (False).
        It may be a member this node has not heard of: one that joined through an entry this
        node, restarted with a `--peer` list from before, has not applied yet. A majority that
        knows it elected it, and its appends are what bring that entry here. (A forgotten
        member never leads: nobody grants it a vote.)"""
        if term < self.term:
            return False
        if term > self.term or self.role != "follower":
            self._step_down(term)
        if self.leader != leader:
            self.log.info("raft leader is", leader=leader, term=term)
        self.leader = leader
        self._heard_leader(now)
        self.election = None            # a leader is in charge: our pre-vote, if any, is moot
        return True

    def _heard_leader(self, now: float) -> None:
        """The leader's silence, and our election timer, count from now."""
        self.leader_heard = now
        self.deadline = self._new_deadline(now)

    def answered_leader(self, term: int, leader: str, now: float) -> None:
        """Our answer to the leader's append or snapshot has just gone, after its entries were
        written and what they committed was applied (long, with many queues on a busy machine).
        The leader sends a follower one request at a time, so it said nothing meanwhile: its
        silence counts from now. Counted from the request, a follower slower than the election
        timeout called elections against a leader that was waiting for it (a cluster declaring
        100,000 queues changed leader every few seconds)."""
        if self.role == "follower" and self.term == term and self.leader == leader:
            self._heard_leader(now)

    def on_append_request(self, request: AppendRequest, now: float) -> Ready:
        if not self._follow(request.term, request.leader, now):
            return self._append_reply(request, False, 0)
        prev, prev_term, entries = request.prev_log_index, request.prev_log_term, request.entries
        compacted = self.persistent.snapshot_index
        if prev < compacted:
            # entries up to our snapshot are committed, so the leader's match ours: only those
            # after it are looked at, against the snapshot's last entry
            entries = entries[compacted - prev:]
            prev, prev_term = compacted, self.persistent.snapshot_term
        if not rules.consistent(prev, prev_term, self.persistent.last_index, self.persistent.term_at):
            return self._append_reply(request, False, rules.refusal_hint(prev, self.persistent.last_index))
        new = rules.new_entries(entries, self.persistent.last_index, self.persistent.term_at)
        if new:
            self._append(new[0].index, [(e.term, e.command) for e in new])
        last = prev + len(entries)
        if request.leader_commit > self.commit_index:
            self.commit_index = rules.follower_commit(request.leader_commit, last, self.commit_index)
            self._hand_out_committed()
        return self._append_reply(request, True, last)

    def on_install_snapshot(self, request: SnapshotRequest, now: float) -> Ready:
        """The leader's snapshot, for entries it no longer holds. A snapshot of entries this node
        has committed already changes nothing; one whose last entry the log holds (same index
        and term) commits the log up to it, and the log applies as usual; any other replaces
        the log: it is made durable and handed to the state machine (Ready.snapshot), and the
        entries after it follow as appends."""
        probe = AppendRequest(self.name, request.term, request.leader, 0, 0)
        if not self._follow(request.term, request.leader, now):
            return self._append_reply(probe, False, 0)
        index, term = request.last_index, request.last_term
        if index <= self.commit_index:
            return self._append_reply(probe, True, index)
        if index <= self.persistent.last_index and self.persistent.term_at(index) == term:
            self.commit_index = index
            self._hand_out_committed()
            return self._append_reply(probe, True, index)
        self.log.info("raft snapshot installed", index=index, term=term, bytes=len(request.data))
        self.persistent.compact(index, term)
        self.commit_index = self._handed_out = index
        self._ready.snapshot = request
        return self._append_reply(probe, True, index)

    def log_durable(self, index: int, now: float) -> Ready:
        """The shell wrote and fsynced the log up to `index` (its end then): as the leader, what
        that commits (its entries to apply, the followers to tell)."""
        self.durable_index = index
        if self.role == "leader":
            self._advance_commit(now)
        return self._take()

    def compaction_point(self, index: int, keep: int, most: int) -> int:
        """Where the log may be cut once a snapshot at `index` is written: `keep` entries before
        it stay, for members a little behind (with fewer they would need the snapshot, and one
        serving clients cannot load it), and as the leader also what a follower that is up still
        needs (its match index), but never more than `most` entries before it."""
        cut = index - keep
        if self.role == "leader":
            for peer, progress in self.progress.items():
                if peer in self.members.peers and self.members.is_up(peer):
                    cut = min(cut, progress.match_index)
        return min(index, max(self.persistent.snapshot_index, cut, index - most))

    def compact(self, index: int, term: int) -> None:
        """The shell made a snapshot of the state after entry `index` (applied, so committed)
        durable, and cut the log file before it: the entries up to it are forgotten here too."""
        if index <= self.persistent.snapshot_index:
            return          # a newer snapshot (the leader's) is in place already
        if index > self._handed_out or self.persistent.term_at(index) != term:
            raise ValueError(f"a snapshot at {index} (term {term}) is not of an applied entry")
        self.persistent.compact(index, term)

    def _append_reply(self, request: AppendRequest, success: bool, match_index: int) -> Ready:
        self._ready.messages.append(AppendReply(request.leader, self.term, success, match_index))
        return self._take()

    # ---- the log ------------------------------------------------------------------------------------
    def _append(self, start: int, entries: list[tuple[int, bytes]]) -> None:
        truncated = self.persistent.replace_from(start, entries)
        whole = tuple(self.persistent.entries) if truncated else None
        self._ready.log_writes.append(LogWrite(start, tuple(entries), whole, self.persistent.snapshot_index))

    def _hand_out_committed(self) -> None:
        while self._handed_out < self.commit_index:
            self._handed_out += 1
            term, command = self.persistent.entry(self._handed_out)
            self._ready.committed.append(Entry(self._handed_out, term, command))
