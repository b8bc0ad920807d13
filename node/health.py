"""`haremq health`: exit 0 when the node answers the AMQP handshake (and its cluster port).

For Docker HEALTHCHECK and Kubernetes probes: it speaks the first step of
AMQP (protocol header in, connection.start out) rather than only opening a
TCP connection, so a wedged node fails the check.
"""
from __future__ import annotations

import argparse
import socket
import sys


def amqp_answers(host: str, port: int, timeout: float) -> bool:
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(b"AMQP\x00\x00\x09\x01")
        data = sock.recv(7)
        return len(data) == 7 and data[0] == 1   # a method frame: connection.start


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="haremq health")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--amqp-port", type=int, default=5672)
    parser.add_argument("--cluster-port", type=int)
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args(argv)
    try:
        if not amqp_answers(args.host, args.amqp_port, args.timeout):
            print(f"haremq health: {args.host}:{args.amqp_port} did not answer the AMQP handshake", file=sys.stderr)
            return 1
        if args.cluster_port:
            socket.create_connection((args.host, args.cluster_port), timeout=args.timeout).close()
    except OSError as exc:
        print(f"haremq health: {exc}", file=sys.stderr)
        return 1
    return 0
