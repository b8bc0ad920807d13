"""Users, vhosts and permissions (ERR-3).

The node is started with `--definitions` (RabbitMQ's JSON, with salted
SHA-256 password hashes) holding a vhost `accv`, users `bob` (everything on
names starting `bob.`), `reader` (read only), `writer` (write only) and
`nobody` (no permissions in accv), and a queue `shared.q` bound to a topic
exchange `shared.x`. Each operation class is tried by a user that has the
right and by one that lacks it. Texts were checked against RabbitMQ 3.10; in
reference mode the same users are made with rabbitmqctl.
"""
import json
import shutil
import subprocess

import pika
import pytest
from pika.exceptions import (ChannelClosedByBroker, ConnectionClosedByBroker, ProbableAccessDeniedError,
                             ProbableAuthenticationError)

from haremq.node.broker.auth import hash_password
from tests.conftest import HOST, IS_REF, REF_PORT, Node, _open_clients, unique_name, wait_until

PASSWORD = "s3cret"
PERMISSIONS = {"bob": (r"^bob\.", r"^bob\.", r"^bob\."), "reader": ("", "", ".*"), "writer": ("", ".*", ""),
               "guest": (".*", ".*", ".*")}


def definitions() -> dict:
    return {
        "users": [{"name": u, "password_hash": hash_password(PASSWORD),
                   "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": []}
                  for u in ("bob", "reader", "writer", "nobody")]
        + [{"name": "guest", "password_hash": hash_password("guest"),
            "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["administrator"]}],
        "vhosts": [{"name": "/"}, {"name": "accv"}],
        "permissions": [{"user": u, "vhost": "accv", "configure": c, "write": w, "read": r}
                        for u, (c, w, r) in PERMISSIONS.items()]
        + [{"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}],
        "exchanges": [{"name": "shared.x", "vhost": "accv", "type": "topic", "durable": True,
                       "auto_delete": False, "internal": False, "arguments": {}}],
        "queues": [{"name": "shared.q", "vhost": "accv", "durable": True, "auto_delete": False,
                    "arguments": {}}],
        "bindings": [{"source": "shared.x", "vhost": "accv", "destination": "shared.q",
                      "destination_type": "queue", "routing_key": "#", "arguments": {}}],
        "policies": [], "parameters": [], "global_parameters": [], "topic_permissions": [],
    }


class DefinitionsNode(Node):
    def __init__(self, *args, extra=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.extra = list(extra)

    def argv(self):
        return super().argv() + self.extra


def _rabbitmqctl(*args):
    subprocess.run(["rabbitmqctl", "-q", "-n", f"ref{REF_PORT}@localhost", *args], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def acl(tmp_path_factory):
    if IS_REF:
        if not shutil.which("rabbitmqctl"):
            pytest.skip("reference mode needs rabbitmqctl to create users")
        _rabbitmqctl("add_vhost", "accv")
        for user in ("bob", "reader", "writer", "nobody"):
            _rabbitmqctl("add_user", user, PASSWORD)
        for user, (c, w, r) in PERMISSIONS.items():
            _rabbitmqctl("set_permissions", "-p", "accv", user, c, w, r)
        node = Node.reference(tmp_path_factory.mktemp("acl")).start()
        ch = pika.BlockingConnection(pika.URLParameters(f"amqp://guest:guest@{HOST}:{node.port}/accv")).channel()
        ch.exchange_declare("shared.x", "topic", durable=True)
        ch.queue_declare("shared.q", durable=True)
        ch.queue_bind("shared.q", "shared.x", "#")
        ch.connection.close()
        yield node
        return
    workdir = tmp_path_factory.mktemp("acl")
    path = workdir / "definitions.json"
    path.write_text(json.dumps(definitions()))
    node = DefinitionsNode("hare-acl", workdir, extra=["--definitions", str(path)]).start()
    yield node
    node.stop()


def connect(node, user, password=PASSWORD, vhost="accv"):
    c = pika.BlockingConnection(pika.ConnectionParameters(
        HOST, node.port, vhost, pika.PlainCredentials(user, password), connection_attempts=1, socket_timeout=5))
    _open_clients.append(c)
    return c


def refused(fn, user, kind, name):
    with pytest.raises(ChannelClosedByBroker) as ei:
        fn()
    assert (ei.value.reply_code, ei.value.reply_text) == \
        (403, f"ACCESS_REFUSED - access to {kind} '{name}' in vhost 'accv' refused for user '{user}'")


# ------------------------------------------------------------------ logging in

def test_definitions_users_log_in_with_their_password(acl):
    assert connect(acl, "bob").is_open


def test_wrong_password_is_refused(acl):
    with pytest.raises(ProbableAuthenticationError) as ei:
        connect(acl, "bob", password="wrong")
    assert "403" in str(ei.value) and "ACCESS_REFUSED - Login was refused" in str(ei.value)


def test_unknown_user_is_refused(acl):
    with pytest.raises(ProbableAuthenticationError):
        connect(acl, "mallory")


def test_vhost_without_permissions_is_530(acl):
    with pytest.raises(ProbableAccessDeniedError) as ei:
        connect(acl, "nobody")
    assert "(530) \"NOT_ALLOWED - access to vhost 'accv' refused for user 'nobody'\"" in str(ei.value)


def test_unknown_vhost_is_530(acl):
    with pytest.raises(ProbableAccessDeniedError) as ei:
        connect(acl, "bob", vhost="nope")
    assert "(530) 'NOT_ALLOWED - vhost nope not found'" in str(ei.value)


def test_guest_keeps_everything_on_the_default_vhost(acl):
    ch = connect(acl, "guest", "guest", "/").channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.confirm_delivery()
    ch.basic_publish("", q, b"hi")
    assert ch.basic_get(q, auto_ack=True)[2] == b"hi"


# ------------------------------------------------------------------ configure

def test_configure_queue(acl):
    c = connect(acl, "bob")
    ch = c.channel()
    own = unique_name("bob.q")
    ch.queue_declare(own, exclusive=True)
    refused(lambda: c.channel().queue_declare("alice.q"), "bob", "queue", "alice.q")
    refused(lambda: c.channel().queue_delete("shared.q"), "bob", "queue", "shared.q")
    ch.queue_delete(own)


def test_server_named_queue_needs_configure_on_the_generated_name(acl):
    c = connect(acl, "reader")
    with pytest.raises(ChannelClosedByBroker) as ei:
        c.channel().queue_declare("")
    assert ei.value.reply_code == 403
    assert ei.value.reply_text.startswith("ACCESS_REFUSED - access to queue 'amq.gen-")
    assert ei.value.reply_text.endswith("' in vhost 'accv' refused for user 'reader'")


def test_passive_declare_needs_no_permission(acl):
    ch = connect(acl, "bob").channel()
    assert ch.queue_declare("shared.q", passive=True).method.queue == "shared.q"
    ch.exchange_declare("shared.x", passive=True)


def test_configure_exchange(acl):
    c = connect(acl, "bob")
    ch = c.channel()
    own = unique_name("bob.x")
    ch.exchange_declare(own, "fanout", auto_delete=False)
    refused(lambda: c.channel().exchange_declare("other.x"), "bob", "exchange", "other.x")
    refused(lambda: c.channel().exchange_delete("shared.x"), "bob", "exchange", "shared.x")
    ch.exchange_delete(own)


def test_declare_with_dlx_or_alternate_exchange_needs_write_on_it(acl):
    c = connect(acl, "bob")
    refused(lambda: c.channel().queue_declare(unique_name("bob.dl"),
                                              arguments={"x-dead-letter-exchange": "shared.x"}),
            "bob", "exchange", "shared.x")
    refused(lambda: c.channel().exchange_declare(unique_name("bob.ae"),
                                                 arguments={"alternate-exchange": "shared.x"}),
            "bob", "exchange", "shared.x")


# ------------------------------------------------------------------ write

def test_write_publish(acl):
    w = connect(acl, "writer").channel()
    w.confirm_delivery()
    w.basic_publish("shared.x", "k", b"from writer")
    c = connect(acl, "bob")
    ch = c.channel()
    ch.basic_publish("shared.x", "k", b"x")
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_declare("shared.q", passive=True)
    assert ei.value.reply_text == \
        "ACCESS_REFUSED - access to exchange 'shared.x' in vhost 'accv' refused for user 'bob'"
    ch = c.channel()
    ch.basic_publish("", "bob.anything", b"x")
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_declare("shared.q", passive=True)
    assert ei.value.reply_text == \
        "ACCESS_REFUSED - access to exchange 'amq.default' in vhost 'accv' refused for user 'bob'"


def test_bindings_need_write_on_destination_and_read_on_source(acl):
    c = connect(acl, "bob")
    ch = c.channel()
    own_q, own_x = unique_name("bob.q"), unique_name("bob.x")
    ch.queue_declare(own_q, exclusive=True)
    ch.exchange_declare(own_x, "topic")
    refused(lambda: c.channel().queue_bind(own_q, "shared.x", "k"), "bob", "exchange", "shared.x")
    refused(lambda: c.channel().queue_unbind("shared.q", "shared.x", "#"), "bob", "queue", "shared.q")
    refused(lambda: c.channel().exchange_bind(own_x, "shared.x", "k"), "bob", "exchange", "shared.x")
    refused(lambda: c.channel().exchange_bind("shared.x", own_x, "k"), "bob", "exchange", "shared.x")
    ch.queue_bind(own_q, own_x, "k")          # both his own: fine
    ch.exchange_delete(own_x)


# ------------------------------------------------------------------ read

def test_read_get_consume_purge(acl):
    w = connect(acl, "writer").channel()
    w.confirm_delivery()
    w.basic_publish("shared.x", "k", b"for reader")
    r = connect(acl, "reader").channel()
    got = wait_until(lambda: r.basic_get("shared.q", auto_ack=True)[2], 5)
    assert got
    r.queue_purge("shared.q")
    r.basic_cancel(r.basic_consume("shared.q", lambda *a: None))
    c = connect(acl, "writer")
    refused(lambda: c.channel().basic_get("shared.q"), "writer", "queue", "shared.q")
    refused(lambda: c.channel().basic_consume("shared.q", lambda *a: None), "writer", "queue", "shared.q")
    refused(lambda: c.channel().queue_purge("shared.q"), "writer", "queue", "shared.q")


# ------------------------------------------------------------------ management (in-process)

def test_user_vhost_permission_management_persists(tmp_path):
    from haremq.node.broker.broker import BrokerError
    from tests.inprocess import InProcessNode

    with InProcessNode(tmp_path) as n:
        b = n.broker
        n.call(b.add_vhost, "mgmt")
        n.call(b.add_user, "carol", "pw1")
        n.call(b.set_user_tags, "carol", ["monitoring", "policymaker"])
        n.call(b.set_permissions, "carol", "mgmt", "^carol", ".*", ".*")
        n.call(b.set_policy, "mgmt", "ttl", "^carol", {"message-ttl": 5000}, "queues", 1)
        with pytest.raises(BrokerError):
            n.call(b.add_user, "carol", "again")
        with pytest.raises(BrokerError):
            n.call(b.set_permissions, "nobody-such", "mgmt", ".*", ".*", ".*")
        c = pika.BlockingConnection(pika.ConnectionParameters(
            HOST, n.port, "mgmt", pika.PlainCredentials("carol", "pw1")))
        q = c.channel().queue_declare("carol.q", durable=True).method.queue
        assert n.call(lambda: b.vhosts["mgmt"].queues[q].ttl) == 5000
        c.close()
        n.call(b.change_password, "carol", "pw2")
    with InProcessNode(tmp_path) as n:      # everything came back from the metadata snapshot
        b = n.broker
        assert {"user": "carol", "tags": ["monitoring", "policymaker"]} in n.call(b.list_users)
        assert {"name": "mgmt"} in n.call(b.list_vhosts)
        assert n.call(b.list_permissions, "mgmt") == \
            [{"user": "carol", "vhost": "mgmt", "configure": "^carol", "write": ".*", "read": ".*"}]
        assert [p["name"] for p in n.call(b.list_policies, "mgmt")] == ["ttl"]
        assert n.call(lambda: b.vhosts["mgmt"].queues["carol.q"].ttl) == 5000
        with pytest.raises(ProbableAuthenticationError):
            pika.BlockingConnection(pika.ConnectionParameters(
                HOST, n.port, "mgmt", pika.PlainCredentials("carol", "pw1"), connection_attempts=1))
        c = pika.BlockingConnection(pika.ConnectionParameters(
            HOST, n.port, "mgmt", pika.PlainCredentials("carol", "pw2")))
        ch = c.channel()
        ch.queue_declare("carol.q2", exclusive=True)
        # permissions change under an open connection: the next operation sees it
        n.call(b.set_permissions, "carol", "mgmt", "", ".*", ".*")
        with pytest.raises(ChannelClosedByBroker) as ei:
            ch.queue_declare("carol.q3", exclusive=True)
        assert ei.value.reply_code == 403
        # deleting the vhost closes its connections
        n.call(b.delete_vhost, "mgmt")
        with pytest.raises(ConnectionClosedByBroker) as ei:
            wait_until(lambda: c.process_data_events(0.05), 5)
        assert (ei.value.reply_code, ei.value.reply_text) == (320, "CONNECTION_FORCED - vhost 'mgmt' is deleted")
        n.call(b.delete_user, "carol")
        assert "carol" not in [u["user"] for u in n.call(b.list_users)]


def test_definitions_export_and_import_round_trip():
    from haremq.node.broker.broker import Broker

    source = Broker("a")
    source.import_definitions(definitions())
    source.set_policy("accv", "lim", "^shared", {"max-length": 10}, "queues", 2)
    exported = source.export_definitions()
    assert json.loads(json.dumps(exported)) == exported
    assert exported["rabbit_version"] and exported["product_name"] == "HareMQ"
    target = Broker("b")
    target.import_definitions(exported)
    again = target.export_definitions()
    for key in ("users", "vhosts", "permissions", "policies", "queues", "exchanges", "bindings"):
        assert sorted(map(json.dumps, again[key])) == sorted(map(json.dumps, exported[key])), key
    assert target.vhosts["accv"].queues["shared.q"].max_length == 10
    assert target.users.authenticate("bob", PASSWORD, "10.0.0.1") == "bob"
    assert target.users.authenticate("guest", "guest", "10.0.0.1") is None      # loopback only
    assert target.users.authenticate("guest", "guest", "127.0.0.1") == "guest"
