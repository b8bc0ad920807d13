"""A quorum queue below a majority, on HareMQ and on RabbitMQ 3.10 (Debian's package) in turn.

    python -m bench.quorum_recipe                       # both brokers, the figures as a table
    python -m bench.quorum_recipe --brokers haremq --backlog 50000

The recipe (tests/test_quorum_majority.py runs it on HareMQ as a test): three nodes, a quorum
queue led by node 1 with a backlog of 1 KiB messages; node 2 SIGKILLed and started again (it
catches up), node 3 SIGKILLed and left down; then publishes with confirms through node 1. Until
node 2 holds everything, node 1 is the only copy, and a Raft queue must hold every confirm
back (neither confirm nor nack). Reported: confirms that came while node 1 still said node 2 was
catching up (none, for a queue that keeps the promise), nacks, when the
first confirm came after node 3's kill, when the last one did, and how long node 2 took to be
whole again (HareMQ: its copy past the snapshot, as node 1's replicator sees it; RabbitMQ:
node 2 started again, with its log).
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.machinery
import importlib.util
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import pika

ROOT = Path(__file__).resolve().parent.parent
QUORUM = {"x-queue-type": "quorum"}


def _compare():
    """bench/compare's broker classes (a script, not a module)."""
    loader = importlib.machinery.SourceFileLoader("bench_compare", str(ROOT / "bench" / "compare"))
    spec = importlib.util.spec_from_loader("bench_compare", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def log(msg: str) -> None:
    print(f"[quorum-recipe {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _backlog(url: str, name: str, count: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_declare(name, durable=True, arguments=QUORUM)
    props = pika.BasicProperties(delivery_mode=2)
    body = b"x" * 1024
    for i in range(count):
        ch.basic_publish("", name, body, props)
        if i % 50_000 == 0:
            log(f"backlog {i:,}/{count:,}")
    ch.confirm_delivery()
    ch.basic_publish("", name, b"last", props)       # confirmed: the backlog is in
    conn.close()


class Publisher(threading.Thread):
    """Publishes with confirms one after the other (pika's blocking confirms), timing each."""

    def __init__(self, url: str, name: str, count: int, t0: float):
        super().__init__(daemon=True)
        self.url, self.name, self.count, self.t0 = url, name, count, t0
        self.confirmed: list[float] = []
        self.nacked = 0
        self.error = ""

    def run(self) -> None:
        try:
            conn = pika.BlockingConnection(pika.URLParameters(self.url))
            ch = conn.channel()
            ch.confirm_delivery()
            for i in range(self.count):
                try:
                    ch.basic_publish("", self.name, b"p%d" % i, pika.BasicProperties(delivery_mode=2))
                    self.confirmed.append(time.monotonic() - self.t0)
                except pika.exceptions.NackError:
                    self.nacked += 1
            conn.close()
        except Exception as exc:  # noqa: BLE001 - reported in the table
            self.error = f"{type(exc).__name__}: {exc}"[:160]


def _haremq_whole(broker, name: str) -> bool:
    """Node 2 holds the whole queue, as node 1's replicator sees it (its link past the snapshot:
    it counts for the majority from then on), asked in-process (`haremq ctl`'s client, no
    interpreter to start)."""
    from haremq.cluster import secret
    from haremq.cluster.control.client import ControlClient
    client = ControlClient(secret.resolve())
    try:
        ok, rows = asyncio.run(client.call(f"127.0.0.1:{broker.nodes[0].cluster_port}", "list_queues",
                                           {"local": True}, timeout=2.0))
    except OSError:          # ConnectionError, TimeoutError: not answering now
        return False
    listed = rows if ok and isinstance(rows, list) else []
    row: dict = next((r for r in listed if r.get("name") == name), {})
    return (row.get("mirror_states") or {}).get(broker.nodes[1].name) in ("catching", "proposing", "synced")


def run_one(kind: str, work: Path, backlog: int, publishes: int, rabbit_port: int) -> dict:
    cmp = _compare()
    broker = cmp.HareMQ(work) if kind == "haremq" else cmp.RabbitMQ(work, rabbit_port)
    out: dict = {"broker": broker.label}
    try:
        log(f"{broker.label}: starting three nodes")
        broker.start(3)
        urls = broker.urls()
        name = "recipe.qq"
        _backlog(urls[0], name, backlog)
        log(f"{broker.label}: node 2 SIGKILLed and started again")
        broker.nodes[1].kill9()
        restarted = time.monotonic()
        if kind == "haremq":
            broker.nodes[1].start()
        else:
            broker.nodes[1].launch()
            broker.nodes[1].wait_up()
        out["node2_started_s"] = round(time.monotonic() - restarted, 2)
        log(f"{broker.label}: node 3 SIGKILLed, left down; {publishes:,} publishes with confirms")
        broker.nodes[2].kill9()
        t0 = time.monotonic()
        pub = Publisher(urls[0], name, publishes, t0)
        pub.start()
        whole_at = None
        catching_up_at = 0.0            # the last time node 1 said node 2 was not whole yet
        while pub.is_alive() and time.monotonic() - t0 < 180:
            if whole_at is None and kind == "haremq":
                asked = time.monotonic() - t0
                if _haremq_whole(broker, name):
                    whole_at = time.monotonic() - t0
                else:
                    catching_up_at = asked
            time.sleep(0.05)
        pub.join(5)
        if kind == "rabbitmq":
            whole_at = 0.0               # its follower kept its log on disk: started is whole
        out.update(
            confirmed=len(pub.confirmed), nacked=pub.nacked, error=pub.error or None,
            node2_whole_after_kill3_s=None if whole_at is None else round(whole_at, 2),
            first_confirm_s=round(pub.confirmed[0], 2) if pub.confirmed else None,
            last_confirm_s=round(pub.confirmed[-1], 2) if pub.confirmed else None,
            # confirms that came before node 1 last said node 2 was still catching up (a poll's
            # answer may come a little after the moment it tells of: this errs towards none)
            confirmed_while_catching_up=sum(1 for t in pub.confirmed if t < catching_up_at))
    except cmp.Unavailable as exc:
        out["error"] = str(exc)
    finally:
        broker.stop()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--brokers", default="haremq,rabbitmq")
    ap.add_argument("--backlog", type=int, default=150_000)
    ap.add_argument("--publishes", type=int, default=2000)
    ap.add_argument("--rabbit-port", type=int, default=5691)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    rows = []
    for kind in args.brokers.split(","):
        with tempfile.TemporaryDirectory(prefix=f"quorum-recipe-{kind}-") as work:
            os.chmod(work, 0o755)       # noqa: S103 - Debian's rabbitmq-server runs as user rabbitmq
            rows.append(run_one(kind, Path(work), args.backlog, args.publishes, args.rabbit_port))
            log(json.dumps(rows[-1]))
    keys = ["broker", "node2_started_s", "node2_whole_after_kill3_s", "confirmed_while_catching_up",
            "first_confirm_s", "last_confirm_s", "confirmed", "nacked", "error"]
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row.get(k)) for k in keys) + " |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
