"""The management API's answers and refusals: RabbitMQ's error bodies and status codes, and the
check that keeps another site's page from changing anything through a browser."""
from __future__ import annotations

import json

import yarl
from aiohttp import web


class HTTPError(Exception):
    def __init__(self, status: int, kind: str, reason: str):
        super().__init__(reason)
        self.status, self.kind, self.reason = status, kind, reason


SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def refuse_forgery(request: web.Request) -> None:
    """What a browser can be made to send by another site's page must not change anything.

    A page elsewhere can post an HTML form (`text/plain`, `multipart/form-data` or
    `application/x-www-form-urlencoded`, no preflight) to the API, and the browser adds the
    basic auth it has cached for it. So a request that changes state (every method but GET
    and HEAD) with a body, and every POST, must say `Content-Type: application/json` (415
    otherwise), which a form cannot send and a script on another origin can send only after a
    CORS preflight that the API never grants. A PUT or DELETE without a body needs none (as
    `curl -X PUT .../api/vhosts/v` in RabbitMQ's guides): only a script can send those methods,
    and only after that preflight. And a request that names its page's origin (`Origin`,
    which browsers send on every such request) is taken only from the API's own origin, the
    scheme, host and port it was asked on (403).

    A request that a browser says comes from the API's own origin may send its JSON under
    another type: only a page served by the API's origin can send it, and RabbitMQ's own
    management UI (served there, e.g. behind a proxy) posts its publish and get requests
    without a Content-Type, which the browser sends as text/plain."""
    origin = request.headers.get("Origin")
    if origin is not None and not same_origin(origin, request):
        raise HTTPError(403, "forbidden", f"cross-origin request refused: Origin {origin[:200]} "
                        f"is not this API's {request.scheme}://{request.host}")
    if request.method in ("PUT", "DELETE") and not request.body_exists:
        return
    if origin is not None:
        return
    if request.content_type != "application/json":
        given = request.headers.get("Content-Type", "none")[:100]
        raise HTTPError(415, "unsupported_media_type",
                        f"Content-Type must be application/json (was {given})")


def same_origin(origin: str, request: web.Request) -> bool:
    """`Origin` is scheme://host[:port] of the page; the API's own is the scheme and Host it was
    asked with (a proxy that ends TLS in front of it says X-Forwarded-Proto: https)."""
    try:
        given = yarl.URL(origin.strip())
        own_host = yarl.URL(f"http://{request.host}")
    except ValueError:
        return False
    if not given.is_absolute() or given.path not in ("", "/") or given.user is not None:
        return False
    schemes = {request.scheme, request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()}
    scheme = given.scheme.lower()
    if scheme not in schemes - {""}:
        return False
    own_port = own_host.explicit_port or yarl.URL(f"{scheme}://x").port
    return (given.host or "").lower() == (own_host.host or "").lower() and given.port == own_port


def not_found() -> HTTPError:
    return HTTPError(404, "Object Not Found", "Not Found")


def bad_request(reason: str) -> HTTPError:
    return HTTPError(400, "bad_request", reason)


def no_content() -> web.Response:
    return web.Response(status=204)


def created() -> web.Response:
    return web.Response(status=201)


def as_json(data, status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(data), content_type="application/json")
