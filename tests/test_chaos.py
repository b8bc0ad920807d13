"""Chaos for mirrored queues (MIR-4, MIR-5, CONF-5): publishers with confirms and consumers with
manual acks on every node while the current master is SIGKILLed and restarted, and while one
node is cut off from the others (a majority/minority split). A checker in the style of Jepsen's
total-queue compares what was confirmed with what was consumed: a confirmed message that was
never consumed is lost, and must never happen; duplicates and unconfirmed losses are counted.

Rounds: HAREMQ_CHAOS_KILL_ROUNDS (default 3) and HAREMQ_CHAOS_PARTITION_ROUNDS (default 2);
deploy/chaos-suite.sh runs it for longer.
"""
from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter

import pika
import pytest

from tests.clusters import ctl, proxied_cluster, queue_row, stop_cluster
from tests.conftest import IS_REF, wait_until

pytestmark = [pytest.mark.skipif(IS_REF, reason="kills cluster node processes"), pytest.mark.chaos]

KILL_ROUNDS = int(os.environ.get("HAREMQ_CHAOS_KILL_ROUNDS", "3"))
PARTITION_ROUNDS = int(os.environ.get("HAREMQ_CHAOS_PARTITION_ROUNDS", "2"))
QUEUE = "chaos.q"


class Load:
    """One publisher and one consumer per node, each reconnecting (to any node) when cut off."""

    def __init__(self, members):
        self.members = members
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.published: set[str] = set()
        self.confirmed: set[str] = set()
        self.consumed: Counter = Counter()
        self.nacked = 0
        self.threads = []
        for i, _m in enumerate(members):
            self.threads.append(threading.Thread(target=self._publish, args=(i,), daemon=True))
            self.threads.append(threading.Thread(target=self._consume, args=(i,), daemon=True))

    def start(self):
        for t in self.threads:
            t.start()

    def finish(self):
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def _connect(self, i):
        for k in range(len(self.members)):
            member = self.members[(i + k) % len(self.members)]
            try:
                return pika.BlockingConnection(pika.URLParameters(member.url + "?heartbeat=5&socket_timeout=5"))
            except Exception:  # noqa: BLE001 - that node is down or paused: try the next
                continue
        time.sleep(0.2)
        return None

    def _publish(self, i):
        n = 0
        while not self.stop.is_set():
            conn = self._connect(i)
            if conn is None:
                continue
            try:
                ch = conn.channel()
                ch.confirm_delivery()
                while not self.stop.is_set():
                    n += 1
                    body = f"p{i}-{n}"
                    with self.lock:
                        self.published.add(body)
                    try:
                        ch.basic_publish("", QUEUE, body.encode(), pika.BasicProperties(delivery_mode=2))
                    except pika.exceptions.NackError:
                        with self.lock:
                            self.nacked += 1
                        time.sleep(0.02)
                        continue
                    with self.lock:
                        self.confirmed.add(body)
            except Exception:  # noqa: BLE001 - the node went away: reconnect elsewhere
                time.sleep(0.1)
            finally:
                _close(conn)

    def _consume(self, i):
        while not self.stop.is_set():
            conn = self._connect(i + 1)
            if conn is None:
                continue
            try:
                ch = conn.channel()
                ch.basic_qos(prefetch_count=50)

                def on_message(ch_, method, _props, body):
                    with self.lock:
                        self.consumed[body.decode()] += 1
                    ch_.basic_ack(method.delivery_tag)
                ch.basic_consume(QUEUE, on_message)
                while not self.stop.is_set() and ch.consumer_tags:
                    conn.process_data_events(0.1)
            except Exception:  # noqa: BLE001
                time.sleep(0.1)
            finally:
                _close(conn)


def _close(conn) -> None:
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - already gone with its node
        pass


def _row(member):
    try:
        return queue_row(member, QUEUE)
    except Exception:  # noqa: BLE001 - that node is paused or down
        return None


def _healthy(members, alive):
    """The queue has a running master and every other live node as a synchronised mirror."""
    for m in alive:
        row = _row(m)
        if row and row.get("state") == "running":
            others = sorted(x.name for x in members if x.name != row["master"])
            return row if sorted(row["synchronised_mirrors"]) == others else None
    return None


@pytest.mark.timeout(120 + 30 * (KILL_ROUNDS + PARTITION_ROUNDS))
def _finish(load, members, by_name, partition) -> None:
    """Stop the load, read what is left in the queue from its master, and stop the cluster."""
    load.finish()
    row = _healthy(members, members) or {}
    drain_from = by_name.get(row.get("master"), members[1])
    try:
        c = pika.BlockingConnection(pika.URLParameters(drain_from.url))
        ch = c.channel()
        while True:
            method, _props, body = ch.basic_get(QUEUE, auto_ack=True)
            if method is None:
                break
            load.consumed[body.decode()] += 1
        c.close()
    finally:
        stop_cluster(members, partition)


def test_chaos_total_queue(tmp_path):
    members, partition = proxied_cluster(tmp_path, failure_timeout=3.0)
    by_name = {m.name: m for m in members}
    load = Load(members)
    report = {"kill_rounds": 0, "partition_rounds": 0}
    try:
        r = ctl(members[0], "set-policy", "chaos", r"^chaos\.", json.dumps({"ha-mode": "all",
                                                                           "ha-sync-mode": "automatic"}),
                "--apply-to", "queues")
        assert r.returncode == 0, r.stderr
        c = pika.BlockingConnection(pika.URLParameters(members[0].url))
        c.channel().queue_declare(QUEUE, durable=True)
        c.close()
        wait_until(lambda: _healthy(members, members), timeout=30)
        load.start()
        time.sleep(2)
        for round_ in range(KILL_ROUNDS):
            row = wait_until(lambda: _healthy(members, members), timeout=60,
                             message=f"kill round {round_}: the queue never had all its mirrors in sync")
            victim = by_name[row["master"]]
            victim.kill9()
            survivors = [m for m in members if m is not victim]
            wait_until(lambda: (lambda r: r and r["master"] != victim.name and r["state"] == "running")(
                _row(random.choice(survivors))), timeout=30,
                message=f"kill round {round_}: no new master after killing {victim.name}")
            time.sleep(1.5)
            victim.start(timeout=60)
            report["kill_rounds"] += 1
        for round_ in range(PARTITION_ROUNDS):
            wait_until(lambda: _healthy(members, members), timeout=60,
                       message=f"partition round {round_}: the queue never had all its mirrors in sync")
            partition["cut"]()              # hare1 alone in the minority: it pauses
            time.sleep(5)
            partition["heal"]()
            report["partition_rounds"] += 1
        wait_until(lambda: _healthy(members, members), timeout=60, message="the cluster never settled")
        time.sleep(2)
    finally:
        _finish(load, members, by_name, partition)
    consumed = set(load.consumed)
    lost = load.confirmed - consumed
    report.update(published=len(load.published), confirmed=len(load.confirmed), consumed=len(consumed),
                  nacked=load.nacked,
                  lost_confirmed=len(lost), duplicates=sum(n - 1 for n in load.consumed.values() if n > 1),
                  unconfirmed_lost=len(load.published - load.confirmed - consumed))
    print("chaos tally:", json.dumps(report, sort_keys=True))
    assert report["kill_rounds"] == KILL_ROUNDS and report["partition_rounds"] == PARTITION_ROUNDS
    assert load.confirmed, "nothing was confirmed"
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:5]}"


def _survivor_calls(member, results, start):
    """A client arriving on a survivor while the master is down: a passive declare, a declare
    (as kombu, Celery and Spring send after a 404), then a consumer. Each answer, or the error."""
    def run(op, fn):
        start.wait()
        t0 = time.monotonic()
        try:
            c = pika.BlockingConnection(pika.URLParameters(member.url + "?heartbeat=5&socket_timeout=15"))
            try:
                fn(c.channel())
                results.append((member.name, op, None, time.monotonic() - t0))
            finally:
                _close(c)
        except Exception as exc:  # noqa: BLE001 - a refusal is what this test looks for
            results.append((member.name, op, exc, time.monotonic() - t0))

    def consume(ch):      # holds what it gets, unacked: it goes back when the connection closes
        ch.basic_qos(prefetch_count=10)
        ch.basic_consume(QUEUE, lambda *_a: None)
        ch.connection.process_data_events(0.2)
    return [threading.Thread(target=run, args=a, daemon=True) for a in (
        ("passive", lambda ch: ch.queue_declare(QUEUE, passive=True)),
        ("declare", lambda ch: ch.queue_declare(QUEUE, durable=True)),
        ("consume", consume))]


@pytest.mark.timeout(120 + 40 * KILL_ROUNDS)
def test_chaos_clients_on_survivors_never_see_404_during_a_failover(tmp_path):
    """Issue 16: under publish/consume load, each master kill is followed at once by passive and
    plain declares and consumes on every survivor. None may be refused, the queue is never
    duplicated or emptied, and nothing confirmed is lost. Prints how long the calls waited."""
    members, partition = proxied_cluster(tmp_path, failure_timeout=3.0)
    by_name = {m.name: m for m in members}
    load = Load(members)
    results: list = []
    try:
        r = ctl(members[0], "set-policy", "chaos", r"^chaos\.", json.dumps({"ha-mode": "all",
                                                                           "ha-sync-mode": "automatic"}),
                "--apply-to", "queues")
        assert r.returncode == 0, r.stderr
        c = pika.BlockingConnection(pika.URLParameters(members[0].url))
        c.channel().queue_declare(QUEUE, durable=True)
        c.close()
        wait_until(lambda: _healthy(members, members), timeout=30)
        load.start()
        time.sleep(2)
        for round_ in range(KILL_ROUNDS):
            row = wait_until(lambda: _healthy(members, members), timeout=60,
                             message=f"round {round_}: the queue never had all its mirrors in sync")
            victim = by_name[row["master"]]
            start = threading.Event()
            threads = [t for m in members if m is not victim for t in _survivor_calls(m, results, start)]
            for t in threads:
                t.start()
            victim.kill9()
            start.set()
            for t in threads:
                t.join(40)
            rows = [x for x in ctl_rows(members, victim) if x["name"] == QUEUE]
            assert len(rows) == 1, f"round {round_}: {len(rows)} queues named {QUEUE}: {rows}"
            time.sleep(1.0)
            victim.start(timeout=60)
        wait_until(lambda: _healthy(members, members), timeout=60, message="the cluster never settled")
        time.sleep(2)
    finally:
        _finish(load, members, by_name, partition)
    lost = load.confirmed - set(load.consumed)
    waits = sorted(w for _n, _op, err, w in results if err is None)
    refused = [(n, op, str(err)) for n, op, err, _w in results if err is not None]
    print("survivor calls during failover:", json.dumps({
        "rounds": KILL_ROUNDS, "calls": len(results), "refused": len(refused),
        "wait_median_s": round(waits[len(waits) // 2], 3) if waits else None,
        "wait_worst_s": round(waits[-1], 3) if waits else None,
        "confirmed": len(load.confirmed), "lost_confirmed": len(lost), "nacked": load.nacked,
        "duplicates": sum(n - 1 for n in load.consumed.values() if n > 1)}, sort_keys=True))
    assert not refused, f"refused during a failover: {refused}"
    assert len(results) == 6 * KILL_ROUNDS
    assert not lost, f"{len(lost)} confirmed messages lost, e.g. {sorted(lost)[:5]}"


def ctl_rows(members, victim):
    """list-queues as a survivor sees it."""
    for m in members:
        if m is not victim:
            r = ctl(m, "list-queues", "--json")
            if r.returncode == 0:
                return json.loads(r.stdout)
    return []
