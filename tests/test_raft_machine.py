"""The Raft machine (cluster/raft/machine.py) driven by hand: no sockets, no files, no clock.

A simulated network carries the machines' messages between them, with the failure
detector's view derived from who can reach whom, the time advanced in steps, and loss
and partitions chosen by a seeded random source, so every run is the same. Each Ready is
carried out as the shell does it (writes, then applying, then sending), and the checks
that must hold at every step (one leader per term, nothing promised before it is on
disk, every node applying the same sequence) are made as it goes.
"""
from __future__ import annotations

import json
import random

import pytest
import structlog

from haremq.cluster.raft.machine import (APPEND_LOST, ELECTION_MAX, ELECTION_MIN, HEARTBEAT, ChangePending, NotLeader,
                                        RaftMachine)
from haremq.cluster.raft.messages import AppendReply, AppendRequest, Entry, SnapshotRequest, VoteReply, VoteRequest
from haremq.cluster.raft.state import PersistentState

STEP = 0.01
LOG = structlog.get_logger("haremq.raft.test")


class View:
    """What a machine asks of membership, computed from the simulated network."""

    def __init__(self, name: str, net: "Network"):
        self.name, self.net = name, net
        self.peers = {n for n in net.names if n != name}

    size = property(lambda self: len(self.peers) + 1)
    has_majority = property(lambda self: len(self.up_members()) * 2 > self.size)

    def is_up(self, name: str) -> bool:
        return name == self.name or self.net.connected(self.name, name)

    def up_members(self) -> list[str]:
        return [self.name] + sorted(p for p in self.peers if self.net.connected(self.name, p))


class Network:
    def __init__(self, names=("a", "b", "c"), seed: int = 1, loss: float = 0.0):
        self.names = list(names)
        self.now = 0.0
        self.rng = random.Random(seed)
        self.loss = loss
        self.alive = set(names)
        self.cut: set[frozenset] = set()
        self.disk = {n: PersistentState() for n in names}      # what each node has written
        self.applied: dict[str, list[Entry]] = {n: [] for n in names}     # each node's state machine
        self.snapshots: dict[str, tuple[int, int, bytes]] = {}   # what each node's snapshot file holds
        self.installed: dict[str, int] = {n: 0 for n in names}   # snapshots each took from a leader
        self.leaders: dict[int, str] = {}                      # term -> who led it
        self.nodes = {n: RaftMachine(n, View(n, self), PersistentState(), LOG.bind(node=n), self.now,
                                     random.Random(seed * 100 + i)) for i, n in enumerate(names)}
        self.queue: list[tuple[str, object]] = []
        for name, node in self.nodes.items():
            self.carry_out(name, node.start(self.now))

    # ---- the network -----------------------------------------------------------------------------
    def connected(self, a: str, b: str) -> bool:
        return a in self.alive and b in self.alive and frozenset((a, b)) not in self.cut

    def partition(self, *groups) -> None:
        self.cut = {frozenset((a, b)) for g in groups for a in g for b in self.names if b not in g}

    def heal(self) -> None:
        self.cut = set()

    def lost(self) -> bool:
        return self.loss > 0 and self.rng.random() < self.loss

    # ---- carrying out a Ready as the shell does ----------------------------------------------------
    def carry_out(self, name: str, ready) -> list:
        disk = self.disk[name]
        if ready.hard_state is not None:
            disk.term, disk.voted_for = ready.hard_state
        if ready.snapshot is not None:         # a leader's snapshot: in place, the log emptied
            snap = ready.snapshot
            self.snapshots[name] = (snap.last_index, snap.last_term, snap.data)
            disk.entries, disk.snapshot_index, disk.snapshot_term = [], snap.last_index, snap.last_term
        for write in ready.log_writes:
            if write.whole is not None:
                assert write.base == disk.snapshot_index
                disk.entries = list(write.whole)
            else:
                assert write.start == disk.last_index + 1, "an append must follow what is on disk"
                disk.entries.extend(write.entries)
        if ready.snapshot is not None:         # the state machine loads it
            self.applied[name] = [Entry(i, t, c.encode()) for i, t, c in json.loads(ready.snapshot.data)]
            self.installed[name] += 1
            assert [e.index for e in self.applied[name]] == list(range(1, ready.snapshot.last_index + 1))
        assert not ready.committed or ready.committed[0].index == len(self.applied[name]) + 1
        self.applied[name].extend(ready.committed)
        replies = []
        for message in ready.messages:     # nothing promised before it is on disk
            if isinstance(message, AppendReply) and message.success:
                assert disk.last_index >= message.match_index
            if isinstance(message, (VoteReply, AppendReply)):
                replies.append(message)
            else:
                self.queue.append((name, message))
        node = self.nodes[name]
        if node.role == "leader":
            assert self.leaders.setdefault(node.term, name) == name, "two leaders in one term"
        if ready.log_writes or ready.snapshot is not None:     # the shell tells the machine what is on disk
            replies += self.carry_out(name, node.log_durable(disk.last_index, self.now))
        return replies

    def deliver(self) -> None:
        while self.queue:
            sender, request = self.queue.pop(0)
            source, target = self.nodes[sender], self.nodes[request.to]
            if sender not in self.alive:
                continue
            if not self.connected(sender, request.to) or self.lost():
                self.carry_out(sender, source.on_unreachable(request, self.now))
                continue
            if isinstance(request, VoteRequest):
                leader = target.leader_to_ping(request, self.now)
                reachable = leader is None or self.connected(request.to, leader)
                [reply] = self.carry_out(request.to, target.on_vote_request(request, self.now, reachable))
                if reply.granted and not request.pre_vote:    # the vote is on disk before it is given
                    assert (self.disk[request.to].term, self.disk[request.to].voted_for) == (request.term, sender)
            elif isinstance(request, SnapshotRequest):        # the shell sends what its file holds
                index, term, data = self.snapshots[sender]
                request = SnapshotRequest(request.to, request.term, request.leader, index, term,
                                          request.leader_commit, data)
                [reply] = self.carry_out(request.to, target.on_install_snapshot(request, self.now))
            else:
                [reply] = self.carry_out(request.to, target.on_append_request(request, self.now))
            if self.lost():           # the answer is lost: the caller's timeout says as much
                self.carry_out(sender, source.on_unreachable(request, self.now))
            elif isinstance(reply, VoteReply):
                self.carry_out(sender, source.on_vote_reply(request, reply, self.now))
            elif isinstance(request, SnapshotRequest):
                self.carry_out(sender, source.on_snapshot_reply(request, reply, self.now))
            else:
                self.carry_out(sender, source.on_append_reply(request, reply, self.now))

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        while self.now < end - 1e-9:
            self.now += STEP
            for name in self.names:
                if name in self.alive:
                    self.carry_out(name, self.nodes[name].tick(self.now))
            self.deliver()

    def compact(self, name: str) -> int:
        """As the shell does: the state machine's state at what it applied, written, and the log
        cut before it (the state here is the entries applied, which is what a check needs)."""
        node, disk = self.nodes[name], self.disk[name]
        index = len(self.applied[name])
        term = node.persistent.term_at(index)
        data = json.dumps([[e.index, e.term, e.command.decode()] for e in self.applied[name]]).encode()
        self.snapshots[name] = (index, term, data)
        disk.compact(index, term)
        node.compact(index, term)
        assert disk.entries == node.persistent.entries and disk.snapshot_index == node.persistent.snapshot_index
        return index

    # ---- looking at it ---------------------------------------------------------------------------
    def leader(self) -> str | None:
        leaders = [n for n in self.names if n in self.alive and self.nodes[n].role == "leader"
                   and self.nodes[n].members.has_majority]
        assert len(leaders) <= 1
        return leaders[0] if leaders else None

    def propose(self, command: dict) -> int:
        name = self.leader()
        index, ready = self.nodes[name].propose(json.dumps(command).encode(), self.now)
        self.carry_out(name, ready)
        self.deliver()
        return index

    def commands(self, name: str) -> list[dict]:
        return [json.loads(e.command) for e in self.applied[name] if json.loads(e.command).get("op") != "noop"]

    def check_applied_agree(self) -> None:
        """State machine safety: what any two nodes applied, one is a prefix of the other."""
        for a in self.names:
            for b in self.names:
                n = min(len(self.applied[a]), len(self.applied[b]))
                assert self.applied[a][:n] == self.applied[b][:n]
            assert [e.index for e in self.applied[a]] == list(range(1, len(self.applied[a]) + 1))


# ---- a simulated cluster ---------------------------------------------------------------------------------
def test_three_nodes_elect_one_leader_and_replicate_what_it_is_given():
    net = Network()
    net.run(ELECTION_MAX + 0.5)
    leader = net.leader()
    assert leader is not None
    assert all(net.nodes[n].leader == leader for n in net.names)
    for i in range(5):
        net.propose({"op": "set", "i": i})
    net.run(0.5)
    for name in net.names:
        assert net.commands(name) == [{"op": "set", "i": i} for i in range(5)]
        assert net.disk[name].entries == net.nodes[name].persistent.entries     # all of it written
    net.check_applied_agree()
    with pytest.raises(NotLeader):
        follower = next(n for n in net.names if n != leader)
        net.nodes[follower].propose(b"{}", net.now)


def test_a_leader_cut_off_steps_down_and_its_uncommitted_entry_is_replaced():
    net = Network(seed=2)
    net.run(2.0)
    old = net.leader()
    net.propose({"op": "set", "i": 0})
    net.run(0.3)
    old_term = net.nodes[old].term
    rest = [n for n in net.names if n != old]
    net.partition([old], rest)
    # proposed before it notices: appended to its log only, never committed
    orphan, ready = net.nodes[old].propose(b'{"op": "orphan"}', net.now)
    net.carry_out(old, ready)
    net.run(0.05)
    assert net.nodes[old].role == "follower"          # check-quorum: it cannot see a majority
    assert net.nodes[old].term == old_term
    net.run(2.0)
    new = net.leader()
    assert new in rest and net.nodes[new].term > old_term
    net.propose({"op": "set", "i": 1})
    net.run(0.3)
    net.heal()
    net.run(1.0)
    assert net.leader() == new                        # the old leader came back as a follower
    for name in net.names:
        assert net.commands(name) == [{"op": "set", "i": 0}, {"op": "set", "i": 1}]
        assert net.nodes[name].persistent.entries == net.nodes[new].persistent.entries
        assert net.disk[name].entries == net.nodes[new].persistent.entries   # the conflicting suffix rewritten
    assert net.nodes[old].persistent.entries[orphan - 1] != (old_term, b'{"op": "orphan"}')
    net.check_applied_agree()


def test_a_node_cut_off_from_the_leader_only_cannot_raise_the_term():
    # c loses its link to the leader but still sees b: it thinks it sees a majority and its
    # election timer runs out, but b still hears from the leader and refuses its pre-vote
    net = Network(seed=3)
    net.run(2.0)
    leader = net.leader()
    other, returning = [n for n in net.names if n != leader]
    term = net.nodes[leader].term
    net.cut = {frozenset((leader, returning))}
    net.run(5.0)
    assert net.leader() == leader
    assert {net.nodes[n].term for n in net.names} == {term}
    assert net.nodes[returning].role == "follower" and net.nodes[returning].leader == leader
    net.heal()
    net.propose({"op": "set", "i": 0})
    net.run(0.5)
    assert net.commands(returning) == [{"op": "set", "i": 0}]


def test_when_the_leader_dies_the_survivors_stand_in_turn_by_name():
    net = Network(names=("hare1", "hare2", "hare3"), seed=4)
    net.run(2.0)
    dead = net.leader()
    term = net.nodes[dead].term
    net.alive.discard(dead)
    first = min(n for n in net.names if n != dead)
    started = net.now
    while net.leader() is None:
        net.run(STEP)
    assert net.leader() == first and net.nodes[first].term == term + 1     # one election, no split vote
    assert net.now - started < ELECTION_MIN                               # without sitting out a timeout


def test_a_minority_never_elects_and_a_majority_always_does():
    net = Network(names=("a", "b", "c", "d", "e"), seed=5)
    net.run(2.0)
    net.partition(["a", "b"], ["c", "d", "e"])
    net.run(3.0)
    assert net.leader() in ("c", "d", "e")
    assert all(net.nodes[n].role == "follower" for n in ("a", "b"))


@pytest.mark.parametrize("seed", range(6))
def test_under_loss_and_partitions_the_nodes_apply_the_same_sequence(seed):
    net = Network(names=("a", "b", "c"), seed=seed, loss=0.2)
    rng = random.Random(seed)
    proposed = 0
    for _round in range(30):
        choice = rng.random()
        if choice < 0.2:
            group = rng.sample(net.names, 1)
            net.partition(group, [n for n in net.names if n not in group])
        elif choice < 0.5:
            net.heal()
        if net.leader() is not None:
            net.propose({"op": "set", "i": proposed})
            proposed += 1
        net.run(rng.uniform(0.05, 0.6))
        net.check_applied_agree()
    net.heal()
    net.loss = 0.0
    net.run(3.0)
    leader = net.leader()
    assert leader is not None
    net.propose({"op": "last"})
    net.run(0.5)
    net.check_applied_agree()
    assert {len(net.applied[n]) for n in net.names} == {net.nodes[leader].commit_index}
    sets = [c["i"] for c in net.commands(leader) if "i" in c]
    assert sets == sorted(set(sets))        # each proposal applied at most once, in order


# ---- one machine, messages fed by hand ---------------------------------------------------------------
class Fixed:
    """A membership view that does not change: all peers up, but those a test puts `down`."""

    def __init__(self, name, peers):
        self.name, self.peers = name, set(peers)
        self.down: set[str] = set()

    size = property(lambda self: len(self.peers) + 1)
    has_majority = True

    def is_up(self, name):
        return name not in self.down

    def up_members(self):
        return [self.name, *sorted(self.peers - self.down)]


def machine(name="a", peers=("b", "c"), terms=(), term=0) -> RaftMachine:
    state = PersistentState(term, None, [(t, b"x%d" % i) for i, t in enumerate(terms, 1)])
    return RaftMachine(name, Fixed(name, peers), state, LOG, 0.0, random.Random(0))


def elect(m: RaftMachine, now: float = ELECTION_MAX + 0.01):
    """Past the deadline, every peer says yes to the pre-vote and then to the vote."""
    ready = m.tick(now)
    assert {type(x) for x in ready.messages} == {VoteRequest} and all(x.pre_vote for x in ready.messages)
    assert ready.hard_state is None                      # a pre-vote raises nothing
    for request in ready.messages:
        ready = m.on_vote_reply(request, VoteReply(m.name, m.term, True), now)
        if ready.messages:
            break
    assert ready.hard_state == (m.term, m.name) and m.role == "candidate"
    votes = ready.messages
    for request in votes:
        ready = m.on_vote_reply(request, VoteReply(m.name, m.term, True), now)
        if m.role == "leader":
            durable = m.log_durable(m.persistent.last_index, now)    # the shell wrote its noop
            ready.committed += durable.committed
            ready.messages += durable.messages
            return ready
    raise AssertionError("not elected")


def test_a_new_leader_commits_an_old_terms_entry_only_under_one_of_its_own():
    m = machine(terms=(1, 2), term=3)
    ready = elect(m)
    assert m.term == 4 and m.persistent.last_index == 3 and m.persistent.term_at(3) == 4   # its noop
    assert ready.log_writes[0].start == 3
    appends = {r.to: r for r in ready.messages}
    assert set(appends) == {"b", "c"} and appends["b"].prev_log_index == 2
    # b holds index 2 (term 2) only: a majority has it, but it is not of term 4
    ready = m.on_append_reply(appends["b"], AppendReply("a", 4, True, 2), 1.3)
    assert m.commit_index == 0 and not ready.committed
    # then b holds the noop too: everything up to it commits, in order
    ready = m.on_append_reply(ready.messages[0], AppendReply("a", 4, True, 3), 1.3)
    assert m.commit_index == 3 and [e.index for e in ready.committed] == [1, 2, 3]
    assert {r.to for r in ready.messages} == {"b"}     # c is still busy; b is told the commit now


def test_a_leader_steps_back_to_a_lagging_follower_and_a_higher_term_deposes_it():
    m = machine(terms=(1, 1, 1), term=1)
    ready = elect(m)
    request = next(r for r in ready.messages if r.to == "b")
    ready = m.on_append_reply(request, AppendReply("a", m.term, False, 1), 1.3)     # b has one entry
    [retry] = ready.messages
    assert retry.prev_log_index == 1 and [e.index for e in retry.entries] == [2, 3, 4]
    ready = m.on_append_reply(retry, AppendReply("a", m.term + 3, False, 0), 1.3)
    assert m.role == "follower" and ready.leadership_lost and ready.hard_state == (m.term, None)
    with pytest.raises(NotLeader):
        m.propose(b"{}", 1.4)


def test_a_follower_replaces_a_conflicting_suffix_and_commits_what_the_append_vouched_for():
    f = machine("b", ("a", "c"), terms=(1, 1, 2, 2), term=2)
    ready = f.on_append_request(AppendRequest("b", 3, "a", 4, 3, (), 0), 1.0)
    assert ready.messages == [AppendReply("a", 3, False, 3)] and ready.hard_state == (3, None)
    ready = f.on_append_request(AppendRequest("b", 3, "a", 2, 1, (Entry(3, 3, b"n"),), 9), 1.0)
    assert ready.messages == [AppendReply("a", 3, True, 3)]
    [write] = ready.log_writes
    assert write.start == 3 and write.whole == ((1, b"x1"), (1, b"x2"), (3, b"n"))
    assert f.persistent.entries == list(write.whole) and f.commit_index == 3
    assert [e.index for e in ready.committed] == [1, 2, 3]
    ready = f.on_append_request(AppendRequest("b", 2, "a", 3, 3, (), 9), 1.1)     # a stale leader
    assert ready.messages == [AppendReply("a", 3, False, 0)] and f.leader == "a"


def test_pre_vote_is_refused_while_the_leader_is_heard_and_granted_once_it_is_not():
    f = machine("b", ("a", "c"), term=5)
    f.on_append_request(AppendRequest("b", 5, "a", 0, 0), 10.0)
    ask = VoteRequest("b", 6, "c", 0, 0, pre_vote=True)
    assert f.leader_to_ping(ask, 10.1) == "a"
    ready = f.on_vote_request(ask, 10.1, leader_reachable=True)
    assert ready.messages == [VoteReply("c", 5, False)] and f.term == 5
    ready = f.on_vote_request(VoteRequest("b", 6, "c", 0, 0), 10.1)       # nor a real vote
    assert ready.messages == [VoteReply("c", 5, False)] and f.term == 5 and ready.hard_state is None
    ready = f.on_vote_request(ask, 10.1, leader_reachable=False)          # the ping found it gone
    assert ready.messages == [VoteReply("c", 5, True)] and f.term == 5 and ready.hard_state is None
    later = 10.0 + ELECTION_MIN + 0.01
    ready = f.on_vote_request(ask, later, leader_reachable=True)          # its lease ran out
    assert ready.messages == [VoteReply("c", 5, True)] and f.leader_to_ping(ask, later) is None
    ready = f.on_vote_request(VoteRequest("b", 6, "c", 0, 0), later)
    assert ready.messages == [VoteReply("c", 6, True)] and ready.hard_state == (6, "c") and f.leader is None
    outsider = f.on_vote_request(VoteRequest("b", 9, "z", 0, 0), 20.0)     # a forgotten member
    assert outsider.messages == [VoteReply("z", 6, False)]


def test_a_follower_slow_to_answer_counts_the_leaders_silence_from_its_answer():
    """The leader waits for a follower's answer before it sends that follower anything else;
    a follower that took longer than an election timeout to write and apply an append must not
    take that wait for a dead leader (it stood for election every few seconds under load)."""
    f = machine("b", ("a", "c"), term=5)
    f.on_append_request(AppendRequest("b", 5, "a", 0, 0), 10.0)
    answered = 10.0 + ELECTION_MAX + 0.3        # writing and applying took this long
    f.answered_leader(5, "a", answered)
    ready = f.tick(answered + ELECTION_MIN / 2)
    assert not [m for m in ready.messages if isinstance(m, VoteRequest)] and f.role == "follower"
    assert f.hears_from_leader(answered + ELECTION_MIN / 2)
    later = answered + ELECTION_MAX + 0.01       # and now the leader really is silent
    f.members.down.add("a")                      # and the failure detector counts it down
    ready = f.tick(later)
    assert sorted(m.to for m in ready.messages if isinstance(m, VoteRequest) and m.pre_vote) == ["a", "c"]
    f2 = machine("b", ("a", "c"), term=5)       # an answer in an older term, or to another leader, counts for nothing
    f2.on_append_request(AppendRequest("b", 5, "a", 0, 0), 10.0)
    f2.answered_leader(4, "a", answered)
    f2.answered_leader(5, "c", answered)
    assert not f2.hears_from_leader(answered) and f2.deadline < answered


def test_a_silent_leader_the_failure_detector_still_hears_is_not_deposed():
    """A leader whose loop is held up (a full garbage collection at 100,000 queues, a long batch
    to write and apply) sends nothing for longer than an election timeout but still answers the
    failure detector: its followers wait. Once it is counted down they stand, in turn."""
    f = machine("b", ("a", "c"), term=5)
    f.on_append_request(AppendRequest("b", 5, "a", 0, 0), 10.0)
    for step in range(1, 40):                    # 4 s of silence
        ready = f.tick(10.0 + step * 0.1)
        assert not ready.messages and f.role == "follower" and f.leader == "a" and f.term == 5
    f.members.down.add("a")
    now = 14.0
    while not ready.messages:
        now += 0.01
        ready = f.tick(now)
    assert now < 14.0 + 0.3                      # its turn among the survivors, not a full timeout
    assert sorted(m.to for m in ready.messages if isinstance(m, VoteRequest) and m.pre_vote) == ["a", "c"]


def test_a_cluster_of_one_leads_and_commits_on_its_own():
    m = machine(peers=())
    ready = m.start(0.0)
    assert m.role == "leader" and not ready.committed and not ready.messages   # its noop is not on disk yet
    assert [e.index for e in m.log_durable(1, 0.0).committed] == [1]
    index, ready = m.propose(b'{"op": "x"}', 0.1)
    assert index == 2 and not ready.committed and [w.start for w in ready.log_writes] == [2]
    assert [e.command for e in m.log_durable(2, 0.1).committed] == [b'{"op": "x"}']


def test_a_leader_counts_itself_towards_a_commit_only_for_what_it_has_written():
    """The leader sends a follower entries it has not written yet (the shell writes them in
    turn): acknowledged by one follower they are on one disk of three, and a commit counted
    on the leader's memory could lose them with the leader while that follower applied them."""
    m = machine()
    ready = elect(m, now=2.0)
    to_b = next(r for r in ready.messages if r.to == "b")
    ready = m.on_append_reply(to_b, AppendReply("a", m.term, True, 1), 2.0)
    assert m.commit_index == 1
    [to_b] = ready.messages
    index, _ready = m.propose(b'{"op": "x"}', 2.1)       # in memory; its write waits its turn
    [to_b] = m.on_append_reply(to_b, AppendReply("a", m.term, True, 1), 2.1).messages
    assert [e.index for e in to_b.entries] == [index]
    ready = m.on_append_reply(to_b, AppendReply("a", m.term, True, index), 2.2)
    assert m.commit_index == 1 and not ready.committed   # b's copy alone: not a majority
    ready = m.log_durable(index, 2.3)                     # and now on the leader's disk too
    assert m.commit_index == index and [e.index for e in ready.committed] == [index]
    assert {r.to for r in ready.messages} == {"b"}        # b is told the commit (c is busy)


def test_a_leader_sends_one_append_at_a_time_and_retries_a_failed_or_lost_one():
    m = machine()
    ready = elect(m, now=2.0)
    to_b = next(r for r in ready.messages if r.to == "b")
    _, ready = m.propose(b'{"op": "x"}', 2.1)
    assert {r.to for r in ready.messages} == set()        # both still have an append in flight
    ready = m.on_unreachable(to_b, 2.2)                     # b's call failed: not again at once
    assert not m.tick(2.2 + HEARTBEAT / 2).messages
    [retry] = m.tick(2.2 + HEARTBEAT + 0.01).messages
    assert retry.to == "b" and [e.index for e in retry.entries] == [1, 2]
    # c's call never reported back: after APPEND_LOST it counts as lost and c is sent to again
    assert "c" not in {r.to for r in m.tick(2.0 + APPEND_LOST - 0.1).messages}
    assert "c" in {r.to for r in m.tick(2.0 + APPEND_LOST + 0.1).messages}


def test_membership_changes_are_taken_one_at_a_time():
    # Raft thesis 4.1: a member added or forgotten changes the majority once applied, so the
    # leader proposes the next change only once the last one has committed.
    m = machine()
    ready = elect(m, now=2.0)
    to_b = next(r for r in ready.messages if r.to == "b")
    with pytest.raises(ChangePending):          # the noop may follow an uncommitted change
        m.propose(b'{"op": "member.add"}', 2.0, change=True)
    ready = m.on_append_reply(to_b, AppendReply("a", m.term, True, 1), 2.0)
    assert m.commit_index == 1 and m.change_allowed()
    [to_b] = ready.messages                     # b is told the commit
    index, _ready = m.propose(b'{"op": "member.add"}', 2.1, change=True)
    assert index == 2 and not m.change_allowed()
    with pytest.raises(ChangePending):
        m.propose(b'{"op": "member.forget"}', 2.1, change=True)
    assert m.propose(b'{"op": "x"}', 2.1)[0] == 3      # other commands go on meanwhile
    m.log_durable(3, 2.1)                               # the shell wrote both
    [to_b] = m.on_append_reply(to_b, AppendReply("a", m.term, True, 1), 2.2).messages
    assert [e.index for e in to_b.entries] == [2, 3]
    m.on_append_reply(to_b, AppendReply("a", m.term, True, 3), 2.2)
    assert m.commit_index == 3 and m.change_allowed()
    assert m.propose(b'{"op": "member.forget"}', 2.3, change=True)[0] == 4
    # a new leader's first entry stands for whatever changes its log may hold uncommitted
    f = machine("b", ("a", "c"), terms=(1, 1), term=1)
    elect(f, now=5.0)
    assert f.change_index == 3 and not f.change_allowed()


# ---- log compaction and InstallSnapshot (Raft's section 7) ---------------------------------------------
def test_compacted_nodes_keep_only_the_tail_and_go_on_replicating():
    net = Network(seed=11)
    net.run(2.0)
    for i in range(30):
        net.propose({"op": "set", "i": i})
    net.run(0.5)
    for name in net.names:
        assert net.compact(name) == 31           # the leader's noop and 30 sets
        assert net.nodes[name].persistent.entries == [] and net.disk[name].last_index == 31
    for i in range(30, 40):
        net.propose({"op": "set", "i": i})
    net.run(0.5)
    for name in net.names:
        assert net.commands(name) == [{"op": "set", "i": i} for i in range(40)]
        assert len(net.disk[name].entries) == 10 and net.disk[name].snapshot_index == 31
        assert net.installed[name] == 0          # nobody needed a snapshot
    net.check_applied_agree()


def test_a_follower_away_while_the_log_was_compacted_catches_up_by_snapshot():
    net = Network(seed=12)
    net.run(2.0)
    leader = net.leader()
    away = next(n for n in net.names if n != leader)
    net.propose({"op": "set", "i": 0})
    net.run(0.3)
    net.alive.discard(away)
    for i in range(1, 600):                      # past a batch: the follower is far behind
        net.propose({"op": "set", "i": i})
    net.run(0.5)
    for name in net.names:
        if name != away:
            net.compact(name)
    for i in range(600, 610):
        net.propose({"op": "set", "i": i})
    net.run(0.3)
    net.alive.add(away)
    net.run(2.0)
    assert net.installed[away] == 1
    assert net.commands(away) == [{"op": "set", "i": i} for i in range(610)]
    assert net.disk[away].snapshot_index == net.snapshots[leader][0]
    assert net.disk[away].entries == net.nodes[leader].persistent.entries      # the tail, by appends
    net.propose({"op": "last"})
    net.run(0.5)
    net.check_applied_agree()
    assert net.commands(away)[-1] == {"op": "last"}


def test_a_follower_restarted_from_its_snapshot_and_tail_resumes_where_it_was():
    net = Network(seed=13)
    net.run(2.0)
    leader = net.leader()
    follower = next(n for n in net.names if n != leader)
    for i in range(20):
        net.propose({"op": "set", "i": i})
    net.run(0.5)
    net.compact(follower)
    for i in range(20, 25):
        net.propose({"op": "set", "i": i})
    net.run(0.5)
    # the node restarts: a machine on what its disk holds, the state machine loaded from the snapshot
    disk = net.disk[follower]
    state = PersistentState(disk.term, disk.voted_for, list(disk.entries), disk.snapshot_index, disk.snapshot_term)
    index, _term, data = net.snapshots[follower]
    net.applied[follower] = [Entry(i, t, c.encode()) for i, t, c in json.loads(data)]
    net.nodes[follower] = RaftMachine(follower, View(follower, net), state, LOG, net.now, random.Random(7))
    assert net.nodes[follower].commit_index == index == 21
    net.run(1.0)
    net.propose({"op": "set", "i": 25})
    net.run(0.5)
    assert net.commands(follower) == [{"op": "set", "i": i} for i in range(26)]
    assert net.installed[follower] == 0          # its own log had the rest: appends only
    net.check_applied_agree()


def test_install_snapshot_rules():
    # older than what the follower committed: changes nothing
    f = machine("b", ("a", "c"), terms=(1, 1, 1, 1), term=1)
    f.on_append_request(AppendRequest("b", 1, "a", 4, 1, (), 4), 1.0)
    assert f.commit_index == 4
    ready = f.on_install_snapshot(SnapshotRequest("b", 1, "a", 3, 1, 4, b"s"), 1.1)
    assert ready.snapshot is None and ready.messages == [AppendReply("a", 1, True, 3)]
    assert f.persistent.last_index == 4 and f.persistent.snapshot_index == 0
    # its log holds the snapshot's last entry (same term): that much commits, the log stays
    f = machine("b", ("a", "c"), terms=(1, 1, 2, 2, 2), term=2)
    ready = f.on_install_snapshot(SnapshotRequest("b", 2, "a", 4, 2, 4, b"s"), 1.0)
    assert ready.snapshot is None and [e.index for e in ready.committed] == [1, 2, 3, 4]
    assert f.persistent.last_index == 5 and ready.messages == [AppendReply("a", 2, True, 4)]
    # a log that conflicts with it (another term there): replaced by the snapshot
    f = machine("b", ("a", "c"), terms=(1, 1, 1, 1, 1), term=1)
    ready = f.on_install_snapshot(SnapshotRequest("b", 3, "a", 4, 2, 4, b"s"), 1.0)
    assert ready.snapshot is not None and ready.snapshot.last_index == 4 and not ready.committed
    assert ready.hard_state == (3, None)
    assert f.persistent.entries == [] and f.persistent.last_index == 4 and f.persistent.last_term == 2
    assert f.commit_index == 4 and ready.messages == [AppendReply("a", 3, True, 4)]
    # the next append follows the snapshot, and what it carries is applied from there
    ready = f.on_append_request(AppendRequest("b", 3, "a", 4, 2, (Entry(5, 3, b"n"),), 5), 1.1)
    assert ready.messages == [AppendReply("a", 3, True, 5)] and [e.index for e in ready.committed] == [5]
    # a stale leader's snapshot is refused
    ready = f.on_install_snapshot(SnapshotRequest("b", 2, "c", 9, 2, 9, b"s"), 1.2)
    assert ready.snapshot is None and ready.messages == [AppendReply("c", 3, False, 0)]


def test_an_append_from_before_a_followers_snapshot_matches_from_the_snapshot_on():
    f = RaftMachine("b", Fixed("b", ("a", "c")), PersistentState(2, None, [(2, b"x31")], 30, 2), LOG, 0.0,
                    random.Random(0))
    assert f.commit_index == 30 and f.persistent.last_index == 31
    # a new leader starts it low: entries 11..33, some compacted here, the rest new
    entries = tuple(Entry(i, 2 if i <= 31 else 3, b"x%d" % i) for i in range(11, 34))
    ready = f.on_append_request(AppendRequest("b", 3, "a", 10, 1, entries, 33), 1.0)
    assert ready.messages == [AppendReply("a", 3, True, 33)]
    [write] = ready.log_writes
    assert write.start == 32 and not write.whole and f.persistent.last_index == 33
    assert [e.index for e in ready.committed] == [31, 32, 33]
    # one that carries nothing past the snapshot: matched, nothing written
    ready = f.on_append_request(AppendRequest("b", 3, "a", 5, 1, entries[:3], 33), 1.1)
    assert ready.messages == [AppendReply("a", 3, True, 30)] and not ready.log_writes


def test_a_leader_sends_its_snapshot_to_a_follower_whose_next_entry_it_compacted():
    m = machine(terms=(1,) * 10, term=1)
    ready = elect(m, now=2.0)
    to_b = next(r for r in ready.messages if r.to == "b")
    m.on_append_reply(to_b, AppendReply("a", m.term, True, 11), 2.0)
    assert m.commit_index == 11
    m.compact(11, m.term)
    assert m.persistent.entries == [] and m.persistent.snapshot_index == 11
    with pytest.raises(ValueError):
        m.compact(12, m.term)                # not applied: never snapshotted
    to_c = next(r for r in ready.messages if r.to == "c")
    [again] = m.on_append_reply(to_c, AppendReply("a", m.term, False, 0), 2.1).messages   # c holds nothing
    assert isinstance(again, SnapshotRequest) and (again.last_index, again.last_term) == (11, m.term)
    # one snapshot in flight at a time: not sent again when an append would count as lost
    assert not [x for x in m.tick(2.1 + APPEND_LOST + 0.1).messages if x.to == "c"]
    index, ready = m.propose(b'{"op": "x"}', 2.2)
    ready = m.on_snapshot_reply(again, AppendReply("a", m.term, True, 11), 2.3)
    [append] = ready.messages
    assert isinstance(append, AppendRequest) and append.prev_log_index == 11 and append.prev_log_term == m.term
    assert [e.index for e in append.entries] == [index]
    # a reply from an earlier term (a leader change during a transfer) is ignored
    stale = SnapshotRequest("c", m.term - 1, "a", 5, 1, 5)
    assert not m.on_snapshot_reply(stale, AppendReply("a", m.term, True, 5), 2.4).messages


def test_persistent_state_compaction():
    state = PersistentState(3, None, [(1, b"a"), (2, b"b"), (3, b"c"), (3, b"d")])
    state.compact(2, 2)
    assert (state.snapshot_index, state.snapshot_term, state.last_index, state.last_term) == (2, 2, 4, 3)
    assert state.term_at(2) == 2 and state.term_at(3) == 3 and state.term_at(1) == 0
    assert state.entry(3) == (3, b"c") and state.slice(3, 10) == [(3, b"c"), (3, b"d")]
    with pytest.raises(ValueError):
        state.replace_from(2, [(4, b"x")])       # inside the snapshot: committed, never replaced
    assert state.replace_from(4, [(4, b"x")]) and state.entries == [(3, b"c"), (4, b"x")]
    state.compact(1, 1)                          # older than the one held: nothing changes
    assert state.snapshot_index == 2
    state.compact(9, 5)                          # a log that does not hold it: dropped whole
    assert state.entries == [] and (state.last_index, state.last_term) == (9, 5)


def test_the_log_is_cut_where_followers_that_are_up_still_need_it():
    # a member slightly behind must get appends, not the snapshot: one serving clients cannot load it
    m = machine(terms=(1,) * 99, term=1)
    ready = elect(m, now=2.0)
    to = {r.to: r for r in ready.messages}
    m.on_append_reply(to["b"], AppendReply("a", m.term, True, 40), 2.0)
    m.on_append_reply(to["c"], AppendReply("a", m.term, True, 60), 2.0)
    assert m.compaction_point(100, keep=10, most=80) == 40        # b still needs 41 on
    m.progress["b"].match_index = 5
    assert m.compaction_point(100, keep=10, most=80) == 20        # but the log stays bounded
    f = machine("b", ("a", "c"), terms=(1,) * 100, term=1)
    assert f.compaction_point(100, keep=10, most=80) == 90        # a follower keeps `keep`
