"""`haremq node` settings: typed, read once, from four places.

Precedence is flag > HAREMQ_<SETTING> environment variable > config file
(`--config FILE` or HAREMQ_CONFIG, TOML, keys as the flags without the dashes:
`amqp_port = 5672`) > default. Containers set the environment, people type
flags, deployments ship a file; all three go through the same parser, so a
bad value anywhere is one line naming the setting, and exit status 2.
Booleans take 1/0/true/false/yes/no/on/off in the environment and the file.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib


class SettingError(ValueError):
    """A bad value for a setting, in one line that names where it came from."""


# ---- value parsers: str -> value, ValueError with a short reason --------------------------------
def port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError("not a port number (0..65535)") from None
    if not 0 <= value <= 65535:
        raise ValueError("port out of range (0..65535)")
    return value


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("not a whole number") from None


def positive_int(text: str) -> int:
    value = integer(text)
    if value <= 0:
        raise ValueError("must be > 0")
    return value


def non_negative_int(text: str) -> int:
    value = integer(text)
    if value < 0:
        raise ValueError("must be >= 0")
    return value


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("not a number of seconds") from None
    if value <= 0:
        raise ValueError("must be > 0")
    return value


TRUE = {"1", "true", "yes", "on"}
FALSE = {"0", "false", "no", "off", ""}


def boolean(text: str) -> bool:
    low = str(text).strip().lower()
    if low in TRUE:
        return True
    if low in FALSE:
        return False
    raise ValueError("not a boolean (1/0/true/false)")


def choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        low = text.strip().lower()
        if low not in options:
            raise ValueError(f"must be one of {', '.join(options)}")
        return low
    return parse


def text(value: str) -> str:
    return value


def path(value: str) -> Path:
    if not value:
        raise ValueError("empty path")
    return Path(value)


def peer(value: str) -> tuple[str, str]:
    name, sep, address = value.strip().partition("=")
    if not sep or not name or ":" not in address:
        raise ValueError(f"'{value}' is not NAME=HOST:PORT")
    return name, address


def peers(value) -> list[tuple[str, str]]:
    items = value if isinstance(value, list) else str(value).split(",")
    return [peer(str(item)) for item in items if str(item).strip()]


@dataclass(frozen=True)
class Setting:
    name: str                      # attribute, TOML key; flag --name-with-dashes, env HAREMQ_NAME
    parse: Callable[[str], Any]
    default: Any
    help: str
    metavar: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "HAREMQ_" + self.name.upper()

    @property
    def is_bool(self) -> bool:
        return self.parse is boolean


NODE_SETTINGS = [
    Setting("name", text, "hare", "node name"),
    Setting("data_dir", path, Path("./haremq-data"), "where the node keeps its data"),
    Setting("amqp_port", port, 5672, "AMQP listener port"),
    Setting("bind", text, "127.0.0.1", "address to listen on"),
    Setting("cluster_port", port, None,
            "gRPC port for the other members and `haremq ctl`; makes the node clustered"),
    Setting("peers", peers, [], "other members, NAME=HOST:CLUSTER_PORT (repeat --peer, or comma-separated)"),
    Setting("peers_dns", text, None, "headless service DNS name: members are NAME-0, NAME-1, ... .SERVICE, "
            "found by resolving their names (Kubernetes; follows `kubectl scale`)"),
    Setting("join_as", text, None, "HOST:CLUSTER_PORT the members reach this node at: a node starting on an "
            "empty data dir asks the running members (its --peer list) to add it, as --peers-dns does"),
    Setting("replicas", positive_int, None, "members to expect with --peers-dns before any resolves "
            "(default: discover from DNS)"),
    Setting("cluster_secret_file", path, None, "file holding the cluster secret (default ~/.haremq/cluster-secret)"),
    Setting("cluster_tls_cert", path, None, "this member's certificate (PEM) for mutual TLS on the cluster port"),
    Setting("cluster_tls_key", path, None, "its private key (PEM)"),
    Setting("cluster_tls_ca", path, None, "the CA that signs every member's (and operator's) certificate"),
    Setting("insecure_cluster", boolean, False, "start a cluster with the public example secret or with none "
            "(tests, a trial on one machine); otherwise such a node refuses to start"),
    Setting("failure_timeout", seconds, 3.0, "seconds without an answer before a member counts as down"),
    Setting("consumer_timeout", non_negative_int, 1_800_000, "ms a delivery may wait for its ack before its "
            "channel is closed (406) and it is requeued, as RabbitMQ's consumer_timeout (default 30 min; 0: never)"),
    Setting("default_user", text, None, "create this user (all permissions on /) at first start"),
    Setting("default_pass", text, None, "its password"),
    Setting("definitions", path, None, "RabbitMQ definitions JSON (users, vhosts, permissions, policies, queues, "
            "exchanges, bindings) to import at start"),
    Setting("tls_port", port, None, "AMQP over TLS (amqps) listener port, usually 5671; needs --tls-cert "
            "and --tls-key"),
    Setting("tls_cert", path, None, "server certificate (PEM)"),
    Setting("tls_key", path, None, "server private key (PEM)"),
    Setting("tls_ca", path, None, "CA certificates for client certificates"),
    Setting("tls_verify_peer", boolean, False, "require a client certificate signed by --tls-ca (mutual TLS)"),
    Setting("vm_memory_high_watermark", text, "0.4", "memory alarm above this fraction of RAM (0.4) or size (1GB)"),
    Setting("disk_free_limit", text, "50MB", "disk alarm below this much free space in the data dir"),
    Setting("management_port", port, None, "HTTP management API and web view port (default 15672; 0 turns it off)"),
    Setting("prometheus_port", port, None, "Prometheus /metrics port (default 15692; 0 turns it off)"),
    Setting("prometheus_per_queue", boolean, True, "one /metrics series per queue (on), or queue series summed "
            "(off; for many queues)"),
    Setting("management_tls", boolean, False, "serve the management API over HTTPS with --tls-cert and --tls-key"),
    Setting("skip_corrupt", boolean, False, "start even if a segment has a corrupt record mid-log "
            "(drops the rest of it)"),
    Setting("segment_size", positive_int, 64 << 20, "bytes per message-store segment file (default 64 MiB)"),
    Setting("log_level", choice("debug", "info", "warning", "error"), "info", "debug, info, warning or error"),
    Setting("log_json", boolean, False, "log JSON lines instead of key=value"),
]
BY_NAME = {s.name: s for s in NODE_SETTINGS}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags keep the raw text (default None): values are parsed once, in `resolve`."""
    parser.add_argument("--config", metavar="FILE", default=None,
                        help="TOML file of settings (keys as the flags: amqp_port = 5672); env HAREMQ_CONFIG")
    for s in NODE_SETTINGS:
        shown = "" if s.default in (None, [], False) else f" (default {s.default})"
        helptext = f"{s.help}{shown}; env {s.env}"
        if s.name == "peers":
            parser.add_argument("--peer", dest="peers", action="append", metavar="NAME=HOST:PORT", help=helptext)
        elif s.is_bool:
            # --flag alone means true; --flag=false is accepted too, as in the env and the file
            parser.add_argument(s.flag, dest=s.name, nargs="?", const="true", default=None, metavar="BOOL",
                                help=helptext)
        else:
            parser.add_argument(s.flag, dest=s.name, default=None, help=helptext, metavar=s.metavar)
    # --prometheus-per-queue on/off stays accepted as it was


def _from_file(filename: str) -> dict:
    try:
        with open(filename, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise SettingError(f"config {filename}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingError(f"config {filename}: not TOML: {exc}") from None
    values = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name == "peer":
            name = "peers"
        if name not in BY_NAME:
            raise SettingError(f"config {filename}: unknown setting '{key}'")
        values[name] = value
    return values


def _parse(setting: Setting, value, where: str):
    if isinstance(value, bool):
        value = "true" if value else "false"
    elif isinstance(value, list) and setting.name == "peers":
        pass
    elif isinstance(value, (dict, list)):
        raise SettingError(f"{where}: {setting.name} must be a single value")
    else:
        value = str(value)
    try:
        return setting.parse(value)
    except ValueError as exc:
        raise SettingError(f"{where}: {exc}") from None


def resolve(args: argparse.Namespace, environ=None) -> dict:
    """Every node setting's value, by precedence; SettingError names the bad one."""
    environ = os.environ if environ is None else environ
    config = args.config if args.config is not None else environ.get("HAREMQ_CONFIG")
    from_file = _from_file(config) if config else {}
    out = {}
    for s in NODE_SETTINGS:
        given = getattr(args, s.name, None)
        if given is not None:
            if s.name == "peers":
                try:
                    out[s.name] = [peer(p) for p in given]
                except ValueError as exc:
                    raise SettingError(f"--peer {exc}") from None
            else:
                out[s.name] = _parse(s, given, f"{s.flag}={given!r}")
        elif s.env in environ:
            out[s.name] = _parse(s, environ[s.env], f"{s.env}={environ[s.env]!r}")
        elif s.name in from_file:
            out[s.name] = _parse(s, from_file[s.name], f"config {config}: {s.name}={from_file[s.name]!r}")
        else:
            out[s.name] = s.default
    return out


def fail(prog: str, exc: SettingError) -> int:
    print(f"{prog}: {exc}", file=sys.stderr)
    return 2
