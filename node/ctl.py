"""`haremq ctl`: control a running node or cluster, modelled on rabbitmqctl.

    haremq ctl [--node HOST:CLUSTER_PORT] COMMAND [ARGS] [--formatter json | --json]

Talks to the node's cluster port over gRPC with the cluster secret (the same
one the nodes use: --cluster-secret-file, $HAREMQ_CLUSTER_SECRET, or the
user's ~/.haremq/cluster-secret). Prints tables for people, JSON for scripts.
Exit statuses are rabbitmqctl's, so scripts written for it keep working:
0 done, 64 usage, 65 bad data (no such queue, bad JSON), 69 node unreachable,
70 the command failed on the node, 75 timed out, 77 secret refused.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Callable, Protocol

DEFAULT_NODE = "127.0.0.1:25672"

# rabbitmqctl's exit statuses (sysexits.h)
EX_OK, EX_USAGE, EX_DATAERR, EX_UNAVAILABLE, EX_SOFTWARE, EX_TEMPFAIL, EX_NOPERM, EX_CONFIG = \
    0, 64, 65, 69, 70, 75, 77, 78

# command -> (control command, default columns, help)
LISTINGS = {
    "cluster-status": ("cluster_status", None, "members, which are up, the Raft leader and alarms"),
    "list-queues": ("list_queues", ["name", "vhost", "messages", "messages_unacknowledged", "consumers", "node",
                                    "mirrors", "synchronised_mirrors", "epoch", "sync"],
                    "queues of the whole cluster; name columns to choose them (list-queues name messages; "
                    "dedup_cache_size dedup_dropped for deduplication)"),
    "list-exchanges": ("list_exchanges", ["name", "vhost", "type", "durable", "auto_delete", "internal"],
                       "exchanges"),
    "list-bindings": ("list_bindings", ["source", "vhost", "destination", "destination_type", "routing_key"],
                      "bindings"),
    "list-connections": ("list_connections", ["node", "peer", "user", "vhost", "channels", "blocked"],
                         "client connections on every member"),
    "list-channels": ("management_rows", ["name", "node", "user", "vhost", "prefetch_count",
                                          "messages_unacknowledged", "consumer_count", "state"],
                      "client channels on every member"),
    "list-consumers": ("management_rows", ["queue", "channel_details", "consumer_tag", "ack_required",
                                           "prefetch_count", "exclusive"],
                       "consumers on every member"),
}
VHOST_LISTINGS = {"list-queues", "list-exchanges", "list-bindings", "list-connections", "list-channels",
                  "list-consumers"}

# broker methods reachable through ctl: command -> (method, positional args, reads only, help)
BROKER_CALLS = {
    "add-user": ("add_user", ["username", "password?"], False,
                 "add a user; the password is read from stdin when not given"),
    "delete-user": ("delete_user", ["username"], False, "delete a user"),
    "change-password": ("change_password", ["username", "password?"], False,
                        "change a user's password; read from stdin when not given"),
    "set-user-tags": ("set_user_tags", ["username", "tags*"], False,
                      "set a user's tags (administrator, monitoring, management, ...)"),
    "list-users": ("list_users", [], True, "users and their tags"),
    "add-vhost": ("add_vhost", ["vhost"], False, "add a virtual host"),
    "delete-vhost": ("delete_vhost", ["vhost"], False, "delete a virtual host and everything in it"),
    "list-vhosts": ("list_vhosts", [], True, "virtual hosts"),
    "set-permissions": ("set_permissions", ["username", "configure", "write", "read"], False,
                        "set a user's configure, write and read patterns in a vhost (-p)"),
    "clear-permissions": ("clear_permissions", ["username"], False, "remove a user's permissions in a vhost (-p)"),
    "list-permissions": ("list_permissions", [], True, "permissions in a vhost (-p)"),
    "set-policy": ("set_policy", ["name", "pattern", "definition"], False,
                   "set a policy: NAME PATTERN DEFINITION(JSON) [--apply-to] [--priority]"),
    "clear-policy": ("clear_policy", ["name"], False, "remove a policy"),
    "list-policies": ("list_policies", [], True, "policies in a vhost (-p)"),
    "export-definitions": ("export_definitions", [], True,
                           "print the definitions JSON (users, vhosts, permissions, policies, queues, ...)"),
}
VHOST_SCOPED = {"set-permissions", "clear-permissions", "list-permissions", "set-policy", "clear-policy",
                "list-policies"}


class CtlError(Exception):
    """A failure to report in one line, with rabbitmqctl's exit status."""

    def __init__(self, message: str, code: int = EX_SOFTWARE):
        super().__init__(message)
        self.code = code


class UsageError(Exception):
    pass


class CtlParser(argparse.ArgumentParser):
    """A usage mistake is one line on stderr and exit 64, as with rabbitmqctl."""

    def error(self, message: str):
        raise UsageError(f"{message} (see {self.prog} --help)")


def _common(p: argparse.ArgumentParser, top: bool = False) -> None:
    default = "table" if top else argparse.SUPPRESS
    p.add_argument("--formatter", choices=["table", "json"], default=default, help="output format (default table)")
    p.add_argument("--json", dest="formatter", action="store_const", const="json", default=default,
                   help="the same as --formatter json")


def build_parser() -> argparse.ArgumentParser:
    parser = CtlParser(prog="haremq ctl", description="control a HareMQ node or cluster (rabbitmqctl's commands)",
                       epilog="exit status: 0 ok, 64 usage, 65 data error, 69 node unreachable, "
                              "70 failed on the node, 75 timeout, 77 secret refused")
    parser.add_argument("--node", "-n", default=DEFAULT_NODE, help=f"HOST:CLUSTER_PORT (default {DEFAULT_NODE})")
    parser.add_argument("--cluster-secret-file", type=Path, help="the cluster secret (default: as the nodes)")
    parser.add_argument("--timeout", "-t", type=float, default=10.0, help="seconds to wait for the node (default 10)")
    parser.add_argument("--tls-cert", type=Path, help="operator certificate when the cluster port uses TLS")
    parser.add_argument("--tls-key", type=Path, help="its private key")
    parser.add_argument("--tls-ca", type=Path, help="the CA of the cluster's certificates")
    _common(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=CtlParser)

    def add(name: str, helptext: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=helptext, description=helptext)
        _common(p)
        return p

    for name, (_command, columns, helptext) in LISTINGS.items():
        p = add(name, helptext)
        if columns:
            p.add_argument("columns", nargs="*", metavar="COLUMN", help=f"columns to show (default: "
                           f"{' '.join(columns)})")
        if name in VHOST_LISTINGS:
            p.add_argument("-p", "--vhost", help="only this vhost (default: all)")
    for name, (_method, params, _read, helptext) in BROKER_CALLS.items():
        p = add(name, helptext)
        for param in params:
            if param.endswith("*"):
                p.add_argument(param[:-1], nargs="*")
            elif param.endswith("?"):
                p.add_argument(param[:-1], nargs="?")
            else:
                p.add_argument(param)
        if name in VHOST_SCOPED:
            p.add_argument("-p", "--vhost", default="/")
        if name == "set-policy":
            p.add_argument("--apply-to", default="all", choices=["all", "queues", "exchanges"])
            p.add_argument("--priority", type=int, default=0)
    p = add("sync-queue", "start synchronising a mirrored queue's unsynchronised mirrors")
    p.add_argument("queue")
    p.add_argument("-p", "--vhost", default="/")
    p = add("cancel-sync-queue", "stop a mirrored queue's synchronisation in progress")
    p.add_argument("queue")
    p.add_argument("-p", "--vhost", default="/")
    for name, helptext in (("add-member", "add a member to a quorum queue (it syncs, then counts)"),
                           ("delete-member", "remove a member from a quorum queue")):
        p = add(name, helptext)
        p.add_argument("queue")
        p.add_argument("member", help="the member (node name)")
        p.add_argument("-p", "--vhost", default="/")
    for name, helptext in (("grow", "add a member to every matching quorum queue (all, or those with an even "
                                    "number of members)"),
                           ("shrink", "remove a member from every quorum queue it belongs to (not where it "
                                      "leads or is the last one)")):
        p = add(name, helptext)
        p.add_argument("member", help="the member (node name)")
        if name == "grow":
            p.add_argument("which", choices=["all", "even"])
        p.add_argument("--vhost-pattern", default=".*")
        p.add_argument("--queue-pattern", default=".*")
    p = add("quorum-status", "a quorum queue's members: leader, followers, syncing, online")
    p.add_argument("queue")
    p.add_argument("-p", "--vhost", default="/")
    add("check-if-node-is-quorum-critical", "exit 69 if stopping this node would leave a quorum queue "
                                            "without a majority of its members online")
    p = add("purge-queue", "remove every ready message from a queue")
    p.add_argument("queue")
    p.add_argument("-p", "--vhost", default="/")
    p = add("delete-queue", "delete a queue (through the metadata log: on every member)")
    p.add_argument("queue")
    p.add_argument("-p", "--vhost", default="/")
    p.add_argument("--if-unused", "-u", action="store_true", help="only if it has no consumers")
    p.add_argument("--if-empty", "-e", action="store_true", help="only if it has no messages")
    p = add("close-connection", "close a client connection (as list-connections names it: PEER -> NODE "
                                "or the connection name) with 320 CONNECTION_FORCED")
    p.add_argument("connection")
    p.add_argument("reason", nargs="?", default="closed via haremq ctl")
    p = add("import-definitions", "import a definitions JSON file (or - for stdin) into the running "
                                  "cluster, through the metadata log")
    p.add_argument("file")
    p = add("forget-node", "remove a stopped member from the cluster for good")
    p.add_argument("member")
    p = add("await-startup", "wait until the node has started and serves (up to --timeout)")
    p = add("await-online-synchronized-mirror",
            "wait until no mirrored queue has its only synchronised copy on this node (before stopping it)")
    p = add("check-if-node-is-mirror-sync-critical",
            "exit 69 if stopping this node would leave a mirrored queue without a synchronised copy")
    p = add("drain", "maintenance mode: stop accepting clients and close their connections (before an upgrade)")
    p = add("revive", "leave maintenance mode: accept clients again")
    p = add("watch", "a live view of the cluster, refreshed every second")
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    return parser


def _password(args) -> str:
    """rabbitmqctl add_user USER with no password reads it from stdin (a shell history keeps none)."""
    if args.password is not None:
        return args.password
    if sys.stdin.isatty():
        import getpass
        return getpass.getpass("Password: ")
    line = sys.stdin.readline()
    password = line.rstrip("\r\n")
    if not password:
        raise CtlError("no password on stdin", EX_DATAERR)
    return password


def _call_args(args) -> list:
    _method, params, _read, _help = BROKER_CALLS[args.command]
    values = []
    for param in params:
        name = param.rstrip("*?")
        value = getattr(args, name)
        if name == "password":
            value = _password(args)
        if args.command == "set-policy" and name == "definition":
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise CtlError(f"policy definition is not JSON: {exc}", EX_DATAERR) from None
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


DATA_ERRORS = ("NOT_FOUND", "PRECONDITION_FAILED", "RESOURCE_LOCKED", "NOT_ALLOWED", "ACCESS_REFUSED")


class ControlPort(Protocol):
    """What ctl asks of a node's cluster port: cluster/control/client.py's ControlClient,
    handed to main() by the `haremq` command (cluster/cli.py)."""

    async def call(self, node: str, command: str, arguments: dict, timeout: float) -> tuple[bool, object]: ...


async def control(node: str, client: ControlPort, command: str, arguments: dict, timeout: float):
    """One Control call; no answer, or an error for one, is a CtlError with rabbitmqctl's status."""
    try:
        ok, answer = await client.call(node, command, arguments, timeout)
    except PermissionError as exc:
        raise CtlError(str(exc), EX_NOPERM) from None
    except TimeoutError as exc:
        raise CtlError(str(exc), EX_TEMPFAIL) from None
    except ConnectionError as exc:
        raise CtlError(str(exc), EX_UNAVAILABLE) from None
    except OSError as exc:
        raise CtlError(str(exc), EX_SOFTWARE) from None
    if not ok:
        text = answer
        data_error = text.startswith(DATA_ERRORS) or text.startswith(("no ", "unknown ")) \
            or "does not exist" in text or "not a member" in text or "is up:" in text
        raise CtlError(text, EX_DATAERR if data_error else EX_SOFTWARE)
    return answer


def _table(rows: list[dict], columns: list[str]) -> str:
    if not rows:
        return "(none)"
    cells = [[_cell(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def _cell(value) -> str:
    if isinstance(value, dict) and "name" in value:        # channel_details and the like
        return str(value["name"])
    return "" if value is None else str(value)


def _print(result, columns, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
    elif isinstance(result, list) and result and isinstance(result[0], dict):
        print(_table(result, columns or list(result[0])))
    elif isinstance(result, list) and not result:
        print("(none)")
    elif isinstance(result, dict) and "members" in result:
        print(f"Cluster status of node {result['node']}")
        print(_table(result["members"], ["name", "address", "up", "paused"]))
        print(f"majority: {result['majority']}  leader: {result['leader'] or '-'}  term: {result.get('term', '-')}  "
              f"alarms: {', '.join(result['alarms']) or 'none'}")
    elif result is not None:
        print(json.dumps(result, indent=2, sort_keys=True) if not isinstance(result, str) else result)


async def _listing(args, client: ControlPort):
    command, default_columns, _help = LISTINGS[args.command]
    arguments = {"kind": args.command.split("-", 1)[1]} if command == "management_rows" else {}
    rows = await control(args.node, client, command, arguments, args.timeout)
    vhost = getattr(args, "vhost", None)
    if vhost is not None and isinstance(rows, list):
        rows = [r for r in rows if r.get("vhost") == vhost]
    columns = getattr(args, "columns", None) or default_columns
    if getattr(args, "columns", None) and isinstance(rows, list):
        known = set(default_columns or ()).union(*(r.keys() for r in rows)) if rows else None
        unknown = [c for c in args.columns if known is not None and c not in known]
        if unknown:
            raise CtlError(f"unknown column(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}", EX_USAGE)
        if args.formatter == "json":
            rows = [{c: r.get(c) for c in args.columns} for r in rows]
    return rows, columns


async def _await(args, check, what: str):
    """Ask again until `check` holds or --timeout passes (75, as rabbitmqctl's await commands)."""
    deadline = time.monotonic() + args.timeout
    last = None
    while True:
        left = deadline - time.monotonic()
        try:
            done, last = await check(max(0.5, min(left, 5.0)))
            if done:
                return last
        except CtlError as exc:
            if exc.code not in (EX_UNAVAILABLE, EX_TEMPFAIL):
                raise
            last = str(exc)
        if time.monotonic() >= deadline:
            raise CtlError(f"timed out after {args.timeout:g}s waiting for {what}"
                           + (f" ({last})" if isinstance(last, str) else ""), EX_TEMPFAIL)
        await asyncio.sleep(0.25)


async def _run(args, client: ControlPort) -> int:
    as_json = args.formatter == "json"
    columns = None
    node = args.node
    if args.command == "watch":
        from .watch import watch
        await watch(node, client, args.interval, control, once=args.once)
        return EX_OK
    if args.command in LISTINGS:
        result, columns = await _listing(args, client)
    elif args.command in ("sync-queue", "cancel-sync-queue"):
        result = await control(node, client, args.command.replace("-", "_"),
                               {"vhost": args.vhost, "name": args.queue}, args.timeout)
    elif args.command == "purge-queue":
        result = await control(node, client, "purge_queue_any", {"vhost": args.vhost, "name": args.queue},
                               args.timeout)
    elif args.command == "delete-queue":
        result = await control(node, client, "delete_queue", {"vhost": args.vhost, "name": args.queue,
                                                             "if_unused": args.if_unused,
                                                             "if_empty": args.if_empty}, args.timeout)
    elif args.command == "close-connection":
        result = await control(node, client, "close_connection", {"name": args.connection, "reason": args.reason},
                               args.timeout)
    elif args.command == "import-definitions":
        result = await control(node, client, "import_definitions", {"definitions": await _read_definitions(args.file)},
                               args.timeout)
    elif args.command == "forget-node":
        result = await control(node, client, "forget_node", {"node": args.member}, args.timeout)
    elif args.command == "await-startup":
        async def started(t):
            status = await control(node, client, "cluster_status", {}, t)
            return bool(status.get("majority")) and not status.get("paused"), "no majority yet"
        result = await _await(args, started, f"{node} to start")
    elif args.command == "await-online-synchronized-mirror":
        async def safe(t):
            critical = await control(node, client, "sync_critical_queues", {}, t)
            return not critical, f"{len(critical)} queue(s) have their only synchronised copy here"
        result = await _await(args, safe, "a synchronised mirror of every queue on another member")
        result = result if as_json else "every mirrored queue has a synchronised copy on another member"
    elif args.command == "check-if-node-is-mirror-sync-critical":
        result = await control(node, client, "sync_critical_queues", {}, args.timeout)
        if result:
            _print(result, ["vhost", "name", "node"], as_json)
            return EX_UNAVAILABLE
    elif args.command in ("add-member", "delete-member"):
        result = await control(node, client, args.command.replace("-", "_"),
                               {"vhost": args.vhost, "name": args.queue, "node": args.member}, args.timeout)
    elif args.command in ("grow", "shrink"):
        result = await control(node, client, args.command,
                               {"node": args.member, "which": getattr(args, "which", "all"),
                                "vhost_pattern": args.vhost_pattern, "queue_pattern": args.queue_pattern},
                               args.timeout)
        columns = ["vhost", "name", "size", "result"]
    elif args.command == "quorum-status":
        result = await control(node, client, "quorum_status", {"vhost": args.vhost, "name": args.queue},
                               args.timeout)
        columns = ["node", "raft_state", "online", "synchronised"]
    elif args.command == "check-if-node-is-quorum-critical":
        result = await control(node, client, "quorum_critical", {}, args.timeout)
        if result:
            _print(result, ["vhost", "name", "members", "online"], as_json)
            return EX_UNAVAILABLE
        result = result if as_json else "no quorum queue would lose its majority if this node stopped"
    elif args.command in ("drain", "revive"):
        result = await control(node, client, args.command, {}, args.timeout)
    else:
        method, _params, read, _help = BROKER_CALLS[args.command]
        result = await control(node, client, "broker_call",
                               {"method": method, "args": _call_args(args), "read": read}, args.timeout)
    _print(result, columns, as_json)
    return EX_OK


async def _read_definitions(filename: str) -> dict:
    """The file, read without blocking the loop (aiofiles); bad JSON is a data error (65)."""
    if filename == "-":
        text = sys.stdin.read()
    else:
        import aiofiles
        try:
            async with aiofiles.open(filename) as f:
                text = await f.read()
        except OSError as exc:
            raise CtlError(f"cannot read {filename}: {exc.strerror or exc}", EX_DATAERR) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise CtlError(f"{filename} is not JSON: {exc}", EX_DATAERR) from None
    if not isinstance(data, dict):
        raise CtlError(f"{filename} does not hold a JSON object", EX_DATAERR)
    return data


def main(argv: list[str], connect: Callable[..., ControlPort]) -> int:
    """connect(secret_file, tls_cert, tls_key, tls_ca): the client of the cluster port (from
    cluster/cli.py); OSError or ValueError when the operator's files cannot be read."""
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        print(f"haremq ctl: {exc}", file=sys.stderr)
        return EX_USAGE
    try:
        client = connect(args.cluster_secret_file, args.tls_cert, args.tls_key, args.tls_ca)
    except (OSError, ValueError) as exc:
        print(f"haremq ctl: {exc}", file=sys.stderr)
        return EX_CONFIG
    try:
        return asyncio.run(_run(args, client))
    except CtlError as exc:
        print(f"haremq ctl: {exc}", file=sys.stderr)
        return exc.code
    except OSError as exc:
        print(f"haremq ctl: {exc}", file=sys.stderr)
        return EX_SOFTWARE
    except KeyboardInterrupt:
        return 130
