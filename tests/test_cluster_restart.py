"""Whole-cluster restarts: every member stopped and started again (a power cut, an upgrade,
`docker compose down && up`) after failovers. What a restarted node replays from the metadata
log rebuilds its state; it must not act on it (MIR-2..6, CONF-4)."""
from __future__ import annotations

import json

import pika
import pytest

from tests.clusters import ctl, launch, queue_row
from tests.conftest import IS_REF, wait_until

pytestmark = pytest.mark.skipif(IS_REF, reason="starts and kills cluster node processes")

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def _policy(member, pattern, definition, name="ha"):
    r = ctl(member, "set-policy", name, pattern, json.dumps(definition), "--apply-to", "queues")
    assert r.returncode == 0, r.stderr


def _row(member, name, check, what, timeout=40):
    seen = []

    def probe():
        try:
            row = queue_row(member, name)
        except AssertionError:
            return None
        seen[:] = [row]
        return row if row and check(row) else None
    try:
        return wait_until(probe, timeout=timeout, interval=0.2)
    except AssertionError:
        raise AssertionError(f"{name}: {what} never held: {seen}") from None


def _master_is(member, name, master, synced):
    return _row(member, name, lambda r: r["node"] == master and sorted(r["synchronised_mirrors"] or []) == synced,
                f"master {master} with synchronised mirrors {synced}")


def _count(member, name) -> int:
    conn = pika.BlockingConnection(pika.URLParameters(member.url))
    try:
        return conn.channel().queue_declare(name, passive=True).method.message_count
    finally:
        conn.close()


def _publish(member, name, count):
    conn = pika.BlockingConnection(pika.URLParameters(member.url))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(count):
        ch.basic_publish("", name, b"m%d" % i, PERSISTENT)
    conn.close()


def _restart_all(members, power_cut: bool):
    """SIGKILL every member at once (a power cut), or SIGTERM them in turn (as `docker compose
    down` does); then start them all together."""
    for m in members:
        m.kill9() if power_cut else m.stop()
    launch(members)


@pytest.mark.parametrize("failovers", [0, 1, 2, 3])
def test_whole_cluster_restart_after_failovers_keeps_every_message(cluster, failovers):
    hare1, hare2, hare3 = cluster
    name = "ha.restart"
    _policy(hare1, r"^ha\.", {"ha-mode": "nodes", "ha-params": ["hare1", "hare2"], "ha-sync-mode": "automatic"})
    conn = pika.BlockingConnection(pika.URLParameters(hare1.url))
    conn.channel().queue_declare(name, durable=True)
    conn.close()
    _master_is(hare3, name, "hare1", ["hare2"])
    _publish(hare1, name, 1000)
    master, mirror = hare1, hare2
    for _ in range(failovers):
        master.kill9()
        _master_is(hare3, name, mirror.name, [])
        master.start(timeout=60)
        _master_is(hare3, name, mirror.name, [master.name])
        master, mirror = mirror, master
    assert _count(hare3, name) == 1000
    for power_cut in (True, False):     # the second once the mirror has synchronised again
        _restart_all(cluster, power_cut)
        # a stopping master hands the queue to its synchronised mirror (ha-promote-on-shutdown),
        # so either member may master it now: what matters is that it holds every message
        _row(hare3, name, lambda r: len(r["synchronised_mirrors"] or []) == 1, "a synchronised mirror")
        assert _count(hare3, name) == 1000
    conn = pika.BlockingConnection(pika.URLParameters(hare2.url))
    ch = conn.channel()
    got = []
    while True:
        method, _props, body = ch.basic_get(name, auto_ack=True)
        if method is None:
            break
        got.append(body)
    assert sorted(got) == sorted(b"m%d" % i for i in range(1000))
