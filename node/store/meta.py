"""A single node's durable metadata: a snapshot and a log of the changes made since it.

Durable exchanges, queues (with their store ids) and bindings, users,
permissions, vhosts and policies. Each change is one small record appended
to the log by the store's writer thread, in order with the message records
and synced with them, so a change costs the same on its way to disk whatever
else exists. When the log file in use has grown past a threshold (the last
snapshot's size, at least LOG_MIN) the writer starts the next one and hands
the full one to the snapshot thread, which applies it to its own copy of the
state (plain records, no broker object: nothing is read from the event
loop's side) and writes a new snapshot: write, fsync, rename, directory
fsync; the log files it covers are removed then. What is on disk is bounded
by what exists, not by the history, and a restart loads the snapshot and
replays only the log files written after it.

Files, in the data directory:

- `meta.bin`: the snapshot. Version 2 is a header line
  `{"version":2,"log":N,"next_queue_id":Q}` (it covers log files 1..N), then
  one change record per line, which replayed in order make the state.
  Version 1, one JSON document rewritten whole at every change by HareMQ
  before the log, loads as a snapshot that no log file follows.
- `meta-NNNNNNNN.log`: change records, each `crc32 (u32) | length (u32) |
  JSON`. Only the last write to the newest file can be torn (a crash before
  its sync, never acknowledged): a record that fails its length or checksum
  with no valid record after it is cut off at recovery. Anything else that
  does not read back is damage to changes that were acknowledged, and the
  node refuses to start (`--skip-corrupt` drops the rest of that file and
  says so), as the message store does.

A change record is the JSON object `{"op": ..., ...}`. Each sets or removes
the state of one key (an exchange, a queue, a binding; the users, the
permissions, one vhost's policies as a whole), so replaying a record the
state already holds changes nothing. Removing an exchange or a queue removes
its bindings with it. AMQP argument tables are kept in their wire encoding
(node.protocol.tables) so every field type round-trips.
"""
from __future__ import annotations

import json
import os
import queue
import re
import struct
import threading
import time
import zlib
from json.scanner import make_scanner
from pathlib import Path

import structlog

from ..protocol.tables import decode_table, encode_table
from .writer import sync_directory

VERSION = 2
SNAPSHOT = "meta.bin"
LOG_MIN = 1 << 20            # a log file this large (or as large as the last snapshot) is snapshotted
HEADER = struct.Struct("<II")   # crc32 of the payload, its length
_LOG_NAME = re.compile(r"^meta-(\d{8})\.log$")
_EMPTY_TABLE = encode_table({})


class MetaError(Exception):
    """The metadata on disk cannot be loaded as it is."""


def record(change: dict) -> bytes:
    """A change as it is logged (and kept in a snapshot): compact JSON, never a raw newline."""
    return json.dumps(change, separators=(",", ":")).encode()


def frame(payload: bytes) -> bytes:
    return HEADER.pack(zlib.crc32(payload), len(payload)) + payload


def log_path(directory: Path, number: int) -> Path:
    return Path(directory) / f"meta-{number:08d}.log"


def log_numbers(directory: Path) -> list[int]:
    found = []
    for path in Path(directory).glob("meta-*.log"):
        match = _LOG_NAME.match(path.name)
        if match:
            found.append(int(match.group(1)))
    return sorted(found)


def scan(data: bytes, pos: int = 0) -> tuple[list[bytes], int]:
    """The whole records of a log file from `pos` on, and where the valid ones end."""
    out = []
    size = len(data)
    view = memoryview(data)
    while pos + HEADER.size <= size:
        crc, length = HEADER.unpack_from(data, pos)
        start = pos + HEADER.size
        end = start + length
        if end > size or zlib.crc32(view[start:end]) != crc:
            break
        out.append(bytes(view[start:end]))
        pos = end
    return out, pos


def _valid_record_after(data: bytes, pos: int) -> bool:
    """Does a whole, checksummed record begin anywhere after `pos`? (A torn last write has none.)"""
    view = memoryview(data)
    for start in range(pos + 1, len(data) - HEADER.size + 1):
        crc, length = HEADER.unpack_from(data, start)
        end = start + HEADER.size + length
        if length and end <= len(data) and zlib.crc32(view[start + HEADER.size:end]) == crc:
            return True
    return False


def write_synced(path: Path, blob: bytes) -> None:
    """`path` holds `blob`, written to its end and fsynced (its name is not synced: see below)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(blob)
        while view:              # a write may take less than it was given
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, blob: bytes, tmp: Path | None = None) -> None:
    """Replace `path` with `blob`: write a temporary file to its end, fsync, rename, fsync the directory."""
    tmp = tmp or path.with_suffix(".tmp")
    write_synced(tmp, blob)
    os.replace(tmp, path)
    sync_directory(path.parent)


def truncate_synced(path: Path, size: int) -> None:
    """Cut `path` to `size` bytes and fsync it (a torn last write dropped)."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


# ---- the state the records make ---------------------------------------------------------------
def _canonical(value):
    """A binding's arguments with every table's keys in order: the identity the broker gives a
    binding (node/broker/exchange.py `_freeze`) does not depend on the order they came in."""
    if isinstance(value, dict):
        return {k: _canonical(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def binding_key(binding: dict) -> tuple:
    args = binding.get("arguments") or _EMPTY_TABLE
    if args != _EMPTY_TABLE:
        args = encode_table(_canonical(decode_table(args)))
    return (binding["source"], binding["kind"], binding["destination"], binding["routing_key"], args)


class _VHost:
    __slots__ = ("exchanges", "queues", "bindings", "by_source", "by_destination", "policies")

    def __init__(self):
        self.exchanges: dict[str, bytes] = {}
        self.queues: dict[str, bytes] = {}
        self.bindings: dict[tuple, bytes] = {}
        self.by_source: dict[str, set] = {}
        self.by_destination: dict[tuple, set] = {}
        self.policies: bytes | None = None

    def unbind(self, key: tuple) -> None:
        if self.bindings.pop(key, None) is None:
            return
        for index, at in ((self.by_source, key[0]), (self.by_destination, (key[1], key[2]))):
            keys = index.get(at)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del index[at]

    def unbind_all(self, index: dict, at) -> None:
        for key in list(index.get(at, ())):
            self.unbind(key)


class MetaState:
    """The metadata as change records, one per key: what a snapshot holds. Applying a record
    costs the same whatever the state holds."""

    def __init__(self, keep_decoded: bool = False):
        self.next_queue_id = 1
        self.users: bytes | None = None
        self.permissions: bytes | None = None
        self.vhosts: dict[str, _VHost] = {}
        # While recovering: each record as `apply` decoded it, so that `as_snapshot` (once, at
        # start) decodes none a second time; dropped then.
        self._decoded: dict[bytes, dict] | None = {} if keep_decoded else None
        self._scan = make_scanner(json.JSONDecoder())    # its own: a scanner keeps a memo

    def _decode(self, raw: bytes) -> dict:
        """`json.loads(raw)` without its per-call overhead (on a 100-byte record, 2.6 us against
        the scanner's 1.0): a snapshot of 100,000 queues applies that many. Whatever the scanner
        does not take whole goes to `json.loads`, which decodes it or raises as ever."""
        try:
            text = raw.decode()
            change, end = self._scan(text, 0)
        except (UnicodeDecodeError, StopIteration):
            return json.loads(raw)
        return change if end == len(text) else json.loads(raw)

    def _vhost(self, name: str) -> _VHost:
        vhost = self.vhosts.get(name)
        if vhost is None:
            vhost = self.vhosts[name] = _VHost()
        return vhost

    def apply(self, raw: bytes) -> None:
        change = self._decode(raw)
        if self._decoded is not None:
            self._decoded[raw] = change
        op = change["op"]
        if op == "queue":
            q = change["queue"]
            self._vhost(change["vhost"]).queues[q["name"]] = raw
            if q["id"] >= self.next_queue_id:
                self.next_queue_id = q["id"] + 1
        elif op == "queue.delete":
            vhost = self.vhosts.get(change["vhost"])
            if vhost is not None:
                vhost.queues.pop(change["name"], None)
                vhost.unbind_all(vhost.by_destination, ("queue", change["name"]))
        elif op == "unbind":
            vhost = self.vhosts.get(change["vhost"])
            if vhost is not None:
                vhost.unbind(binding_key(change["binding"]))
        elif op == "bind":
            vhost = self._vhost(change["vhost"])
            key = binding_key(change["binding"])
            vhost.bindings[key] = raw
            vhost.by_source.setdefault(key[0], set()).add(key)
            vhost.by_destination.setdefault((key[1], key[2]), set()).add(key)
        elif op == "exchange":
            self._vhost(change["vhost"]).exchanges[change["exchange"]["name"]] = raw
        elif op == "exchange.delete":
            vhost = self.vhosts.get(change["vhost"])
            if vhost is not None:
                vhost.exchanges.pop(change["name"], None)
                vhost.unbind_all(vhost.by_source, change["name"])
                vhost.unbind_all(vhost.by_destination, ("exchange", change["name"]))
        elif op == "policies":
            self._vhost(change["vhost"]).policies = raw
        elif op == "vhost":
            self._vhost(change["vhost"])
        elif op == "vhost.delete":
            self.vhosts.pop(change["vhost"], None)
        elif op == "users":
            self.users = raw
        elif op == "permissions":
            self.permissions = raw
        else:
            raise MetaError(f"unknown metadata change {op!r} (written by a newer HareMQ?)")

    def lines(self):
        """Every record of the state, in an order that replays to it."""
        for name, vhost in self.vhosts.items():
            yield record({"op": "vhost", "vhost": name})
            if vhost.policies is not None:
                yield vhost.policies
            yield from vhost.exchanges.values()
            yield from vhost.queues.values()
            yield from vhost.bindings.values()
        if self.users is not None:
            yield self.users
        if self.permissions is not None:
            yield self.permissions

    def dumps(self, log: int) -> bytes:
        """The snapshot of this state, covering log files up to `log`."""
        head = record({"version": VERSION, "log": log, "next_queue_id": self.next_queue_id})
        return b"\n".join([head, *self.lines()]) + b"\n"

    def as_snapshot(self) -> dict:
        """The state as the broker restores it (node/broker/broker.py `restore`)."""
        decoded = self._decoded or {}
        self._decoded = None

        def read(raw: bytes) -> dict:
            change = decoded.get(raw)
            return json.loads(raw) if change is None else change
        vhosts = {}
        for name, vhost in self.vhosts.items():
            vhosts[name] = {
                "exchanges": [read(raw)["exchange"] for raw in vhost.exchanges.values()],
                "queues": [read(raw)["queue"] for raw in vhost.queues.values()],
                "bindings": [read(raw)["binding"] for raw in vhost.bindings.values()],
                "policies": read(vhost.policies)["policies"] if vhost.policies is not None else []}
        out = {"vhosts": vhosts, "next_queue_id": self.next_queue_id}
        if self.users is not None:          # each list only as logged: the broker keeps the other
            out["users"] = read(self.users)["users"]
        if self.permissions is not None:
            out["permissions"] = read(self.permissions)["permissions"]
        return out

    @classmethod
    def from_version1(cls, doc: dict) -> "MetaState":
        """The whole-document snapshot earlier HareMQ rewrote at every change."""
        state = cls()
        for name, data in doc.get("vhosts", {}).items():
            state.apply(record({"op": "vhost", "vhost": name}))
            state.apply(record({"op": "policies", "vhost": name, "policies": data.get("policies", [])}))
            for x in data.get("exchanges", []):
                state.apply(record({"op": "exchange", "vhost": name, "exchange": x}))
            for q in data.get("queues", []):
                state.apply(record({"op": "queue", "vhost": name, "queue": q}))
            for b in data.get("bindings", []):
                state.apply(record({"op": "bind", "vhost": name, "binding": b}))
        if "users" in doc:
            state.apply(record({"op": "users", "users": doc["users"]}))
            state.apply(record({"op": "permissions", "permissions": doc.get("permissions", [])}))
        state.next_queue_id = max(state.next_queue_id, doc.get("next_queue_id", 1))
        return state


def load_snapshot(blob: bytes) -> tuple[MetaState, int]:
    """(the state, the last log file it covers) of a snapshot file's contents."""
    first, _nl, rest = blob.partition(b"\n")
    try:
        head = json.loads(first)
    except ValueError as exc:
        raise MetaError(f"{SNAPSHOT} does not read back: {exc}") from None
    version = head.get("version")
    if version == 1:
        return MetaState.from_version1(head), 0
    if version != VERSION:
        raise MetaError(f"unknown metadata version {version}")
    state = MetaState(keep_decoded=True)
    for line in rest.split(b"\n"):
        if line:
            state.apply(line)
    state.next_queue_id = max(state.next_queue_id, head.get("next_queue_id", 1))
    return state, head["log"]


class Recovery:
    """What recovery found: the state, and where the log goes on."""

    def __init__(self):
        self.state = MetaState(keep_decoded=True)
        self.found = False            # a snapshot or a log was there
        self.snapshot_size = 0
        self.covered = 0              # the snapshot covers log files up to this one
        self.number = 1               # the log file appends go on in ...
        self.size = 0                 # ... from this offset
        self.replayed = 0             # records replayed from the log


def recover(directory: Path, skip_corrupt: bool = False, log=None) -> Recovery:
    """Load the snapshot and replay the log files written after it (blocking: before serving)."""
    log = log or structlog.get_logger("haremq.store")
    directory = Path(directory)
    found = Recovery()
    snapshot = directory / SNAPSHOT
    if snapshot.exists():
        blob = snapshot.read_bytes()
        found.state, found.covered = load_snapshot(blob)
        found.found = True
        found.snapshot_size = len(blob)
    tmp = snapshot.with_suffix(".tmp")
    if tmp.exists():
        tmp.unlink()              # a snapshot that was being written: the one before it holds
    numbers = log_numbers(directory)
    for number in [n for n in numbers if n <= found.covered]:
        log_path(directory, number).unlink()     # covered by the snapshot, left by a crash before removal
    numbers = [n for n in numbers if n > found.covered]
    found.number = found.covered + 1
    for i, number in enumerate(numbers):
        if number != found.covered + 1 + i:
            raise MetaError(f"metadata log file {log_path(directory, found.covered + 1 + i).name} is missing "
                            f"(the snapshot covers up to {found.covered}; found {numbers})")
        path = log_path(directory, number)
        data = path.read_bytes()
        records, end = scan(data)
        for raw in records:
            found.state.apply(raw)
        found.replayed += len(records)
        found.found = True
        last = i == len(numbers) - 1
        if end < len(data):
            if last and not _valid_record_after(data, end):
                log.warning("dropping torn metadata record at the tail", file=path.name, offset=end)
                truncate_synced(path, end)
            elif not skip_corrupt:
                raise MetaError(f"corrupt record in metadata log {path.name} at offset {end}; "
                                "start with --skip-corrupt to drop the rest of that file")
            else:
                log.error("skipping corrupt rest of metadata log", file=path.name, offset=end)
                truncate_synced(path, end)
        found.number, found.size = number, end
    return found


# ---- writing: the log (writer thread) and the snapshots (their own thread) ------------------------
class MetaLog:
    """The writing end of the change log; used by the store's writer thread only.

    Appends go at `size`, which moves only once they are synced: a write that failed is
    written again over whatever part of it reached the file."""

    def __init__(self, directory: Path, number: int, size: int, snapshots: "Snapshotter"):
        self.directory = Path(directory)
        self.number = number
        self.size = size
        self.snapshots = snapshots
        self._fd: int | None = None

    def append(self, data: bytes) -> int:
        """Write and sync framed records; the number of syncs it took."""
        syncs = 0
        if self._fd is None:
            path = log_path(self.directory, self.number)
            created = not path.exists()
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
            if created:
                sync_directory(self.directory)
                syncs += 1
        view = memoryview(data)
        offset = self.size
        while view:
            n = os.pwrite(self._fd, view, offset)
            view = view[n:]
            offset += n
        os.fdatasync(self._fd)
        self.size = offset
        if self.size >= self.snapshots.threshold:
            os.close(self._fd)
            self._fd = None
            self.snapshots.closed(self.number, self.size)
            self.number += 1
            self.size = 0
        return syncs + 1

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Snapshotter:
    """The snapshot thread: owns a copy of the state as of the log files closed so far, and
    writes a snapshot after each one closes (then removes the files it covers)."""

    def __init__(self, directory: Path, recovery: Recovery, node: str = ""):
        self.directory = Path(directory)
        self.state = recovery.state
        self.covered = recovery.covered
        # the file appends go on in was replayed into the state up to here already
        self._partial = (recovery.number, recovery.size)
        self.threshold = max(LOG_MIN, recovery.snapshot_size)
        self.snapshots = 0
        self.log = structlog.get_logger("haremq.store").bind(node=node)
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._applied = recovery.number - 1     # the state holds the log files up to this one
        self._sizes: dict[int, int] = {}   # each closed file's size, until it is applied
        self._thread = threading.Thread(target=self._run, name="haremq-meta-snapshots", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if self._applied > self.covered:     # full log files a crash left unsnapshotted
            self._jobs.put((self._applied, None))

    def stop(self) -> None:
        """Finish the snapshots asked for, end the thread."""
        self._jobs.put(None)
        self._thread.join()

    def closed(self, number: int, size: int) -> None:
        """Log file `number` is full at `size` (writer thread): snapshot it."""
        self._jobs.put((number, size))

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                break
            number, size = job
            if size is not None:
                self._sizes[number] = size
            try:
                self._take(number)
            except (OSError, MetaError, ValueError) as exc:
                # the log files stay until a later snapshot covers them: nothing is lost
                self.log.error("metadata snapshot failed; the log is kept", error=str(exc))

    def _take(self, number: int) -> None:
        started = time.monotonic()
        while self._applied < number:     # every file closed since the last snapshot, in order
            current = self._applied + 1
            size = self._sizes[current]
            path = log_path(self.directory, current)
            data = path.read_bytes()[:size]
            start = self._partial[1] if current == self._partial[0] else 0
            records, end = scan(data, start)
            if end != size:
                raise MetaError(f"metadata log {path.name} does not read back to {size} (stops at {end})")
            for raw in records:
                self.state.apply(raw)
            self._applied = current
            del self._sizes[current]
        blob = self.state.dumps(number)
        write_atomically(self.directory / SNAPSHOT, blob)
        for old in log_numbers(self.directory):
            if old <= number:
                log_path(self.directory, old).unlink()
        sync_directory(self.directory)
        self.covered = number
        self.threshold = max(LOG_MIN, len(blob))
        self.snapshots += 1
        self.log.info("metadata snapshot written", covers=number, bytes=len(blob),
                      seconds=round(time.monotonic() - started, 3))
