"""Raft's persistent state (the paper's Figure 2): the current term, the vote, and the log.

Held in memory; the consensus machine (cluster/raft_machine.py) reads and changes it and
asks for each change to be made durable; cluster/raft_storage.py loads it from disk and
writes those changes. Keeping it apart from both lets the machine run on a plain one in
tests and on the loaded one in a node.
"""
from __future__ import annotations


class PersistentState:
    """Term, vote and log entries as (term, command); an entry's index is its position + 1."""

    def __init__(self, term: int = 0, voted_for: str | None = None,
                 entries: list[tuple[int, bytes]] | None = None):
        self.term = term
        self.voted_for = voted_for
        self.entries: list[tuple[int, bytes]] = entries if entries is not None else []

    @property
    def last_index(self) -> int:
        return len(self.entries)

    @property
    def last_term(self) -> int:
        return self.entries[-1][0] if self.entries else 0

    def term_at(self, index: int) -> int:
        return self.entries[index - 1][0] if 0 < index <= len(self.entries) else 0

    def replace_from(self, start: int, entries: list[tuple[int, bytes]]) -> bool:
        """The log from index `start` on becomes `entries`; True if a suffix was dropped for them."""
        truncated = start <= len(self.entries)
        del self.entries[start - 1:]
        self.entries.extend(entries)
        return truncated
