"""The cluster secret: every inter-node call carries it, calls without it are refused.

A deployment passes the same file to every node (`--cluster-secret-file`);
on one host the user's default file is shared by all nodes and `haremq ctl`.

A secret file may hold several secrets, one a line: a member sends the first
and accepts every one, so the secret can be rotated one member at a time
(README, "Security"). A node refuses to start a cluster with the public
example secret (deploy/cluster-secret.example) or with none, unless started
with `--insecure-cluster` (`check`).
"""
from __future__ import annotations

import hmac
import os
import secrets
import time
from pathlib import Path

import grpc

METADATA_KEY = "x-haremq-secret"
# deploy/cluster-secret.example: public, so never a secret (tests/test_cluster_secret.py checks the file)
EXAMPLE_SECRET = "haremq-example-cluster-secret-change-me-0123456789abcdef"  # noqa: S105 - public, refused
LOOPBACK = {"127.0.0.1", "::1", "localhost"}


DEFAULT_PATH = Path.home() / ".haremq" / "cluster-secret"


def resolve(path: Path | str | None = None, allow_empty: bool = False) -> str:
    """The secret from --cluster-secret-file, $HAREMQ_CLUSTER_SECRET(_FILE), or the user's default file.

    Like RabbitMQ's Erlang cookie, the default file (~/.haremq/cluster-secret) is
    created on first use, so nodes and `haremq ctl` run by one user on one host
    share it without configuration. `allow_empty` (a node: `check` then refuses it):
    an empty file, or $HAREMQ_CLUSTER_SECRET set but blank, is "" rather than an error
    or the default file.
    """
    environ = os.environ
    if path is None and "HAREMQ_CLUSTER_SECRET" in environ and \
            (environ["HAREMQ_CLUSTER_SECRET"].strip() or allow_empty):
        return _normal(environ["HAREMQ_CLUSTER_SECRET"])
    if path is None and environ.get("HAREMQ_CLUSTER_SECRET_FILE"):
        path = environ["HAREMQ_CLUSTER_SECRET_FILE"]
    if path is not None:
        text = _normal(Path(path).read_text())
        if not text and not allow_empty:
            raise ValueError(f"cluster secret file {path} is empty")
        return text
    return _default_file(DEFAULT_PATH)


def _normal(text: str) -> str:
    """One secret a line, blank lines and surrounding spaces dropped."""
    return "\n".join(line.strip() for line in text.splitlines() if line.strip())


def secrets_of(secret: str) -> list[str]:
    """Every secret a member accepts; the first is the one it sends."""
    return [line.strip() for line in secret.splitlines() if line.strip()] or [""]


def check(secret: str, tls: bool, insecure: bool, bind: str) -> tuple[str | None, str | None]:
    """(why a node must not start a cluster with this secret, what to warn about), either None.

    Refused: no secret, or the public example among those accepted, unless `insecure`
    (--insecure-cluster, for tests and trials). Without TLS the secret and everything the
    members say travel in clear: a warning, unless the cluster port is on loopback only
    (as RabbitMQ, which clusters over plain Erlang distribution unless told otherwise)."""
    accepted = secrets_of(secret)
    problem = None
    if not any(accepted):
        problem = "no cluster secret"
    elif EXAMPLE_SECRET in accepted:
        problem = "the cluster secret is the public example (deploy/cluster-secret.example)"
    if problem and not insecure:
        return (f"{problem}: refusing to start a cluster; generate one (openssl rand -hex 32 > FILE, "
                "then --cluster-secret-file FILE on every member) or pass --insecure-cluster for a test"), None
    if insecure:
        return None, (f"--insecure-cluster: {problem or 'started as a test cluster'}; anyone who can reach the "
                      "cluster port with this secret can run every `haremq ctl` command")
    if not tls and bind not in LOOPBACK:
        return None, ("the cluster port has no TLS: the cluster secret and all traffic between members "
                      "travel in clear (--cluster-tls-cert, --cluster-tls-key, --cluster-tls-ca; README, Security)")
    return None, None


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
        self._secrets = [s.encode() for s in secrets_of(secret)]

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
                # every accepted secret is compared, so the time taken does not say which matched
                if sum(hmac.compare_digest(given, s) for s in self._secrets):
                    return await continuation(handler_call_details)
        if handler_call_details.method.endswith("QueueSession"):
            return self._refuse_stream
        return self._refuse_unary


def call_metadata(secret: str) -> tuple[tuple[str, str], ...]:
    return ((METADATA_KEY, secrets_of(secret)[0]),)
