"""Plain-HTTP helpers for the management API tests (urllib: nothing HareMQ-specific)."""
from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request

from tests.conftest import HOST, Node, free_port


def q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def http(method: str, port: int, path: str, body=None, user=("guest", "guest"), host: str = HOST,
         raw: bool = False, timeout: float = 20.0, headers: dict | None = None):
    """(status, decoded JSON or text, headers). A body goes as application/json unless `headers`
    names another Content-Type."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    request = urllib.request.Request(f"http://{host}:{port}{path}", data=data, method=method)
    if user is not None:
        token = base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
        request.add_header("Authorization", "Basic " + token)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, text, headers = response.status, response.read().decode(errors="replace"), response.headers
    except urllib.error.HTTPError as exc:
        status, text, headers = exc.code, exc.read().decode(errors="replace"), exc.headers
    if raw or not text.strip():
        return status, text, headers
    try:
        return status, json.loads(text), headers
    except ValueError:
        return status, text, headers


class ManagedNode(Node):
    """A `haremq node` with the management API and /metrics on free ports."""

    def __init__(self, name, workdir, extra: list[str] | None = None):
        super().__init__(name, workdir)
        self.management_port = free_port()
        self.prometheus_port = free_port()
        self.extra = list(extra or [])

    def argv(self):
        return super().argv() + ["--management-port", str(self.management_port),
                                 "--prometheus-port", str(self.prometheus_port), *self.extra]

    def api(self, method: str, path: str, body=None, **kw):
        return http(method, self.management_port, path, body, **kw)

    def metrics(self, path: str = "/metrics") -> str:
        status, text, _ = http("GET", self.prometheus_port, path, user=None, raw=True)
        assert status == 200, text
        return text


def with_management(member):
    """Give a tests.clusters.ClusterMember the management API and /metrics on free ports."""
    member.management_port = free_port()
    member.prometheus_port = free_port()
    member.extra_args += ["--management-port", str(member.management_port),
                          "--prometheus-port", str(member.prometheus_port)]
    member.api = lambda method, path, body=None, **kw: http(method, member.management_port, path, body, **kw)
    return member
