"""gRPC channels and listeners between members: plain, or mutual TLS when certificates are set.

With TLS each side presents a certificate signed by the cluster's CA and
checks the other's, so only members (and operators holding a certificate)
can talk to a node at all; the cluster secret is checked on top.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc


@dataclass(frozen=True)
class TLSFiles:
    cert: bytes
    key: bytes
    ca: bytes

    @classmethod
    def load(cls, cert: Path | None, key: Path | None, ca: Path | None) -> "TLSFiles | None":
        given = [p for p in (cert, key, ca) if p]
        if not given:
            return None
        if len(given) != 3:
            raise ValueError("cluster TLS needs a certificate, its key and the CA certificate")
        return cls(Path(cert).read_bytes(), Path(key).read_bytes(), Path(ca).read_bytes())


def listen(server: grpc.aio.Server, address: str, tls: TLSFiles | None) -> int:
    if tls is None:
        return server.add_insecure_port(address)
    credentials = grpc.ssl_server_credentials([(tls.key, tls.cert)], root_certificates=tls.ca,
                                              require_client_auth=True)
    return server.add_secure_port(address, credentials)


def channel(address: str, tls: TLSFiles | None, options=()) -> grpc.aio.Channel:
    if tls is None:
        return grpc.aio.insecure_channel(address, options=list(options))
    credentials = grpc.ssl_channel_credentials(root_certificates=tls.ca, private_key=tls.key,
                                               certificate_chain=tls.cert)
    return grpc.aio.secure_channel(address, credentials, options=list(options))
