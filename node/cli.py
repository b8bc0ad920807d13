"""`haremq` command line.

    haremq node ...        run one broker node in the foreground
    haremq cluster up ...  run a local cluster of nodes in the foreground
    haremq ctl ...         control a running node or cluster (node/ctl.py)
    haremq health ...      exit 0 when a node accepts connections (probes)
    haremq perf ...        PerfTest-style load tool (bench/perf.py)

Every `haremq node` flag can also be given as an environment variable
HAREMQ_<FLAG> (for example HAREMQ_CLUSTER_PORT), which containers use.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import os
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


def _env(flag: str, default=None):
    return os.environ.get("HAREMQ_" + flag.upper().replace("-", "_"), default)


_port.__name__ = "port"


def _peer(value: str) -> tuple[str, str]:
    name, sep, address = value.partition("=")
    if not sep or not name or ":" not in address:
        raise argparse.ArgumentTypeError(f"peer '{value}' is not NAME=HOST:PORT")
    return name, address


class OneLineParser(argparse.ArgumentParser):
    """A wrong flag is one line on stderr (and exit 2), not the whole usage."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="haremq", description="HareMQ message broker")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    node = sub.add_parser("node", help="run one broker node in the foreground")
    node.add_argument("--name", default=_env("name", "hare"), help="node name (default: hare)")
    node.add_argument("--data-dir", type=Path, default=Path(_env("data-dir", "./haremq-data")),
                      help="where the node keeps its data")
    node.add_argument("--amqp-port", type=_port, default=int(_env("amqp-port", 5672)),
                      help="AMQP listener port (default: 5672)")
    node.add_argument("--bind", default=_env("bind", "127.0.0.1"), help="address to listen on (default: 127.0.0.1)")
    node.add_argument("--cluster-port", type=_port, default=_env("cluster-port"),
                      help="gRPC port for the other members and `haremq ctl`; makes the node clustered")
    node.add_argument("--peer", type=_peer, action="append", default=[],
                      help="another member, NAME=HOST:CLUSTER_PORT (repeat; or HAREMQ_PEERS=a=h:p,b=h:p)")
    node.add_argument("--peers-dns", default=_env("peers-dns"),
                      help="headless service DNS name: members are NAME-0..NAME-(N-1).SERVICE (Kubernetes)")
    node.add_argument("--replicas", type=int, default=int(_env("replicas", 3)),
                      help="number of members with --peers-dns (default: 3)")
    node.add_argument("--cluster-secret-file", type=Path, default=_env("cluster-secret-file"),
                      help="file holding the cluster secret (default: ~/.haremq/cluster-secret)")
    node.add_argument("--cluster-tls-cert", type=Path, default=_env("cluster-tls-cert"),
                      help="this member's certificate (PEM) for mutual TLS on the cluster port")
    node.add_argument("--cluster-tls-key", type=Path, default=_env("cluster-tls-key"), help="its private key (PEM)")
    node.add_argument("--cluster-tls-ca", type=Path, default=_env("cluster-tls-ca"),
                      help="the CA that signs every member's (and operator's) certificate")
    node.add_argument("--failure-timeout", type=float, default=float(_env("failure-timeout", 3.0)),
                      help="seconds without an answer before a member counts as down (default: 3)")
    node.add_argument("--default-user", default=_env("default-user"),
                      help="create this user (all permissions on /) at first start")
    node.add_argument("--default-pass", default=_env("default-pass"), help="its password")
    node.add_argument("--definitions", type=Path, default=_env("definitions"),
                      help="RabbitMQ definitions JSON (users, vhosts, permissions, policies, queues, "
                           "exchanges, bindings) to import at start")
    node.add_argument("--tls-port", type=_port, default=_env("tls-port"),
                      help="AMQP over TLS (amqps) listener port, usually 5671; needs --tls-cert and --tls-key")
    node.add_argument("--tls-cert", type=Path, default=_env("tls-cert"), help="server certificate (PEM)")
    node.add_argument("--tls-key", type=Path, default=_env("tls-key"), help="server private key (PEM)")
    node.add_argument("--tls-ca", type=Path, default=_env("tls-ca"), help="CA certificates for client certificates")
    node.add_argument("--tls-verify-peer", action="store_true",
                      help="require a client certificate signed by --tls-ca (mutual TLS)")
    node.add_argument("--vm-memory-high-watermark", default=_env("vm-memory-high-watermark", "0.4"),
                      help="memory alarm above this fraction of RAM (0.4) or size (1GB); default 0.4")
    node.add_argument("--disk-free-limit", default=_env("disk-free-limit", "50MB"),
                      help="disk alarm below this much free space in the data dir (default 50MB)")
    node.add_argument("--management-port", type=_port, default=_env("management-port"),
                      help="HTTP management API and web view port (default: 15672; 0 turns it off)")
    node.add_argument("--prometheus-port", type=_port, default=_env("prometheus-port"),
                      help="Prometheus /metrics port (default: 15692; 0 turns it off)")
    node.add_argument("--prometheus-per-queue", choices=["on", "off"], default=_env("prometheus-per-queue", "on"),
                      help="one /metrics series per queue (on), or queue series summed (off; for many queues)")
    node.add_argument("--management-tls", action="store_true", default=bool(_env("management-tls")),
                      help="serve the management API over HTTPS with --tls-cert and --tls-key")
    node.add_argument("--skip-corrupt", action="store_true",
                      help="start even if a segment has a corrupt record mid-log (drops the rest of it)")
    node.add_argument("--segment-size", type=int, default=64 << 20,
                      help="bytes per message-store segment file (default 64 MiB)")
    node.add_argument("--log-level", default=_env("log-level", "info"), choices=["debug", "info", "warning", "error"])
    node.add_argument("--log-json", action="store_true", help="log JSON lines instead of key=value")
    sub.add_parser("perf", help="PerfTest-style load tool (haremq perf --help)", add_help=False)
    sub.add_parser("ctl", help="control a running node (haremq ctl --help)", add_help=False)
    sub.add_parser("cluster", help="run a local cluster (haremq cluster up --help)", add_help=False)
    sub.add_parser("health", help="exit 0 when a node accepts connections", add_help=False)
    return parser


def _peers(args) -> dict[str, str]:
    peers = dict(args.peer)
    for item in filter(None, (_env("peers") or "").split(",")):
        name, address = _peer(item.strip())
        peers.setdefault(name, address)
    if args.peers_dns:
        prefix = args.name.rsplit("-", 1)[0]
        for i in range(args.replicas):
            peers.setdefault(f"{prefix}-{i}", f"{prefix}-{i}.{args.peers_dns}:{args.cluster_port}")
    peers.pop(args.name, None)
    return peers


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
    if node.failure is not None:
        raise NodeError(node.failure)


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
    if argv[:1] == ["ctl"]:
        from .ctl import main as ctl_main
        return ctl_main(argv[1:])
    if argv[:1] == ["cluster"]:
        from .local_cluster import main as cluster_main
        return cluster_main(argv[1:])
    if argv[:1] == ["health"]:
        from .health import main as health_main
        return health_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "node":
        logs.configure(args.log_level, args.log_json)
        cluster_secret = ""
        cluster_tls = None
        if args.cluster_port is not None:
            from cluster import secret, transport
            try:
                cluster_secret = secret.resolve(args.cluster_secret_file)
            except (OSError, ValueError) as exc:
                print(f"haremq: cannot read the cluster secret: {exc}", file=sys.stderr)
                return 1
            try:
                cluster_tls = transport.TLSFiles.load(args.cluster_tls_cert, args.cluster_tls_key, args.cluster_tls_ca)
            except (OSError, ValueError) as exc:
                print(f"haremq: cluster TLS: {exc}", file=sys.stderr)
                return 1
        config = NodeConfig(name=args.name, data_dir=args.data_dir, amqp_port=args.amqp_port, bind=args.bind,
                            skip_corrupt=args.skip_corrupt, segment_size=args.segment_size,
                            cluster_port=int(args.cluster_port) if args.cluster_port is not None else None,
                            peers=_peers(args), cluster_secret=cluster_secret,
                            failure_timeout=args.failure_timeout, cluster_tls=cluster_tls,
                            default_user=args.default_user, default_pass=args.default_pass,
                            definitions=args.definitions,
                            tls_port=int(args.tls_port) if args.tls_port is not None else None,
                            tls_cert=args.tls_cert, tls_key=args.tls_key, tls_ca=args.tls_ca,
                            tls_verify_peer=args.tls_verify_peer,
                            vm_memory_high_watermark=args.vm_memory_high_watermark,
                            disk_free_limit=args.disk_free_limit,
                            management_port=_port(str(args.management_port if args.management_port is not None
                                                      else 15672)),
                            prometheus_port=_port(str(args.prometheus_port if args.prometheus_port is not None
                                                      else 15692)),
                            prometheus_per_queue=args.prometheus_per_queue == "on",
                            management_tls=args.management_tls,
                            # the default ports: several nodes on one host must not stop each other
                            optional_ports=tuple(name for name, given in (("management", args.management_port),
                                                                          ("prometheus", args.prometheus_port))
                                                 if given is None))
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
