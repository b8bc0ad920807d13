"""A mirror link's phases, pure: events in, actions out.

The master of a mirrored queue streams its changes to each mirror over one
long-lived call (cluster/mirroring/replicator.py's MirrorLink). Whether that mirror counts
for confirms, when it may be called synchronised and when it is dropped from the
in-sync set are decided here, by LinkMachine, from what the link sees (a stream
started, an ack, the stream ended, the mirror unreachable), what the metadata log
decides (the "mirror synced" entry taken or refused, the in-sync set changed) and
tick(now). Each call returns the actions the link must carry out: propose an entry
to the metadata log, or start the stream over. It opens no socket, starts no task
and reads no clock, so tests/test_mirror_link_machine.py drives it by hand.

The phases, in the order a mirror normally passes through them:

  CONNECTING -> no stream yet;
  SYNCING    -> a stream began with a reset; the mirror has not applied it yet;
  MANUAL     -> no snapshot was sent (manual sync mode): it waits until every
                message older than the stream has left the queue;
  CATCHING   -> the mirror holds the snapshot; from now on confirms wait for it
                too, and it is caught up once it has acked everything the master
                had when it entered this phase (join_seq);
  PROPOSING  -> "mirror synced" is going through the metadata log;
  SYNCED     -> the log says so: it may be promoted, confirms wait for it;
  DOWN       -> unreachable, or its stream ended: a new stream follows;
  DROPPED    -> the log took it out of the in-sync set: a new stream follows.

A synced mirror whose stream is lost, or that owes an ack for the oldest waiting
confirm and has acked nothing for the failure timeout, is proposed for dropping
(once per reason until the log has decided). A mirror the log calls synchronised
while this link started over is dropped too ("resynchronising"): a new stream
proves nothing until it has caught up again.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Callable, Union


class LinkPhase(str, Enum):
    """A str, so the phase compares equal to its name as status rows and ctl show it."""
    CONNECTING = "connecting"
    SYNCING = "syncing"
    MANUAL = "manual"
    CATCHING = "catching"
    PROPOSING = "proposing"
    SYNCED = "synced"
    DOWN = "down"
    DROPPED = "dropped"


IN_CONFIRM_SET = (LinkPhase.CATCHING, LinkPhase.PROPOSING, LinkPhase.SYNCED)
RECEIVING = (LinkPhase.SYNCING, LinkPhase.MANUAL)     # on a stream, not caught up yet

# how long the link waits before it tries a stream again (seconds)
WAIT_FOR_LOG = 0.05        # the log still calls the mirror synchronised, or a synced entry is in flight
RETRY_UNREACHABLE = 0.2    # no address for the mirror, or the failure detector has it down
AFTER_STREAM = 0.1         # a stream ended


@dataclass(frozen=True)
class ProposeSynced:
    """Submit "mirror synced" for this mirror (with the incarnation its stream reached);
    synced_decided() with the outcome."""


@dataclass(frozen=True)
class ProposeDropped:
    """Submit "mirror dropped from the in-sync set"; dropped_decided(reason) once it is done."""
    reason: str


@dataclass(frozen=True)
class Restart:
    """End the current stream (if any): the next one starts with a reset. force_sync: the next
    reset sends the whole queue (True), follows the sync mode (False), or as before (None)."""
    force_sync: bool | None = None


Action = Union[ProposeSynced, ProposeDropped, Restart]


class LinkMachine:
    def __init__(self, force_sync: bool = False, reconcile_upto: int | None = None):
        self.phase = LinkPhase.CONNECTING
        self.force_sync = force_sync
        # a promoted master's first stream to a mirror that was in sync with the old master: keys
        # up to this one are sent as keys only, and the mirror asks for what it lacks
        self.reconcile_upto = reconcile_upto
        # such a mirror had every confirmed message: until its first stream ends, confirms wait
        # for it as they did under the old master (a promotion must not leave one copy)
        self.owed = reconcile_upto is not None
        self.streaming = False
        self.proposing = False              # a "mirror synced" entry is in flight
        self.dropping: set[str] = set()     # reasons a "mirror dropped" entry is in flight for
        self.full = False                   # this stream's reset sends the queue's contents
        self.base = 0                       # the master's sequence when this stream began
        self.cut_key = 0                    # the newest key in the queue when this stream began
        self.join_seq = 0                   # caught up once acked this far
        self.acked = 0
        self.acked_at = 0.0

    @property
    def counts_for_confirms(self) -> bool:
        """A classic queue's confirms wait for this mirror: it is receiving the stream (syncing,
        or manual sync: RabbitMQ sends new messages to every mirror, synchronised or not, and
        confirms after all of them), holds the snapshot, or may be (or be about to be) called
        synchronised."""
        return (self.phase in IN_CONFIRM_SET or self.proposing or self.owed
                or (self.streaming and self.phase in RECEIVING))

    @property
    def holds_copy(self) -> bool:
        """The mirror holds the whole queue up to `acked` (its snapshot arrived, and every op
        since, or every message older than a manual stream has gone): a quorum member counts
        towards a majority only then (Raft's log matching)."""
        return self.phase in IN_CONFIRM_SET

    # ---- the stream's life ---------------------------------------------------------------------
    def wait_before_stream(self, in_synced: bool, reachable: bool) -> float:
        """0: start a stream now; otherwise the seconds to wait before asking again. A fresh stream
        waits until the log has dropped the mirror (and for a synced entry in flight to be decided)."""
        if in_synced or self.proposing:
            return WAIT_FOR_LOG
        if not reachable:
            self.owed = False
            self.phase = LinkPhase.DOWN
            return RETRY_UNREACHABLE
        return 0.0

    def stream_started(self, base: int, cut_key: int, automatic: bool) -> tuple[bool, bool]:
        """A stream begins at the master's sequence `base`; (full, reconcile): whether its reset
        sends the queue's contents, and whether as keys only up to reconcile_upto."""
        self.full = self.force_sync or automatic
        reconcile = self.full and self.reconcile_upto is not None
        self.base = base
        self.cut_key = cut_key
        self.acked = 0
        self.phase = LinkPhase.SYNCING
        self.streaming = True
        return self.full, reconcile

    def acked_upto(self, seq: int, now: float, master_seq: int) -> list[Action]:
        """The mirror has applied (and made durable) everything up to `seq`."""
        self.acked = seq
        self.acked_at = now
        if self.phase is LinkPhase.SYNCING and seq >= self.base:
            if self.full:
                self._caught_up_from(master_seq)
                self.force_sync = False
                self.reconcile_upto = None
            else:
                self.phase = LinkPhase.MANUAL
        if self.phase is LinkPhase.CATCHING and self.acked >= self.join_seq:
            return [self._propose_synced()]
        return []

    def stream_ended(self, wants_all: bool = False) -> None:
        """The stream is over (refused, failed, cancelled). wants_all: the mirror could not be
        reconciled, so the next reset sends everything."""
        if wants_all:
            self.reconcile_upto = None
        self.streaming = False
        self.owed = False
        if self.phase is not LinkPhase.SYNCED:
            self.phase = LinkPhase.DOWN

    def restart(self, force_sync: bool | None = None) -> Restart:
        """Start over with a reset (ctl sync-queue, cancel-sync-queue, or a dropped mirror)."""
        if force_sync is not None:
            self.force_sync = force_sync
        return Restart(force_sync)

    # ---- time --------------------------------------------------------------------------------
    def tick(self, now: float, *, oldest_key: Callable[[], int], master_seq: int, in_synced: bool,
             oldest_waiting: tuple[int, float] | None, timeout: float) -> list[Action]:
        """Housekeeping, every mirroring round. oldest_key(): the key of the oldest message still in
        the queue; oldest_waiting: (sequence, since) of the oldest confirm waiting for mirrors."""
        actions: list[Action] = []
        if self.phase is LinkPhase.MANUAL and oldest_key() > self.cut_key:
            self._caught_up_from(master_seq)
        if self.phase is LinkPhase.CATCHING and self.acked >= self.join_seq:
            actions.append(self._propose_synced())
        if in_synced and not self.dropping:
            stalled = oldest_waiting is not None and self.acked < oldest_waiting[0] and \
                now - max(oldest_waiting[1], self.acked_at) > timeout
            if stalled or not self.streaming:
                actions.append(self._propose_dropped("stopped answering" if stalled else "stream lost"))
        return actions

    # ---- what the metadata log decided -------------------------------------------------------
    def synced_decided(self, failed: bool, synced: bool, closed: bool) -> list[Action]:
        """The "mirror synced" entry: not applied (failed: tried again at a later tick), applied,
        or refused in log order (not `synced`: the mirror restarted since this stream began, or
        the queue moved; this stream proves nothing, a fresh one syncs it again)."""
        self.proposing = False
        if failed:
            if self.phase is LinkPhase.PROPOSING:
                self.phase = LinkPhase.CATCHING
            return []
        if not synced and not closed:
            self.phase = LinkPhase.DOWN
            return [self.restart(force_sync=True)]
        return []

    def dropped_decided(self, reason: str) -> None:
        self.dropping.discard(reason)

    def synced_changed(self, in_synced: bool) -> list[Action]:
        """The log added or dropped this mirror in the in-sync set."""
        if in_synced:
            if self.phase in (LinkPhase.PROPOSING, LinkPhase.SYNCED):
                self.phase = LinkPhase.SYNCED
            elif not self.dropping:      # it started over meanwhile: not in sync after all
                return [self._propose_dropped("resynchronising")]
        elif self.phase is LinkPhase.SYNCED:
            self.phase = LinkPhase.DROPPED
            return [self.restart()]
        return []

    # ---- transitions -------------------------------------------------------------------------
    def _caught_up_from(self, seq: int) -> None:
        self.owed = False
        self.phase = LinkPhase.CATCHING
        self.join_seq = seq

    def _propose_synced(self) -> ProposeSynced:
        self.phase = LinkPhase.PROPOSING
        self.proposing = True
        return ProposeSynced()

    def _propose_dropped(self, reason: str) -> ProposeDropped:
        self.dropping.add(reason)
        return ProposeDropped(reason)
