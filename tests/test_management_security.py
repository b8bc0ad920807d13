"""The management API against a browser's tricks: a state change needs a JSON body
(a form can send none: 415) and, when a browser names the page it comes from (`Origin`),
that page must be the API's own (403). Plain HTTP (urllib) against one real node; the
cross-origin form post from a real browser is in tests/test_web_view.py."""
from __future__ import annotations

import json

import pytest

from tests.conftest import IS_REF, unique_name
from tests.management import ManagedNode, q

pytestmark = pytest.mark.skipif(IS_REF, reason="starts its own node with the management API")


@pytest.fixture(scope="module")
def mnode(tmp_path_factory):
    node = ManagedNode("hare-sec", tmp_path_factory.mktemp("sec")).start()
    yield node
    node.stop()


def _evil_definitions(name: str) -> bytes:
    return json.dumps({"users": [{"name": name, "password_hash": "", "tags": "administrator"}],
                       "permissions": [{"user": name, "vhost": "/", "configure": ".*", "write": ".*",
                                        "read": ".*"}]}).encode()


def _is_rabbitmq_error(body) -> bool:
    return isinstance(body, dict) and set(body) == {"error", "reason"} and all(
        isinstance(v, str) and v for v in body.values())


def test_definitions_posted_as_text_plain_are_refused(mnode):
    """The form-post shape of the attack: a JSON document sent as text/plain creates no
    administrator (RabbitMQ 3.10 answers this one 415 too)."""
    name = unique_name("evil")
    status, body, _ = mnode.api("POST", "/api/definitions", _evil_definitions(name),
                                headers={"Content-Type": "text/plain"})
    assert status == 415, (status, body)
    assert _is_rabbitmq_error(body), body
    assert mnode.api("GET", f"/api/users/{q(name)}")[0] == 404


def test_vhost_put_as_a_form_is_refused(mnode):
    """RabbitMQ 3.10 takes this one (201); HareMQ takes no form body on any route."""
    name = unique_name("formvhost")
    status, body, _ = mnode.api("PUT", f"/api/vhosts/{q(name)}", b"a=b",
                                headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert status == 415, (status, body)
    assert _is_rabbitmq_error(body), body
    assert mnode.api("GET", f"/api/vhosts/{q(name)}")[0] == 404


@pytest.mark.parametrize("content_type", ["text/plain", "multipart/form-data; boundary=x",
                                          "application/x-www-form-urlencoded", None])
def test_no_state_change_from_a_body_that_is_not_json(mnode, content_type):
    name = unique_name("notjson")
    headers = {"Content-Type": content_type} if content_type else {}
    for method, path, body in (("PUT", f"/api/users/{q(name)}", {"password": "pw", "tags": "administrator"}),
                               ("PUT", f"/api/queues/%2F/{q(name)}", {"durable": True}),
                               ("PUT", f"/api/policies/%2F/{q(name)}", {"pattern": ".*", "definition": {}}),
                               ("POST", "/api/definitions", {"vhosts": [{"name": name}]})):
        data = json.dumps(body).encode()
        if content_type is None:       # urllib adds a form Content-Type to any body: send none at all
            status = _without_content_type(mnode, method, path, data)
        else:
            status = mnode.api(method, path, data, headers=headers)[0]
        assert status == 415, (method, path, content_type, status)
    assert mnode.api("GET", f"/api/users/{q(name)}")[0] == 404
    assert mnode.api("GET", f"/api/queues/%2F/{q(name)}")[0] == 404
    assert mnode.api("GET", f"/api/policies/%2F/{q(name)}")[0] == 404
    assert mnode.api("GET", f"/api/vhosts/{q(name)}")[0] == 404


def _without_content_type(node, method: str, path: str, data: bytes) -> int:
    import base64
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", node.management_port, timeout=20)
    try:
        conn.putrequest(method, path)
        conn.putheader("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        conn.putheader("Content-Length", str(len(data)))
        conn.endheaders(data)
        return conn.getresponse().status
    finally:
        conn.close()


def test_json_bodies_and_bodiless_puts_and_deletes_still_work(mnode):
    name = unique_name("ok")
    status, _, _ = mnode.api("PUT", f"/api/vhosts/{q(name)}", {},
                             headers={"Content-Type": "application/json; charset=utf-8"})
    assert status == 201
    assert mnode.api("DELETE", f"/api/vhosts/{q(name)}")[0] == 204        # no body, no Content-Type
    assert mnode.api("PUT", f"/api/vhosts/{q(name)}")[0] == 201           # as RabbitMQ's guides do it
    assert mnode.api("DELETE", f"/api/vhosts/{q(name)}")[0] == 204
    # a POST without a body is what a script elsewhere can send without a preflight: refused
    assert mnode.api("PUT", f"/api/queues/%2F/{q(name)}", {"durable": False})[0] == 201
    assert mnode.api("POST", f"/api/bindings/%2F/e/amq.direct/q/{q(name)}")[0] == 415
    assert mnode.api("GET", f"/api/bindings/%2F/e/amq.direct/q/{q(name)}")[1] == []
    assert mnode.api("DELETE", f"/api/queues/%2F/{q(name)}")[0] == 204
    assert mnode.api("PUT", f"/api/queues/%2F/{q(name)}", {"durable": False})[0] == 201
    status, _, _ = mnode.api("DELETE", f"/api/queues/%2F/{q(name)}", {}, headers={"Content-Type": "text/plain"})
    assert status == 415, "a DELETE with a body that is not JSON"
    assert mnode.api("DELETE", f"/api/queues/%2F/{q(name)}")[0] == 204


def test_a_cross_origin_request_is_refused(mnode):
    """What a browser sends from another page: its Origin, which is not the API's."""
    name = unique_name("xorigin")
    own = f"http://127.0.0.1:{mnode.management_port}"
    for origin in ("http://127.0.0.1:8000", f"http://evil.example:{mnode.management_port}",
                   f"https://127.0.0.1:{mnode.management_port}", "null"):
        status, body, _ = mnode.api("PUT", f"/api/vhosts/{q(name)}", {}, headers={"Origin": origin})
        assert status == 403, (origin, status, body)
        assert _is_rabbitmq_error(body), body
        status, body, _ = mnode.api("DELETE", "/api/vhosts/%2F", headers={"Origin": origin})
        assert status == 403, (origin, status, body)
    assert mnode.api("GET", f"/api/vhosts/{q(name)}")[0] == 404
    assert mnode.api("GET", "/api/vhosts/%2F")[0] == 200
    # the API's own page (the web view) and tools that send no Origin go on as before
    assert mnode.api("PUT", f"/api/vhosts/{q(name)}", {}, headers={"Origin": own})[0] == 201
    assert mnode.api("GET", "/api/overview", headers={"Origin": "http://127.0.0.1:8000"})[0] == 200
    assert mnode.api("DELETE", f"/api/vhosts/{q(name)}")[0] == 204


# ---- the timeline and history of /api/haremq: by the user's vhosts ----------------------------------
@pytest.fixture
def inproc(tmp_path):
    from tests.conftest import free_port
    from tests.inprocess import InProcessNode
    with InProcessNode(tmp_path, management_port=free_port(), prometheus_port=0) as n:
        yield n


def _inproc_api(n, method, path, body=None, **kw):
    from tests.management import http
    return http(method, n.node.config.management_port, path, body, **kw)


def test_events_and_history_show_only_the_users_vhosts(inproc):
    n = inproc
    for vhost in ("team-a", "team-b"):
        assert _inproc_api(n, "PUT", f"/api/vhosts/{vhost}")[0] == 201
        assert _inproc_api(n, "PUT", f"/api/permissions/{vhost}/guest",
                           {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    for user, tags in (("alice", "management"), ("mona", "monitoring")):
        assert _inproc_api(n, "PUT", f"/api/users/{user}", {"password": "pw", "tags": tags})[0] == 201
    assert _inproc_api(n, "PUT", "/api/permissions/team-a/alice",
                       {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    sampler = n.node.management.sampler
    n.call(sampler.note, "failover", "queue 'payroll' in vhost 'team-b': master x -> y (epoch 2)",
           vhost="team-b", queue="payroll", old="x", new="y", epoch=2)
    n.call(sampler.note, "failover", "queue 'orders' in vhost 'team-a': master x -> y (epoch 2)",
           vhost="team-a", queue="orders", old="x", new="y", epoch=2)
    n.call(sampler.note, "member", "hare2 is down", node="hare2", state="down")
    for vhost, count in (("team-a", 3), ("team-b", 7)):
        assert _inproc_api(n, "PUT", f"/api/queues/{vhost}/q", {"durable": False})[0] == 201
        for i in range(count):
            body = {"routing_key": "q", "payload": str(i), "payload_encoding": "string", "properties": {}}
            assert _inproc_api(n, "POST", f"/api/exchanges/{vhost}/amq.default/publish", body)[1] == {"routed": True}
    n.call(sampler.sample)

    def texts(user):
        status, events, _ = _inproc_api(n, "GET", "/api/haremq/events", user=user)
        assert status == 200, events
        return " | ".join(e["text"] for e in events)
    assert "payroll" in texts(("guest", "guest")) and "hare2 is down" in texts(("guest", "guest"))
    assert "payroll" in texts(("mona", "pw"))          # monitoring sees every vhost, as in /api/queues
    seen = texts(("alice", "pw"))
    assert "orders" in seen and "payroll" not in seen, seen
    assert "hare2" not in seen, "cluster members are for monitoring users (as /api/nodes)"

    def last_sample(user):
        status, history, _ = _inproc_api(n, "GET", "/api/haremq/history", user=user)
        assert status == 200, history
        return history[-1]
    admin = last_sample(("guest", "guest"))
    assert admin["messages_ready"] == 10 and set(admin["vhosts"]) >= {"team-a", "team-b"}
    alice = last_sample(("alice", "pw"))
    assert alice["messages_ready"] == 3 and alice["publish"] == 3, alice
    assert set(alice["vhosts"]) == {"team-a"}, alice


# ---- bad input on every route: a 4xx with RabbitMQ's error body, never a 500 -----------------------
HUGE = 10 ** 30
BAD_REQUESTS = [
    # unknown vhost, queue, exchange, user, node, connection
    ("GET", "/api/queues/nope", None), ("GET", "/api/queues/nope/q", None), ("GET", "/api/queues/%2F/nope", None),
    ("GET", "/api/queues/nope/q/bindings", None), ("GET", "/api/exchanges/nope", None),
    ("GET", "/api/exchanges/nope/x", None), ("GET", "/api/exchanges/%2F/nope", None),
    ("GET", "/api/bindings/nope", None), ("GET", "/api/bindings/nope/e/a/q/b", None),
    ("GET", "/api/bindings/%2F/e/nope/q/nope", None), ("GET", "/api/consumers/nope", None),
    ("GET", "/api/policies/nope", None), ("GET", "/api/policies/nope/p", None), ("GET", "/api/policies/%2F/nope", None),
    ("GET", "/api/permissions/nope/guest", None), ("GET", "/api/permissions/%2F/nobody", None),
    ("GET", "/api/aliveness-test/nope", None), ("GET", "/api/vhosts/nope", None), ("GET", "/api/nodes/nope", None),
    ("GET", "/api/connections/nope", None), ("GET", "/api/users/nope", None),
    ("DELETE", "/api/queues/nope/q", None), ("DELETE", "/api/queues/%2F/nope", None),
    ("DELETE", "/api/queues/%2F/nope/contents", None), ("POST", "/api/queues/%2F/nope/get", {"count": 1}),
    ("DELETE", "/api/exchanges/nope/x", None), ("DELETE", "/api/exchanges/%2F/nope", None),
    ("POST", "/api/exchanges/nope/amq.direct/publish", {"routing_key": "k", "payload": "", "payload_encoding":
                                                          "string", "properties": {}}),
    ("POST", "/api/bindings/nope/e/amq.direct/q/q", {}),
    ("DELETE", "/api/bindings/%2F/e/amq.direct/q/bad.q/nope", None),
    ("DELETE", "/api/connections/nope", None), ("DELETE", "/api/users/nope", None),
    ("DELETE", "/api/vhosts/nope", None),
    ("DELETE", "/api/permissions/nope/guest", None), ("DELETE", "/api/policies/%2F/nope", None),
    ("DELETE", "/api/policies/nope/p", None), ("PUT", "/api/queues/nope/q", {}), ("PUT", "/api/exchanges/nope/x",
                                                                                   {"type": "direct"}),
    ("PUT", "/api/permissions/nope/guest", {"configure": ".*", "write": ".*", "read": ".*"}),
    ("PUT", "/api/permissions/%2F/nobody", {"configure": ".*", "write": ".*", "read": ".*"}),
    ("PUT", "/api/policies/nope/p", {"pattern": ".*", "definition": {}}),
    # bodies: not JSON, not an object
    ("PUT", "/api/queues/%2F/bad.q", b"{not json"), ("PUT", "/api/queues/%2F/bad.q", [1, 2]),
    ("PUT", "/api/queues/%2F/bad.q", "a string"), ("POST", "/api/definitions", 5),
    # queues: wrong types, huge numbers
    ("PUT", "/api/queues/%2F/bad.q", {"arguments": "x"}), ("PUT", "/api/queues/%2F/bad.q", {"arguments": [1]}),
    ("PUT", "/api/queues/%2F/bad.q", {"arguments": {"x-max-length": "lots"}}),
    ("PUT", "/api/queues/%2F/bad.q", {"arguments": {"x-max-length": HUGE}}),
    ("PUT", "/api/queues/%2F/bad.q", {"arguments": {"x-message-ttl": -1}}),
    ("PUT", "/api/queues/%2F/bad.q", {"arguments": {"x-max-priority": HUGE}}),
    ("PUT", "/api/queues/%2F/bad.q", {"durable": "yes"}), ("PUT", "/api/queues/%2F/bad.q", {"auto_delete": [1]}),
    ("PUT", "/api/queues/%2F/" + "q" * 300, {}),
    ("POST", "/api/queues/%2F/bad.q/get", {"count": "many"}), ("POST", "/api/queues/%2F/bad.q/get", {"count": HUGE}),
    ("POST", "/api/queues/%2F/bad.q/get", {"count": -1, "ackmode": 5}),
    ("POST", "/api/queues/%2F/bad.q/get", {"count": 1, "truncate": "x"}),
    ("POST", "/api/queues/%2F/bad.q/get", {"count": 1, "truncate": HUGE * -1}),
    ("POST", "/api/queues/%2F/bad.q/get", {"count": 1, "encoding": []}),
    ("POST", "/api/queues/%2F/bad.q/get", {"count": 1, "ackmode": "keep_it"}),
    # exchanges
    ("PUT", "/api/exchanges/%2F/bad.x", {}), ("PUT", "/api/exchanges/%2F/bad.x", {"type": 5}),
    ("PUT", "/api/exchanges/%2F/bad.x", {"type": "nope"}), ("PUT", "/api/exchanges/%2F/bad.x",
                                                            {"type": "direct", "arguments": "x"}),
    ("PUT", "/api/exchanges/%2F/bad.x", {"type": "direct", "internal": {"a": 1}}),
    # publish
    ("POST", "/api/exchanges/%2F/amq.default/publish", {}),
    ("POST", "/api/exchanges/%2F/amq.default/publish", {"routing_key": 5, "payload": "x", "payload_encoding":
                                                        "string", "properties": {}}),
    ("POST", "/api/exchanges/%2F/amq.default/publish", {"routing_key": "k", "payload": 5, "payload_encoding":
                                                        "base64", "properties": {}}),
    ("POST", "/api/exchanges/%2F/amq.default/publish", {"routing_key": "k", "payload": "!!", "payload_encoding":
                                                        "base64", "properties": {}}),
    ("POST", "/api/exchanges/%2F/amq.default/publish", {"routing_key": "k", "payload": "x", "payload_encoding":
                                                        "rot13", "properties": {}}),
    ("POST", "/api/exchanges/%2F/amq.default/publish", {"routing_key": "k", "payload": "x", "payload_encoding":
                                                        "string", "properties": "x"}),
    ("POST", "/api/exchanges/%2F/amq.default/publish", {"routing_key": "k", "payload": "x", "payload_encoding":
                                                        "string", "properties": {"delivery_mode": "x"}}),
    ("POST", "/api/exchanges/%2F/amq.default/publish", {"routing_key": "k", "payload": "x", "payload_encoding":
                                                        "string", "properties": {"priority": HUGE}}),
    ("POST", "/api/exchanges/%2F/amq.default/publish", {"routing_key": "k", "payload": "x", "payload_encoding":
                                                        "string", "properties": {"headers": "x"}}),
    ("POST", "/api/exchanges/%2F/amq.default/publish", {"routing_key": "k", "payload": "x", "payload_encoding":
                                                        "string", "properties": {"headers": {"n": HUGE}}}),
    ("POST", "/api/exchanges/%2F/amq.default/publish", {"routing_key": "k" * 300, "payload": "x",
                                                        "payload_encoding": "string", "properties": {}}),
    # bindings
    ("POST", "/api/bindings/%2F/e/amq.direct/q/bad.q", {"routing_key": 5}),
    ("POST", "/api/bindings/%2F/e/amq.direct/q/bad.q", {"arguments": "x"}),
    ("POST", "/api/bindings/%2F/e/amq.direct/q/bad.q", {"routing_key": "k" * 300}),
    ("POST", "/api/bindings/%2F/e/amq.direct/e/nope", {}),
    # users
    ("PUT", "/api/users/bad.user", {}), ("PUT", "/api/users/bad.user", {"password": ["x"]}),
    ("PUT", "/api/users/bad.user", {"password": "pw", "tags": {"a": 1}}),
    ("PUT", "/api/users/bad.user", {"password_hash": 5}), ("PUT", "/api/users/bad.user", {"password_hash": "!!"}),
    ("PUT", "/api/users/bad.user", {"password_hash": "", "hashing_algorithm": "rot13"}),
    # vhosts
    ("PUT", "/api/vhosts/" + "v" * 300, {}), ("PUT", "/api/vhosts/bad.v", {"tracing": "x", "description": 5}),
    # permissions
    ("PUT", "/api/permissions/%2F/guest", {}), ("PUT", "/api/permissions/%2F/guest",
                                                {"configure": 5, "write": ".*", "read": ".*"}),
    ("PUT", "/api/permissions/%2F/guest", {"configure": "(", "write": ".*", "read": ".*"}),
    # policies
    ("PUT", "/api/policies/%2F/bad.p", {}), ("PUT", "/api/policies/%2F/bad.p", {"pattern": ".*"}),
    ("PUT", "/api/policies/%2F/bad.p", {"pattern": "(", "definition": {"max-length": 1}}),
    ("PUT", "/api/policies/%2F/bad.p", {"pattern": 5, "definition": {"max-length": 1}}),
    ("PUT", "/api/policies/%2F/bad.p", {"pattern": ".*", "definition": "x"}),
    ("PUT", "/api/policies/%2F/bad.p", {"pattern": ".*", "definition": {"max-length": "x"}}),
    ("PUT", "/api/policies/%2F/bad.p", {"pattern": ".*", "definition": {"max-length": 1}, "priority": "high"}),
    ("PUT", "/api/policies/%2F/bad.p", {"pattern": ".*", "definition": {"max-length": 1}, "priority": HUGE}),
    ("PUT", "/api/policies/%2F/bad.p", {"pattern": ".*", "definition": {"max-length": 1}, "apply-to": "nope"}),
    # definitions
    ("POST", "/api/definitions", {"users": "x"}), ("POST", "/api/definitions", {"users": [5]}),
    ("POST", "/api/definitions", {"users": [{"name": 5, "password_hash": "", "tags": ""}]}),
    ("POST", "/api/definitions", {"vhosts": [{}]}), ("POST", "/api/definitions", {"vhosts": [{"name": 5}]}),
    ("POST", "/api/definitions", {"permissions": [{}]}),
    ("POST", "/api/definitions", {"queues": [{}]}), ("POST", "/api/definitions", {"queues": [{"name": 5}]}),
    ("POST", "/api/definitions", {"queues": [{"name": "bad.d", "vhost": "nope"}]}),
    ("POST", "/api/definitions", {"queues": [{"name": "bad.d", "arguments": {"x-max-length": HUGE}}]}),
    ("POST", "/api/definitions", {"exchanges": [{"name": "bad.dx", "type": 5}]}),
    ("POST", "/api/definitions", {"bindings": [{"source": "amq.direct", "destination": "nope"}]}),
    ("POST", "/api/definitions", {"policies": [{"name": "p"}]}),
    ("POST", "/api/definitions", {"policies": [{"name": "p", "pattern": ".*", "definition": {}, "priority": "x"}]}),
    ("POST", "/api/definitions", {"policies": [{"name": "p", "pattern": "(", "definition": {}}]}),
    ("POST", "/api/definitions", {"queues": "x"}),
]


@pytest.fixture(scope="module")
def bad_q(mnode):
    assert mnode.api("PUT", "/api/queues/%2F/bad.q", {"durable": False})[0] in (201, 204)
    yield "bad.q"


@pytest.mark.parametrize("method,path,body", BAD_REQUESTS,
                         ids=[f"{m} {p[:60]} {str(b)[:40]}" for m, p, b in BAD_REQUESTS])
def test_bad_input_is_a_4xx_with_rabbitmqs_error_body(mnode, bad_q, method, path, body):
    if isinstance(body, (bytes, str)) and not (isinstance(body, str) and body == "a string"):
        data = body if isinstance(body, bytes) else body.encode()
    else:
        data = None if body is None else json.dumps(body).encode()
    status, answer, _ = mnode.api(method, path, data)
    assert 400 <= status < 500, (status, answer)
    assert _is_rabbitmq_error(answer), answer
    assert status != 401 or method == "GET" and "nodes" in path, "bad input answered as a login failure"
