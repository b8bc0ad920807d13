"""Raft's durable state: the current term, the vote, and the log, each fsynced before use.

DATA_DIR/raft/state.json holds term and vote (written whole: write, fsync,
rename); DATA_DIR/raft/log.jsonl holds one entry per line, appended and
fsynced. RaftStorage is the persistent state (cluster/raft/state.py) loaded
from there; the Raft machine changes it in memory and asks for each change
to be written, and the shell (cluster/raft/shell.py) has these writes done off the
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

Compaction (Raft's section 7): DATA_DIR/raft/snapshot.json is the state
machine's state after entry S, a header line
`{"version":1,"index":S,"term":T}` and then the state as JSON. It is written
to a temporary file and fsynced off the event loop, then renamed into place
and the directory fsynced; only then is the log cut: the lines after S are
copied to a new file that replaces log.jsonl the same way. A crash between
the two leaves lines up to S in the log, which loading skips. A follower
that takes the leader's snapshot (InstallSnapshot) writes it the same way
and empties its log. Loading reads the snapshot's header, skips the lines up
to S and takes those after it, which must start at S + 1 at the latest; if
the log's line S has another term than the snapshot (a crash before a
follower's log was emptied for a snapshot it took), the log's entries are
not the cluster's and are dropped. A log written before snapshots existed
(no snapshot file, lines from 1) loads as it always did.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import structlog

from haremq.node.store.meta import truncate_synced, write_atomically, write_synced
from haremq.node.store.writer import sync_directory

from haremq.cluster.raft.messages import LogWrite
from haremq.cluster.raft.state import PersistentState

SNAPSHOT_VERSION = 1


class RaftStorageError(Exception):
    """DATA_DIR/raft cannot be used as it is (entries missing or damaged before the end)."""


def snapshot_blob(index: int, term: int, body: bytes) -> bytes:
    """A snapshot file's contents: the header line, then the state machine's state."""
    head = json.dumps({"version": SNAPSHOT_VERSION, "index": index, "term": term}, separators=(",", ":"))
    return head.encode() + b"\n" + body


def snapshot_header(blob: bytes) -> tuple[int, int, bytes]:
    """(index, term, body) of a snapshot file's contents."""
    first, _nl, body = blob.partition(b"\n")
    try:
        head = json.loads(first)
        index, term = head["index"], head["term"]
    except (ValueError, KeyError, TypeError) as exc:
        raise RaftStorageError(f"the raft snapshot's header does not read back: {exc}") from None
    if head.get("version") != SNAPSHOT_VERSION:
        raise RaftStorageError(f"unknown raft snapshot version {head.get('version')} (written by a newer HareMQ?)")
    return index, term, body


def _line_index(line: bytes) -> int:
    """The index a log line carries (lines are written as '{"i": N, ...')."""
    start = line.index(b":") + 1
    end = line.index(b",", start)
    return int(line[start:end])


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
        self.snapshot_path = self.directory / "snapshot.json"
        # the state machine's state as of snapshot_index, for the shell to load at start
        self.snapshot_body: bytes | None = None
        self.snapshot_bytes = 0
        if self.state_path.exists():
            state = json.loads(self.state_path.read_text())
            self.term, self.voted_for = state["term"], state.get("voted_for")
        for stale in self.directory.glob("snapshot.json.*.tmp"):
            stale.unlink()               # a snapshot being written when the node stopped
        if self.snapshot_path.exists():
            blob = self.snapshot_path.read_bytes()
            self.snapshot_index, self.snapshot_term, self.snapshot_body = snapshot_header(blob)
            self.snapshot_bytes = len(blob)
        self._on_disk = self.snapshot_index      # the snapshot the files hold (the thread's own view)
        self._log_exists = self.log_path.exists()
        if self._log_exists:
            self._load_log()

    def _load_log(self) -> None:
        data = self.log_path.read_bytes()
        pos = good = line_no = 0       # good: where the last whole, valid line ends
        bad: tuple[int, int] | None = None     # (line number, offset) of the first line that does not parse
        base = self.snapshot_index
        stale = False                  # the log's entry at the snapshot's index has another term
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
                if not 1 <= index <= base + len(self.entries) + 1:
                    raise RaftStorageError(
                        f"{self.log_path}: line {line_no} holds entry {index} after entry "
                        f"{base + len(self.entries)}: entries are missing; not starting on it")
                if index <= base:          # the snapshot stands in for it
                    if index == base:
                        stale = term != self.snapshot_term
                else:
                    del self.entries[index - base - 1:]
                    self.entries.append((term, command))
                good = end + 1
            pos = end + 1
        if stale and self.entries:
            self.log.warning("raft log: entries after the snapshot are not the cluster's; dropped",
                             snapshot_index=base, entries=len(self.entries))
            self.entries = []
        if good < len(data):
            # the last append, cut short: never fsynced, so never acknowledged to anyone
            self.log.warning("raft log: dropping a torn last write", file=str(self.log_path), offset=good,
                             bytes=len(data) - good, entries=len(self.entries))
            truncate_synced(self.log_path, good)

    def save_state(self, term: int, voted_for: str | None) -> None:
        write_atomically(self.state_path, json.dumps({"term": term, "voted_for": voted_for}).encode())

    def write(self, write: LogWrite) -> None:
        """Append the written entries and fsync; after a replaced suffix, rewrite the file whole."""
        if write.whole is not None:   # rare: a follower dropping an uncommitted suffix
            lines = [json.dumps({"i": write.base + i + 1, "t": t, "c": c.decode()})
                     for i, (t, c) in enumerate(write.whole)]
            self._replace_log("".join(line + "\n" for line in lines).encode())
            return
        self._append([write])

    def write_many(self, writes: Sequence[LogWrite]) -> None:
        """Several writes in order: the appends among them with one fsync (a rewrite of the
        whole log made on its own, in its place)."""
        run: list[LogWrite] = []
        for write in writes:
            if write.whole is None:
                run.append(write)
            else:
                self._append(run)
                run = []
                self.write(write)
        self._append(run)

    def _append(self, writes: Sequence[LogWrite]) -> None:
        if not writes:
            return
        lines = [json.dumps({"i": write.start + offset, "t": t, "c": c.decode()}) + "\n"
                 for write in writes for offset, (t, c) in enumerate(write.entries)]
        with open(self.log_path, "a") as fh:
            fh.write("".join(lines))
            fh.flush()
            os.fsync(fh.fileno())
        if not self._log_exists:       # the file was created by this append: its name too
            sync_directory(self.directory)
            self._log_exists = True

    def _replace_log(self, blob: bytes) -> None:
        """log.jsonl becomes `blob`: written, fsynced, renamed into place, the directory fsynced."""
        write_atomically(self.log_path, blob)
        self._log_exists = True

    # ---- snapshots (each in a thread; the shell runs prepare outside its write lock, the rest in it) ----
    def prepare_snapshot(self, index: int, term: int, body: bytes) -> tuple[Path, int]:
        """Write the state after entry `index` to a temporary file and fsync it: the slow part,
        done while the log goes on being appended to. (Its path, its size.)"""
        tmp = self.directory / f"snapshot.json.{index}.tmp"
        blob = snapshot_blob(index, term, body)
        write_synced(tmp, blob)
        return tmp, len(blob)

    def commit_snapshot(self, tmp: Path, index: int, cut: int | None = None) -> bool:
        """Put a prepared snapshot in place and cut the log up to `cut` (at most `index`: the
        entries after `cut` stay, for members a little behind; a restart skips those up to
        `index`), under the shell's write lock: no append runs meanwhile, so the file holds
        exactly what was written. False if a snapshot as new is in place already (one the
        leader sent): this one is dropped."""
        cut = index if cut is None else min(cut, index)
        if index <= self._on_disk:
            tmp.unlink()
            return False
        os.replace(tmp, self.snapshot_path)
        sync_directory(self.directory)
        self._on_disk = index
        self.cut_log(cut)
        return True

    def cut_log(self, cut: int) -> None:
        """The log file keeps only the entries after `cut` (under the shell's write lock)."""
        if not self._log_exists:
            return
        data = self.log_path.read_bytes()
        pos = 0
        while pos < len(data):         # the first line after the cut (indexes only grow)
            end = data.find(b"\n", pos)
            if end < 0 or _line_index(data[pos:end]) > cut:
                break
            pos = end + 1
        if pos:
            self._replace_log(data[pos:])

    def install_snapshot(self, index: int, term: int, blob: bytes) -> None:
        """The leader's snapshot, taken by this follower: in place, and the log emptied."""
        write_atomically(self.snapshot_path, blob, self.directory / f"snapshot.json.{index}.leader.tmp")
        self._on_disk = max(self._on_disk, index)
        self._replace_log(b"")

    def read_snapshot(self) -> bytes | None:
        """The snapshot file's contents (for a follower that needs them), None if there is none."""
        try:
            return self.snapshot_path.read_bytes()
        except FileNotFoundError:
            return None
