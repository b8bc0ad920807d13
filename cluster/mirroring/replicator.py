"""A mirrored queue's master side: every change, in order, to each mirror (MIR-2, MIR-3, MIR-6).

The master's `Queue` reports each change it applies (enqueue, deliver,
remove, requeue) to its `Replicator`, which numbers it and appends it to one
shared log. One `MirrorLink` per mirror streams that log over a long-lived
gRPC call; whatever piled up while the previous batch was on the wire goes as
one batch, so a busy queue sends many changes per message.

A stream starts with a reset: the queue's contents as of the current sequence
(all of it with automatic sync or `ctl sync-queue`, nothing with manual sync),
read from the queue (paged-out messages from the store) a batch at a time while
the queue keeps serving, then the live log. Mirroring wraps the queue: the
master's queue pages to its store exactly as an unmirrored one does.

Synchronisation, one link at a time, is cluster/mirroring/link_machine.py's
LinkMachine: its phases (syncing, manual, catching, proposing, synced, ...) and
when a mirror is proposed synchronised or dropped; a MirrorLink carries out what
it asks. A classic queue's confirms wait for every synced mirror (by the log) and
every one receiving the stream, syncing or catching up, so a mirror the log calls
synchronised holds every message ever confirmed. A synced mirror that stops
answering is dropped from the log's in-sync set after the failure timeout, and
only then do confirms go on without it. A quorum queue's confirms wait for a
majority of its members instead (`majority_upto`), and its failover picks the
member holding the most (cluster/mirroring/election.py).
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING, Iterable

import grpc

from haremq.node.broker.commands import QueueMirrorDropped, QueueMirrorSynced

from haremq.cluster.links.codec import message_to_pb
from haremq.cluster.mirroring.link_machine import (AFTER_STREAM, Action, LinkMachine, LinkPhase, ProposeDropped, ProposeSynced,
                                  Restart)
from haremq.cluster.mirroring.reading import ContentsReader, entries_at, keys_upto, oldest_position
from haremq.cluster.rpc import cluster_pb2 as pb

if TYPE_CHECKING:
    from haremq.node.broker.message import Entry

ENQUEUE, DELIVER, REMOVE, REQUEUE = (pb.MirrorOp.ENQUEUE, pb.MirrorOp.DELIVER, pb.MirrorOp.REMOVE,
                                     pb.MirrorOp.REQUEUE)
SNAPSHOT_BATCH = 1000
RECONCILE_BATCH = 50_000     # keys per batch of a reconcile
MAX_BATCH_OPS = 4000
BATCH_BYTES = 16 << 20       # bodies per batch, live or sync; a larger message goes alone


def enqueue_op(seq: int, message, redelivered: bool, expires: float, seen=None):
    """ENQUEUE, with what is left of the message's TTL: a promoted mirror expires it on time;
    and the deduplication id it entered the master's cache with, (id, seen-at ms), if any."""
    left = max(1, int((expires - time.monotonic()) * 1000)) if expires else 0
    if seen is None:
        return pb.MirrorOp(kind=ENQUEUE, key=seq, message=message_to_pb(message), redelivered=redelivered,
                           ttl_left_ms=left)
    return pb.MirrorOp(kind=ENQUEUE, key=seq, message=message_to_pb(message), redelivered=redelivered,
                       ttl_left_ms=left, dedup_id=seen[0], dedup_seen_ms=seen[1])


def majority_upto(group, whole: dict[str, int], own: int) -> int:
    """A quorum queue's commit rule (Raft's): the newest sequence a majority of its members hold
    durably. The master's own copy counts up to `own` (confirms reach the replicator only after
    the local write); a mirror in `whole` (node -> sequence acked) only while it holds the whole
    queue. Below a majority nothing more is confirmed, and nothing is nacked."""
    others = len(group) // 2          # copies besides the master's that make a majority
    if not others:
        return own
    acked = sorted((seq for node, seq in whole.items() if node in group), reverse=True)
    return min(own, acked[others - 1]) if len(acked) >= others else 0


class MirrorRefused(Exception):
    """The mirror would not take the stream (it has not applied our epoch yet, or a newer one)."""


class MirrorWantsAll(Exception):
    """The mirror's copy cannot be reconciled (not whole, or too far behind): a full sync."""


class Replicator:
    def __init__(self, mirroring, state):
        self.mirroring = mirroring        # cluster.mirroring.manager.Mirroring: peers, proposals, log fields
        self.state = state                # cluster.mirroring.policy.HAState, changed only by the metadata log
        self.queue = None
        self.seq = 0
        self.ops: list = []               # ops not yet sent on every open stream
        self.op_bytes: list[int] = []     # the body size each of them carries
        self.ops_start = 1                # sequence of ops[0]
        self.links: dict[str, MirrorLink] = {}
        self.waiting: deque = deque()     # (seq, fn, args, since): confirms waiting for mirrors
        self.closed = False
        self.log = mirroring.log.bind(vhost=state.vhost, queue=state.name, epoch=state.epoch)
        # promoted: mirrors in sync with the old master, and the newest key this copy brought
        self.reconcile_nodes, self.reconcile_upto = mirroring.reconcile_offers.pop(state.key, (set(), 0))

    def start(self, queue) -> None:
        """Mirrors of a new (empty) queue copy everything on their first stream whatever the sync
        mode: like RabbitMQ's, they are created in sync. A master just promoted keeps the mirrors
        that were in sync with the old one (reconciled, not copied); others, like mirrors added to
        a queue that already holds messages, follow ha-sync-mode (RabbitMQ's restarted mirrors
        rejoin unsynchronised, too)."""
        self.queue = queue
        empty = not queue.message_count and not queue.unacked
        self.set_mirrors(self.state.mirrors, initial=empty)

    def set_mirrors(self, nodes: list[str], initial: bool = False) -> None:
        for node in list(self.links):
            if node not in nodes:
                self.links.pop(node).close()
        for node in nodes:
            if node not in self.links and not self.closed:
                upto = self.reconcile_upto if node in self.reconcile_nodes else None
                self.reconcile_nodes.discard(node)
                self.links[node] = MirrorLink(self, node, force_sync=initial or upto is not None,
                                              reconcile_upto=upto)
        self.release()

    def close(self, ok: bool = False) -> None:
        """No longer the master (deposed, deleted, unmirrored): waiting confirms get `ok`."""
        self.closed = True
        for link in self.links.values():
            link.close()
        self.links.clear()
        waiting, self.waiting = self.waiting, deque()
        for _seq, fn, args, _since in waiting:
            fn(ok, *args)

    # ---- changes, as the queue applies them -------------------------------------------------
    def _push(self, op, size: int = 0) -> None:
        self.seq += 1
        if not self.links:
            self.ops_start = self.seq + 1
            return
        self.ops.append(op)
        self.op_bytes.append(size)
        for link in self.links.values():
            link.wake()

    def _push_keys(self, kind, keys: list[int]) -> None:
        """Settlements in a row merge into one op while no stream has taken it yet."""
        ops = self.ops
        if ops and ops[-1].kind == kind and all(link.sent_upto < self.seq for link in self.links.values()):
            ops[-1].keys.extend(keys)
            return
        self._push(pb.MirrorOp(kind=kind, keys=keys))

    def enqueue(self, seq: int, message, redelivered: bool, expires: float, seen=None) -> None:
        self._push(enqueue_op(seq, message, redelivered, expires, seen), len(message.body))

    @property
    def dedup_size(self) -> int:
        """The master's id cache size (0: no deduplication); every live batch says it."""
        cache = self.queue.dedup if self.queue is not None else None
        return cache.size if cache is not None else 0

    def deliver(self, entry: Entry) -> None:
        self._push_keys(DELIVER, [entry.seq])

    def remove(self, entries: Iterable[Entry]) -> None:
        keys = [entry.seq for entry in entries]
        if keys:
            self._push_keys(REMOVE, keys)

    def remove_keys(self, keys: list[int]) -> None:
        """Paged-out messages left the queue (a purge): they are known by position only."""
        if keys:
            self._push_keys(REMOVE, keys)

    def requeue(self, entries: Iterable[Entry]) -> None:
        keys = [e.seq for e in entries]
        if keys:
            self._push_keys(REQUEUE, keys)

    def _too_few_copies(self) -> bool:
        return len(self.state.synced) < self.state.min_in_sync

    def trim(self) -> None:
        streaming = [link.sent_upto for link in self.links.values() if link.streaming]
        upto = min(streaming) if streaming else self.seq
        drop = upto - self.ops_start + 1
        if drop >= 1024 or (drop > 0 and drop == len(self.ops)):
            del self.ops[:drop]
            del self.op_bytes[:drop]
            self.ops_start += drop

    def ops_after(self, seq: int) -> list:
        """The next batch: up to MAX_BATCH_OPS ops and BATCH_BYTES of bodies (at least one op),
        so no batch nears the channel's message limit whatever the messages' sizes."""
        start = seq + 1 - self.ops_start
        end, total = start, 0
        for size in self.op_bytes[start:start + MAX_BATCH_OPS]:
            total += size
            if total > BATCH_BYTES and end > start:
                break
            end += 1
        return self.ops[start:end]

    # ---- confirms (MIR-3) ----------------------------------------------------------------------
    def confirm_nodes(self) -> set[str]:
        """A classic queue's: every mirror the log calls synchronised, or may call so (one whose
        "synced" entry is in flight counts even if its stream dropped meanwhile, until the entry
        is decided), and every mirror receiving the stream, synchronised or catching up."""
        nodes = set(self.state.synced)
        nodes.update(n for n, link in self.links.items() if link.machine.counts_for_confirms)
        nodes.discard(self.mirroring.node)
        return nodes

    def safe_upto(self) -> int:
        if self.state.group is not None:
            return self.majority_upto()
        upto = self.seq
        for node in self.confirm_nodes():
            link = self.links.get(node)
            upto = min(upto, link.acked if link is not None else 0)
        return upto

    def majority_upto(self) -> int:
        whole = {node: link.acked for node, link in self.links.items() if link.machine.holds_copy}
        return majority_upto(self.state.group or (), whole, self.seq)

    def when_replicated(self, seq: int, ok: bool, fn, args) -> None:
        if not ok or self.closed or self._too_few_copies():
            fn(False, *args)      # too few copies for the policy: nacked rather than confirmed
        elif not self.waiting and self.safe_upto() >= seq:
            fn(True, *args)
        else:
            self.waiting.append((seq, fn, args, time.monotonic()))

    def when_replicated_after(self, ok: bool, seq: int, fn, args) -> None:
        """store.when_durable's callback: the local write is durable, now the mirrors."""
        self.when_replicated(seq, ok, fn, args)

    def release(self) -> None:
        waiting = self.waiting
        if not waiting:
            return
        if self._too_few_copies():
            self.waiting = deque()
            for _seq, fn, args, _since in waiting:
                fn(False, *args)
            return
        upto = self.safe_upto()
        while waiting and waiting[0][0] <= upto:
            _seq, fn, args, _since = waiting.popleft()
            fn(True, *args)

    # ---- housekeeping, every tick --------------------------------------------------------------
    def tick(self, now: float, timeout: float) -> None:
        synced = self.state.synced
        oldest = self.waiting[0] if self.waiting else None
        waiting = (oldest[0], oldest[3]) if oldest is not None else None

        def oldest_key() -> int:        # read only for a link in manual sync
            return oldest_position(self.queue.backing)

        for node, link in self.links.items():
            link.carry_out(link.machine.tick(now, oldest_key=oldest_key, master_seq=self.seq, in_synced=node in synced,
                                             oldest_waiting=waiting, timeout=timeout))
        self.trim()
        self.release()

    def on_synced_changed(self) -> None:
        """The log added or dropped an in-sync mirror."""
        for node, link in self.links.items():
            link.carry_out(link.machine.synced_changed(node in self.state.synced))
        self.release()

    def status(self) -> dict:
        rows = {}
        for node, link in self.links.items():
            rows[node] = {"state": link.phase.value, "acked": link.acked,
                          "sync": f"{link.sync_sent}/{link.sync_total}" if link.sync_total else None}
        return {"seq": self.seq, "links": rows}


class MirrorLink:
    """The master's stream to one mirror; reconnects (with a fresh reset) until closed. Its
    phases are its LinkMachine's; this carries out what the machine asks."""

    def __init__(self, replicator: Replicator, node: str, force_sync: bool = False,
                 reconcile_upto: int | None = None):
        self.rep = replicator
        self.node = node
        self.machine = LinkMachine(force_sync, reconcile_upto)
        self.fills: deque = deque()         # key lists the mirror asked for
        self.sent_upto = 0
        self.sync_total = self.sync_sent = 0
        self.incarnation = ""               # the mirror's, as the log named it when the stream began
        self.closed = False
        self._event = asyncio.Event()
        self._stream_id = 0
        self._call: grpc.aio.StreamStreamCall | None = None     # the stream now open
        self._task = replicator.mirroring.tasks.spawn(self._run())   # cancelled on close, awaited by mirroring

    def wake(self) -> None:
        if not self._event.is_set():
            self._event.set()

    def close(self) -> None:
        self.closed = True
        self._task.cancel()
        if self._call is not None:
            self._call.cancel()

    # ---- what the machine holds, as the replicator, mirroring and ctl read it ----------------
    @property
    def phase(self) -> LinkPhase:
        return self.machine.phase

    @property
    def acked(self) -> int:
        return self.machine.acked

    @property
    def streaming(self) -> bool:
        return self.machine.streaming

    def restart(self, force_sync: bool | None = None) -> None:
        """Start over with a reset (ctl sync-queue, cancel-sync-queue, or a dropped mirror)."""
        self.carry_out([self.machine.restart(force_sync)])

    # ---- the machine's actions -------------------------------------------------------------
    def carry_out(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, ProposeSynced):
                state = self.rep.state
                self.rep.mirroring.cluster.submit(
                    QueueMirrorSynced(state.vhost, state.name, self.node, state.epoch, self.incarnation),
                    self._synced_decided)
            elif isinstance(action, ProposeDropped):
                state = self.rep.state
                self.rep.log.warning("dropping mirror from the in-sync set", mirror=self.node, reason=action.reason)
                self.rep.mirroring.submit(QueueMirrorDropped(state.vhost, state.name, self.node, state.epoch),
                                          lambda _ok, reason=action.reason: self.machine.dropped_decided(reason))
            elif isinstance(action, Restart):
                if self._call is not None:
                    self._call.cancel()

    def _synced_decided(self, result, err) -> None:
        synced = err is None and (result or {}).get("synced", True)
        if err is None and not synced and not self.closed:
            self.rep.log.info("mirror's synced entry refused: streaming to it afresh", mirror=self.node)
        self.carry_out(self.machine.synced_decided(err is not None, synced, self.closed))

    async def _run(self) -> None:
        mirroring = self.rep.mirroring
        machine = self.machine
        while not self.closed:
            peer = mirroring.peer(self.node)
            wait = machine.wait_before_stream(self.node in self.rep.state.synced,
                                              peer is not None and mirroring.is_up(self.node))
            if wait:
                await asyncio.sleep(wait)
                continue
            wants_all = False
            try:
                await self._stream(peer)
            except asyncio.CancelledError:
                if self.closed:
                    raise
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.CANCELLED:
                    self.rep.log.info("mirror stream ended", mirror=self.node, code=exc.code().name)
            except MirrorRefused as exc:
                self.rep.log.info("mirror refused the stream", mirror=self.node, reason=str(exc))
            except MirrorWantsAll:
                self.rep.log.info("mirror cannot be reconciled: syncing it whole", mirror=self.node)
                wants_all = True
            finally:
                self._call = None
                machine.stream_ended(wants_all)
            await asyncio.sleep(AFTER_STREAM)

    async def _stream(self, peer) -> None:
        rep = self.rep
        state = rep.state
        machine = self.machine
        base = rep.seq
        reconcile_upto = machine.reconcile_upto
        full, reconcile = machine.stream_started(base, rep.queue.next_seq - 1, state.sync_mode == "automatic")
        reader = ContentsReader(rep.queue.backing) if full else None
        keys = None
        if reconcile and reader is not None and reconcile_upto is not None:    # reconcile: both are
            keys = keys_upto(rep.queue.backing, reconcile_upto)
            reader.cursor = reconcile_upto + 1     # newer messages are sent whole
        self.incarnation = rep.mirroring.incarnations.get(self.node, "")   # the mirror this stream reaches
        # the id cache as of base: the mirror's copy is replaced by it whatever the sync mode
        # (ids outlive their messages, so no snapshot of the messages brings them)
        ids = rep.queue.dedup.entries() if rep.queue.dedup is not None else []
        self.sent_upto = base
        self.fills.clear()
        self.sync_total, self.sync_sent = (reader.total if reader else 0), 0
        if self.sync_total:
            rep.log.info("reconciling mirror" if reconcile else "syncing mirror", mirror=self.node,
                          messages=self.sync_total)
        self._event = asyncio.Event()       # a generator of an earlier stream may linger: not woken
        self._stream_id += 1
        self._call = call = peer.stub.Mirror(self._batches(reader, base, self._stream_id, self._event, keys, ids),
                                             metadata=rep.mirroring.call_metadata())
        async for ack in call:
            if ack.error:
                raise MirrorRefused(ack.error)
            if ack.resync:
                raise MirrorWantsAll()
            if ack.missing:
                self.fills.append(list(ack.missing))
                self.wake()
                continue
            if machine.phase is LinkPhase.SYNCING and ack.seq >= base:
                self.sync_total = self.sync_sent = 0
                if reader is not None and (reader.sent or reconcile):      # a full sync
                    rep.log.info("mirror holds the snapshot", mirror=self.node, messages=reader.sent,
                                  reconciled=reconcile)
            self.carry_out(machine.acked_upto(ack.seq, time.monotonic(), rep.seq))
            rep.release()
            rep.mirroring.broker.send_confirms()

    async def _filled(self, keys: list[int]) -> list:
        """ENQUEUE ops for the keys a reconciled mirror lacks, as the queue holds them now (those
        gone since are left out: their removal is in the live log the mirror gets next)."""
        queue = self.rep.queue
        while True:
            found = entries_at(queue.backing, keys)
            if found is not None:
                return [enqueue_op(seq, message, delivered, expires) for seq, message, delivered, expires in found]
            await _next_write(queue.store)

    async def _snapshot_chunks(self, reader):
        """The reset's contents, a chunk at a time; a paged-out message not yet in the file
        waits for the store's next write."""
        if reader is None:
            return
        while True:
            chunk = reader.read(SNAPSHOT_BATCH)
            if chunk is None:
                await _next_write(self.rep.queue.store)
                continue
            if not chunk:
                return
            yield chunk

    async def _batches(self, reader, base: int, stream_id: int, event: asyncio.Event, keys=None, ids=()):
        rep = self.rep
        state = rep.state
        head = {"vhost": state.vhost, "queue": state.name, "epoch": state.epoch, "master": rep.mirroring.node}
        yield pb.MirrorBatch(reset=True, base_seq=base, snapshot_done=reader is None, reconcile=keys is not None,
                             dedup_size=rep.dedup_size, dedup_ids=[key for key, _at in ids],
                             dedup_seen_ms=[at for _key, at in ids], **head)
        if keys is not None:
            held, delivered = keys
            for i in range(0, len(held), RECONCILE_BATCH):
                if stream_id != self._stream_id:
                    return
                yield pb.MirrorBatch(keys=held[i:i + RECONCILE_BATCH],
                                     delivered_keys=delivered if i == 0 else ())
        if reader is not None:
            n = 0
            started = time.monotonic()
            async for whole_chunk in self._snapshot_chunks(reader):
                for chunk in _by_bytes(whole_chunk):
                    if stream_id != self._stream_id:
                        return
                    batch = pb.MirrorBatch(ops=[enqueue_op(seq, message, delivered, expires)
                                                for seq, message, delivered, expires in chunk])
                    # a sync takes at most about half of the loop: the queue keeps serving at speed
                    await asyncio.sleep(time.monotonic() - started)
                    yield batch
                    started = time.monotonic()
                    self.sync_sent += len(chunk)
                n += 1
                if n % 50 == 0:
                    rep.log.info("sync progress", mirror=self.node, sent=self.sync_sent, total=self.sync_total)
            yield pb.MirrorBatch(snapshot_done=True)
        while stream_id == self._stream_id:
            if self.fills:
                ops = await self._filled(self.fills.popleft())
                yield pb.MirrorBatch(fill=True, ops=ops)
                continue
            if self.sent_upto >= rep.seq:
                event.clear()
                rep.trim()
                await event.wait()
                continue
            first = self.sent_upto + 1
            ops = rep.ops_after(self.sent_upto)
            self.sent_upto += len(ops)
            yield pb.MirrorBatch(first_seq=first, ops=ops, dedup_size=rep.dedup_size)


def _by_bytes(chunk: list) -> list[list]:
    """A sync chunk cut into batches of at most BATCH_BYTES of bodies (a larger message alone):
    1,000 messages of 300 KiB in one batch passed the channel's limit, and the sync failed for
    ever (RESOURCE_EXHAUSTED at every retry)."""
    parts: list[list] = []
    part: list = []
    total = 0
    for item in chunk:
        size = len(item[1].body)
        if part and total + size > BATCH_BYTES:
            parts.append(part)
            part, total = [], 0
        part.append(item)
        total += size
    if part:
        parts.append(part)
    return parts


def _next_write(store) -> asyncio.Future[None]:
    """Done once the store's next write is durable (a paged-out message is in the file then)."""
    written: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def durable(_ok: bool) -> None:
        if not written.done():
            written.set_result(None)
    store.when_durable(durable)
    return written
