"""The management HTTP API and /metrics of one real node, driven over plain HTTP (urllib) with
pika for the data: RabbitMQ's paths, JSON names, status codes and 401 bodies."""
from __future__ import annotations

import socket

import pika
import pytest

from tests.conftest import IS_REF, free_port, pika_conn, unique_name, wait_until
from tests.management import ManagedNode, http, q

pytestmark = pytest.mark.skipif(IS_REF, reason="starts its own node with the management API")


@pytest.fixture(scope="module")
def mnode(tmp_path_factory):
    node = ManagedNode("hare-mgmt", tmp_path_factory.mktemp("mgmt")).start()
    yield node
    node.stop()


def _publish(node, queue, bodies, persistent=True):
    c = pika_conn(node)
    ch = c.channel()
    ch.confirm_delivery()
    for body in bodies:
        ch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2 if persistent else 1))
    c.close()


def _queue(node, name, vhost="/"):
    status, data, _ = node.api("GET", f"/api/queues/{q(vhost)}/{q(name)}")
    assert status == 200, (status, data)
    return data


def _user(node, name, tags, vhost_permissions=True):
    assert node.api("PUT", f"/api/users/{q(name)}", {"password": "pw", "tags": tags})[0] == 201
    if vhost_permissions:
        assert node.api("PUT", f"/api/permissions/%2F/{q(name)}",
                        {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201


# ---- auth -------------------------------------------------------------------------------------------
def test_wrong_password_and_missing_credentials_are_401_with_rabbitmq_bodies(mnode):
    """Only a request without credentials is challenged (`WWW-Authenticate`, which makes a
    browser show its own password dialog), as RabbitMQ decides it: a UI's sign-in with a wrong
    password gets the 401 alone and shows its own message."""
    status, body, headers = mnode.api("GET", "/api/overview", user=("guest", "nope"))
    assert status == 401 and body == {"error": "not_authorized", "reason": "Login failed"}
    assert "WWW-Authenticate" not in headers
    status, body, headers = mnode.api("GET", "/api/overview", user=None)
    assert status == 401 and body["reason"] == "Login failed"
    assert headers["WWW-Authenticate"].startswith("Basic")
    assert mnode.api("GET", "/api/queues", user=("nobody", "x"))[0] == 401


def test_tags_decide_what_a_user_may_do(mnode):
    untagged, manager, monitor = unique_name("u"), unique_name("mg"), unique_name("mon")
    _user(mnode, untagged, "")
    _user(mnode, manager, "management")
    _user(mnode, monitor, "monitoring")
    status, body, _ = mnode.api("GET", "/api/overview", user=(untagged, "pw"))
    assert (status, body) == (401, {"error": "not_authorised", "reason": "Not management user"})
    assert mnode.api("GET", "/api/overview", user=(manager, "pw"))[0] == 200
    status, body, _ = mnode.api("GET", "/api/users", user=(manager, "pw"))
    assert (status, body["reason"]) == (401, "Not administrator user")
    status, body, _ = mnode.api("GET", "/api/nodes", user=(manager, "pw"))
    assert (status, body["reason"]) == (401, "Not monitor user")
    status, nodes, _ = mnode.api("GET", "/api/nodes", user=(monitor, "pw"))
    assert status == 200 and nodes[0]["name"] == "hare-mgmt" and nodes[0]["running"] is True
    assert mnode.api("GET", "/api/users", user=(monitor, "pw"))[0] == 401
    status, body, _ = mnode.api("PUT", "/api/policies/%2F/p", {"pattern": ".*", "definition": {"max-length": 1}},
                                user=(manager, "pw"))
    assert (status, body["reason"]) == (401, "Not policymaker user")


def test_amqp_permissions_apply_to_api_actions(mnode):
    """A management user acts with its own AMQP permissions (configure on the queue name)."""
    name = unique_name("limited")
    assert mnode.api("PUT", f"/api/users/{name}", {"password": "pw", "tags": "management"})[0] == 201
    assert mnode.api("PUT", f"/api/permissions/%2F/{name}",
                     {"configure": "^mine\\.", "write": ".*", "read": ".*"})[0] == 201
    status, body, _ = mnode.api("PUT", "/api/queues/%2F/other.q", {"durable": True}, user=(name, "pw"))
    assert status == 401
    assert body["reason"] == f"access to queue 'other.q' in vhost '/' refused for user '{name}'"
    queue = "mine." + unique_name("q")
    assert mnode.api("PUT", f"/api/queues/%2F/{q(queue)}", {"durable": False}, user=(name, "pw"))[0] == 201
    assert mnode.api("DELETE", f"/api/queues/%2F/{q(queue)}", user=(name, "pw"))[0] == 204


def _non_loopback_address() -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            address = s.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_guest_only_from_loopback(tmp_path):
    address = _non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    node = ManagedNode("hare-remote", tmp_path)
    base = node.argv
    node.argv = lambda: [a if a != "127.0.0.1" else "0.0.0.0" for a in base()]
    node.start()
    try:
        assert http("GET", node.management_port, "/api/overview", host="127.0.0.1")[0] == 200
        status, body, _ = http("GET", node.management_port, "/api/overview", host=address)
        assert (status, body["reason"]) == (401, "Login failed")
        assert node.api("PUT", "/api/users/remote-admin", {"password": "pw", "tags": "administrator"})[0] == 201
        assert http("GET", node.management_port, "/api/overview", host=address, user=("remote-admin", "pw"))[0] == 200
    finally:
        node.stop()


# ---- queues -----------------------------------------------------------------------------------------
def test_declare_publish_count_get_purge_delete(mnode):
    name = unique_name("api")
    path = f"/api/queues/%2F/{q(name)}"
    assert mnode.api("PUT", path, {"durable": True, "auto_delete": False, "arguments": {"x-max-length": 100}})[0] == 201
    assert mnode.api("PUT", path, {"durable": True, "arguments": {"x-max-length": 100}})[0] == 204
    status, body, _ = mnode.api("PUT", path, {"durable": False})
    assert status == 400 and body["error"] == "bad_request"
    assert body["reason"] == (f"inequivalent arg 'durable' for queue '{name}' in vhost '/': "
                              "received 'false' but current is 'true'")
    _publish(mnode, name, [b"m0", b"m1", b"\xff\xfe", b"m3"])
    row = wait_until(lambda: (lambda r: r if r["messages"] == 4 else None)(_queue(mnode, name)), 10)
    assert row["durable"] is True and row["node"] == "hare-mgmt" and row["state"] == "running"
    assert row["messages_ready"] == 4 and row["messages_unacknowledged"] == 0 and row["consumers"] == 0
    assert row["arguments"] == {"x-max-length": 100} and row["message_stats"]["publish"] == 4
    assert any(r["name"] == name for r in mnode.api("GET", "/api/queues")[1])
    assert any(r["name"] == name for r in mnode.api("GET", "/api/queues/%2F")[1])

    status, got, _ = mnode.api("POST", path + "/get", {"count": 3, "ackmode": "ack_requeue_true",
                                                       "encoding": "auto", "truncate": 50000})
    assert status == 200 and [m["payload"] for m in got[:2]] == ["m0", "m1"]
    assert got[0] == {"payload_bytes": 2, "redelivered": False, "exchange": "", "routing_key": name,
                      "message_count": 3, "properties": {"delivery_mode": 2}, "payload": "m0",
                      "payload_encoding": "string"}
    assert got[2]["payload_encoding"] == "base64" and got[2]["payload"] == "//4="
    # requeued at their places, redelivered
    status, again, _ = mnode.api("POST", path + "/get", {"count": 1, "ackmode": "ack_requeue_false",
                                                         "encoding": "auto"})
    assert again[0]["payload"] == "m0" and again[0]["redelivered"] is True
    wait_until(lambda: _queue(mnode, name)["messages"] == 3, 10)
    status, body, _ = mnode.api("POST", path + "/get", {"count": 1, "ackmode": "bogus", "encoding": "auto"})
    assert status == 400

    assert mnode.api("DELETE", path + "/contents")[0] == 204
    wait_until(lambda: _queue(mnode, name)["messages"] == 0, 10)
    assert mnode.api("DELETE", path)[0] == 204
    assert mnode.api("GET", path)[0] == 404
    assert mnode.api("DELETE", path)[0] == 404
    assert mnode.api("GET", "/api/queues/no-such-vhost")[0] == 404


def test_delete_if_empty_refuses_a_queue_with_messages(mnode):
    name = unique_name("ifempty")
    assert mnode.api("PUT", f"/api/queues/%2F/{q(name)}", {"durable": False})[0] == 201
    _publish(mnode, name, [b"x"], persistent=False)
    status, body, _ = mnode.api("DELETE", f"/api/queues/%2F/{q(name)}?if-empty=true")
    assert status == 400 and "not empty" in body["reason"]
    assert mnode.api("DELETE", f"/api/queues/%2F/{q(name)}")[0] == 204


def test_publish_through_an_exchange_says_whether_it_was_routed(mnode):
    name, exchange = unique_name("pubq"), unique_name("x")
    assert mnode.api("PUT", f"/api/queues/%2F/{q(name)}", {"durable": False})[0] == 201
    assert mnode.api("PUT", f"/api/exchanges/%2F/{q(exchange)}", {"type": "topic", "durable": True})[0] == 201
    status, _, headers = mnode.api("POST", f"/api/bindings/%2F/e/{q(exchange)}/q/{q(name)}",
                                   {"routing_key": "a.#", "arguments": {}})
    assert status == 201 and headers["Location"] == f"{q(name)}/a.%2523"       # as RabbitMQ writes it
    status, rows, _ = mnode.api("GET", f"/api/bindings/%2F/e/{q(exchange)}/q/{q(name)}")
    assert rows == [{"source": exchange, "vhost": "/", "destination": name, "destination_type": "queue",
                     "routing_key": "a.#", "arguments": {}, "properties_key": "a.%23"}]
    body = {"properties": {"headers": {"k": "v"}}, "routing_key": "a.b", "payload": "hi",
            "payload_encoding": "string"}
    status, answer, _ = mnode.api("POST", f"/api/exchanges/%2F/{q(exchange)}/publish", body)
    assert (status, answer) == (200, {"routed": True})
    status, answer, _ = mnode.api("POST", f"/api/exchanges/%2F/{q(exchange)}/publish", dict(body, routing_key="z"))
    assert (status, answer) == (200, {"routed": False})
    c = pika_conn(mnode)
    method, props, payload = c.channel().basic_get(name, auto_ack=True)
    assert payload == b"hi" and props.headers == {"k": "v"} and method.routing_key == "a.b"
    assert mnode.api("DELETE", f"/api/bindings/%2F/e/{q(exchange)}/q/{q(name)}/a.%23")[0] == 204
    assert mnode.api("GET", f"/api/bindings/%2F/e/{q(exchange)}/q/{q(name)}")[1] == []
    assert mnode.api("DELETE", f"/api/exchanges/%2F/{q(exchange)}")[0] == 204
    assert mnode.api("GET", f"/api/exchanges/%2F/{q(exchange)}")[0] == 404
    status, default, _ = mnode.api("GET", "/api/exchanges/%2F/amq.default")
    assert status == 200 and default["name"] == "" and default["type"] == "direct"


# ---- connections, channels, consumers ------------------------------------------------------------
def test_connections_channels_consumers_and_closing_a_connection(mnode):
    name = unique_name("cons")
    c = pika_conn(mnode, client_properties={"connection_name": "api-test"})
    ch = c.channel()
    ch.queue_declare(name, auto_delete=False)
    ch.basic_qos(prefetch_count=7)
    ch.basic_consume(name, lambda *a: None, consumer_tag="ctag-1")

    def mine():
        rows = mnode.api("GET", "/api/connections")[1]
        return next((r for r in rows if r["client_properties"].get("connection_name") == "api-test"), None)
    row = wait_until(mine, 10)
    assert row["user"] == "guest" and row["vhost"] == "/" and row["node"] == "hare-mgmt" and row["channels"] == 1
    assert mnode.api("GET", f"/api/connections/{q(row['name'])}")[1]["name"] == row["name"]
    channels = [r for r in mnode.api("GET", "/api/channels")[1] if r["connection_details"]["name"] == row["name"]]
    assert len(channels) == 1 and channels[0]["consumer_count"] == 1 and channels[0]["prefetch_count"] == 7
    consumers = [r for r in mnode.api("GET", "/api/consumers/%2F")[1] if r["consumer_tag"] == "ctag-1"]
    assert consumers and consumers[0]["queue"] == {"name": name, "vhost": "/"}
    assert consumers[0]["prefetch_count"] == 7 and consumers[0]["ack_required"] is True
    assert _queue(mnode, name)["consumers"] == 1
    # the API's own direct connections are not listed
    assert all(r["client_properties"].get("product") != "HareMQ management" for r in mnode.api("GET",
                                                                                                "/api/connections")[1])

    assert mnode.api("DELETE", f"/api/connections/{q(row['name'])}")[0] == 204
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        c.process_data_events(time_limit=5)
        c.process_data_events(time_limit=5)
    assert closed.value.reply_code == 320
    wait_until(lambda: mine() is None, 10)
    assert mnode.api("DELETE", f"/api/connections/{q(row['name'])}")[0] == 404


# ---- users, vhosts, permissions, policies -------------------------------------------------------
def test_users_vhosts_permissions_and_policies(mnode):
    user, vhost = unique_name("user"), unique_name("vh")
    assert mnode.api("PUT", f"/api/users/{user}", {"password": "secret", "tags": "monitoring"})[0] == 201
    status, row, _ = mnode.api("GET", f"/api/users/{user}")
    assert status == 200 and row["tags"] == ["monitoring"] and row["hashing_algorithm"].endswith("sha256")
    assert mnode.api("PUT", f"/api/users/{user}", {"password": "other", "tags": "management"})[0] == 204
    assert mnode.api("GET", "/api/overview", user=(user, "secret"))[0] == 401
    assert mnode.api("GET", "/api/overview", user=(user, "other"))[0] == 200
    assert mnode.api("PUT", f"/api/vhosts/{vhost}")[0] == 201
    assert mnode.api("PUT", f"/api/vhosts/{vhost}")[0] == 204
    assert mnode.api("GET", f"/api/vhosts/{vhost}")[1]["name"] == vhost
    assert mnode.api("PUT", f"/api/permissions/{vhost}/{user}", {"configure": "", "write": ".*", "read": ".*"})[0] == 201
    assert mnode.api("GET", f"/api/permissions/{vhost}/{user}")[1] == {
        "user": user, "vhost": vhost, "configure": "", "write": ".*", "read": ".*"}
    # the user sees its vhost only
    assert [v["name"] for v in mnode.api("GET", "/api/vhosts", user=(user, "other"))[1]] == [vhost]
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", mnode.port, vhost,
                                                          pika.PlainCredentials(user, "other")))
    c.close()

    policy = {"pattern": "^lim\\.", "definition": {"max-length": 2}, "apply-to": "queues", "priority": 1}
    assert mnode.api("PUT", "/api/policies/%2F/lim", policy)[0] == 201
    assert mnode.api("PUT", "/api/policies/%2F/lim", policy)[0] == 204
    status, body, _ = mnode.api("PUT", "/api/policies/%2F/bad", {"pattern": ".*", "definition": {"bogus": 1}})
    assert status == 400 and body["error"] == "bad_request"
    assert {"vhost": "/", "name": "lim", "pattern": "^lim\\.", "apply-to": "queues",
            "definition": {"max-length": 2}, "priority": 1} in mnode.api("GET", "/api/policies")[1]
    name = "lim." + unique_name("q")
    assert mnode.api("PUT", f"/api/queues/%2F/{q(name)}", {"durable": False})[0] == 201
    _publish(mnode, name, [b"1", b"2", b"3"], persistent=False)
    row = wait_until(lambda: (lambda r: r if r["messages"] == 2 else None)(_queue(mnode, name)), 10)
    assert row["policy"] == "lim" and row["effective_policy_definition"] == {"max-length": 2}
    assert mnode.api("DELETE", "/api/policies/%2F/lim")[0] == 204
    assert mnode.api("DELETE", "/api/policies/%2F/lim")[0] == 404

    assert mnode.api("DELETE", f"/api/permissions/{vhost}/{user}")[0] == 204
    assert mnode.api("DELETE", f"/api/vhosts/{vhost}")[0] == 204
    assert mnode.api("GET", f"/api/vhosts/{vhost}")[0] == 404
    assert mnode.api("DELETE", f"/api/users/{user}")[0] == 204
    assert mnode.api("DELETE", f"/api/users/{user}")[0] == 404


# ---- definitions ---------------------------------------------------------------------------------
def test_definitions_export_then_import_into_another_node(mnode, tmp_path):
    vhost, user = unique_name("defs"), unique_name("defuser")
    assert mnode.api("PUT", f"/api/vhosts/{vhost}")[0] == 201
    assert mnode.api("PUT", f"/api/users/{user}", {"password": "pw1", "tags": "management"})[0] == 201
    for who in ("guest", user):
        assert mnode.api("PUT", f"/api/permissions/{vhost}/{who}",
                         {"configure": ".*", "write": ".*", "read": ".*"})[0] == 201
    assert mnode.api("PUT", f"/api/policies/{vhost}/ttl", {"pattern": "^t", "definition": {"message-ttl": 60000},
                                                           "apply-to": "queues"})[0] == 201
    assert mnode.api("PUT", f"/api/exchanges/{vhost}/ex", {"type": "fanout", "durable": True})[0] == 201
    assert mnode.api("PUT", f"/api/queues/{vhost}/tq", {"durable": True,
                                                         "arguments": {"x-max-priority": 5}})[0] == 201
    assert mnode.api("POST", f"/api/bindings/{vhost}/e/ex/q/tq", {"routing_key": "k"})[0] == 201
    status, exported, _ = mnode.api("GET", "/api/definitions")
    assert status == 200

    other = ManagedNode("hare-import", tmp_path).start()
    try:
        assert other.api("POST", "/api/definitions", exported)[0] == 204
        status, imported, _ = other.api("GET", "/api/definitions")

        def of(defs, kind, keys):
            return sorted(tuple(str(item.get(k)) for k in keys) for item in defs[kind] if item.get("vhost") == vhost
                          or (kind == "users" and item["name"] == user))
        for kind, keys in (("users", ("name", "password_hash", "tags")), ("permissions", ("user", "configure")),
                           ("policies", ("name", "pattern", "definition")),
                           ("exchanges", ("name", "type", "durable")),
                           ("queues", ("name", "durable", "arguments")),
                           ("bindings", ("source", "destination", "routing_key"))):
            assert of(imported, kind, keys) == of(exported, kind, keys) != [], kind
        # the imported user logs in with its password (the hash carried over)
        assert other.api("GET", "/api/overview", user=(user, "pw1"))[0] == 200
        c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", other.port, vhost,
                                                              pika.PlainCredentials(user, "pw1")))
        ch = c.channel()
        ch.basic_publish("ex", "", b"via-binding")
        assert wait_until(lambda: ch.queue_declare("tq", passive=True).method.message_count == 1, 10)
        c.close()
    finally:
        other.stop()


# ---- health ----------------------------------------------------------------------------------------
def test_health_checks_and_aliveness(mnode):
    assert mnode.api("GET", "/api/health/checks/alarms")[:2] == (200, {"status": "ok"})
    assert mnode.api("GET", "/api/health/checks/local-alarms")[:2] == (200, {"status": "ok"})
    assert mnode.api("GET", "/api/aliveness-test/%2F")[:2] == (200, {"status": "ok"})
    assert mnode.api("GET", "/api/aliveness-test/nope")[0] == 404
    assert mnode.api("GET", "/api/health/checks/alarms", user=None)[0] == 401


def test_alarm_health_check_fails_while_a_disk_alarm_is_on(tmp_path):
    node = ManagedNode("hare-alarm", tmp_path, extra=["--disk-free-limit", "1000000GB"]).start()
    try:
        def failing():
            status, body, _ = node.api("GET", "/api/health/checks/local-alarms")
            return body if status == 503 else None
        body = wait_until(failing, 10)
        assert body["status"] == "failed" and body["alarms"] == [{"node": "hare-alarm", "resource": "disk"}]
        assert "rabbitmq_alarms_free_disk_space_watermark 1.0" in node.metrics()
        assert node.api("GET", "/api/nodes")[1][0]["disk_free_alarm"] is True
    finally:
        node.stop()


# ---- metrics and the page -------------------------------------------------------------------------
def test_metrics_per_queue_and_totals(mnode):
    name = unique_name("metq")
    assert mnode.api("PUT", f"/api/queues/%2F/{q(name)}", {"durable": True})[0] == 201
    _publish(mnode, name, [b"a", b"b", b"c"])
    status, text, headers = http("GET", mnode.prometheus_port, "/metrics", user=None, raw=True)
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert f'rabbitmq_queue_messages_ready{{queue="{name}",vhost="/"}} 3.0' in text
    assert f'rabbitmq_queue_messages_published_total{{queue="{name}",vhost="/"}} 3.0' in text
    for series in ("rabbitmq_connections ", "rabbitmq_global_messages_received_total ",
                   "rabbitmq_global_messages_confirmed_total ", "rabbitmq_identity_info{",
                   "haremq_store_fsyncs_total ", "haremq_store_group_commit_seconds_count ",
                   'haremq_store_group_commit_seconds_bucket{le="+Inf"} '):
        assert "\n" + series in text, series


def test_metrics_without_per_queue_series(tmp_path):
    node = ManagedNode("hare-agg", tmp_path, extra=["--prometheus-per-queue", "off"]).start()
    try:
        assert node.api("PUT", "/api/queues/%2F/one", {"durable": False})[0] == 201
        _publish(node, "one", [b"x", b"y"], persistent=False)
        text = node.metrics()
        assert "\nrabbitmq_queue_messages_ready 2.0" in text and 'queue="one"' not in text
        assert 'rabbitmq_queue_messages_ready{queue="one",vhost="/"} 2.0' in node.metrics("/metrics/per-object")
    finally:
        node.stop()


def test_the_web_view_is_served_without_login(mnode):
    status, text, headers = http("GET", mnode.management_port, "/", user=None, raw=True)
    assert status == 200 and headers["Content-Type"].startswith("text/html") and "<table id=\"queues\"" in text
    status, script, headers = http("GET", mnode.management_port, "/static/haremq.js", user=None, raw=True)
    assert status == 200 and "javascript" in headers["Content-Type"] and "api(\"queues\")" in script
    events = mnode.api("GET", "/api/haremq/events")
    assert events[0] == 200 and isinstance(events[1], list)


def test_busy_explicit_port_stops_the_node_with_a_reason(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        node = ManagedNode("hare-busy", tmp_path)
        node.management_port = taken.getsockname()[1]
        with pytest.raises(RuntimeError) as failed:
            node.start(timeout=20)
        assert "for the management port" in str(failed.value)


def test_management_off_with_port_zero(tmp_path):
    node = ManagedNode("hare-off", tmp_path)
    node.management_port = 0
    node.start()
    try:
        assert "management listener started" not in node.log_text()
        assert "prometheus listener started" in node.log_text()
    finally:
        node.stop()


def test_user_put_with_a_password_hash_keeps_its_permissions(mnode):
    name = unique_name("hashed")
    _user(mnode, name, "management")
    from haremq.node.broker.auth import hash_password
    status, _, _ = mnode.api("PUT", f"/api/users/{name}", {"password_hash": hash_password("new-pw"),
                                                           "tags": "monitoring"})
    assert status == 204
    assert mnode.api("GET", "/api/overview", user=(name, "new-pw"))[0] == 200
    assert mnode.api("GET", f"/api/permissions/%2F/{name}")[0] == 200
    assert mnode.api("GET", f"/api/users/{name}")[1]["tags"] == ["monitoring"]


def test_management_api_over_tls(tmp_path):
    import ssl
    import urllib.request

    import trustme
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.cert_chain_pems[0].write_to_path(tmp_path / "server.pem")
    server.private_key_pem.write_to_path(tmp_path / "server.key")
    node = ManagedNode("hare-https", tmp_path, extra=["--tls-port", str(free_port()), "--tls-cert",
                                                      str(tmp_path / "server.pem"), "--tls-key",
                                                      str(tmp_path / "server.key"), "--management-tls"]).start()
    try:
        context = ssl.create_default_context()
        ca.configure_trust(context)
        request = urllib.request.Request(f"https://127.0.0.1:{node.management_port}/api/overview",
                                         headers={"Authorization": "Basic Z3Vlc3Q6Z3Vlc3Q="})
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            assert response.status == 200 and b'"node": "hare-https"' in response.read()
        with pytest.raises(Exception):  # noqa: B017 - plain HTTP on the TLS port: reset or a bad status line
            http("GET", node.management_port, "/api/overview", timeout=5)
    finally:
        node.stop()


def test_a_sample_of_many_queues_lets_the_node_serve_between_chunks(tmp_path, monkeypatch):
    """The sampler reads every queue's counters every few seconds; with 100,000 queues that is
    a long time for the event loop to serve nobody, so it reads them a chunk at a time (here two
    queues a chunk): work that was waiting runs before the sample ends, and the sample still
    counts every queue."""
    import asyncio

    from haremq.node.management import stats
    from tests.inprocess import InProcessNode
    monkeypatch.setattr(stats, "SAMPLE_CHUNK", 2)
    with InProcessNode(tmp_path, management_port=free_port(), prometheus_port=0) as n:
        for i in range(7):
            body = {"durable": False}
            assert http("PUT", n.node.config.management_port, f"/api/queues/%2F/chunked-{i}", body)[0] == 201
            http("POST", n.node.config.management_port, "/api/exchanges/%2F/amq.default/publish",
                 {"routing_key": f"chunked-{i}", "payload": "x", "payload_encoding": "string", "properties": {}})
        sampler = n.node.management.sampler

        async def sample_while_waited_on() -> list[str]:
            order: list[str] = []
            asyncio.get_running_loop().call_soon(order.append, "served")
            await sampler.sample()
            order.append("sampled")
            return order
        assert n.call(sample_while_waited_on) == ["served", "sampled"]
        assert sampler.history[-1]["messages_ready"] == 7
