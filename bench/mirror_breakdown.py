"""Where the time of one mirrored window-1 confirm goes: three nodes, a queue mirrored on all,
one publisher on the master waiting for each confirm (S4-w1 without a consumer), timed at
every step in all three node processes.

    python -m haremq.bench.mirror_breakdown [--messages 2000] [--size 1024]

Each node runs as `haremq node` with timestamps added around its steps (the node's code is
not changed: the steps are wrapped when the process starts, and each node writes its marks
when it stops); the publisher is another process on a raw socket. All read CLOCK_MONOTONIC.
With one message in flight at a time, the k-th publish on the master is the k-th batch each
mirror applies. For each confirm it prints, as median and p90 in microseconds:

    client -> master        the publish leaves the client until the master has it
    parse, route, log       decoded, routed, appended to the master's store and mirror log
    to the stream           until the mirror link takes the op for its gRPC stream
    master -> mirror        until the mirror applies it (gRPC, both loops)
    mirror: apply, to sync  apply the op, append it, until its sync starts
    mirror: sync            the mirror's write + fdatasync
    mirror -> master        the mirror's ack until the master has it (gRPC, both loops)
    confirm out             the later mirror's ack until the basic.ack is handed to the socket
    master -> client        until the client has read the basic.ack

("mirror" is the slower of the two for each message: the one the confirm waits for.) It
also prints the master's own sync, which runs meanwhile and is not on the path unless it
ends after the mirrors' acks.
"""
from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .confirm_breakdown import CLIENT, now, wrap
from .failover import Member, mirror_ha_queues, three_members, wait_for, _all_open, _synced

QUEUE = "ha.scale"        # bench/failover's policy pattern (^ha\.) makes it mirrored on all

STEPS = ["client -> master", "parse, route, log", "to the stream", "master -> mirror",
         "mirror: apply, to sync", "mirror: sync", "mirror -> master", "confirm out", "master -> client"]


# ---- inside a node process -------------------------------------------------------------------
def install_marks(out_path: str) -> None:
    """Wrap the node's steps; write {name: [ns, ...]} to out_path when the process ends."""
    from haremq.cluster.mirroring.mirror import MirrorQueue
    from haremq.cluster.mirroring.replicator import Replicator
    from haremq.node.broker.session import Session
    from haremq.node.server import AMQPProtocol
    from haremq.node.store.store import MessageStore
    from haremq.node.store.writer import SegmentWriter

    mark = recorder(out_path)
    wrap(AMQPProtocol, "data_received", before=mark("arrived"))
    wrap(Replicator, "enqueue", after=mark("logged"))
    wrap(Replicator, "ops_after", before=mark("to stream"))
    wrap(Replicator, "release", before=mark("ack in"))
    mark_output(Session, mark("confirm out"))
    wrap(MirrorQueue, "apply", before=mark("applied"))
    wrap(SegmentWriter, "_apply", before=mark("sync start"), after=mark("sync end"))
    wrap(MessageStore, "_batch_done", after=mark("acked"))


def recorder(out_path: str):
    """mark(name) -> a function that records the time under name; all of them are written to
    out_path as {name: [ns, ...]} when the process ends."""
    marks: dict[str, list[int]] = {}
    atexit.register(lambda: Path(out_path).write_text(json.dumps(marks)))
    return lambda name: lambda: marks.setdefault(name, []).append(now())


def mark_output(session_class, record) -> None:
    """record() each time a session hands bytes to its socket."""
    take_output = session_class.take_output

    def take_output_marked(self, retry):
        data = take_output(self, retry)
        if data:
            record()
        return data
    session_class.take_output = take_output_marked


def node_main(out_path: str, argv: list[str]) -> int:
    install_marks(out_path)
    from haremq.cluster.cli import main
    return main(argv)


# ---- the bench --------------------------------------------------------------------------------
class MarkedMember(Member):
    """A bench/failover member whose process records marks (`module`'s install_marks)."""

    module = "haremq.bench.mirror_breakdown"

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = ["node", "--name", self.name, "--data-dir", str(self.workdir / "data"),
                "--amqp-port", str(self.amqp), "--bind", "127.0.0.1", "--cluster-port", str(self.cluster),
                "--cluster-secret-file", str(self.workdir.parent / "secret"),
                "--failure-timeout", str(self.failure_timeout)]
        for name, address in self.peers.items():
            argv += ["--peer", f"{name}={address}"]
        log = open(self.workdir / f"{self.name}.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", self.module, "--marks",  # noqa: S603 - ourselves
                                      str(self.workdir / "marks.json"), "--", *argv],
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)

    def stop(self) -> dict:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        return json.loads((self.workdir / "marks.json").read_text())


async def run(messages: int, size: int, workdir: Path):
    members = three_members(workdir, 3.0, MarkedMember)
    for m in members.values():
        m.start()
    try:
        await wait_for(lambda: _all_open(members), 60, "every node to serve AMQP")
        master = members["hare1"]
        await mirror_ha_queues(master)
        await wait_for(lambda: _declared(master.amqp), 30, "the queue")
        await wait_for(lambda: _synced(members, set(), 2), 30, "mirrors in sync")
        await asyncio.sleep(5)   # a new store zero-fills its first segment while idle, about a second
        client = await asyncio.create_subprocess_exec(sys.executable, "-c", CLIENT.replace("breakdown", QUEUE),
                                                      str(master.amqp), str(messages), str(size),
                                                      stdout=subprocess.PIPE)
        out, _ = await client.communicate()
        client_times = json.loads(out)
    finally:
        marks = {}
        for n, m in members.items():
            try:
                marks[n] = m.stop()
            except (OSError, ValueError, subprocess.TimeoutExpired):
                m.kill()
    return client_times, marks


async def _declared(port: int, queue: str = QUEUE) -> bool:
    import aio_pika
    try:
        conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{port}/%2F")
    except Exception:   # noqa: BLE001 - not up yet
        return False
    async with conn:
        ch = await conn.channel()
        await ch.declare_queue(queue, durable=True)
    return True


def after(times: list[int], t: int) -> int | None:
    """The first mark at or after t."""
    import bisect
    i = bisect.bisect_left(times, t)
    return times[i] if i < len(times) else None


def breakdown(client_times: list, marks: dict) -> dict[str, list[float]]:
    for node_marks in marks.values():     # the writer thread's marks interleave with the loop's
        for times in node_marks.values():
            times.sort()
    master, mirrors = marks["hare1"], [marks["hare2"], marks["hare3"]]
    steps: dict[str, list[float]] = {name: [] for name in STEPS + ["master's own sync", "  of which to its writer",
                                                                      "  of which write + fdatasync"]}
    skip = len(client_times) // 10
    for sent, acked in client_times[skip:]:
        arrived = after(master["arrived"], sent)
        logged = after(master["logged"], arrived)
        to_stream = after(master["to stream"], logged)
        sync_started = after(master["sync start"], logged)
        synced = after(master["sync end"], sync_started) if sync_started is not None else None
        legs = []
        for mirror in mirrors:
            applied = after(mirror["applied"], to_stream)
            sync_start = after(mirror["sync start"], applied)
            sync_end = after(mirror["sync end"], sync_start)
            done = after(mirror["acked"], sync_end)
            legs.append((done, applied, sync_start, sync_end))
        done, applied, sync_start, sync_end = max(legs)
        ack_in = after(master["ack in"], done)
        confirm = after(master["confirm out"], ack_in)
        points = [sent, arrived, logged, to_stream, applied, sync_start, sync_end, ack_in, confirm, acked]
        if None in points or synced is None:
            continue
        for name, a, b in zip(STEPS, points, points[1:]):
            steps[name].append((b - a) / 1000)
        steps["master's own sync"].append((synced - logged) / 1000)
        steps["  of which to its writer"].append((sync_started - logged) / 1000)
        steps["  of which write + fdatasync"].append((synced - sync_started) / 1000)
    return steps


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--marks"]:
        sys.exit(node_main(argv[1], argv[3:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--size", type=int, default=1024)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="haremq-mirror-breakdown-") as tmp:
        client_times, marks = asyncio.run(run(args.messages, args.size, Path(tmp)))
    steps = breakdown(client_times, marks)
    total = sorted((b - a) / 1000 for a, b in client_times[len(client_times) // 10:])
    print(f"{len(steps['client -> master'])} mirrored (x3) window-1 confirms of {args.size} B persistent "
          f"messages, microseconds")
    print(f"{'step':<26}{'median':>8}{'p90':>8}")
    for name, values in steps.items():
        if values:
            values.sort()
            print(f"{name:<26}{statistics.median(values):>8.0f}{values[int(len(values) * 0.9)]:>8.0f}")
    print(f"{'round trip':<26}{statistics.median(total):>8.0f}{total[int(len(total) * 0.9)]:>8.0f}"
          f"   ({1e6 / statistics.median(total):.0f} confirms/s)")


if __name__ == "__main__":
    main()
