"""Raft's persistent state (the paper's Figure 2): the current term, the vote, and the log.

Held in memory; the consensus machine (cluster/raft/machine.py) reads and changes it and
asks for each change to be made durable; cluster/raft/storage.py loads it from disk and
writes those changes. Keeping it apart from both lets the machine run on a plain one in
tests and on the loaded one in a node.

The log may start after a snapshot (Raft's section 7): `snapshot_index` and
`snapshot_term` are the last entry the snapshot stands in for, and `entries` holds only
the entries after it. Only committed entries are ever compacted into a snapshot.
"""
from __future__ import annotations


class PersistentState:
    """Term, vote and log entries as (term, command); entry `i` is entries[i - snapshot_index - 1]."""

    def __init__(self, term: int = 0, voted_for: str | None = None,
                 entries: list[tuple[int, bytes]] | None = None, snapshot_index: int = 0, snapshot_term: int = 0):
        self.term = term
        self.voted_for = voted_for
        self.entries: list[tuple[int, bytes]] = entries if entries is not None else []
        self.snapshot_index = snapshot_index
        self.snapshot_term = snapshot_term

    @property
    def last_index(self) -> int:
        return self.snapshot_index + len(self.entries)

    @property
    def last_term(self) -> int:
        return self.entries[-1][0] if self.entries else self.snapshot_term

    def term_at(self, index: int) -> int:
        """The term of entry `index`; 0 if the log does not hold it (or it is compacted away)."""
        if index == self.snapshot_index:
            return self.snapshot_term
        offset = index - self.snapshot_index
        return self.entries[offset - 1][0] if 0 < offset <= len(self.entries) else 0

    def entry(self, index: int) -> tuple[int, bytes]:
        """(term, command) of an entry the log holds (after the snapshot)."""
        return self.entries[index - self.snapshot_index - 1]

    def slice(self, start: int, count: int) -> list[tuple[int, bytes]]:
        """Up to `count` entries from index `start` on (start past the snapshot)."""
        offset = start - self.snapshot_index - 1
        return self.entries[offset:offset + count]

    def replace_from(self, start: int, entries: list[tuple[int, bytes]]) -> bool:
        """The log from index `start` on becomes `entries`; True if a suffix was dropped for them."""
        if start <= self.snapshot_index:
            raise ValueError(f"entry {start} is in the snapshot (up to {self.snapshot_index}): it cannot change")
        offset = start - self.snapshot_index - 1
        truncated = offset < len(self.entries)
        del self.entries[offset:]
        self.entries.extend(entries)
        return truncated

    def compact(self, index: int, term: int) -> None:
        """A snapshot stands in for the entries up to `index` (of `term`) from now on. A log that
        holds that entry keeps what follows it; any other log is dropped whole (Raft's
        InstallSnapshot rule). A snapshot older than the one held changes nothing."""
        if index <= self.snapshot_index:
            return
        if index <= self.last_index and self.term_at(index) == term:
            del self.entries[:index - self.snapshot_index]
        else:
            self.entries = []
        self.snapshot_index, self.snapshot_term = index, term
