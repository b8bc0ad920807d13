"""Where the time of one window-1 confirm goes: a lone publisher, one persistent message at a
time, each waiting for its basic.ack (scenario S3n), timed at every step inside the node.

    python -m haremq.bench.confirm_breakdown [--messages 3000] [--size 1024]

A node runs in this process with timestamps added around its steps (the node's code is not
changed: the steps are wrapped here); the publisher is another process on a raw socket, so
its own work is not on the node's core. Both read CLOCK_MONOTONIC. For each confirm it
splits the round trip into:

    client -> node      the publish leaves the client until the node has it (socket, wake-up)
    parse, route, log   the node decodes it, routes it, appends it to the store's batch
    to the batch        until the loop hands the batch to the writer
    to the writer       until the writer thread runs it (a thread hand-off)
    write + fdatasync   pwrite and fdatasync of the batch
    back to the loop    until the loop runs the batch's waiters (a thread hand-off back)
    confirm out         the confirm is settled, coalesced and handed to the socket
    node -> client      until the client has read the basic.ack

and prints the median and p90 of each, in microseconds.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from haremq.cluster.assembly import build_node
from haremq.node.app import NodeConfig
from haremq.cluster.cli import use_uvloop
from haremq.node.broker.broker import Broker
from haremq.node.broker.session import Session
from haremq.node.server import AMQPProtocol
from haremq.node.store.store import MessageStore
from haremq.node.store.writer import SegmentWriter

from .failover import free_port

now = time.perf_counter_ns      # CLOCK_MONOTONIC on Linux, as the client's time.monotonic_ns

STEPS = ["client -> node", "parse, route, log", "to the batch", "to the writer", "write + fdatasync",
         "back to the loop", "confirm out", "node -> client"]

CLIENT = textwrap.dedent('''
    import json, socket, sys, time
    from pamqp import commands as spec, frame, header, body as pbody
    port, n, size = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""
    def read():
        global buf
        while True:
            try:
                used, ch, f = frame.unmarshal(buf)
                buf = buf[used:]
                return f
            except Exception:
                buf += s.recv(65536)
    def send(*fs):
        s.sendall(b"".join(frame.marshal(f, ch) for f, ch in fs))
    s.sendall(b"AMQP\\x00\\x00\\x09\\x01"); read()
    send((spec.Connection.StartOk({}, "PLAIN", "\\x00guest\\x00guest", "en_US"), 0)); read()
    send((spec.Connection.TuneOk(2047, 131072, 0), 0), (spec.Connection.Open("/"), 0)); read()
    send((spec.Channel.Open(), 1)); read()
    send((spec.Confirm.Select(), 1)); read()
    send((spec.Queue.Declare(queue="breakdown", durable=True), 1)); read()
    body = b"x" * size
    one = b"".join(frame.marshal(f, 1) for f in (
        spec.Basic.Publish(exchange="", routing_key="breakdown"),
        header.ContentHeader(0, size, spec.Basic.Properties(delivery_mode=2)), pbody.ContentBody(body)))
    times = []
    for i in range(n):
        sent = time.monotonic_ns()
        s.sendall(one)
        f = read()
        assert isinstance(f, spec.Basic.Ack), f
        times.append((sent, time.monotonic_ns()))
    print(json.dumps(times))
''')


class Marks:
    """Timestamps of the one publish in flight (window 1: there is never more than one)."""

    def __init__(self):
        self.current: dict[str, int] = {}
        self.done: list[dict[str, int]] = []

    def mark(self, name: str, after: str | None = None) -> None:
        """The first time this publish reaches step `name` (only once it has passed `after`)."""
        if after is None or after in self.current:
            self.current.setdefault(name, now())

    def finish(self) -> None:
        """A batch's confirms went out: one publish's walk ends (what a declare-ok's batch
        marked before the first publish is dropped)."""
        if "logged" in self.current:
            self.done.append(self.current)
        self.current = {}


def wrap(cls, name: str, before=None, after=None):
    original = getattr(cls, name)

    def wrapped(*args, **kwargs):
        if before:
            before()
        result = original(*args, **kwargs)
        if after:
            after()
        return result
    setattr(cls, name, wrapped)


def instrument(marks: Marks) -> None:
    wrap(AMQPProtocol, "data_received", before=lambda: marks.mark("arrived"))
    wrap(MessageStore, "enqueue", after=lambda: marks.mark("logged"))
    wrap(MessageStore, "_kick", before=lambda: marks.mark("kicked"))
    wrap(SegmentWriter, "_apply", before=lambda: marks.mark("writer"), after=lambda: marks.mark("synced"))
    wrap(MessageStore, "_batch_done", before=lambda: marks.mark("loop"))
    wrap(Session, "take_output", after=lambda: marks.mark("confirm out", after="loop"))
    wrap(Broker, "send_confirms", after=marks.finish)


async def run(messages: int, size: int, data_dir: Path) -> tuple[list, list]:
    marks = Marks()
    instrument(marks)
    port = free_port()
    node = build_node(NodeConfig(name="breakdown", data_dir=data_dir, amqp_port=port))
    await node.start()
    while not node.store.prepared:
        await asyncio.sleep(0.05)
    client = await asyncio.create_subprocess_exec(sys.executable, "-c", CLIENT, str(port), str(messages), str(size),
                                                  stdout=subprocess.PIPE)
    out, _ = await client.communicate()
    await node.stop()
    return json.loads(out), marks.done


def breakdown(client_times: list, node_marks: list) -> dict[str, list[float]]:
    steps = {name: [] for name in STEPS}
    skip = len(client_times) // 10            # the first tenth warms up
    for (sent, acked), m in list(zip(client_times, node_marks))[skip:]:
        points = [sent, m["arrived"], m["logged"], m["kicked"], m["writer"], m["synced"], m["loop"],
                  m["confirm out"], acked]
        for name, a, b in zip(STEPS, points, points[1:]):
            steps[name].append((b - a) / 1000)
    return steps


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--size", type=int, default=1024)
    args = parser.parse_args(argv)
    use_uvloop()
    with tempfile.TemporaryDirectory() as tmp:
        client_times, node_marks = asyncio.run(run(args.messages, args.size, Path(tmp)))
    if len(node_marks) != len(client_times):
        sys.exit(f"{len(node_marks)} confirms timed in the node for {len(client_times)} publishes")
    steps = breakdown(client_times, node_marks)
    total = [(acked - sent) / 1000 for sent, acked in client_times[len(client_times) // 10:]]
    print(f"{len(total)} window-1 confirms of {args.size} B persistent messages, microseconds")
    print(f"{'step':<20}{'median':>8}{'p90':>8}")
    for name, values in steps.items():
        values.sort()
        print(f"{name:<20}{statistics.median(values):>8.0f}{values[int(len(values) * 0.9)]:>8.0f}")
    total.sort()
    print(f"{'round trip':<20}{statistics.median(total):>8.0f}{total[int(len(total) * 0.9)]:>8.0f}"
          f"   ({1e6 / statistics.median(total):.0f} confirms/s)")


if __name__ == "__main__":
    main()
