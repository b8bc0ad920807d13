"""`haremq` command line.

    haremq node ...        run one broker node in the foreground
    haremq cluster up ...  run a local cluster of nodes in the foreground
    haremq ctl ...         control a running node or cluster (node/ctl.py)
    haremq health ...      exit 0 when a node accepts connections (probes)
    haremq certs ...       make the cluster's TLS certificates and secret, once (cluster/certs.py)
    haremq perf ...        PerfTest-style load tool (cluster/perf/)

Every `haremq node` setting is a flag, an environment variable HAREMQ_<SETTING>
(for example HAREMQ_CLUSTER_PORT, which containers use) and a key of the
`--config FILE` (TOML); node/settings.py reads them once.

The command sits at the top of cluster/, above node/ and the rest of cluster/:
it builds a node with cluster/assembly.py and hands `haremq ctl` (node/ctl.py)
its client of the cluster port, so no import runs back up.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import os
import signal
import sys

import structlog

from haremq.node import logs, settings
from haremq.node.app import NodeConfig, NodeError
from haremq.node.version import __version__


class OneLineParser(argparse.ArgumentParser):
    """A wrong flag is one line on stderr (and exit 2), not the whole usage."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="haremq", description="HareMQ message broker")
    parser.add_argument("--version", action="version", version=f"haremq {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)
    node = sub.add_parser("node", help="run one broker node in the foreground",
                          description="Run one broker node. Settings: flag > HAREMQ_<SETTING> > --config FILE "
                                      "(TOML) > default.")
    settings.add_arguments(node)
    sub.add_parser("perf", help="PerfTest-style load tool (haremq perf --help)", add_help=False)
    sub.add_parser("ctl", help="control a running node (haremq ctl --help)", add_help=False)
    sub.add_parser("cluster", help="run a local cluster (haremq cluster up --help)", add_help=False)
    sub.add_parser("health", help="exit 0 when a node accepts connections", add_help=False)
    sub.add_parser("certs", help="make the cluster's TLS certificates and secret (haremq certs --help)",
                   add_help=False)
    return parser


def _peers(values: dict) -> dict[str, str]:
    """Static peers (--peer, HAREMQ_PEERS, the file) and, with --peers-dns, the StatefulSet's members
    that resolve now; members that start later join by asking (cluster/membership/discovery.py)."""
    peers = dict(values["peers"])
    if values["peers_dns"] and values["cluster_port"] is not None:
        from .membership.discovery import dns_members
        peers.update({name: address for name, address in dns_members(
            values["name"], values["peers_dns"], values["cluster_port"], values["replicas"]).items()
            if name not in peers})
    peers.pop(values["name"], None)
    return peers


async def _run_node(config: NodeConfig) -> None:
    # Queued messages are long-lived acyclic objects: collect young garbage rarely and
    # never rescan what start-up created.
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 1000)
    from .assembly import build_node     # here: `haremq ctl`, `health` and `perf` need none of it
    node = build_node(config)
    await node.start()
    loop = asyncio.get_running_loop()
    loop.call_later(60, os.environ.pop, RESTARTS_ENV, None)     # a start that lasted: count afresh
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, node.stop_soon)
    await node.wait_stopped()
    if node.failure is not None and node.restart:
        raise Restart(node.failure)
    if node.failure is not None:
        raise NodeError(node.failure)


class Restart(Exception):
    """The node stopped to start again (a snapshot it must load at start)."""


RESTARTS_ENV = "HAREMQ_SELF_RESTARTS"
MAX_RESTARTS = 20           # in a row without a start that lasted a minute: something else is wrong


def restart_process(reason: str) -> int:
    """The process starts itself again: the same pid, arguments and environment (a supervisor,
    if any, sees nothing), every file and socket closed by exec (Python opens them
    non-inheritable). Returns only when it cannot, with the exit status."""
    log = structlog.get_logger("haremq.node")
    restarts = int(os.environ.get(RESTARTS_ENV, "0")) + 1
    if restarts > MAX_RESTARTS:
        print(f"haremq: {reason}; {MAX_RESTARTS} restarts in a row, giving up", file=sys.stderr)
        return 1
    log.warning("node starting again", reason=reason, restarts=restarts)
    sys.stdout.flush()
    sys.stderr.flush()
    os.environ[RESTARTS_ENV] = str(restarts)
    try:
        # sys.orig_argv: the interpreter's own arguments too (`-m haremq.cluster.cli`, a script)
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])  # noqa: S606 - this very command again
    except OSError as exc:
        print(f"haremq: {reason}; cannot start again: {exc}", file=sys.stderr)
    return 1


def raise_fd_limit() -> tuple[int, int]:
    """Every AMQP connection, cluster link and store file is a file descriptor: the soft limit
    (often 1,024) goes up to the hard one at start, as RabbitMQ asks of `ulimit -n`; (soft, hard)
    as they are now. Silent: the node's start line reports the limit it got (`open_files`), and
    a node refusing its settings says only why."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft, hard
        return target, hard
    return soft, hard


def use_uvloop() -> None:
    """The event loop `haremq node` runs on (and the benches that time a node in-process)."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio still works
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["perf"]:
        from .perf.tool import main as perf_main
        return perf_main(argv[1:])
    if argv[:1] == ["ctl"]:
        from haremq.node.ctl import main as ctl_main

        from .control.client import ControlClient
        return ctl_main(argv[1:], ControlClient.load)
    if argv[:1] == ["cluster"]:
        from haremq.node.local_cluster import main as cluster_main
        return cluster_main(argv[1:])
    if argv[:1] == ["health"]:
        from haremq.node.health import main as health_main
        return health_main(argv[1:])
    if argv[:1] == ["certs"]:
        from .certs import main as certs_main
        return certs_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "node":
        try:
            v = settings.resolve(args)
        except settings.SettingError as exc:
            return settings.fail("haremq", exc)
        logs.configure(v["log_level"], v["log_json"])
        raise_fd_limit()
        cluster_secret = ""
        cluster_tls = None
        if v["cluster_port"] is not None:
            from . import secret, transport
            try:
                cluster_secret = secret.resolve(v["cluster_secret_file"], allow_empty=True)
            except (OSError, ValueError) as exc:
                print(f"haremq: cannot read the cluster secret: {exc}", file=sys.stderr)
                return 1
            try:
                cluster_tls = transport.TLSFiles.load(v["cluster_tls_cert"], v["cluster_tls_key"], v["cluster_tls_ca"])
            except (OSError, ValueError) as exc:
                print(f"haremq: cluster TLS: {exc}", file=sys.stderr)
                return 1
            refusal, warning = secret.check(cluster_secret, cluster_tls is not None, v["insecure_cluster"], v["bind"])
            if refusal:
                print(f"haremq: {refusal}", file=sys.stderr)
                return 2
            if warning:
                structlog.get_logger("haremq.cluster").warning(warning, node=v["name"])
        config = NodeConfig(name=v["name"], data_dir=v["data_dir"], amqp_port=v["amqp_port"], bind=v["bind"],
                            skip_corrupt=v["skip_corrupt"], segment_size=v["segment_size"],
                            cluster_port=v["cluster_port"], peers=_peers(v), cluster_secret=cluster_secret,
                            failure_timeout=v["failure_timeout"], consumer_timeout=v["consumer_timeout"],
                            cluster_tls=cluster_tls,
                            default_user=v["default_user"], default_pass=v["default_pass"],
                            definitions=v["definitions"], tls_port=v["tls_port"],
                            tls_cert=v["tls_cert"], tls_key=v["tls_key"], tls_ca=v["tls_ca"],
                            tls_verify_peer=v["tls_verify_peer"],
                            vm_memory_high_watermark=v["vm_memory_high_watermark"],
                            disk_free_limit=v["disk_free_limit"],
                            management_port=15672 if v["management_port"] is None else v["management_port"],
                            prometheus_port=15692 if v["prometheus_port"] is None else v["prometheus_port"],
                            prometheus_per_queue=v["prometheus_per_queue"],
                            management_tls=v["management_tls"],
                            advertise=v["join_as"] or (f"{v['name']}.{v['peers_dns']}:{v['cluster_port']}"
                                                       if v["peers_dns"] and v["cluster_port"] is not None else None),
                            # the default ports: several nodes on one host must not stop each other
                            optional_ports=tuple(name for name in ("management", "prometheus")
                                                 if v[f"{name}_port"] is None))
        use_uvloop()
        try:
            asyncio.run(_run_node(config))
        except Restart as exc:
            return restart_process(str(exc))
        except NodeError as exc:
            print(f"haremq: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 0
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
