"""Raft's durable state: the current term, the vote, and the log, each fsynced before use.

DATA_DIR/raft/state.json holds term and vote (written whole: write, fsync,
rename); DATA_DIR/raft/log.jsonl holds one entry per line, appended and
fsynced. RaftStorage is the persistent state (cluster/raft_state.py) loaded
from there; the Raft machine changes it in memory and asks for each change
to be written, and the shell (cluster/raft.py) has these writes done off the
event loop before it sends what depends on them.

A file created or renamed into place is only there after a power loss once
its directory is synced too: without that, a vote given (state.json renamed,
the reply sent) could be forgotten and given again in the same term. So the
directory is synced after each rename and after the log file is created.

Loading checks the log as it reads it. Each line carries its index, which
must be at most one past the entries read so far (an index seen again
replaces the suffix from there on, as a rewrite did): a line further on
means entries are missing, and reading on would shift every later entry to
a lower index (queue store ids are log indexes), so the node refuses to
start. The last append can be cut short by a crash: a last line without its
newline, or lines that do not parse with no valid entry after them, were
never fsynced, so never acknowledged; they are cut off the file (and the
truncation fsynced) so that the next append starts on a line of its own. A
line that does not parse with valid entries after it is not a torn append
but damage to entries this node may have acknowledged: the node refuses to
start rather than guess.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import structlog

from haremq.node.store.writer import sync_directory

from .raft_messages import LogWrite
from .raft_state import PersistentState


class RaftStorageError(Exception):
    """DATA_DIR/raft cannot be used as it is (entries missing or damaged before the end)."""


def _entry(line: bytes) -> tuple[int, int, bytes] | None:
    """(index, term, command) of one log line, None if it is not a whole entry."""
    try:
        item = json.loads(line)
        index, term, command = item["i"], item["t"], item["c"].encode()
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if type(index) is not int or type(term) is not int:
        return None
    return index, term, command


class RaftStorage(PersistentState):
    """The persistent state as DATA_DIR/raft holds it. The writes take what they write as
    arguments and never read the live state: they run in a thread while it moves on."""

    def __init__(self, directory: Path, node: str = ""):
        super().__init__()
        self.directory = Path(directory)
        self.log = structlog.get_logger("haremq.raft").bind(node=node)
        if not self.directory.is_dir():
            self.directory.mkdir(parents=True, exist_ok=True)
            sync_directory(self.directory.parent)
        self.state_path = self.directory / "state.json"
        self.log_path = self.directory / "log.jsonl"
        if self.state_path.exists():
            state = json.loads(self.state_path.read_text())
            self.term, self.voted_for = state["term"], state.get("voted_for")
        self._log_exists = self.log_path.exists()
        if self._log_exists:
            self._load_log()

    def _load_log(self) -> None:
        data = self.log_path.read_bytes()
        pos = good = line_no = 0       # good: where the last whole, valid line ends
        bad: tuple[int, int] | None = None     # (line number, offset) of the first line that does not parse
        while pos < len(data):
            end = data.find(b"\n", pos)
            if end < 0:
                break                  # a last line without its newline
            line_no += 1
            found = _entry(data[pos:end])
            if found is None:
                if bad is None:
                    bad = (line_no, pos)
            elif bad is not None:
                raise RaftStorageError(
                    f"{self.log_path}: line {bad[0]} (byte {bad[1]}) is not a log entry, and valid entries "
                    f"follow it (line {line_no}): the log is damaged, not cut short; not starting on it")
            else:
                index, term, command = found
                if not 1 <= index <= len(self.entries) + 1:
                    raise RaftStorageError(
                        f"{self.log_path}: line {line_no} holds entry {index} after entry {len(self.entries)}: "
                        "entries are missing; not starting on it")
                del self.entries[index - 1:]
                self.entries.append((term, command))
                good = end + 1
            pos = end + 1
        if good < len(data):
            # the last append, cut short: never fsynced, so never acknowledged to anyone
            self.log.warning("raft log: dropping a torn last write", file=str(self.log_path), offset=good,
                             bytes=len(data) - good, entries=len(self.entries))
            with open(self.log_path, "r+b") as fh:
                fh.truncate(good)
                fh.flush()
                os.fsync(fh.fileno())

    def save_state(self, term: int, voted_for: str | None) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            json.dump({"term": term, "voted_for": voted_for}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.state_path)
        sync_directory(self.directory)

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
            sync_directory(self.directory)
            self._log_exists = True
            return
        with open(self.log_path, "a") as fh:
            for offset, (t, c) in enumerate(write.entries):
                fh.write(json.dumps({"i": write.start + offset, "t": t, "c": c.decode()}) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        if not self._log_exists:       # the file was created by this append: its name too
            sync_directory(self.directory)
            self._log_exists = True
