"""`haremq` command line: `haremq node` runs one broker node in the foreground."""
from __future__ import annotations

import argparse
import asyncio
import gc
import signal
import sys
from pathlib import Path

from . import logs
from .app import Node, NodeConfig, NodeError


def _port(value: str) -> int:
    port = int(value)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {value} out of range")
    return port


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="haremq", description="HareMQ message broker")
    sub = parser.add_subparsers(dest="command", required=True)
    node = sub.add_parser("node", help="run one broker node in the foreground")
    node.add_argument("--name", default="hare", help="node name (default: hare)")
    node.add_argument("--data-dir", type=Path, default=Path("./haremq-data"), help="where the node keeps its data")
    node.add_argument("--amqp-port", type=_port, default=5672, help="AMQP listener port (default: 5672)")
    node.add_argument("--bind", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    node.add_argument("--skip-corrupt", action="store_true",
                      help="start even if a segment has a corrupt record mid-log (drops the rest of it)")
    node.add_argument("--segment-size", type=int, default=64 << 20,
                      help="bytes per message-store segment file (default 64 MiB)")
    node.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    node.add_argument("--log-json", action="store_true", help="log JSON lines instead of key=value")
    sub.add_parser("perf", help="PerfTest-style load tool (haremq perf --help)", add_help=False)
    return parser


async def _run_node(config: NodeConfig) -> None:
    # Queued messages are long-lived acyclic objects: collect young garbage rarely and
    # never rescan what start-up created.
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 1000)
    node = Node(config)
    await node.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(node.stop()))
    await node.wait_stopped()


def _event_loop_policy() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio still works
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["perf"]:
        from bench.perf import main as perf_main
        return perf_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "node":
        logs.configure(args.log_level, args.log_json)
        config = NodeConfig(name=args.name, data_dir=args.data_dir, amqp_port=args.amqp_port, bind=args.bind,
                            skip_corrupt=args.skip_corrupt, segment_size=args.segment_size)
        _event_loop_policy()
        try:
            asyncio.run(_run_node(config))
        except NodeError as exc:
            print(f"haremq: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 0
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
