"""Where the time of a client on a node that is not its queue's master goes: three nodes, a
queue mirrored on all and mastered on hare1; one remote publish and one remote delivery at a
time, timed at every step in all three node processes.

    python -m haremq.bench.remote_breakdown [--messages 2000] [--size 1024]

As bench/mirror_breakdown does, each node runs as `haremq node` with its steps wrapped when the
process starts (the node's code is not changed) and writes its marks when it stops; the clients
are other processes on raw sockets. All read CLOCK_MONOTONIC.

Publish (window 1, no consumer): a publisher on hare2 waits for each confirm.

    client -> hare2          the publish leaves the client until hare2 has it
    hare2: route, to link    decoded, routed to the remote queue, handed to its link
    hare2 -> hare1           until the master's link handler has it (gRPC, both loops)
    hare1: publish, log      enqueued, appended to the store and the mirrors' log
    hare1: mirrors, sync     until every in-sync mirror and the master's own store have it
    hare1 -> hare2           the confirm event until hare2's link reads it (gRPC, both loops)
    hare2: confirm out       until the basic.ack is handed to the socket
    hare2 -> client          until the client has read it

Delivery (prefetch 100): a publisher on hare1 sends one message and waits until a consumer
on hare3 has it, then acks it and sends the next.

    client -> hare1          the publish leaves the client until hare1 has it
    hare1: route, dispatch   until the queue hands it to the consumer's link
    hare1 -> hare3           the delivery event until hare3's link reads it (gRPC, both loops)
    hare3: deliver out       until basic.deliver is handed to the socket
    hare3 -> client          until the consumer has read it
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
from pathlib import Path

from .confirm_breakdown import CLIENT, wrap
from .failover import mirror_ha_queues, three_members, wait_for, _all_open, _synced
from .mirror_breakdown import MarkedMember, _declared, after, mark_output, recorder

QUEUE = "ha.scale"        # bench/failover's queue: its policy (^ha\.) mirrors it on all three, `roles` reads it

PUBLISH_STEPS = ["client -> hare2", "hare2: route, to link", "hare2 -> hare1", "hare1: publish, log",
                 "hare1: mirrors, sync", "hare1 -> hare2", "hare2: confirm out", "hare2 -> client"]
DELIVERY_STEPS = ["client -> hare1", "hare1: route, dispatch", "hare1 -> hare3", "hare3: deliver out",
                  "hare3 -> client"]

DELIVERY_CLIENT = textwrap.dedent('''
    import json, socket, sys, time
    from pamqp import commands as spec, frame, header, body as pbody
    pub_port, con_port, n, size = (int(a) for a in sys.argv[1:5])
    class Conn:
        def __init__(self, port):
            self.s = socket.create_connection(("127.0.0.1", port))
            self.s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.buf = b""
            self.s.sendall(b"AMQP\\x00\\x00\\x09\\x01"); self.read()
            self.send((spec.Connection.StartOk({}, "PLAIN", "\\x00guest\\x00guest", "en_US"), 0)); self.read()
            self.send((spec.Connection.TuneOk(2047, 131072, 0), 0), (spec.Connection.Open("/"), 0)); self.read()
            self.send((spec.Channel.Open(), 1)); self.read()
        def read(self):
            while True:
                try:
                    used, ch, f = frame.unmarshal(self.buf)
                    self.buf = self.buf[used:]
                    return f
                except Exception:
                    self.buf += self.s.recv(65536)
        def send(self, *fs):
            self.s.sendall(b"".join(frame.marshal(f, ch) for f, ch in fs))
    pub, con = Conn(pub_port), Conn(con_port)
    con.send((spec.Queue.Purge(queue="breakdown"), 1)); con.read()    # what the publish leg left
    con.send((spec.Basic.Qos(prefetch_count=100), 1)); con.read()
    con.send((spec.Basic.Consume(queue="breakdown"), 1)); con.read()
    body = b"x" * size
    one = b"".join(frame.marshal(f, 1) for f in (
        spec.Basic.Publish(exchange="", routing_key="breakdown"),
        header.ContentHeader(0, size, spec.Basic.Properties(delivery_mode=2)), pbody.ContentBody(body)))
    times = []
    for i in range(n):
        sent = time.monotonic_ns()
        pub.s.sendall(one)
        f = con.read()
        assert isinstance(f, spec.Basic.Deliver), f
        con.read()
        got = 0
        while got < size:
            got += len(con.read().value)
        times.append((sent, time.monotonic_ns()))
        con.send((spec.Basic.Ack(f.delivery_tag), 1))
    print(json.dumps(times))
''')


# ---- inside a node process -------------------------------------------------------------------
def install_marks(out_path: str) -> None:
    """Wrap the node's steps; write {name: [ns, ...]} to out_path when the process ends."""
    from haremq.cluster.links.home import LinkChannel
    from haremq.cluster.links.link import QueueLink
    from haremq.cluster.mirroring.replicator import Replicator
    from haremq.node.broker.session import Session
    from haremq.node.server import AMQPProtocol

    mark = recorder(out_path)
    wrap(AMQPProtocol, "data_received", before=mark("arrived"))
    wrap(QueueLink, "send_publish", before=mark("to link"))
    wrap(QueueLink, "_event", before=mark("event in"))
    wrap(LinkChannel, "handle", before=mark("link in"))
    wrap(LinkChannel, "_confirm", before=mark("confirm"))
    wrap(LinkChannel, "deliver", before=mark("deliver"))
    wrap(Replicator, "enqueue", after=mark("logged"))
    mark_output(Session, mark("out"))


def node_main(out_path: str, argv: list[str]) -> int:
    install_marks(out_path)
    from haremq.cluster.cli import main
    return main(argv)


class RemoteMarkedMember(MarkedMember):
    module = "haremq.bench.remote_breakdown"


# ---- the bench --------------------------------------------------------------------------------
async def _client(script: str, *args) -> list:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", script, *(str(a) for a in args),
                                                stdout=subprocess.PIPE)
    out, _ = await proc.communicate()
    return json.loads(out)


async def run(messages: int, size: int, workdir: Path):
    members = three_members(workdir, 3.0, RemoteMarkedMember)
    for m in members.values():
        m.start()
    try:
        await wait_for(lambda: _all_open(members), 60, "every node to serve AMQP")
        hare1, hare2, hare3 = members["hare1"], members["hare2"], members["hare3"]
        await mirror_ha_queues(hare1)
        await wait_for(lambda: _declared(hare1.amqp, QUEUE), 30, "the queue")
        await wait_for(lambda: _synced(members, set(), 2), 30, "mirrors in sync")
        await asyncio.sleep(5)   # a new store zero-fills its first segment while idle, about a second
        publish = await _client(CLIENT.replace("breakdown", QUEUE), hare2.amqp, messages, size)
        delivery = await _client(DELIVERY_CLIENT.replace("breakdown", QUEUE), hare1.amqp, hare3.amqp,
                                 messages, size)
    finally:
        marks = {}
        for n, m in members.items():
            try:
                marks[n] = m.stop()
            except (OSError, ValueError, subprocess.TimeoutExpired):
                m.kill()
    return publish, delivery, marks


def legs(times: list, marks: dict, path: list[tuple[str, str]], steps: list[str]) -> dict[str, list[float]]:
    """For each (sent, done) of the client, the first mark of each (node, name) in `path` after
    the one before it; the steps are the gaps between them, in microseconds."""
    out: dict[str, list[float]] = {name: [] for name in steps}
    for sent, done in times[len(times) // 10:]:
        points = [sent]
        for node, name in path:
            points.append(after(marks[node].get(name, []), points[-1]) if points[-1] is not None else None)
        points.append(done)
        if None in points:
            continue
        for name, a, b in zip(steps, points, points[1:]):
            out[name].append((b - a) / 1000)
    return out


def report(title: str, steps: dict[str, list[float]], times: list) -> None:
    total = sorted((b - a) / 1000 for a, b in times[len(times) // 10:])
    print(f"{title}: {len(next(iter(steps.values())))} timed, microseconds")
    print(f"{'step':<26}{'median':>8}{'p90':>8}")
    for name, values in steps.items():
        if values:
            values.sort()
            print(f"{name:<26}{statistics.median(values):>8.0f}{values[int(len(values) * 0.9)]:>8.0f}")
    print(f"{'round trip':<26}{statistics.median(total):>8.0f}{total[int(len(total) * 0.9)]:>8.0f}"
          f"   ({1e6 / statistics.median(total):.0f}/s one at a time)")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--marks"]:
        sys.exit(node_main(argv[1], argv[3:]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--size", type=int, default=1024)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="haremq-remote-breakdown-") as tmp:
        publish, delivery, marks = asyncio.run(run(args.messages, args.size, Path(tmp)))
    for node_marks in marks.values():     # marks from other threads interleave with the loop's
        for times in node_marks.values():
            times.sort()
    report(f"remote publish, window 1, {args.size} B persistent, mirrored x3", legs(
        publish, marks, [("hare2", "arrived"), ("hare2", "to link"), ("hare1", "link in"), ("hare1", "logged"),
                         ("hare1", "confirm"), ("hare2", "event in"), ("hare2", "out")], PUBLISH_STEPS), publish)
    print()
    report(f"remote delivery, {args.size} B persistent, mirrored x3", legs(
        delivery, marks, [("hare1", "arrived"), ("hare1", "deliver"), ("hare3", "event in"), ("hare3", "out")],
        DELIVERY_STEPS), delivery)


if __name__ == "__main__":
    main()
