"""Raft's durable state: the current term, the vote, and the log, each fsynced before use.

DATA_DIR/raft/state.json holds term and vote (written whole: write, fsync,
rename); DATA_DIR/raft/log.jsonl holds one entry per line, appended and
fsynced. RaftStorage is the persistent state (cluster/raft_state.py) loaded
from there; the Raft machine changes it in memory and asks for each change
to be written, and the shell (cluster/raft.py) has these writes done off the
event loop before it sends what depends on them.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from .raft_messages import LogWrite
from .raft_state import PersistentState


class RaftStorage(PersistentState):
    """The persistent state as DATA_DIR/raft holds it. The writes take what they write as
    arguments and never read the live state: they run in a thread while it moves on."""

    def __init__(self, directory: Path):
        super().__init__()
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.state_path = self.directory / "state.json"
        self.log_path = self.directory / "log.jsonl"
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

    def save_state(self, term: int, voted_for: str | None) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            json.dump({"term": term, "voted_for": voted_for}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.state_path)

    def write(self, write: LogWrite) -> None:
        """Append the written entries and fsync; after a replaced suffix, rewrite the file whole."""
        if write.whole is not None:   # rare: a follower dropping an uncommitted suffix
            lines = [json.dumps({"i": i + 1, "t": t, "c": c.decode()}) for i, (t, c) in enumerate(write.whole)]
            tmp = self.log_path.with_suffix(".tmp")
            with open(tmp, "w") as fh:
                fh.write("".join(line + "\n" for line in lines))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.log_path)
            return
        with open(self.log_path, "a") as fh:
            for offset, (t, c) in enumerate(write.entries):
                fh.write(json.dumps({"i": write.start + offset, "t": t, "c": c.decode()}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
