"""`haremq ctl`'s side of a node's cluster port: one Control call, with the cluster secret
and, when the cluster port uses TLS, the operator's certificate.

The command line (node/ctl.py) gets it from the `haremq` command (cluster/cli.py)
and sees only its answer and built-in exceptions, so it never imports the cluster.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import grpc

from haremq.cluster import secret as cluster_secret
from haremq.cluster import transport
from haremq.cluster.rpc import cluster_pb2 as pb
from haremq.cluster.rpc import cluster_pb2_grpc as pbg
from haremq.cluster.secret import call_metadata


class ControlClient:
    def __init__(self, secret: str, tls: transport.TLSFiles | None = None):
        self.secret = secret
        self.tls = tls

    @classmethod
    def load(cls, secret_file: Path | None, tls_cert: Path | None, tls_key: Path | None,
             tls_ca: Path | None) -> "ControlClient":
        """From the operator's files (the secret's default lookup when none is named; the
        certificate, key and CA from HAREMQ_CLUSTER_TLS_CERT, _KEY and _CA, as a node reads
        them, when none is named); OSError or ValueError when one cannot be read."""
        if not (tls_cert or tls_key or tls_ca):
            tls_cert, tls_key, tls_ca = (os.environ.get(f"HAREMQ_CLUSTER_TLS_{part}") or None
                                         for part in ("CERT", "KEY", "CA"))
        tls = transport.TLSFiles.load(tls_cert, tls_key, tls_ca)
        return cls(cluster_secret.resolve(secret_file), tls)

    async def call(self, node: str, command: str, arguments: dict, timeout: float) -> tuple[bool, object]:
        """(True, the decoded result) or (False, the node's error text). When no answer came:
        PermissionError (the secret was refused), TimeoutError, ConnectionError (the node is
        unreachable) or OSError (another gRPC status, named in the message)."""
        async with transport.channel(node, self.tls) as channel:
            stub = pbg.ClusterStub(channel)
            try:
                reply = await stub.Control(pb.ControlRequest(command=command,
                                                             arguments=json.dumps(arguments).encode()),
                                           timeout=timeout, metadata=call_metadata(self.secret))
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.UNAUTHENTICATED:
                    raise PermissionError(f"{node} refused the cluster secret") from None
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise TimeoutError(f"{node} did not answer within {timeout:g}s") from None
                if code == grpc.StatusCode.UNAVAILABLE:
                    raise ConnectionError(f"cannot reach {node}: unavailable") from None
                raise OSError(f"cannot reach {node}: {code.name.lower()}") from None
        if not reply.ok:
            return False, reply.error
        return True, json.loads(reply.result) if reply.result else None
