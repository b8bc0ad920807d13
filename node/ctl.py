"""`haremq ctl`: control a running node or cluster, modelled on rabbitmqctl.

    haremq ctl [--node HOST:CLUSTER_PORT] COMMAND [ARGS] [--json]

Talks to the node's cluster port over gRPC with the cluster secret (the same
one the nodes use: --cluster-secret-file, $HAREMQ_CLUSTER_SECRET, or the
user's ~/.haremq/cluster-secret). Prints tables for people, JSON for scripts.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

DEFAULT_NODE = "127.0.0.1:25672"

# command -> (control command, fixed arguments builder, columns for the table)
LISTINGS = {
    "cluster-status": ("cluster_status", None),
    "list-queues": ("list_queues", ["name", "vhost", "messages", "messages_unacknowledged", "consumers", "node",
                                    "mirrors", "synchronised_mirrors", "epoch", "sync"]),
    "list-exchanges": ("list_exchanges", ["name", "vhost", "type", "durable", "auto_delete", "internal"]),
    "list-bindings": ("list_bindings", ["source", "vhost", "destination", "destination_type", "routing_key"]),
    "list-connections": ("list_connections", ["node", "peer", "user", "vhost", "channels", "blocked"]),
}

# broker methods reachable through ctl: command -> (method, positional args, reads only)
BROKER_CALLS = {
    "add-user": ("add_user", ["username", "password"], False),
    "delete-user": ("delete_user", ["username"], False),
    "change-password": ("change_password", ["username", "password"], False),
    "set-user-tags": ("set_user_tags", ["username", "tags*"], False),
    "list-users": ("list_users", [], True),
    "add-vhost": ("add_vhost", ["vhost"], False),
    "delete-vhost": ("delete_vhost", ["vhost"], False),
    "list-vhosts": ("list_vhosts", [], True),
    "set-permissions": ("set_permissions", ["username", "configure", "write", "read"], False),
    "clear-permissions": ("clear_permissions", ["username"], False),
    "list-permissions": ("list_permissions", [], True),
    "set-policy": ("set_policy", ["name", "pattern", "definition"], False),
    "clear-policy": ("clear_policy", ["name"], False),
    "list-policies": ("list_policies", [], True),
    "export-definitions": ("export_definitions", [], True),
}
VHOST_SCOPED = {"set-permissions", "clear-permissions", "list-permissions", "set-policy", "clear-policy",
                "list-policies"}


class CtlError(Exception):
    pass


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="haremq ctl", description="control a HareMQ node or cluster")
    parser.add_argument("--node", default=DEFAULT_NODE, help=f"HOST:CLUSTER_PORT (default {DEFAULT_NODE})")
    parser.add_argument("--cluster-secret-file", type=Path, help="the cluster secret (default: as the nodes)")
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--tls-cert", type=Path, help="operator certificate when the cluster port uses TLS")
    parser.add_argument("--tls-key", type=Path)
    parser.add_argument("--tls-ca", type=Path)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in LISTINGS:
        p = sub.add_parser(name)
        p.add_argument("--json", action="store_true")
    for name, (_method, params, _read) in BROKER_CALLS.items():
        p = sub.add_parser(name)
        for param in params:
            if param.endswith("*"):
                p.add_argument(param[:-1], nargs="*")
            else:
                p.add_argument(param)
        if name in VHOST_SCOPED:
            p.add_argument("-p", "--vhost", default="/")
        if name == "set-policy":
            p.add_argument("--apply-to", default="all", choices=["all", "queues", "exchanges"])
            p.add_argument("--priority", type=int, default=0)
        p.add_argument("--json", action="store_true")
    for name in ("sync-queue", "cancel-sync-queue"):
        p = sub.add_parser(name, help="start (or stop) synchronising a mirrored queue's mirrors")
        p.add_argument("queue")
        p.add_argument("-p", "--vhost", default="/")
        p.add_argument("--json", action="store_true")
    p = sub.add_parser("forget-node", help="remove a stopped member from the cluster for good")
    p.add_argument("member")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("watch", help="a live view of the cluster, refreshed every second")
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    return parser


def _call_args(args) -> list:
    _method, params, _read = BROKER_CALLS[args.command]
    values = []
    for param in params:
        name = param.rstrip("*")
        value = getattr(args, name)
        if args.command == "set-policy" and name == "definition":
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise CtlError(f"policy definition is not JSON: {exc}") from None
        values.append(value)
    if args.command in ("set-permissions", "clear-permissions"):
        values.insert(1, args.vhost)
    elif args.command in ("set-policy", "clear-policy", "list-policies"):
        values.insert(0, args.vhost)
        if args.command == "set-policy":
            values += [args.apply_to, args.priority]
    elif args.command == "list-permissions":
        values = [args.vhost]
    return values


TLS = None   # cluster.transport.TLSFiles, set from --tls-* flags


async def control(node: str, secret: str, command: str, arguments: dict, timeout: float):
    import grpc

    from cluster import transport
    from cluster.rpc import cluster_pb2 as pb
    from cluster.rpc import cluster_pb2_grpc as pbg
    from cluster.secret import call_metadata
    async with transport.channel(node, TLS) as channel:
        stub = pbg.ClusterStub(channel)
        try:
            reply = await stub.Control(pb.ControlRequest(command=command, arguments=json.dumps(arguments).encode()),
                                       timeout=timeout, metadata=call_metadata(secret))
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                raise CtlError(f"{node} refused the cluster secret") from None
            raise CtlError(f"cannot reach {node}: {exc.code().name.lower()}") from None
    if not reply.ok:
        raise CtlError(reply.error)
    return json.loads(reply.result) if reply.result else None


def _table(rows: list[dict], columns: list[str]) -> str:
    if not rows:
        return "(none)"
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def _print(result, columns, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
    elif isinstance(result, list) and result and isinstance(result[0], dict):
        print(_table(result, columns or list(result[0])))
    elif isinstance(result, dict) and "members" in result:
        print(f"Cluster status of node {result['node']}")
        print(_table(result["members"], ["name", "address", "up", "paused"]))
        print(f"majority: {result['majority']}  leader: {result['leader'] or '-'}  term: {result.get('term', '-')}  "
              f"alarms: {', '.join(result['alarms']) or 'none'}")
    elif result is not None:
        print(json.dumps(result, indent=2, sort_keys=True) if not isinstance(result, str) else result)


async def _run(args, secret: str) -> None:
    if args.command == "watch":
        from .watch import watch
        await watch(args.node, secret, args.interval, control, once=args.once)
        return
    if args.command in LISTINGS:
        command, columns = LISTINGS[args.command]
        result = await control(args.node, secret, command, {}, args.timeout)
    elif args.command in ("sync-queue", "cancel-sync-queue"):
        command, columns = args.command.replace("-", "_"), None
        result = await control(args.node, secret, command, {"vhost": args.vhost, "name": args.queue}, args.timeout)
    elif args.command == "forget-node":
        command, columns = "forget_node", None
        result = await control(args.node, secret, command, {"node": args.member}, args.timeout)
    else:
        method, _params, read = BROKER_CALLS[args.command]
        columns = None
        result = await control(args.node, secret, "broker_call",
                               {"method": method, "args": _call_args(args), "read": read}, args.timeout)
    _print(result, columns, getattr(args, "json", False))


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    global TLS
    from cluster import secret as cluster_secret
    from cluster import transport
    try:
        TLS = transport.TLSFiles.load(args.tls_cert, args.tls_key, args.tls_ca)
        secret = cluster_secret.resolve(args.cluster_secret_file)
        asyncio.run(_run(args, secret))
    except CtlError as exc:
        print(f"haremq ctl: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"haremq ctl: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0
