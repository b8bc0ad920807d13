"""Raft's rules, pure: what to grant, accept, commit and retry, from values passed in.

Everything here is a function of its arguments: no sockets, no tasks, no files,
and no clock of its own (the time is an argument). The Raft machine
(cluster/raft/machine.py) holds the state and asks this module what the
consensus rules decide, so each rule can be tested on its own
(tests/test_raft_core.py) as well as in a running machine.

Section numbers are the Raft paper's (Ongaro and Ousterhout, 2014) and, for
pre-vote and leader stickiness, Ongaro's thesis.
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence


# ---- elections (5.2, 5.4.1; thesis 9.6 and 4.2.3) -------------------------------------------------
def up_to_date(last_term: int, last_index: int, my_last_term: int, my_last_index: int) -> bool:
    """A candidate's log is at least as up to date as ours (5.4.1): only then may it have our vote."""
    return (last_term, last_index) >= (my_last_term, my_last_index)


def grant_pre_vote(request_term: int, term: int, log_ok: bool) -> bool:
    """Would we vote for this candidate in `request_term`? (Our term does not change.)"""
    return request_term > term and log_ok


def grant_vote(request_term: int, term: int, log_ok: bool, voted_for: str | None, candidate: str) -> bool:
    """The real vote, in our (already raised) term: once per term, to an up-to-date log."""
    return request_term == term and log_ok and voted_for in (None, candidate)


def hears_from_leader(role: str, has_majority: bool | None, leader: str | None, now: float,
                      leader_heard: float, lease: float, leader_up: Callable[[str], bool]) -> bool:
    """Leader stickiness: a leader is in charge and reachable, so no election is called for.
    The leader itself while it sees a majority; a follower within `lease` of an AppendEntries
    from a leader its failure detector still sees up (asked last, only if it matters)."""
    if role == "leader":
        return bool(has_majority)
    return leader is not None and now - leader_heard < lease and leader_up(leader)


def won(votes: int, majority: int) -> bool:
    return votes >= majority


def majority(size: int) -> int:
    return size // 2 + 1


def stagger(name: str, up: Iterable[str], dead: str, jitter: float) -> float:
    """This node's turn to stand when the leader died: 0.1 s apart by name among the members
    that are up (so two survivors do not split the vote), plus `jitter`."""
    order = sorted(n for n in up if n != dead)
    rank = order.index(name) if name in order else len(order)
    return rank * 0.1 + jitter


# ---- log replication (5.3) ---------------------------------------------------------------------
def consistent(prev_index: int, prev_term: int, last_index: int, term_at: Callable[[int], int]) -> bool:
    """Our log holds the leader's entry before the new ones (the log matching property)."""
    return prev_index <= last_index and term_at(prev_index) == prev_term


def refusal_hint(prev_index: int, last_index: int) -> int:
    """On a refused append: the index the leader may try to match next."""
    return min(prev_index - 1, last_index) if prev_index else 0


def new_entries(entries: Sequence, last_index: int, term_at: Callable[[int], int]) -> list:
    """The entries (with .index and .term) we do not hold yet: those past our log, or whose
    term differs from ours at their index (our conflicting suffix is replaced from the first)."""
    return [e for e in entries if not (e.index <= last_index and term_at(e.index) == e.term)]


def follower_commit(leader_commit: int, last_new: int, commit: int) -> int:
    """A follower's commit index after an accepted append (5.3): the leader's, capped at the
    last entry this append vouched for; never lower than it was."""
    if leader_commit > commit:
        return min(leader_commit, max(last_new, commit))
    return commit


def next_index_after_refusal(next_index: int, hint: int) -> int:
    """The leader steps back for a follower that refused (by one, or to its hint)."""
    return max(1, min(next_index - 1, hint + 1))


def leader_commit(last_index: int, matches: Iterable[int], quorum: int, term_at: Callable[[int], int],
                  term: int, commit: int) -> int:
    """The leader's commit index: the highest index a majority holds, if it is an entry of the
    current term (5.4.2: an older term's entry commits only under one of ours)."""
    ranked = sorted([last_index, *matches], reverse=True)
    candidate = ranked[quorum - 1]
    if candidate > commit and term_at(candidate) == term:
        return candidate
    return commit
