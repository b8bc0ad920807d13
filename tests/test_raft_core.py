"""Raft's rules without sockets, files or a clock (cluster/raft/rules.py): the paper's cases
fed in as values, as the Raft machine (cluster/raft/machine.py) asks them."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from haremq.cluster.raft import rules


@dataclass
class E:
    index: int
    term: int


def log_of(*terms):
    """A log as the shell keeps it: term_at(i) for 1-based i, 0 outside it."""
    def term_at(index: int) -> int:
        return terms[index - 1] if 0 < index <= len(terms) else 0
    return len(terms), term_at


def test_only_an_up_to_date_log_gets_a_vote_once_per_term():
    assert rules.up_to_date(3, 5, 3, 5) and rules.up_to_date(4, 1, 3, 9)
    assert not rules.up_to_date(3, 4, 3, 5) and not rules.up_to_date(2, 9, 3, 1)
    assert rules.grant_vote(5, 5, True, None, "b")
    assert rules.grant_vote(5, 5, True, "b", "b")             # asked again: the same answer
    assert not rules.grant_vote(5, 5, True, "c", "b")         # voted for another this term
    assert not rules.grant_vote(5, 5, False, None, "b")
    assert not rules.grant_vote(4, 5, True, None, "b")        # a stale candidate


def test_a_pre_vote_is_a_yes_only_for_a_later_term_and_changes_nothing():
    assert rules.grant_pre_vote(6, 5, True)
    assert not rules.grant_pre_vote(5, 5, True)
    assert not rules.grant_pre_vote(6, 5, False)


def test_a_followed_leader_is_sticky_for_its_lease_and_only_while_up():
    asked = []

    def up(name):
        asked.append(name)
        return name == "a"
    assert rules.hears_from_leader("follower", None, "a", now=10.5, leader_heard=10.0, lease=0.6, leader_up=up)
    assert not rules.hears_from_leader("follower", None, "a", now=10.7, leader_heard=10.0, lease=0.6,
                                       leader_up=up)
    assert not rules.hears_from_leader("follower", None, "b", now=10.1, leader_heard=10.0, lease=0.6,
                                       leader_up=up)
    assert not rules.hears_from_leader("follower", None, None, now=10.1, leader_heard=10.0, lease=0.6,
                                       leader_up=up)
    assert asked == ["a", "b"]      # the failure detector is asked only when the lease holds
    assert rules.hears_from_leader("leader", True, "me", 0, 0, 0.6, up)
    assert not rules.hears_from_leader("leader", False, "me", 0, 0, 0.6, up)


def test_survivors_stand_in_turn_by_name():
    up = ["hare3", "hare1", "hare2"]
    turns = {name: rules.stagger(name, up, dead="hare1", jitter=0.0) for name in ("hare2", "hare3")}
    assert turns == {"hare2": 0.0, "hare3": 0.1}
    assert rules.stagger("hare9", up, dead="hare1", jitter=0.01) == pytest.approx(0.21)   # not seen up: last
    assert [rules.majority(n) for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    assert rules.won(2, 2) and not rules.won(1, 2)


def test_a_follower_accepts_only_after_a_matching_entry_and_replaces_a_conflicting_suffix():
    last, term_at = log_of(1, 1, 2, 2)           # our log: terms at indexes 1..4
    assert rules.consistent(3, 2, last, term_at)
    assert not rules.consistent(3, 1, last, term_at)     # a different term at prev
    assert not rules.consistent(6, 2, last, term_at)     # prev beyond our log
    assert rules.consistent(0, 0, last, term_at)         # the start of the log always matches
    assert rules.refusal_hint(6, last) == 4 and rules.refusal_hint(3, last) == 2 and rules.refusal_hint(0, 4) == 0
    sent = [E(3, 2), E(4, 3), E(5, 3)]                  # index 4 conflicts: from there on, the leader's
    assert rules.new_entries(sent, last, term_at) == [E(4, 3), E(5, 3)]
    assert rules.new_entries([E(1, 1), E(2, 1)], last, term_at) == []   # a repeated append: nothing new


def test_a_follower_commits_no_further_than_the_append_vouched_for():
    assert rules.follower_commit(leader_commit=9, last_new=5, commit=2) == 5
    assert rules.follower_commit(leader_commit=4, last_new=5, commit=2) == 4
    assert rules.follower_commit(leader_commit=3, last_new=1, commit=2) == 2     # ahead of this append
    assert rules.follower_commit(leader_commit=2, last_new=7, commit=2) == 2


def test_a_leader_steps_back_for_a_refusing_follower():
    assert rules.next_index_after_refusal(8, hint=3) == 4        # straight to the follower's hint
    assert rules.next_index_after_refusal(8, hint=9) == 7        # by one at least
    assert rules.next_index_after_refusal(1, hint=0) == 1


def test_an_old_term_entry_commits_only_under_an_entry_of_the_current_term():
    # Figure 8: the leader of term 4 holds index 2 from term 2 on a majority (3 of 5) ...
    last, term_at = log_of(1, 2)
    assert rules.leader_commit(last, [2, 2, 1, 1], rules.majority(5), term_at, term=4, commit=1) == 1
    # ... and commits it only once an entry of its own term (index 3) is on a majority
    last, term_at = log_of(1, 2, 4)
    assert rules.leader_commit(last, [3, 3, 1, 1], rules.majority(5), term_at, term=4, commit=1) == 3
    assert rules.leader_commit(last, [3, 1, 1, 1], rules.majority(5), term_at, term=4, commit=1) == 1
    assert rules.leader_commit(1, [], 1, log_of(4)[1], term=4, commit=0) == 1    # a cluster of one
