"""A quorum queue confirms only what a majority of its members hold (Raft's commit rule): with
one member down and another restarted and still taking its snapshot, the leader alone holds new
messages and must not confirm them (nor nack them) until the restarted member has caught up."""
from __future__ import annotations

import threading
import time

import pika
import pytest

from tests.clusters import control, leader_and_term
from tests.conftest import pika_conn, unique_name, wait_until

pytestmark = pytest.mark.cluster(failure_timeout=3.0)

QUORUM = {"x-queue-type": "quorum"}
BACKLOG = 150_000          # 1 KiB each: the restarted member's snapshot takes seconds to send
BODY = b"x" * 1024


def _row(member, name):
    rows = control(member, "list_queues", local=True)
    return next((r for r in rows if r["name"] == name), None)


def _publish_backlog(member, name: str) -> None:
    ch = pika_conn(member).channel()
    props = pika.BasicProperties(delivery_mode=2)
    for _ in range(BACKLOG):
        ch.basic_publish("", name, BODY, props)
    ch.confirm_delivery()
    ch.basic_publish("", name, b"last", props)       # confirmed: everything before it has arrived
    ch.connection.close()


def test_no_confirm_while_only_the_leader_holds_the_message(cluster):
    hare1, hare2, hare3 = cluster
    name = unique_name("qq.majority")
    ch = pika_conn(hare1).channel()
    ch.queue_declare(name, durable=True, arguments=QUORUM)
    wait_until(lambda: sorted((_row(hare1, name) or {}).get("synchronised_mirrors") or []) == ["hare2", "hare3"],
               timeout=20, message="the quorum queue never had both followers in sync")
    _publish_backlog(hare1, name)

    hare2.kill9()
    hare2.start(timeout=60)
    # hare2 is taking its snapshot now; with hare3 gone the leader is the only whole copy
    hare3.kill9()
    killed = time.monotonic()

    confirmed: list[float] = []
    errors: list[BaseException] = []

    def publish() -> None:
        try:
            pub = pika_conn(hare1).channel()
            pub.confirm_delivery()
            for i in range(2000):
                pub.basic_publish("", name, b"p%d" % i, pika.BasicProperties(delivery_mode=2))
                confirmed.append(time.monotonic())
        except BaseException as exc:  # noqa: BLE001 - reported by the test below
            errors.append(exc)

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    syncing_seen = []       # when we last asked and the leader said hare2's copy was still being sent
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        asked = time.monotonic()        # the leader answered later: hare2 was not whole before this
        row = _row(hare1, name) or {}
        state = (row.get("mirror_states") or {}).get("hare2")
        if state in ("catching", "proposing", "synced"):
            break
        syncing_seen.append(asked)
        time.sleep(0.05)
    else:
        pytest.fail("hare2 never caught up with the quorum queue's leader")
    assert syncing_seen and syncing_seen[-1] - killed > 1.5, \
        "hare2's snapshot arrived before the test could see a window without a majority"
    # confirms of messages hare3 acked before it died may still arrive just after its kill
    early = [t for t in confirmed if killed + 0.5 < t < syncing_seen[-1]]
    assert early == [], f"{len(early)} confirms while only the leader held the messages"
    wait_until(lambda: len(confirmed) == 2000 or errors, timeout=60,
               message="confirms did not come back once a majority held the messages")
    assert not errors, errors


def test_a_member_restarted_with_another_peer_list_places_queues_as_the_log_does(cluster):
    """Placement reads the members the log records, not the restarted member's own --peer flags:
    one restarted without hare2 in its list still has hare2 mirroring the queue, as the others do.
    hare2 leads the metadata log meanwhile: the restarted member follows a leader it has no
    address for, and its own proposals reach it through hare1."""
    hare1, hare2, hare3 = cluster
    for _ in range(4):      # a dead leader's successor stands by name: hare2 after hare1
        leader = wait_until(lambda: leader_and_term(cluster), timeout=30)[0]
        if leader == "hare2":
            break
        victim = {"hare1": hare1, "hare3": hare3}[leader]
        victim.kill9()
        wait_until(lambda: (leader_and_term([m for m in cluster if m is not victim]) or ("",))[0]
                   not in ("", leader), timeout=30)
        victim.start(timeout=60)
    assert wait_until(lambda: leader_and_term(cluster), timeout=30)[0] == "hare2"
    control(hare1, "broker_call", method="set_policy",
            args=["/", "ha-peers", "^peers[.]", {"ha-mode": "all", "ha-sync-mode": "automatic"}, "queues", 0])
    name = unique_name("peers.c")
    pika_conn(hare1).channel().queue_declare(name, durable=True)

    def record(member):
        return next((r for r in control(member, "queue_records") if r["name"] == name), None)
    wait_until(lambda: (record(hare1) or {}).get("mirrors") == ["hare2", "hare3"], timeout=20)
    hare3.kill9()
    hare3.peers = {n: a for n, a in hare3.peers.items() if n != "hare2"}
    hare3.start(timeout=60)
    wait_until(lambda: record(hare3) is not None, timeout=20)
    mine, theirs = record(hare3), record(hare1)
    assert (mine["master"], mine["mirrors"]) == (theirs["master"], theirs["mirrors"]) == ("hare1", ["hare2", "hare3"])
