"""What the Raft machine says and asks for, as plain values: its messages, and a Ready.

The messages mirror the gRPC ones (cluster.proto's VoteRequest, AppendRequest, ...) plus
`to`, the member each is for; the shell (cluster/raft/shell.py) converts them at the wire, so the
machine and its tests never see protobuf. A request's reply is handed back to the machine
together with the request it answers, which is how a reply is matched to its election or
to what a follower was sent.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Entry:
    index: int
    term: int
    command: bytes


@dataclass(frozen=True)
class VoteRequest:
    to: str
    term: int
    candidate: str
    last_log_index: int
    last_log_term: int
    pre_vote: bool = False     # "would you vote for me in `term`?": nobody's term or vote changes


@dataclass(frozen=True)
class VoteReply:
    to: str
    term: int
    granted: bool


@dataclass(frozen=True)
class AppendRequest:
    to: str
    term: int
    leader: str
    prev_log_index: int
    prev_log_term: int
    entries: tuple[Entry, ...] = ()
    leader_commit: int = 0


@dataclass(frozen=True)
class AppendReply:
    to: str
    term: int
    success: bool
    match_index: int = 0


@dataclass(frozen=True)
class SnapshotRequest:
    """InstallSnapshot (Raft's section 7): the follower's next entry is compacted away on the
    leader, which sends its latest snapshot instead. The machine names the snapshot it holds;
    the shell reads the file's contents (`data`) at the wire, and sends the index and term
    the file says (a newer snapshot may have replaced it meanwhile)."""
    to: str
    term: int
    leader: str
    last_index: int
    last_term: int
    leader_commit: int = 0
    data: bytes = b""


@dataclass(frozen=True)
class LogWrite:
    """The log from `start` on is now `entries`. `whole` is the entire log after the change
    when a suffix was replaced (the file is rewritten from it): the entries after `base`,
    the snapshot's last index then. None for a plain append. Both are copies: the write runs
    off the event loop while the machine moves on."""
    start: int
    entries: tuple[tuple[int, bytes], ...]
    whole: tuple[tuple[int, bytes], ...] | None = None
    base: int = 0


@dataclass
class Ready:
    """What one step of the machine asks of its shell, in this order: make `hard_state` (term,
    vote), `snapshot` and `log_writes` durable; hand `snapshot` to the state machine; apply
    `committed`, in index order; then send `messages`, which may promise what was just
    written. `snapshot` is a leader's InstallSnapshot this follower took: its log is now empty
    after it, and the state machine is to load it as the state after its last index.
    `leadership_lost`: proposals waiting on this node as the leader will not commit through it."""
    hard_state: tuple[int, str | None] | None = None
    snapshot: SnapshotRequest | None = None
    log_writes: list[LogWrite] = field(default_factory=list)
    messages: list = field(default_factory=list)
    committed: list[Entry] = field(default_factory=list)
    leadership_lost: bool = False
