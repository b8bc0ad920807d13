"""AMQP over TLS (amqps): a second listener with certificates made at test time (trustme)."""
import ssl
import subprocess

import pika
import pytest
import trustme
from pika.exceptions import AMQPConnectionError

from tests.conftest import HOST, Node, _open_clients, free_port, haremq_command, needs_process

pytestmark = needs_process


class TLSNode(Node):
    def __init__(self, *args, tls_args=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.tls_port = free_port()
        self.tls_args = list(tls_args)

    def argv(self):
        return super().argv() + ["--tls-port", str(self.tls_port), *self.tls_args]


@pytest.fixture(scope="module")
def ca():
    return trustme.CA()


@pytest.fixture(scope="module")
def pki(ca, tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.cert_chain_pems[0].write_to_path(d / "server.pem")
    server.private_key_pem.write_to_path(d / "server.key")
    ca.cert_pem.write_to_path(d / "ca.pem")
    return d


def start(workdir, pki, *extra):
    node = TLSNode("hare-tls", workdir, tls_args=["--tls-cert", str(pki / "server.pem"),
                                                  "--tls-key", str(pki / "server.key"), *extra])
    return node.start()


@pytest.fixture(scope="module")
def tls_node(pki, tmp_path_factory):
    node = start(tmp_path_factory.mktemp("tls"), pki)
    yield node
    node.stop()


@pytest.fixture(scope="module")
def mtls_node(pki, tmp_path_factory):
    node = start(tmp_path_factory.mktemp("mtls"), pki, "--tls-ca", str(pki / "ca.pem"), "--tls-verify-peer")
    yield node
    node.stop()


def client_context(ca=None, cert=None) -> ssl.SSLContext:
    context = ssl.create_default_context()
    if ca is not None:
        ca.configure_trust(context)
    if cert is not None:
        cert.configure_cert(context)
    return context


def connect_tls(node, context, server_hostname="localhost"):
    params = pika.ConnectionParameters(HOST, node.tls_port, credentials=pika.PlainCredentials("guest", "guest"),
                                       ssl_options=pika.SSLOptions(context, server_hostname),
                                       connection_attempts=1, socket_timeout=5)
    c = pika.BlockingConnection(params)
    _open_clients.append(c)
    return c


def round_trip(conn, body=b"over tls"):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.confirm_delivery()
    ch.basic_publish("", q, body, properties=pika.BasicProperties(delivery_mode=2))
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(b), auto_ack=True)
    deadline = 50
    while not got and deadline:
        conn.process_data_events(0.1)
        deadline -= 1
    return got


def test_amqps_round_trip(tls_node, ca):
    conn = connect_tls(tls_node, client_context(ca))
    assert round_trip(conn) == [b"over tls"]
    assert conn._impl.params.ssl_options is not None


def test_large_message_over_tls(tls_node, ca):
    conn = connect_tls(tls_node, client_context(ca))
    body = bytes(range(256)) * 4096      # 1 MiB: many frames and TLS records
    assert round_trip(conn, body) == [body]


def test_plain_port_still_serves(tls_node):
    conn = pika.BlockingConnection(pika.ConnectionParameters(HOST, tls_node.port))
    _open_clients.append(conn)
    assert round_trip(conn) == [b"over tls"]


def test_untrusted_server_certificate_is_rejected_by_the_client(tls_node):
    with pytest.raises((AMQPConnectionError, ssl.SSLError)):
        connect_tls(tls_node, client_context(trustme.CA()))


def test_mutual_tls_requires_a_client_certificate(mtls_node, ca):
    with pytest.raises((AMQPConnectionError, ssl.SSLError)):
        connect_tls(mtls_node, client_context(ca))
    with pytest.raises((AMQPConnectionError, ssl.SSLError)):     # a certificate from a CA the node does not trust
        connect_tls(mtls_node, client_context(ca, trustme.CA().issue_cert("client@example")))
    conn = connect_tls(mtls_node, client_context(ca, ca.issue_cert("client@example")))
    assert round_trip(conn) == [b"over tls"]


def test_bad_certificate_files_stop_the_node_at_start(tmp_path, pki):
    argv = [*haremq_command(), "node", "--data-dir", str(tmp_path / "d"), "--amqp-port", str(free_port()),
            "--tls-port", str(free_port()), "--tls-cert", str(tmp_path / "missing.pem"),
            "--tls-key", str(pki / "server.key")]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert r.stderr.strip().startswith("haremq: cannot load TLS certificate"), r.stderr
