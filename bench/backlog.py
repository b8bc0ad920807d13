"""A large backlog on one queue: memory of every node, a kill -9, first delivery after it, drain rate.

    python -m bench.backlog --messages 1000000 --size 1024            # mirrored on three nodes
    python -m bench.backlog --messages 1000000 --size 1024 --plain    # one node, restarted

Mirrored: three local nodes, a durable queue with `ha-mode: all` homed on hare1, N persistent
messages published with confirms (window 1000) through hare1; then hare1 is SIGKILLed, a consumer
on the node of the promoted mirror waits for the first delivery and drains the queue; hare1 is
restarted meanwhile and syncs again. With `--drain-via other` the consumer is on the survivor
that is not the new master, as a client behind a load balancer often is: every delivery then
crosses a queue link. Plain: one node, the same publish, SIGKILL, restart, drain.

Every message carries its publish number, so the drain checks that all N come back once and in
order. Each node's resident memory is sampled every 0.2 s and reported per phase (peak). Figures
are printed, never asserted: they move with the machine.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pamqp import commands as pc

from . import amqp
from .failover import free_port, port_open

ROOT = Path(__file__).resolve().parent.parent
SECRET = "backlog-bench-secret"  # noqa: S105 - the throw-away cluster this bench starts on loopback


def rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class BenchNode:
    def __init__(self, name: str, workdir: Path, cluster: dict | None):
        self.name = name
        self.data_dir = workdir / name
        self.port = free_port()
        self.cluster = cluster            # name -> cluster port, or None for a single node
        self.proc: subprocess.Popen | None = None

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "haremq.cluster.cli", "node", "--name", self.name, "--data-dir", str(self.data_dir),
                "--amqp-port", str(self.port), "--log-level", os.environ.get("HAREMQ_BENCH_LOG", "warning")]
        if self.cluster:
            argv += ["--cluster-port", str(self.cluster[self.name]), "--cluster-secret-file",
                     str(self.data_dir.parent / "secret"), "--failure-timeout", "1.5"]
            for peer, port in self.cluster.items():
                if peer != self.name:
                    argv += ["--peer", f"{peer}=127.0.0.1:{port}"]
        return argv

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir.parent / f"{self.name}.log", "ab")
        self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,  # noqa: S603 - our node
                                     start_new_session=True)

    def wait(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not port_open(self.port):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} did not start; see its log")
            time.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    @property
    def url(self) -> amqp.BrokerURL:
        return amqp.parse_url(f"amqp://guest:guest@127.0.0.1:{self.port}/%2F")


class Memory:
    """Peak RSS of each node per phase, sampled in a thread."""

    def __init__(self, nodes: list[BenchNode]):
        self.nodes = nodes
        self.phase = "start"
        self.peaks: dict[str, dict[str, float]] = {}
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self._stop.is_set():
            row = self.peaks.setdefault(self.phase, {})
            for node in self.nodes:
                if node.proc is not None and node.proc.poll() is None:
                    row[node.name] = max(row.get(node.name, 0.0), rss_mb(node.proc.pid))
            self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()


def ctl(node: BenchNode, *args: str) -> str:
    return subprocess.run([sys.executable, "-m", "haremq.cluster.cli", "ctl", "--node", f"127.0.0.1:{node.cluster[node.name]}",  # noqa: S603 - our ctl
                           "--cluster-secret-file", str(node.data_dir.parent / "secret"), *args],
                          check=True, capture_output=True, cwd=ROOT, timeout=30, text=True).stdout


def new_master(survivor: BenchNode, nodes: list[BenchNode], old: str, timeout: float = 30) -> BenchNode:
    """The node the queue's master moved to, as `survivor` sees it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            rows = json.loads(ctl(survivor, "list-queues", "--json"))
            master = next((r.get("master") for r in rows if r["name"] == QUEUE), None)
            if master and master != old:
                return next(n for n in nodes if n.name == master)
        except (subprocess.SubprocessError, ValueError):
            pass
        time.sleep(0.05)
    raise RuntimeError("the queue's master did not move")


async def publish(url: amqp.BrokerURL, queue: str, count: int, size: int, window: int = 1000) -> float:
    conn = await amqp.open_conn(url, "backlog-publisher")
    await conn.rpc(pc.Queue.Declare(queue=queue, durable=True), pc.Queue.DeclareOk)
    await conn.rpc(pc.Confirm.Select(), pc.Confirm.SelectOk)
    head, tail = amqp.publish_template(queue, size, True, False, conn.frame_max)
    confirmed = 0
    nacked = 0
    room = asyncio.Event()
    room.set()

    def on_confirm(_now, tag, multiple, is_nack):
        nonlocal confirmed, nacked
        done = tag - confirmed if multiple else 1
        confirmed = max(confirmed, tag) if multiple else confirmed + 1
        if is_nack:
            nacked += done
        room.set()

    conn.on_confirm = on_confirm
    started = time.monotonic()
    report = started + 5
    for n in range(1, count + 1):
        while n - confirmed > window:
            room.clear()
            await room.wait()
        conn.write(head + amqp.STAMP.pack(n, 7) + tail)
        if not conn.writable.is_set():
            await conn.writable.wait()
        if time.monotonic() > report:
            report += 5
            print(f"  published {n:,}/{count:,}", flush=True)
    while confirmed < count:
        room.clear()
        await asyncio.wait_for(room.wait(), 60)
    elapsed = time.monotonic() - started
    await conn.close()
    if nacked:
        print(f"  {nacked} publishes were nacked")
    return count / elapsed


async def drain(url_for, count: int, since: float, timeout: float = 120) -> dict:
    """Consume `count` messages; the time from `since` to the first delivery, the drain rate and
    whether every publish number came back once, in order. Connects again while refused."""
    seen = bytearray(count + 1)
    state = {"first": None, "got": 0, "dups": 0, "order": True, "last": 0, "redelivered": 0}
    deadline = time.monotonic() + timeout
    while state["got"] < count and time.monotonic() < deadline:
        try:
            conn = await amqp.open_conn(url_for(), "backlog-consumer")
            await conn.rpc(pc.Basic.Qos(prefetch_count=2000), pc.Basic.QosOk)
            unacked = [0]

            def on_deliver(_now, tag, seq, _run, redelivered, conn=conn, unacked=unacked):
                if state["first"] is None:
                    state["first"] = time.monotonic()
                if 0 < seq <= count:
                    if seen[seq]:
                        state["dups"] += 1
                    else:
                        seen[seq] = 1
                        state["got"] += 1
                    if seq < state["last"]:
                        state["order"] = False
                    state["last"] = seq
                state["redelivered"] += redelivered
                unacked[0] += 1
                if unacked[0] >= 500:
                    conn.write(amqp.ack_frame(tag, True))
                    unacked[0] = 0

            conn.on_deliver = on_deliver
            await conn.rpc(pc.Basic.Consume(queue=QUEUE), pc.Basic.ConsumeOk, timeout=30)
            while state["got"] < count and not conn.closed.done() and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await conn.close()
        except amqp.AMQPError as exc:
            print(f"  consumer: {exc}; trying again", flush=True)
            await asyncio.sleep(0.2)
    end = time.monotonic()
    first = state["first"] or end
    return {"first_delivery_s": round(first - since, 2), "drain_rate": round(state["got"] / max(end - first, 1e-9)),
            "received": state["got"], "duplicates": state["dups"], "in_order": state["order"],
            "redelivered": state["redelivered"]}


QUEUE = "bench.backlog"


def run(args) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="haremq-backlog-"))
    result: dict = {"messages": args.messages, "size": args.size, "mode": "plain" if args.plain else "mirrored",
                    "drain_via": "master" if args.plain else args.drain_via}
    names = ["hare1"] if args.plain else ["hare1", "hare2", "hare3"]
    cluster = None if args.plain else {n: free_port() for n in names}
    (workdir / "secret").write_text(SECRET)
    nodes = [BenchNode(n, workdir, cluster) for n in names]
    memory = Memory(nodes)
    try:
        for node in nodes:
            node.start()
        for node in nodes:
            node.wait()
        master = nodes[0]
        if not args.plain:
            ctl(master, "set-policy", "ha", "^bench\\.", json.dumps({"ha-mode": "all"}))
        memory.phase = "publishing"
        print(f"publishing {args.messages:,} x {args.size} B persistent to {master.name}", flush=True)
        result["publish_rate"] = round(asyncio.run(publish(master.url, QUEUE, args.messages, args.size)))
        memory.phase = "full"
        time.sleep(3)
        killed = time.monotonic()
        master.kill()
        if args.plain:
            memory.phase = "recovery"
            master.start()
            consumer_node = master
        else:
            memory.phase = "failover+drain"
            promoted = new_master(nodes[1], nodes, master.name)
            result["new_master"] = promoted.name
            if args.drain_via == "master":
                consumer_node = promoted
            else:
                consumer_node = next(n for n in nodes[1:] if n is not promoted)

            def restart_later():
                time.sleep(3)
                master.start()
            threading.Thread(target=restart_later, daemon=True).start()
        print(f"killed {master.name}; draining through {consumer_node.name}", flush=True)
        result.update(asyncio.run(drain(lambda: consumer_node.url, args.messages, killed,
                                        timeout=max(120.0, args.messages / 2000))))
        result["rss_peak_mb"] = {phase: {n: round(v) for n, v in row.items()} for phase, row in memory.peaks.items()}
        return result
    finally:
        memory.stop()
        for node in nodes:
            node.kill()
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"kept {workdir}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--plain", action="store_true", help="one node, no mirrors: kill -9 and recover")
    p.add_argument("--drain-via", choices=["master", "other"], default="master",
                   help="mirrored: drain through the new master's node or through the other survivor")
    p.add_argument("--keep", action="store_true", help="keep the data directories and logs")
    p.add_argument("--json", help="write the result to this file")
    args = p.parse_args(argv)
    result = run(args)
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
