"""Another management UI's static files on a loopback port of their own, with `/api/` handed on
to a HareMQ node's management port: how an operator would put RabbitMQ's own UI in front of
HareMQ (a reverse proxy that keeps the browser's Host, so the API's same-origin check sees the
page's origin as its own).

A threading http.server: the UI makes synchronous XHRs while its page loads scripts and
templates, so one request must not wait for another."""
from __future__ import annotations

import http.client
import http.server
import threading
from functools import partial
from pathlib import Path

from tests.conftest import HOST, free_port

# hop-by-hop headers (RFC 9110 7.6.1) and the length, which the proxy sets itself
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
                        "trailer", "transfer-encoding", "upgrade", "content-length"})


class _Handler(http.server.SimpleHTTPRequestHandler):
    upstream: tuple[str, int] = (HOST, 0)

    def _api(self) -> bool:
        if not self.path.startswith("/api/"):
            return False
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        conn = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            conn.request(self.command, self.path, body=body, headers=headers)
            response = conn.getresponse()
            data = response.read()
        except OSError as exc:
            self.send_error(502, f"upstream: {exc}")
            return True
        finally:
            conn.close()
        self.send_response(response.status, response.reason)
        for name, value in response.getheaders():
            if name.lower() not in HOP_BY_HOP:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        return True

    def do_GET(self):  # noqa: N802 - http.server's names
        if not self._api():
            super().do_GET()

    def do_HEAD(self):  # noqa: N802
        if not self._api():
            super().do_HEAD()

    def do_PUT(self):  # noqa: N802
        if not self._api():
            self.send_error(405)

    do_POST = do_DELETE = do_PUT  # noqa: N815

    def log_message(self, *args):
        pass


class UIProxy:
    """`UIProxy(www, management_port).start()`; `.url` is the UI's address; `.stop()`."""

    def __init__(self, www: Path, management_port: int, host: str = HOST):
        handler = type("Handler", (_Handler,), {"upstream": (host, management_port)})
        self.server = http.server.ThreadingHTTPServer((HOST, free_port()), partial(handler, directory=str(www)))
        self.server.daemon_threads = True
        self.url = f"http://{HOST}:{self.server.server_address[1]}/"

    def start(self) -> UIProxy:
        threading.Thread(target=self.server.serve_forever, name="ui-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
