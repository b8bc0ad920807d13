"""A mirror link's phases (cluster/mirroring/link_machine.py) driven by hand: no sockets, no tasks,
no clock. Each test feeds the events a MirrorLink would (a stream started, acks, the stream
ended, the metadata log's decisions, ticks) and checks the phase and the actions asked for."""
from __future__ import annotations

import pytest

from haremq.cluster.mirroring.link_machine import (AFTER_STREAM, RETRY_UNREACHABLE, WAIT_FOR_LOG, LinkMachine,
                                                LinkPhase, ProposeDropped, ProposeSynced, Restart)

TIMEOUT = 3.0


def never_read() -> int:
    raise AssertionError("the queue's oldest key is read only for a link in manual sync")


def tick(machine: LinkMachine, now: float = 100.0, oldest_key=never_read, master_seq: int = 0,
         in_synced: bool = False, oldest_waiting=None) -> list:
    return machine.tick(now, oldest_key=oldest_key, master_seq=master_seq, in_synced=in_synced,
                        oldest_waiting=oldest_waiting, timeout=TIMEOUT)


def synced_mirror(base: int = 10) -> LinkMachine:
    """A link through an automatic sync to a mirror the log calls synchronised."""
    machine = LinkMachine()
    machine.stream_started(base, cut_key=base, automatic=True)
    assert machine.acked_upto(base, 1.0, master_seq=base) == [ProposeSynced()]
    assert machine.synced_decided(failed=False, synced=True, closed=False) == []
    assert machine.synced_changed(True) == []
    assert machine.phase is LinkPhase.SYNCED
    return machine


def test_an_automatic_sync_goes_from_the_snapshot_through_catching_up_to_synced():
    machine = LinkMachine()
    assert machine.phase is LinkPhase.CONNECTING and not machine.counts_for_confirms
    assert machine.wait_before_stream(in_synced=False, reachable=True) == 0
    assert machine.stream_started(10, cut_key=7, automatic=True) == (True, False)
    # receiving the stream: a classic queue's confirms wait for it, a quorum majority does not count it
    assert machine.phase is LinkPhase.SYNCING and machine.streaming and machine.counts_for_confirms
    assert not machine.holds_copy
    assert machine.acked_upto(9, 1.0, master_seq=12) == []          # still applying the snapshot
    assert machine.phase is LinkPhase.SYNCING and not machine.holds_copy
    assert machine.acked_upto(10, 2.0, master_seq=15) == []         # holds it: must reach 15 now
    assert machine.phase is LinkPhase.CATCHING and machine.join_seq == 15 and machine.counts_for_confirms
    assert machine.holds_copy
    assert tick(machine, master_seq=16) == []                       # acked 10 of 15
    assert machine.acked_upto(15, 3.0, master_seq=18) == [ProposeSynced()]
    assert machine.phase is LinkPhase.PROPOSING and machine.proposing and machine.counts_for_confirms
    assert machine.wait_before_stream(in_synced=False, reachable=True) == WAIT_FOR_LOG
    assert machine.synced_decided(failed=False, synced=True, closed=False) == []
    assert machine.synced_changed(True) == []
    assert machine.phase is LinkPhase.SYNCED and not machine.proposing and machine.counts_for_confirms


def test_catching_up_is_noticed_by_a_tick_too():
    machine = LinkMachine()
    machine.stream_started(10, cut_key=10, automatic=True)
    machine.acked_upto(10, 1.0, master_seq=20)
    machine.acked = 20                   # acks can be folded; the tick sees where it stands
    assert tick(machine, master_seq=25) == [ProposeSynced()]
    assert machine.phase is LinkPhase.PROPOSING


def test_manual_sync_waits_until_every_older_message_has_left_the_queue():
    machine = LinkMachine()
    assert machine.stream_started(10, cut_key=8, automatic=False) == (False, False)
    assert machine.acked_upto(10, 1.0, master_seq=10) == []
    assert machine.phase is LinkPhase.MANUAL and machine.counts_for_confirms and not machine.holds_copy
    assert tick(machine, oldest_key=lambda: 8, master_seq=12) == []          # key 8 is still there
    assert machine.phase is LinkPhase.MANUAL
    machine.acked_upto(14, 2.0, master_seq=14)
    assert tick(machine, oldest_key=lambda: 9, master_seq=14) == [ProposeSynced()]   # caught up at once
    assert machine.join_seq == 14 and machine.phase is LinkPhase.PROPOSING


def test_a_synced_entry_that_failed_is_proposed_again_at_the_next_tick():
    machine = LinkMachine()
    machine.stream_started(5, cut_key=5, automatic=True)
    assert machine.acked_upto(5, 1.0, master_seq=5) == [ProposeSynced()]
    assert machine.synced_decided(failed=True, synced=False, closed=False) == []
    assert machine.phase is LinkPhase.CATCHING and not machine.proposing
    assert tick(machine, master_seq=6) == [ProposeSynced()]


def test_a_refused_synced_entry_starts_a_full_sync_again():
    machine = LinkMachine()
    machine.stream_started(5, cut_key=5, automatic=False)
    machine.acked_upto(5, 1.0, master_seq=5)
    tick(machine, oldest_key=lambda: 6, master_seq=5)
    assert machine.phase is LinkPhase.PROPOSING
    assert machine.synced_decided(failed=False, synced=False, closed=False) == [Restart(force_sync=True)]
    assert machine.phase is LinkPhase.DOWN and machine.force_sync
    machine.stream_ended()
    assert machine.stream_started(9, cut_key=9, automatic=False) == (True, False)   # the whole queue
    assert machine.acked_upto(9, 2.0, master_seq=12) == []
    assert machine.phase is LinkPhase.CATCHING and machine.join_seq == 12 and not machine.force_sync


def test_a_refusal_for_a_closed_link_asks_for_nothing():
    machine = LinkMachine()
    machine.stream_started(5, cut_key=5, automatic=True)
    machine.acked_upto(5, 1.0, master_seq=5)
    assert machine.synced_decided(failed=False, synced=False, closed=True) == []


def test_a_synced_mirror_whose_stream_is_lost_is_dropped_once_then_streamed_to_afresh():
    machine = synced_mirror()
    machine.stream_ended()
    assert machine.phase is LinkPhase.SYNCED and not machine.streaming    # the log still says so
    assert machine.wait_before_stream(in_synced=True, reachable=True) == WAIT_FOR_LOG
    assert tick(machine, in_synced=True) == [ProposeDropped("stream lost")]
    assert tick(machine, in_synced=True) == []                               # already proposed
    machine.dropped_decided("stream lost")
    assert machine.synced_changed(False) == [Restart()]
    assert machine.phase is LinkPhase.DROPPED and not machine.counts_for_confirms
    assert machine.wait_before_stream(in_synced=False, reachable=True) == 0


def test_a_synced_mirror_that_stops_answering_is_dropped_after_the_failure_timeout():
    machine = synced_mirror(base=10)
    waiting = (11, 50.0)                  # a confirm for seq 11 has waited since t=50
    assert tick(machine, now=50.0 + TIMEOUT, in_synced=True, oldest_waiting=waiting) == []
    assert tick(machine, now=50.0 + TIMEOUT + 0.1, in_synced=True, oldest_waiting=waiting) == \
        [ProposeDropped("stopped answering")]
    other = synced_mirror(base=10)
    other.acked_upto(11, 60.0, master_seq=11)      # it answered: nothing owed
    assert tick(other, now=60.0 + 2 * TIMEOUT, in_synced=True, oldest_waiting=waiting) == []


def test_a_mirror_the_log_calls_synchronised_while_its_link_started_over_is_dropped():
    machine = LinkMachine()                  # a new link (its master restarted) to a mirror the log has synced
    machine.stream_started(20, cut_key=20, automatic=True)
    assert machine.synced_changed(True) == [ProposeDropped("resynchronising")]
    assert machine.synced_changed(True) == []      # already proposed
    machine.dropped_decided("resynchronising")
    assert machine.synced_changed(False) == [] and machine.phase is LinkPhase.SYNCING


def test_an_unreachable_mirror_is_down_and_owed_nothing():
    machine = LinkMachine(force_sync=True, reconcile_upto=42)
    assert machine.owed and machine.counts_for_confirms        # in sync with the old master
    assert machine.wait_before_stream(in_synced=False, reachable=False) == RETRY_UNREACHABLE
    assert machine.phase is LinkPhase.DOWN and not machine.owed and not machine.counts_for_confirms


def test_a_promoted_masters_first_stream_reconciles_and_falls_back_to_a_full_sync():
    machine = LinkMachine(force_sync=True, reconcile_upto=42)
    assert machine.stream_started(50, cut_key=50, automatic=False) == (True, True)
    machine.stream_ended(wants_all=True)          # the mirror could not be reconciled
    assert machine.reconcile_upto is None and not machine.owed and machine.phase is LinkPhase.DOWN
    assert machine.stream_started(60, cut_key=60, automatic=False) == (True, False)
    machine.acked_upto(60, 1.0, master_seq=61)
    assert machine.phase is LinkPhase.CATCHING and not machine.force_sync


def test_a_reconciled_mirror_holds_the_snapshot_and_forgets_the_old_master():
    machine = LinkMachine(force_sync=True, reconcile_upto=42)
    machine.stream_started(50, cut_key=50, automatic=True)
    machine.acked_upto(50, 1.0, master_seq=50)
    assert machine.reconcile_upto is None and not machine.owed and machine.phase is LinkPhase.PROPOSING


@pytest.mark.parametrize("force_sync", [True, False, None])
def test_a_restart_asked_by_ctl_keeps_or_sets_the_sync_mode(force_sync):
    machine = LinkMachine(force_sync=True)
    assert machine.restart(force_sync) == Restart(force_sync)
    assert machine.force_sync is (True if force_sync is None else force_sync)


def test_phases_read_as_their_names():
    assert LinkPhase.SYNCING == "syncing" and LinkPhase.SYNCED.value == "synced"
    assert LinkPhase.CATCHING in ("synced", "catching", "proposing")
    assert AFTER_STREAM > 0
