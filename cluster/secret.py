"""The cluster secret: every inter-node call carries it, calls without it are refused.

A deployment passes the same file to every node (`--cluster-secret-file`);
on one host the user's default file is shared by all nodes and `haremq ctl`.
"""
from __future__ import annotations

import hmac
import os
import secrets
import time
from pathlib import Path

import grpc

METADATA_KEY = "x-haremq-secret"


DEFAULT_PATH = Path.home() / ".haremq" / "cluster-secret"


def resolve(path: Path | str | None = None) -> str:
    """The secret from --cluster-secret-file, $HAREMQ_CLUSTER_SECRET(_FILE), or the user's default file.

    Like RabbitMQ's Erlang cookie, the default file (~/.haremq/cluster-secret) is
    created on first use, so nodes and `haremq ctl` run by one user on one host
    share it without configuration.
    """
    if path is None and os.environ.get("HAREMQ_CLUSTER_SECRET"):
        return os.environ["HAREMQ_CLUSTER_SECRET"].strip()
    if path is None and os.environ.get("HAREMQ_CLUSTER_SECRET_FILE"):
        path = os.environ["HAREMQ_CLUSTER_SECRET_FILE"]
    if path is not None:
        text = Path(path).read_text().strip()
        if not text:
            raise ValueError(f"cluster secret file {path} is empty")
        return text
    return _default_file(DEFAULT_PATH)


def _default_file(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        for _ in range(50):      # another process may be writing it right now
            text = path.read_text().strip()
            if text:
                return text
            time.sleep(0.02)
        raise ValueError(f"cluster secret file {path} is empty") from None
    value = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as fh:
        fh.write(value + "\n")
    return value


class SecretCheck(grpc.aio.ServerInterceptor):
    """Refuse every call whose metadata lacks the cluster secret."""

    def __init__(self, secret: str):
        self._secret = secret.encode()

        async def refuse(request, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "cluster secret missing or wrong")

        self._refuse_unary = grpc.unary_unary_rpc_method_handler(refuse)

        async def refuse_stream(request_iterator, context):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "cluster secret missing or wrong")
            yield  # pragma: no cover

        self._refuse_stream = grpc.stream_stream_rpc_method_handler(refuse_stream)

    async def intercept_service(self, continuation, handler_call_details):
        for key, value in handler_call_details.invocation_metadata or ():
            if key == METADATA_KEY:
                given = value.encode() if isinstance(value, str) else value
                if hmac.compare_digest(given, self._secret):
                    return await continuation(handler_call_details)
        if handler_call_details.method.endswith("QueueSession"):
            return self._refuse_stream
        return self._refuse_unary


def call_metadata(secret: str) -> tuple[tuple[str, str], ...]:
    return ((METADATA_KEY, secret),)
