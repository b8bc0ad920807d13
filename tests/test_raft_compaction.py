"""The cluster's metadata log compacted (Raft snapshots), with real node processes and clients.

Every node is started with a small snapshot threshold (HAREMQ_RAFT_SNAPSHOT_ENTRIES), so a
few thousand metadata changes make several snapshots: a member that was away meanwhile
catches up by the leader's snapshot (InstallSnapshot), a whole-cluster restart loads each
node's own snapshot and replays only the tail, and neither loses a queue, binding, user,
policy or confirmed message. Server-named exclusive queues, declared and gone by the
thousand, leave nothing behind on disk once compacted.
"""
from __future__ import annotations

import json
import os
import signal
import tarfile
import time
from pathlib import Path

import pika
import pytest

from tests.clusters import SECRET, ClusterMember, control, launch, plain_cluster, queue_row, stop_cluster
from tests.conftest import IS_REF, free_port, wait_until

pytestmark = pytest.mark.skipif(IS_REF, reason="starts and kills cluster node processes")

THRESHOLD = 150
PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("HAREMQ_RAFT_SNAPSHOT_ENTRIES", str(THRESHOLD))    # the node processes inherit it
    members = plain_cluster(tmp_path, failure_timeout=1.5)
    yield members
    stop_cluster(members, {"close": lambda: None})


def _connect(member):
    return pika.BlockingConnection(pika.URLParameters(member.url))


def _setup(member):
    """Durable things that must outlive everything: mirrored queues with messages, bindings,
    a user with permissions in a vhost of its own, policies."""
    control(member, "broker_call", method="set_policy",
            args=["/", "ha-all", "^ha\\.", {"ha-mode": "all", "ha-sync-mode": "automatic"}, "queues", 0])
    control(member, "broker_call", method="set_policy", args=["/", "limit", "^keep\\.", {"max-length": 1000},
                                                              "queues", 1])
    control(member, "broker_call", method="add_vhost", args=["tenant"])
    control(member, "broker_call", method="add_user", args=["alice", "secret", ["monitoring"]])
    control(member, "broker_call", method="set_permissions", args=["alice", "tenant", ".*", ".*", ".*"])
    conn = _connect(member)
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare("events", "topic", durable=True)
    for i in range(20):
        ch.queue_declare(f"keep.{i}", durable=True)
        ch.queue_bind(f"keep.{i}", "events", f"k.{i}")
    ch.queue_declare("ha.orders", durable=True)
    ch.queue_bind("ha.orders", "events", "order.*")
    for i in range(300):
        ch.basic_publish("events", "order.new", b"o%d" % i, PERSISTENT)
    for i in range(20):
        ch.basic_publish("events", f"k.{i}", b"k%d" % i, PERSISTENT)
    conn.close()


def _churn(member, cycles: int) -> None:
    """What an RPC client does for every request: a server-named exclusive reply queue, bound,
    then deleted. Three metadata changes a cycle, none of them leaving anything."""
    conn = _connect(member)
    ch = conn.channel()
    for _ in range(cycles):
        name = ch.queue_declare("", exclusive=True).method.queue
        ch.queue_bind(name, "amq.direct", name)
        ch.queue_delete(name)
    conn.close()


def _definitions(member) -> dict:
    """What the member holds, as RabbitMQ's definitions (a user's hash aside: every node salts
    its own default guest), and every binding as `list_bindings` has them (the definitions
    leave out bindings to queues homed on other members)."""
    data = control(member, "broker_call", method="export_definitions", read=True, timeout=20.0)
    for user in data["users"]:
        user.pop("password_hash")
    data["bindings"] = control(member, "list_bindings", timeout=20.0)
    return {key: sorted(json.dumps(row, sort_keys=True) for row in data[key])
            for key in ("users", "vhosts", "permissions", "policies", "queues", "exchanges", "bindings")}


def _holds(member, expected: dict) -> None:
    """The member comes to hold exactly these definitions (what differs is shown if it never does)."""
    try:
        wait_until(lambda: _definitions(member) == expected, timeout=30)
    except AssertionError:
        assert _definitions(member) == expected, member.name


def _drain(member, queue: str) -> list[bytes]:
    conn = _connect(member)
    ch = conn.channel()
    got = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=False)
        if method is None:
            break
        got.append(body)
    conn.close()        # nothing acked: the messages stay for the next check
    return got


def _raft_files(member) -> tuple[dict, int]:
    """(the snapshot's header, the entries in the log file) of a member's raft directory."""
    raft = member.data_dir / "raft"
    head = json.loads((raft / "snapshot.json").read_bytes().partition(b"\n")[0])
    return head, len((raft / "log.jsonl").read_bytes().splitlines())


def _compacted(member, past: int) -> dict:
    """The member's snapshot covers more than `past` entries and its log holds fewer than three
    thresholds' worth after it (a member catching up compacts as it applies: wait for it)."""
    def check():
        head, lines = _raft_files(member)
        return head if head["index"] > past and lines < 3 * THRESHOLD else None
    try:
        return wait_until(check, timeout=30)
    except AssertionError:
        raise AssertionError(f"{member.name}: snapshot and log {_raft_files(member)}") from None


def _log_says(member, text: str, times: int = 1) -> bool:
    return member.log_path.read_text(errors="replace").count(text) >= times


def _everything_there(member, expected: dict) -> None:
    assert _definitions(member) == expected
    assert sorted(_drain(member, "ha.orders")) == sorted(b"o%d" % i for i in range(300))
    for i in range(20):
        assert _drain(member, f"keep.{i}") == [b"k%d" % i]
    conn = pika.BlockingConnection(pika.URLParameters(f"amqp://alice:secret@{member.host}:{member.port}/tenant"))
    conn.close()


def test_a_member_away_while_thousands_of_changes_happen_catches_up_by_snapshot(cluster):
    hare1, hare2, hare3 = cluster
    _setup(hare1)
    expected = _definitions(hare1)
    wait_until(lambda: (queue_row(hare1, "ha.orders") or {}).get("synchronised_mirrors") and
               len(queue_row(hare1, "ha.orders")["synchronised_mirrors"]) == 2, timeout=30)
    hare3.stop()
    last_seen = sum(1 for _ in (hare3.data_dir / "raft" / "log.jsonl").open("rb"))
    _churn(hare1, 700)                     # 2,100 changes: many snapshots' worth
    _churn(hare2, 300)
    for member in (hare1, hare2):
        _compacted(member, last_seen + 2000)      # the log is cut before each snapshot
    hare3.start(timeout=60)
    wait_until(lambda: _log_says(hare3, "raft snapshot installed"), timeout=30,
               message="hare3 never took the leader's snapshot")
    _compacted(hare3, last_seen + 2000)
    for member in cluster:
        _holds(member, expected)
    _everything_there(hare3, expected)
    # and it goes on taking part: a change made now is seen everywhere
    conn = _connect(hare3)
    conn.channel().queue_declare("keep.after", durable=True)
    conn.close()
    for member in cluster:
        wait_until(lambda m=member: queue_row(m, "keep.after") is not None, timeout=20)


def test_a_whole_cluster_restart_after_compaction_keeps_every_queue_user_policy_and_message(cluster):
    hare1, hare2, hare3 = cluster
    _setup(hare2)
    _churn(hare1, 400)
    _churn(hare3, 200)
    wait_until(lambda: len((queue_row(hare1, "ha.orders") or {}).get("synchronised_mirrors") or []) == 2,
               timeout=30)
    # a failover, then more changes: the snapshot holds the new master and epoch
    master = next(m for m in cluster if m.name == queue_row(hare1, "ha.orders")["node"])
    others = [m for m in cluster if m is not master]
    master.kill9()
    wait_until(lambda: (queue_row(others[0], "ha.orders") or {}).get("node") in {m.name for m in others}, timeout=30)
    _churn(others[0], 300)
    master.start(timeout=60)
    expected = _definitions(others[0])
    for member in cluster:
        _compacted(member, 1000)
    for restart, power_cut in enumerate((True, False), start=1):
        for m in cluster:
            m.kill9() if power_cut else m.stop()
        launch(cluster)
        for member in cluster:
            assert _log_says(member, "raft snapshot loaded", times=restart)
            _holds(member, expected)
        for member in cluster:
            _everything_there(member, expected)


FIXTURE = Path(__file__).parent / "fixtures" / "cluster-4ff821a.tar.gz"


def test_a_cluster_written_before_snapshots_starts_compacts_and_restarts(tmp_path, monkeypatch):
    """The data directories of a three-node cluster HareMQ 4ff821a ran and stopped
    (tests/fixtures/make_cluster_fixture.py): this HareMQ starts on them, finds everything,
    compacts the log it replayed, and restarts from the snapshots."""
    monkeypatch.setenv("HAREMQ_RAFT_SNAPSHOT_ENTRIES", str(THRESHOLD))
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET)
    names = ("hare1", "hare2", "hare3")
    ports = {n: free_port() for n in names}
    members = [ClusterMember(n, tmp_path / n, ports[n], {p: f"127.0.0.1:{ports[p]}" for p in names if p != n},
                             secret_file) for n in names]
    try:
        launch(members)
        for restart in range(2):
            for member in members:
                defs = wait_until(lambda m=member: _definitions(m), timeout=30)
                assert {json.loads(q)["name"] for q in defs["queues"]} == \
                    {"ha.orders", "ha.second", *(f"keep.{i}" for i in range(20))}
                assert {json.loads(u)["name"] for u in defs["users"]} == {"guest", "alice"}
                assert {json.loads(p)["name"] for p in defs["policies"]} == {"ha-all", "limit"}
                assert sorted(_drain(member, "ha.orders")) == sorted(b"o%d" % i for i in range(300))
                assert sorted(_drain(member, "ha.second")) == sorted(b"s%d" % i for i in range(50))
                for i in range(20):
                    assert _drain(member, f"keep.{i}") == [b"k%d" % i]
                conn = pika.BlockingConnection(
                    pika.URLParameters(f"amqp://alice:secret@{member.host}:{member.port}/tenant"))
                conn.close()
                _compacted(member, 1000)
            if restart == 0:
                for m in members:
                    m.stop()
                launch(members)
                for member in members:
                    assert _log_says(member, "raft snapshot loaded")
    finally:
        stop_cluster(members, {"close": lambda: None})


def _serves_queue(member, name: str) -> bool:
    """The member is running and serves AMQP, and its own state has the queue (a passive
    declare is answered from the member's own copy of the metadata)."""
    if member.proc.poll() is not None:
        return False
    try:
        conn = _connect(member)
    except Exception:  # noqa: BLE001 - starting again: not serving yet
        return False
    try:
        conn.channel().queue_declare(name, passive=True)
        return True
    except pika.exceptions.ChannelClosedByBroker:
        return False
    finally:
        if conn.is_open:
            conn.close()


def test_a_paused_member_behind_the_snapshots_serves_again_by_itself(cluster):
    """SIGSTOPped while the others go through several snapshots (a VM migration, a long GC):
    woken, it is sent a snapshot it cannot load while serving clients. It starts itself again
    (the same process, nothing to supervise it) and serves the cluster's state."""

    hare1, _hare2, hare3 = cluster
    conn = _connect(hare1)
    conn.channel().queue_declare("before.pause", durable=True)
    conn.close()
    wait_until(lambda: queue_row(hare3, "before.pause") is not None, timeout=20)
    pid = hare3.proc.pid
    os.killpg(pid, signal.SIGSTOP)
    paused = time.monotonic()
    try:
        _churn(hare1, 500)                        # 1,500 entries: ten snapshots on the others
        conn = _connect(hare1)
        conn.channel().queue_declare("during.pause", durable=True)
        conn.close()
        time.sleep(max(0.0, 10 - (time.monotonic() - paused)))
    finally:
        os.killpg(pid, signal.SIGCONT)
    woke = time.monotonic()
    wait_until(lambda: _log_says(hare3, "raft snapshot"), timeout=30,
               message="the paused member was never sent a snapshot: the test proves nothing")
    wait_until(lambda: _serves_queue(hare3, "during.pause"), timeout=20,
               message=f"the member did not serve again within 20 s of SIGCONT:\n{hare3.log_tail()}")
    assert hare3.proc.pid == pid and hare3.proc.poll() is None
    assert time.monotonic() - woke < 20
    assert _log_says(hare3, "node starting again")
