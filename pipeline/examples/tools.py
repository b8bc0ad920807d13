"""Helpers for trying the example job: declare and fill a queue, or drain and count one.

    python -m pipeline.examples.tools fill  --uri URI --queue orders.in --count 10000 [--also orders.out]
    python -m pipeline.examples.tools drain --uri URI --queue orders.out

`fill` publishes bodies "order-000000", "order-000001", ... with publisher confirms, each with
its body as its message_id (what the job's deduplication needs);
`drain` consumes what is there and prints how many messages, how many distinct bodies, and
how many duplicates (same message_id) it saw.
"""
from __future__ import annotations

import argparse
import collections
import sys

import pika

from haremq.pipeline.amqp import ConfirmingPublisher, Outgoing, parse_uris


def fill(uri: str, queue: str, count: int, also=()) -> int:
    conn = pika.BlockingConnection(pika.URLParameters(uri.split(",")[0]))
    ch = conn.channel()
    for q in (queue, *also):
        ch.queue_declare(q, durable=True)
    conn.close()
    def message(i):
        body = f"order-{i:06d}"
        return Outgoing(queue, body.encode(), pika.BasicProperties(delivery_mode=2, content_type="text/plain",
                                                                   message_id=body))
    return ConfirmingPublisher(parse_uris(uri, "fill"), "").publish(message(i) for i in range(count))


def drain(uri: str, queue: str, idle: float = 2.0):
    """(Counter of bodies, Counter of message ids) of everything in `queue` until idle."""
    conn = pika.BlockingConnection(pika.URLParameters(uri.split(",")[0]))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1000)
    bodies, ids = collections.Counter(), collections.Counter()
    for method, props, body in ch.consume(queue, inactivity_timeout=idle):
        if method is None:
            break
        bodies[body] += 1
        ids[props.message_id] += 1
        ch.basic_ack(method.delivery_tag)
    ch.cancel()
    conn.close()
    return bodies, ids


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fill")
    f.add_argument("--uri", required=True)
    f.add_argument("--queue", required=True)
    f.add_argument("--count", type=int, default=10000)
    f.add_argument("--also", action="append", default=[], help="another queue to declare")
    d = sub.add_parser("drain")
    d.add_argument("--uri", required=True)
    d.add_argument("--queue", required=True)
    a = p.parse_args(argv)
    if a.cmd == "fill":
        n = fill(a.uri, a.queue, a.count, a.also)
        print(f"{n} messages confirmed into {a.queue}")
    else:
        bodies, ids = drain(a.uri, a.queue)
        total = sum(bodies.values())
        print(f"{total} messages, {len(bodies)} distinct bodies, {total - len(ids)} duplicates by message_id")
    return 0


if __name__ == "__main__":
    sys.exit(main())
