"""What RabbitMQ's own management UI asks of the API, over plain HTTP: the routes and JSON shapes
tests/test_management_ui.py drives through the UI in a browser, checked here too because that
test skips where the UI's files are not installed (CI). One real node, urllib and pika."""
from __future__ import annotations

import pika
import pytest

from tests.conftest import IS_REF, pika_conn, unique_name, wait_until
from tests.management import ManagedNode, http, q

pytestmark = pytest.mark.skipif(IS_REF, reason="starts its own node with the management API")


@pytest.fixture(scope="module")
def mnode(tmp_path_factory):
    node = ManagedNode("hare-uiapi", tmp_path_factory.mktemp("uiapi")).start()
    yield node
    node.stop()


def test_auth_settings_are_answered_without_credentials_and_without_a_challenge(mnode):
    status, body, headers = mnode.api("GET", "/api/auth", user=None)
    assert status == 200 and "WWW-Authenticate" not in headers
    assert body["enable_uaa"] is False and body["oauth_enabled"] is False
    # everything else still wants credentials
    status, _, headers = mnode.api("GET", "/api/extensions", user=None)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Basic")
    assert mnode.api("GET", "/api/extensions")[1] == [{"javascript": "dispatcher.js"}]


def test_a_refused_right_carries_no_challenge(mnode):
    name = unique_name("plain")
    assert mnode.api("PUT", f"/api/users/{q(name)}", {"password": "pw", "tags": "management"})[0] == 201
    status, body, headers = mnode.api("GET", "/api/users", user=(name, "pw"))
    assert (status, body["reason"]) == (401, "Not administrator user")
    assert "WWW-Authenticate" not in headers


@pytest.mark.parametrize("path", ["/api/feature-flags", "/api/vhost-limits", "/api/vhost-limits/%2F",
                                  "/api/user-limits", "/api/user-limits/guest", "/api/operator-policies",
                                  "/api/operator-policies/%2F", "/api/parameters", "/api/parameters/shovel",
                                  "/api/global-parameters", "/api/topic-permissions",
                                  "/api/vhosts/%2F/topic-permissions", "/api/users/guest/topic-permissions"])
def test_what_haremq_has_none_of_is_an_empty_list(mnode, path):
    assert mnode.api("GET", path)[:2] == (200, [])


def test_what_haremq_has_none_of_cannot_be_set(mnode):
    status, body, _ = mnode.api("PUT", "/api/vhost-limits/%2F/max-queues", {"value": 10})
    assert (status, body) == (400, {"error": "bad_request", "reason": "HareMQ has no vhost limits"})
    assert mnode.api("GET", "/api/vhost-limits/nosuchvhost")[0] == 404
    assert mnode.api("GET", "/api/user-limits/nosuchuser")[0] == 404


def test_trailing_slashes_and_permissions_by_vhost_and_by_user(mnode):
    status, users, _ = mnode.api("GET", "/api/users/")
    assert status == 200 and "guest" in [u["name"] for u in users]
    by_vhost = mnode.api("GET", "/api/vhosts/%2F/permissions")[1]
    by_user = mnode.api("GET", "/api/users/guest/permissions")[1]
    assert {"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"} in by_vhost
    assert {p["user"] for p in by_user} == {"guest"} and "/" in {p["vhost"] for p in by_user}
    assert mnode.api("GET", "/api/users/nobody-here/permissions")[0] == 404


def test_pages_of_a_listing(mnode):
    prefix = unique_name("page")
    for i in range(5):
        assert mnode.api("PUT", f"/api/queues/%2F/{q(prefix)}.{i}", {"durable": False})[0] == 201
    status, page, _ = mnode.api("GET", f"/api/queues/%2F?page=2&page_size=2&name={q(prefix)}&use_regex=false")
    assert status == 200
    assert {k: page[k] for k in ("page", "page_size", "page_count", "filtered_count", "item_count")} == \
        {"page": 2, "page_size": 2, "page_count": 3, "filtered_count": 5, "item_count": 2}
    assert [r["name"] for r in page["items"]] == [f"{prefix}.2", f"{prefix}.3"]
    assert page["total_count"] >= 5
    status, page, _ = mnode.api("GET", f"/api/queues?page=1&page_size=10&name={q(prefix)}%5C.%5B34%5D&use_regex=true"
                                       "&sort=name&sort_reverse=true")
    assert [r["name"] for r in page["items"]] == [f"{prefix}.4", f"{prefix}.3"]
    status, body, _ = mnode.api("GET", f"/api/queues?page=9&page_size=10&name={q(prefix)}")
    assert (status, body["error"]) == (400, "page_out_of_range")
    status, body, _ = mnode.api("GET", "/api/exchanges?page=1&page_size=501")
    assert (status, body["error"]) == (400, "invalid_pagination_parameters")
    assert isinstance(mnode.api("GET", "/api/queues")[1], list)       # no `page`: the plain list


def test_samples_only_when_asked(mnode):
    plain = mnode.api("GET", "/api/overview")[1]
    assert plain["queue_totals"]["messages_details"] == {"rate": 0.0}
    charted = mnode.api("GET", "/api/overview?lengths_age=60&lengths_incr=5&msg_rates_age=60&msg_rates_incr=5")[1]
    details = charted["queue_totals"]["messages_details"]
    assert details["samples"][0]["sample"] == charted["queue_totals"]["messages"]
    assert {"avg", "avg_rate", "rate"} <= set(details)
    assert "samples" in charted["message_stats"]["publish_details"]
    assert charted["sample_retention_policies"]["global"]
    node = mnode.api("GET", f"/api/nodes/{mnode.name}?node_stats_age=60&node_stats_incr=5")[1]
    for key in ("mem_used", "disk_free", "fd_used", "sockets_used"):
        assert "samples" in node[f"{key}_details"], key
    assert isinstance(node["applications"], list) and isinstance(node["config_files"], list)
    assert node["exchange_types"] and node["auth_mechanisms"]


def test_the_objects_behind_the_ui_pages(mnode):
    exchange, queue = unique_name("uix"), unique_name("uiq")
    assert mnode.api("PUT", f"/api/exchanges/%2F/{q(exchange)}", {"type": "direct"})[0] == 201
    assert mnode.api("PUT", f"/api/queues/%2F/{q(queue)}", {"durable": False})[0] == 201
    assert mnode.api("POST", f"/api/bindings/%2F/e/{q(exchange)}/q/{q(queue)}", {"routing_key": "k"})[0] == 201
    source = mnode.api("GET", f"/api/exchanges/%2F/{q(exchange)}/bindings/source")[1]
    assert [(b["destination"], b["routing_key"]) for b in source] == [(queue, "k")]
    assert mnode.api("GET", f"/api/exchanges/%2F/{q(exchange)}/bindings/destination")[1] == []
    c = pika_conn(mnode)
    ch = c.channel()
    ch.basic_consume(queue, lambda *a: None, consumer_tag="ui-consumer")
    ch.basic_publish(exchange, "k", b"m", pika.BasicProperties(delivery_mode=1))
    try:
        row = wait_until(lambda: (lambda r: r if r and r["consumer_details"] else None)(
            mnode.api("GET", f"/api/queues/%2F/{q(queue)}")[1]), 10, 0.1)
        assert row["consumer_details"][0]["consumer_tag"] == "ui-consumer"
        name = row["consumer_details"][0]["channel_details"]["connection_name"]
        channels = mnode.api("GET", f"/api/connections/{q(name)}/channels")[1]
        assert len(channels) == 1 and channels[0]["connection_details"]["name"] == name
        status, channel, _ = mnode.api("GET", f"/api/channels/{q(channels[0]['name'])}")
        assert status == 200 and channel["consumer_count"] == 1
        assert [c["consumer_tag"] for c in channel["consumer_details"]] == ["ui-consumer"]
        vhost = wait_until(lambda: (lambda v: v if v["messages"] is not None and
                                    v["message_stats"]["publish"] >= 1 else None)(
            mnode.api("GET", "/api/vhosts/%2F")[1]), 10, 0.1)
        assert {"messages_ready", "messages_unacknowledged", "messages_details"} <= set(vhost)
    finally:
        c.close()


def test_a_page_on_the_apis_own_origin_may_post_json_as_text_plain(mnode):
    """RabbitMQ's UI posts publish and get without a Content-Type (the browser says text/plain)."""
    queue = unique_name("plainpost")
    assert mnode.api("PUT", f"/api/queues/%2F/{q(queue)}", {"durable": False})[0] == 201
    own = f"http://127.0.0.1:{mnode.management_port}"
    body = {"properties": {}, "routing_key": queue, "payload": "x", "payload_encoding": "string"}
    status, answer, _ = mnode.api("POST", "/api/exchanges/%2F/amq.default/publish", body,
                                  headers={"Content-Type": "text/plain;charset=UTF-8", "Origin": own})
    assert (status, answer) == (200, {"routed": True})
    # without the browser's word for where it comes from, the same body is a form's: refused
    status, _, _ = http("POST", mnode.management_port, "/api/exchanges/%2F/amq.default/publish", body,
                        headers={"Content-Type": "text/plain"})
    assert status == 415
