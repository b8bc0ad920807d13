"""Failover under confirm load: N SIGKILLs of a mirrored queue's master (issue 16).

Why: the figures that matter for a mirrored queue's failover (how long
confirms stall, what is nacked, what is delivered twice, whether anything
confirmed is lost) only show under load with real processes, and the slow
rounds have to be told apart by what the killed node was. Standalone:

    python -m bench.failover --rounds 20 [--rate 400] [--window 100] [--json out.json]

Three local nodes, a durable queue mirrored on all of them (ha-mode all,
automatic sync), a publisher with confirms (at most `window` unconfirmed) on
one node that is not the master, a consumer (manual acks) on the other. Each
round kills the current master with SIGKILL, measures, restarts it and waits
until it is a synchronised mirror again; the clients move before a round if
the master now sits under one of them. It prints figures and never asserts.

Per round: the killed node's roles (Raft leader or follower), the new master,
`stall` = the longest time without any positive confirm that starts by 0.3 s
after the kill,
`resume` = kill -> the confirm that ends that stall (confirms flow again),
`first-new` = kill -> first positive confirm of a publish sent after the
kill (it waits for the window of held publishes), nacks and duplicate
deliveries in the round. Summary: confirmed lost (confirmed, never
consumed), resume median / worst, duplicates, nacked (count and share).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aio_pika
from aio_pika.exceptions import DeliveryError

ROOT = Path(__file__).resolve().parent.parent
QUEUE = "ha.scale"
SECRET = "bench-failover-secret"  # noqa: S105 - the throw-away cluster this bench starts on loopback
NAMES = ("hare1", "hare2", "hare3")
STALL_START = 0.3     # s after the kill: a pause in confirms starting later is not the failover's


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class Member:
    def __init__(self, name: str, workdir: Path, amqp: int, cluster: int, peers: dict, failure_timeout: float):
        self.name, self.workdir, self.amqp, self.cluster = name, workdir, amqp, cluster
        self.peers, self.failure_timeout = peers, failure_timeout
        self.proc: subprocess.Popen | None = None
        self.url = f"amqp://guest:guest@127.0.0.1:{amqp}/%2F"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "haremq.cluster.cli", "node", "--name", self.name, "--data-dir",
                str(self.workdir / "data"), "--amqp-port", str(self.amqp), "--bind", "127.0.0.1",
                "--cluster-port", str(self.cluster), "--cluster-secret-file", str(self.workdir.parent / "secret"),
                "--failure-timeout", str(self.failure_timeout), "--segment-size", str(4 << 20)]
        for name, address in self.peers.items():
            argv += ["--peer", f"{name}={address}"]
        log = open(self.workdir / f"{self.name}.log", "ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,  # noqa: S603 - our node
                                     start_new_session=True, cwd=str(ROOT))

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    async def ctl(self, *args) -> object:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "haremq.cluster.cli", "ctl", "--node", f"127.0.0.1:{self.cluster}",
            "--cluster-secret-file", str(self.workdir.parent / "secret"), *args, "--json",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(ROOT))
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"ctl {args} on {self.name}: {err.decode().strip()}")
        return json.loads(out)


def three_members(workdir: Path, failure_timeout: float, member=Member) -> dict[str, Member]:
    """hare1..hare3 on free ports, each with the other two as peers (not started yet)."""
    (workdir / "secret").write_text(SECRET)
    amqp = {n: free_port() for n in NAMES}
    cport = {n: free_port() for n in NAMES}
    return {n: member(n, workdir / n, amqp[n], cport[n], {p: f"127.0.0.1:{cport[p]}" for p in NAMES if p != n},
                      failure_timeout)
            for n in NAMES}


async def mirror_ha_queues(member: Member) -> None:
    """A policy mirroring every queue named ha.* on all nodes, synchronised automatically."""
    await member.ctl("set-policy", "ha", r"^ha\.", json.dumps({"ha-mode": "all", "ha-sync-mode": "automatic"}),
                     "--apply-to", "queues")


async def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = await pred()
        except Exception:  # noqa: BLE001 - a node still starting: ask again
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.2)


class Load:
    """A rate-limited publisher with a confirm window, and a consumer that acks each delivery."""

    def __init__(self, rate: float, window: int):
        self.rate, self.window = rate, window
        self.sent = 0
        self.sent_at: dict[int, float] = {}
        self.confirmed: set[int] = set()
        self.acks: list[tuple[float, int]] = []      # (time, body) of each positive confirm
        self.nacks: list[float] = []
        self.failed: list[float] = []                # publish errors other than a nack
        self.channel_errors: list[tuple[float, str]] = []
        self.consumed: Counter = Counter()
        self.dup_times: list[float] = []
        self.redelivered = 0
        self.dup_fresh = 0
        self.publisher_node = self.consumer_node = None
        self._pub_conn = self._con_conn = None
        self._close_reason = None
        self._pub_task = None
        self._outstanding: set[asyncio.Task] = set()
        self._pause = asyncio.Event()
        self._pause.set()

    # ---- publisher ------------------------------------------------------------------------
    async def connect_publisher(self, member: Member) -> None:
        await self.stop_publisher()
        self._pub_conn = await aio_pika.connect(member.url)
        self.publisher_node = member.name
        self._pub_task = asyncio.ensure_future(self._publish())

    async def stop_publisher(self) -> None:
        if self._pub_task is not None:
            self._pub_task.cancel()
            await asyncio.gather(self._pub_task, return_exceptions=True)
            self._pub_task = None
        if self._outstanding:
            await asyncio.wait(list(self._outstanding), timeout=30)
        if self._pub_conn is not None:
            await self._pub_conn.close()
            self._pub_conn = None

    async def _publish(self) -> None:
        """Publishes at the rate; a channel the broker closes is counted and opened again."""
        window = asyncio.Semaphore(self.window)
        channel = await self._open_channel()
        start = time.monotonic()
        n0 = self.sent
        while True:
            if channel.is_closed:
                reason = self._close_reason or "closed"
                self.channel_errors.append((time.monotonic(), str(reason)))
                print(f"  publisher channel closed by the broker: {reason}", flush=True)
                channel = await self._open_channel()
            due = start + (self.sent - n0) / self.rate
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await window.acquire()
            self.sent += 1
            body = self.sent
            self.sent_at[body] = time.monotonic()
            task = asyncio.ensure_future(self._one(channel, body, window))
            self._outstanding.add(task)
            task.add_done_callback(self._outstanding.discard)

    async def _open_channel(self):
        self._close_reason = None
        channel = await self._pub_conn.channel(publisher_confirms=True)

        def closed(_channel, exc) -> None:
            self._close_reason = repr(exc)
        channel.close_callbacks.add(closed)
        return channel

    async def _one(self, channel, body: int, window: asyncio.Semaphore) -> None:
        try:
            await channel.default_exchange.publish(
                aio_pika.Message(str(body).encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                routing_key=QUEUE, timeout=60)
        except DeliveryError:
            self.nacks.append(time.monotonic())
        except Exception:  # noqa: BLE001 - the connection went: counted, not confirmed
            self.failed.append(time.monotonic())
        else:
            self.confirmed.add(body)
            self.acks.append((time.monotonic(), body))
        finally:
            window.release()

    # ---- consumer --------------------------------------------------------------------------
    async def connect_consumer(self, member: Member) -> None:
        await self.stop_consumer()
        self._con_conn = await aio_pika.connect(member.url)
        channel = await self._con_conn.channel()
        await channel.set_qos(prefetch_count=100)
        queue = await channel.get_queue(QUEUE, ensure=False)
        await queue.consume(self._on_message)
        self.consumer_node = member.name

    async def _on_message(self, message) -> None:
        body = int(message.body)
        if self.consumed[body]:
            self.dup_times.append(time.monotonic())
            if not message.redelivered:      # a second copy in the queue: a publish sent twice
                self.dup_fresh += 1
        self.consumed[body] += 1
        if message.redelivered:
            self.redelivered += 1
        await message.ack()

    async def stop_consumer(self) -> None:
        if self._con_conn is not None:
            await self._con_conn.close()
            self._con_conn = None


async def roles(members: dict[str, Member], dead: set[str]) -> tuple[str, str, list]:
    """(master, raft leader, synchronised mirrors) as a running node sees them."""
    for m in members.values():
        if m.name in dead:
            continue
        try:
            status = await m.ctl("cluster-status")
            row = next(r for r in await m.ctl("list-queues") if r["name"] == QUEUE)
            return row["master"], status["leader"], sorted(row.get("synchronised_mirrors") or [])
        except Exception:  # noqa: BLE001, S112 - that node is down or paused: try another
            continue
    raise RuntimeError("no node answers")


async def run(args) -> dict:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="haremq-failover-"))
    workdir.mkdir(parents=True, exist_ok=True)
    members = three_members(workdir, args.failure_timeout)
    for m in members.values():
        m.start()
    try:
        await wait_for(lambda: _all_open(members), 60, "every node to serve AMQP")
        hare1 = members["hare1"]
        await mirror_ha_queues(hare1)
        conn = await aio_pika.connect(hare1.url)
        ch = await conn.channel()
        await ch.declare_queue(QUEUE, durable=True)
        await conn.close()
        await wait_for(lambda: _synced(members, set(), 2), 30, "mirrors in sync")
        load = Load(args.rate, args.window)
        rounds = []
        for r in range(1, args.rounds + 1):
            master, leader, _synced_now = await roles(members, set())
            others = [n for n in NAMES if n != master]
            if load.publisher_node not in others or load.consumer_node not in others \
                    or load.publisher_node == load.consumer_node:
                pub = load.publisher_node if load.publisher_node in others else None
                con = load.consumer_node if load.consumer_node in others and load.consumer_node != pub else None
                pub = pub or next(n for n in others if n != con)
                con = con or next(n for n in others if n != pub)
                if load.consumer_node != con:
                    await load.connect_consumer(members[con])
                if load.publisher_node != pub:
                    await load.connect_publisher(members[pub])
            await asyncio.sleep(args.settle)
            nacks0, dups0, failed0, fresh0 = len(load.nacks), len(load.dup_times), len(load.failed), load.dup_fresh
            victim = members[master]
            t_kill = time.monotonic()
            victim.kill()
            await asyncio.sleep(args.observe)
            after = [(t, b) for t, b in load.acks if t > t_kill]
            first_new = next((t - t_kill for t, b in after if load.sent_at[b] >= t_kill), None)
            times = [t for t, _b in load.acks if t > t_kill - 0.5]
            # the failover's stall starts at the kill (or a moment later, once confirms already
            # on their way have come in); later, unrelated pauses do not count
            gaps = [(b - max(a, t_kill), b) for a, b in zip(times, times[1:])
                    if b > t_kill and a < t_kill + STALL_START]
            gap, resumed_at = max(gaps, default=(None, None))
            resume = resumed_at - t_kill if resumed_at is not None else None
            victim.start()
            await wait_for(lambda: _synced(members, set(), 2), 60, f"{master} back as a synchronised mirror")
            new_master, new_leader, _ = await roles(members, set())
            row = {"round": r, "killed": master, "killed_role": "raft-leader" if leader == master else "follower",
                   "new_master": new_master, "leader_after": new_leader, "publisher": load.publisher_node,
                   "consumer": load.consumer_node, "resume_s": _r(resume), "gap_s": _r(gap),
                   "first_new_confirm_s": _r(first_new),
                   "nacked": len(load.nacks) - nacks0, "failed": len(load.failed) - failed0,
                   "duplicates": len(load.dup_times) - dups0, "duplicates_not_redelivered": load.dup_fresh - fresh0}
            rounds.append(row)
            print(f"round {r:2d}: killed {master} ({row['killed_role']:11s}) new master {new_master} "
                  f"pub@{row['publisher']} con@{row['consumer']}  resume {_f(resume)}  stall {_f(gap)}  "
                  f"first-new {_f(first_new)}  "
                  f"nacked {row['nacked']}  dups {row['duplicates']} ({row['duplicates_not_redelivered']} not redelivered)",
                  flush=True)
        await load.stop_publisher()
        await _drain(load)
        await load.stop_consumer()
        lost = sorted(b for b in load.confirmed if not load.consumed[b])
        resumes = [x["resume_s"] for x in rounds if x["resume_s"] is not None]
        gaps = [x["gap_s"] for x in rounds if x["gap_s"] is not None]
        firsts = [x["first_new_confirm_s"] for x in rounds if x["first_new_confirm_s"] is not None]
        summary = {
            "rounds": len(rounds), "published": load.sent, "confirmed": len(load.confirmed),
            "confirmed_lost": len(lost), "nacked": len(load.nacks),
            "nacked_pct": round(100.0 * len(load.nacks) / max(1, load.sent), 3),
            "publish_errors": len(load.failed),
            "publisher_channel_errors": [reason for _t, reason in load.channel_errors],
            "duplicates": sum(c - 1 for c in load.consumed.values() if c > 1),
            "duplicates_not_redelivered": load.dup_fresh,
            "redelivered_flag": load.redelivered,
            "resume_median_s": _r(statistics.median(resumes)) if resumes else None,
            "resume_worst_s": _r(max(resumes)) if resumes else None,
            "rounds_never_resumed": sum(1 for x in rounds if x["resume_s"] is None),
            "stall_median_s": _r(statistics.median(gaps)) if gaps else None,
            "stall_worst_s": _r(max(gaps)) if gaps else None,
            "first_new_confirm_median_s": _r(statistics.median(firsts)) if firsts else None,
            "first_new_confirm_worst_s": _r(max(firsts)) if firsts else None,
            "resume_by_role": {role: {"rounds": len(v), "median_s": _r(statistics.median(v)), "worst_s": _r(max(v))}
                               for role in ("raft-leader", "follower")
                               if (v := [x["resume_s"] for x in rounds if x["killed_role"] == role
                                         and x["resume_s"] is not None])},
        }
        print(json.dumps(summary, indent=2), flush=True)
        result = {"summary": summary, "rounds": rounds, "workdir": str(workdir)}
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2))
        return result
    finally:
        for m in members.values():
            m.kill()


async def _all_open(members) -> bool:
    return all(port_open(m.amqp) for m in members.values())


async def _synced(members, dead, count) -> bool:
    _master, _leader, synced = await roles(members, dead)
    return len(synced) >= count


async def _drain(load: Load, quiet: float = 3.0) -> None:
    """Until nothing has arrived for `quiet` seconds."""
    last = -1
    while True:
        total = sum(load.consumed.values())
        if total == last:
            return
        last = total
        await asyncio.sleep(quiet)


def _r(x):
    return None if x is None else round(x, 3)


def _f(x):
    return "never" if x is None else f"{x:.3f}s"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--rate", type=float, default=400.0, help="publishes per second")
    p.add_argument("--window", type=int, default=100, help="unconfirmed publishes at most")
    p.add_argument("--failure-timeout", type=float, default=3.0)
    p.add_argument("--settle", type=float, default=2.0, help="steady load before each kill, s")
    p.add_argument("--observe", type=float, default=4.0, help="load after each kill before the restart, s")
    p.add_argument("--workdir", help="data and logs (default: a new temporary directory)")
    p.add_argument("--json", help="write rounds and summary to this file")
    args = p.parse_args()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
