"""Raft's durable state: the current term, the vote, and the log, each fsynced before use.

DATA_DIR/raft/state.json holds term and vote (written whole: write, fsync,
rename); DATA_DIR/raft/log.jsonl holds one entry per line, appended and
fsynced. The Raft shell (cluster/raft.py) calls these off the event loop and
answers a vote or an append only once they return.
"""
from __future__ import annotations

import json
import os
from pathlib import Path


class RaftStorage:
    """The durable part of Raft: current term, vote, and the log."""

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.state_path = self.directory / "state.json"
        self.log_path = self.directory / "log.jsonl"
        self.term = 0
        self.voted_for: str | None = None
        self.entries: list[tuple[int, bytes]] = []    # (term, command); index = position + 1
        if self.state_path.exists():
            state = json.loads(self.state_path.read_text())
            self.term, self.voted_for = state["term"], state.get("voted_for")
        if self.log_path.exists():
            for line in self.log_path.read_text().splitlines():
                try:
                    item = json.loads(line)
                except ValueError:
                    break   # a torn last line: it was never acknowledged to anyone
                del self.entries[item["i"] - 1:]
                self.entries.append((item["t"], item["c"].encode()))

    def save_state(self) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            json.dump({"term": self.term, "voted_for": self.voted_for}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.state_path)

    def append(self, start: int, entries: list[tuple[int, bytes]]) -> None:
        """Write entries from index `start` (replacing any conflicting suffix) and fsync."""
        truncated = start <= len(self.entries)
        del self.entries[start - 1:]
        self.entries.extend(entries)
        if truncated:   # rewrite: rare (a follower dropping an uncommitted suffix)
            lines = [json.dumps({"i": i + 1, "t": t, "c": c.decode()}) for i, (t, c) in enumerate(self.entries)]
            tmp = self.log_path.with_suffix(".tmp")
            with open(tmp, "w") as fh:
                fh.write("".join(line + "\n" for line in lines))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.log_path)
            return
        with open(self.log_path, "a") as fh:
            for offset, (t, c) in enumerate(entries):
                fh.write(json.dumps({"i": start + offset, "t": t, "c": c.decode()}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())

    @property
    def last_index(self) -> int:
        return len(self.entries)

    @property
    def last_term(self) -> int:
        return self.entries[-1][0] if self.entries else 0

    def term_at(self, index: int) -> int:
        return self.entries[index - 1][0] if 0 < index <= len(self.entries) else 0
