"""The same management API calls against HareMQ and a reference RabbitMQ 3.10 with its management
plugin: the status codes, error bodies and the fields tools read must be the same.

Runs only with HAREMQ_TEST_REF_MGMT_PORT set to the reference's management port (guest/guest
from loopback), e.g. a node from ../shared/bench/rabbitmq_ref.sh with rabbitmq_management on."""
from __future__ import annotations

import os
import time

import pytest

from tests.conftest import unique_name
from tests.management import ManagedNode, http, q

REF_MGMT = os.environ.get("HAREMQ_TEST_REF_MGMT_PORT")
pytestmark = pytest.mark.skipif(not REF_MGMT, reason="set HAREMQ_TEST_REF_MGMT_PORT to a RabbitMQ management port")

QUEUE_FIELDS = ("name", "vhost", "durable", "auto_delete", "exclusive", "arguments", "messages", "messages_ready",
                "messages_unacknowledged", "consumers", "state", "type", "policy")


@pytest.fixture(scope="module")
def hare(tmp_path_factory):
    node = ManagedNode("hare-ref-compare", tmp_path_factory.mktemp("refcmp")).start()
    yield node
    node.stop()


def both(hare, method, path, body=None, **kw):
    return (http(method, hare.management_port, path, body, **kw)[:2],
            http(method, int(REF_MGMT), path, body, **kw)[:2])


def same(hare, method, path, body=None, **kw):
    mine, theirs = both(hare, method, path, body, **kw)
    assert mine == theirs, f"{method} {path}: HareMQ {mine} RabbitMQ {theirs}"
    return mine


def same_status(hare, method, path, body=None, **kw):
    mine, theirs = both(hare, method, path, body, **kw)
    assert mine[0] == theirs[0], f"{method} {path}: HareMQ {mine} RabbitMQ {theirs}"
    return mine, theirs


def test_queue_calls_answer_as_rabbitmq(hare):
    name = unique_name("refq")
    path = f"/api/queues/%2F/{q(name)}"
    same(hare, "PUT", path, {"durable": True, "auto_delete": False, "arguments": {"x-max-length": 10}})
    same(hare, "PUT", path, {"durable": True, "arguments": {"x-max-length": 10}})
    same(hare, "PUT", path, {"durable": False, "arguments": {"x-max-length": 10}})       # 400 inequivalent
    for i in range(3):
        same(hare, "POST", "/api/exchanges/%2F/amq.default/publish",
             {"properties": {"delivery_mode": 2, "headers": {"n": i}}, "routing_key": name, "payload": f"m{i}",
              "payload_encoding": "string"})
    same(hare, "POST", "/api/exchanges/%2F/amq.default/publish",
         {"properties": {}, "routing_key": "nowhere." + name, "payload": "x", "payload_encoding": "string"})
    deadline = time.time() + 15      # RabbitMQ's counts lag behind by its stats interval
    while True:
        (s1, mine), (s2, theirs) = both(hare, "GET", path)
        if mine.get("messages") == theirs.get("messages") == 3 or time.time() > deadline:
            break
        time.sleep(0.5)
    assert s1 == s2 == 200
    assert {k: mine.get(k) for k in QUEUE_FIELDS} == {k: theirs.get(k) for k in QUEUE_FIELDS}
    same(hare, "POST", path + "/get", {"count": 2, "ackmode": "ack_requeue_true", "encoding": "auto",
                                       "truncate": 50000})
    same(hare, "POST", path + "/get", {"count": 1, "ackmode": "ack_requeue_false", "encoding": "base64"})
    same(hare, "DELETE", path + "/contents")
    same(hare, "DELETE", path + "?if-empty=true")
    same(hare, "GET", path)                                   # 404 Object Not Found
    same(hare, "DELETE", path)
    same(hare, "GET", "/api/queues/no-such-vhost")


def test_exchanges_and_bindings_answer_as_rabbitmq(hare):
    exchange, queue = unique_name("refx"), unique_name("refbq")
    same(hare, "PUT", f"/api/queues/%2F/{q(queue)}", {"durable": False})
    same(hare, "PUT", f"/api/exchanges/%2F/{q(exchange)}", {"type": "topic", "durable": True})
    mine = http("POST", hare.management_port, f"/api/bindings/%2F/e/{q(exchange)}/q/{q(queue)}",
                {"routing_key": "a.#", "arguments": {}})
    theirs = http("POST", int(REF_MGMT), f"/api/bindings/%2F/e/{q(exchange)}/q/{q(queue)}",
                  {"routing_key": "a.#", "arguments": {}})
    assert (mine[0], mine[2]["Location"]) == (theirs[0], theirs[2]["Location"])
    same(hare, "GET", f"/api/bindings/%2F/e/{q(exchange)}/q/{q(queue)}")
    same(hare, "POST", f"/api/exchanges/%2F/{q(exchange)}/publish",
         {"properties": {}, "routing_key": "a.b", "payload": "hi", "payload_encoding": "string"})
    same(hare, "DELETE", f"/api/bindings/%2F/e/{q(exchange)}/q/{q(queue)}/a.%23")
    same(hare, "DELETE", f"/api/exchanges/%2F/{q(exchange)}")
    same(hare, "GET", f"/api/exchanges/%2F/{q(exchange)}")
    same(hare, "DELETE", f"/api/queues/%2F/{q(queue)}")


def test_auth_health_and_accounts_answer_as_rabbitmq(hare):
    same(hare, "GET", "/api/overview", user=("guest", "wrong"))
    user = unique_name("refuser")
    same(hare, "PUT", f"/api/users/{user}", {"password": "pw", "tags": ""})
    same(hare, "GET", "/api/overview", user=(user, "pw"))
    same(hare, "PUT", f"/api/users/{user}", {"password": "pw", "tags": "management"})
    same(hare, "GET", "/api/users", user=(user, "pw"))
    same(hare, "GET", "/api/nodes", user=(user, "pw"))
    same(hare, "PUT", f"/api/permissions/%2F/{user}", {"configure": "^x", "write": ".*", "read": ".*"})
    same(hare, "GET", f"/api/permissions/%2F/{user}")
    same(hare, "DELETE", f"/api/users/{user}")
    same(hare, "DELETE", f"/api/users/{user}")
    vhost = unique_name("refvh")
    same(hare, "PUT", f"/api/vhosts/{vhost}")
    same(hare, "PUT", f"/api/vhosts/{vhost}")
    same(hare, "DELETE", f"/api/vhosts/{vhost}")
    same(hare, "GET", f"/api/vhosts/{vhost}")
    policy = unique_name("refpol")
    same(hare, "PUT", f"/api/policies/%2F/{policy}", {"pattern": "^zz", "definition": {"max-length": 3},
                                                       "apply-to": "queues", "priority": 2})
    same(hare, "GET", f"/api/policies/%2F/{policy}")
    same_status(hare, "PUT", f"/api/policies/%2F/{policy}", {"pattern": "^zz", "definition": {"bogus": 1}})
    same(hare, "DELETE", f"/api/policies/%2F/{policy}")
    same(hare, "DELETE", f"/api/policies/%2F/{policy}")
    same(hare, "GET", "/api/aliveness-test/%2F")
    same(hare, "GET", "/api/aliveness-test/no-such-vhost")
    same(hare, "GET", "/api/health/checks/alarms")
    same(hare, "GET", "/api/health/checks/local-alarms")
    (_, mine), (_, theirs) = both(hare, "GET", "/api/definitions")
    assert set(theirs) - {"global_parameters", "parameters", "topic_permissions"} <= set(mine)
