"""`haremq cluster up`: a local cluster of N nodes, in the foreground, for trying HareMQ out.

Node i (from 1) is named hareI, listens for AMQP on AMQP_PORT+i-1, for its
peers on CLUSTER_PORT+i-1, serves the management API and web view on
MANAGEMENT_PORT+i-1 and /metrics on PROMETHEUS_PORT+i-1 (0 turns them off),
and keeps its data in DATA_DIR/hareI. Ctrl-C stops them all.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="haremq cluster")
    sub = parser.add_subparsers(dest="action", required=True)
    up = sub.add_parser("up", help="start a local cluster and stay in the foreground")
    up.add_argument("--nodes", type=int, default=3)
    up.add_argument("--amqp-port", type=int, default=5672)
    up.add_argument("--cluster-port", type=int, default=25672)
    up.add_argument("--data-dir", type=Path, default=Path("./haremq-data"))
    up.add_argument("--bind", default="127.0.0.1")
    up.add_argument("--management-port", type=int, default=15672)
    up.add_argument("--prometheus-port", type=int, default=15692)
    args = parser.parse_args(argv)
    names = [f"hare{i}" for i in range(1, args.nodes + 1)]
    ports = {n: (args.amqp_port + i, args.cluster_port + i) for i, n in enumerate(names)}
    http = {n: (args.management_port + i if args.management_port else 0,
                args.prometheus_port + i if args.prometheus_port else 0) for i, n in enumerate(names)}
    procs = []
    for name in names:
        amqp, cport = ports[name]
        cmd = [sys.executable, "-m", "haremq.cluster.cli", "node", "--name", name, "--data-dir", str(args.data_dir / name),
               "--amqp-port", str(amqp), "--cluster-port", str(cport), "--bind", args.bind,
               "--management-port", str(http[name][0]), "--prometheus-port", str(http[name][1])]
        for other in names:
            if other != name:
                cmd += ["--peer", f"{other}={args.bind}:{ports[other][1]}"]
        procs.append(subprocess.Popen(cmd, start_new_session=True))  # noqa: S603 - this Python, our own flags
        web = f"  http://{args.bind}:{http[name][0]}/" if http[name][0] else ""
        metrics = f"  metrics :{http[name][1]}/metrics" if http[name][1] else ""
        print(f"{name}: amqp://guest:guest@{args.bind}:{amqp}/  cluster port {cport}{web}{metrics}  "
              f"pid {procs[-1].pid}", flush=True)
    print(f"watch it: haremq ctl --node {args.bind}:{args.cluster_port} watch   (Ctrl-C stops the cluster)",
          flush=True)
    stopping = []

    def stop(*_):
        stopping.append(True)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    try:
        while not stopping:
            time.sleep(0.5)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
    return 0
