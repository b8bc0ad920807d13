"""How many moves one durable, confirmed publish makes inside HareMQ, from the bytes arriving
to the basic.ack written.

A node runs in this process; a pika client in a thread declares a durable queue, selects
confirm mode and, once the node's event loop is tracing, publishes one persistent message and
waits for its confirm. `sys.setprofile` on the loop's thread records every call of a HareMQ
function (anything under this distribution's folders) in that window. A *move* is a call from
a function in one file into a function in another; a file *entered* N times was moved into N
times. Fewer moves is a path a newcomer can follow (docs/architecture.md walks it).

    python -m haremq.bench.publish_walk [--rounds N] [--calls]
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

import pika

from haremq.cluster.assembly import build_node
from haremq.node.app import NodeConfig

from .failover import free_port

ROOT = Path(__file__).absolute().parent.parent
SKIP = ("bench/publish_walk.py",)


class Walk:
    """The HareMQ calls made on the loop's thread while tracing is on."""

    def __init__(self):
        self.calls: list[tuple[str, str, str | None]] = []    # (file, function, caller's file)
        self._stack: list[str | None] = []

    def profile(self, frame, event, _arg):
        if event == "call":
            path = frame.f_code.co_filename
            mine = path.startswith(str(ROOT)) and ".venv" not in path and not path.endswith(SKIP)
            if mine:
                name = str(Path(path).relative_to(ROOT))
                caller = next((f for f in reversed(self._stack) if f is not None), None)
                self.calls.append((name, frame.f_code.co_name, caller))
                self._stack.append(name)
            else:
                self._stack.append(None)
        elif event == "return" and self._stack:
            self._stack.pop()

    def report(self, show_calls: bool) -> dict:
        moves = [(caller, name) for name, _fn, caller in self.calls if caller is not None and caller != name]
        entered = Counter(name for _caller, name in moves)
        files = {name for name, _fn, _caller in self.calls}
        if show_calls:
            for name, fn, caller in self.calls:
                print(f"  {'->' if caller != name else '  '} {name}:{fn}")
        return {"calls": len(self.calls), "files": len(files), "moves": len(moves),
                "entered": dict(entered.most_common())}


async def _trace(port: int, data_dir: Path, rounds: int) -> list[Walk]:
    node = build_node(NodeConfig(name="walk", data_dir=data_dir, amqp_port=port))
    await node.start()
    loop = asyncio.get_running_loop()
    walks = [Walk() for _ in range(rounds)]

    def client() -> None:
        conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        ch = conn.channel()
        ch.queue_declare("walk", durable=True)
        ch.confirm_delivery()
        for _ in range(50):      # warm: first-use paths (caches, lazily built tables) stay out of the walk
            ch.basic_publish("", "walk", b"x" * 1024, pika.BasicProperties(delivery_mode=2))
        for walk in walks:
            tracing, traced = threading.Event(), threading.Event()
            loop.call_soon_threadsafe(lambda w=walk, tracing=tracing: (sys.setprofile(w.profile), tracing.set()))
            tracing.wait()
            ch.basic_publish("", "walk", b"x" * 1024, pika.BasicProperties(delivery_mode=2))
            loop.call_soon_threadsafe(lambda traced=traced: (sys.setprofile(None), traced.set()))
            traced.wait()
        conn.close()

    await loop.run_in_executor(None, client)
    await node.stop()
    return walks


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21, help="publishes traced, one at a time")
    parser.add_argument("--calls", action="store_true", help="print every call of the median publish")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        walks = asyncio.run(_trace(free_port(), Path(tmp), args.rounds))
    # how the client's frames arrive (one read or several) and whether the fsync finishes
    # before the loop looks again vary from one publish to the next: the median is the walk
    walks.sort(key=lambda w: len(w.calls))
    median = walks[len(walks) // 2]
    result = median.report(args.calls)
    print(f"one durable confirmed publish (median of {len(walks)}): {result['calls']} calls in "
          f"{result['files']} files, {result['moves']} moves from one file to another "
          f"(fewest {len(walks[0].calls)} calls, most {len(walks[-1].calls)})")
    for name, count in result["entered"].items():
        print(f"  {name}: entered {count}x")


if __name__ == "__main__":
    main()
