"""TLS for AMQP (amqps): the server's ssl.SSLContext from certificate files.

    haremq node --tls-port 5671 --tls-cert server.pem --tls-key server.key \\
                [--tls-ca ca.pem] [--tls-verify-peer]

Like RabbitMQ's `ssl_options`: TLS 1.2 or newer; `--tls-ca` names the CAs
client certificates are checked against; `--tls-verify-peer` asks every
client for a certificate signed by them and refuses the handshake without
one (RabbitMQ's verify_peer with fail_if_no_peer_cert=true). Without it a
client certificate is not requested.
"""
from __future__ import annotations

import ssl
from pathlib import Path


class TLSConfigError(ValueError):
    """The certificate, key or CA files cannot be used; one line for the operator."""


def server_context(cert: Path | str, key: Path | str, ca: Path | str | None = None,
                   verify_peer: bool = False) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(f"cannot load TLS certificate {cert} / key {key}: {exc}") from None
    if ca is not None:
        try:
            context.load_verify_locations(cafile=str(ca))
        except (OSError, ssl.SSLError) as exc:
            raise TLSConfigError(f"cannot load TLS CA file {ca}: {exc}") from None
    if verify_peer:
        if ca is None:
            raise TLSConfigError("--tls-verify-peer needs --tls-ca to check client certificates against")
        context.verify_mode = ssl.CERT_REQUIRED
    return context
