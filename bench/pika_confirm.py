"""What a newcomer writes: pika's BlockingConnection with publisher confirms, one persistent
message at a time, each publish waiting for its confirm.

    python -m haremq.bench.pika_confirm --port 5672 -z 10 [-s 1024] [--queue Q] [--json out.json]

Most applications publish this way, so its rate is the latency of one confirm round trip
through the client library, the broker and the disk. `bench/compare` runs it as scenario P1
against HareMQ and RabbitMQ. The summary has the same keys as `haremq perf`'s (confirm_rate,
confirm_latency_ms, machine_cpu) so compare reads it the same way.
"""
from __future__ import annotations

import argparse
import array
import json
import os
import sys
import time

import pika

from haremq.cluster.perf.stats import cpu_self, machine_cpu, proc_cpu, summary_ms


def run(port: int, seconds: float, size: int, queue: str, broker_pids: list[int]) -> dict:
    params = pika.ConnectionParameters("127.0.0.1", port, heartbeat=0)
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.queue_delete(queue)
    ch.queue_declare(queue, durable=True)
    ch.confirm_delivery()
    body = b"x" * size
    props = pika.BasicProperties(delivery_mode=2)
    latencies = array.array("q")
    m0, b0, c0 = machine_cpu(), {p: proc_cpu(p) for p in broker_pids}, cpu_self()
    started = time.monotonic()
    deadline = started + seconds
    sent = 0
    while time.monotonic() < deadline:
        t = time.monotonic_ns()
        ch.basic_publish("", queue, body, props)     # returns once the broker has confirmed it
        latencies.append(time.monotonic_ns() - t)
        sent += 1
    wall = time.monotonic() - started
    m1, b1, c1 = machine_cpu(), {p: proc_cpu(p) for p in broker_pids}, cpu_self()
    ch.queue_delete(queue)
    conn.close()
    busy = (m1[0] - m0[0]) / wall
    client = (c1 - c0) / wall
    broker = {str(p): round((b1[p] - b0[p]) / wall, 3) for p in b0 if b0[p] is not None and b1.get(p) is not None}
    return {
        "sent": sent, "consumed": 0, "errors": [], "duration_s": round(wall, 3),
        "confirm_rate": round(sent / wall, 1),
        "confirm_latency_ms": summary_ms(latencies, max(latencies, default=0)),
        "machine_cpu": {"cores": os.cpu_count() or 1, "busy_cores": round(busy, 3), "client_cores": round(client, 3),
                        "broker_cores": broker or None,
                        "other_cores": round(max(0.0, busy - client - sum(broker.values())), 3)},
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=5672)
    parser.add_argument("-z", "--seconds", type=float, default=10.0)
    parser.add_argument("-s", "--size", type=int, default=1024)
    parser.add_argument("--queue", default="perf.p1")
    parser.add_argument("--broker-pid", type=int, action="append", default=[])
    parser.add_argument("--json", help="write the summary here (- for stdout)")
    args = parser.parse_args(argv)
    result = run(args.port, args.seconds, args.size, args.queue, args.broker_pid)
    text = json.dumps(result, indent=1)
    if args.json == "-":
        print(text)
    elif args.json:
        with open(args.json, "w") as f:
            f.write(text)
    lat = result["confirm_latency_ms"] or {}
    print(f"pika one at a time: {result['confirm_rate']:.0f} confirms/s, p50 {lat.get('p50')} ms, "
          f"p99 {lat.get('p99')} ms", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
