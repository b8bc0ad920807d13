"""Operations as a RabbitMQ user expects them: settings from flags, HAREMQ_* and a config file;
`haremq --version`; `haremq ctl` with rabbitmqctl's exit codes and day-2 commands; PerfTest's
flags in `haremq perf`; quiet health probes. Real node processes, real clients (pika)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pika
import pytest

from haremq.node import settings
from tests.clusters import SECRET, ClusterMember, launch
from tests.conftest import free_port, port_open, wait_until

ROOT = Path(__file__).resolve().parent.parent


def haremq(*args, env=None, input=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "haremq.cluster.cli", *args], capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, **(env or {})), input=input, timeout=timeout)


def _resolve(argv, environ=None):
    from haremq.cluster.cli import build_parser
    return settings.resolve(build_parser().parse_args(["node", *argv]), environ=environ or {})


# ---- settings ---------------------------------------------------------------------------------
def test_settings_precedence_flag_env_file_default(tmp_path):
    cfg = tmp_path / "haremq.toml"
    cfg.write_text('amqp_port = 1111\nname = "from-file"\nlog_json = true\nfailure_timeout = 2.5\n'
                   'peer = ["a=h1:1", "b=h2:2"]\n')
    v = _resolve(["--config", str(cfg)])
    assert (v["amqp_port"], v["name"], v["log_json"], v["failure_timeout"]) == (1111, "from-file", True, 2.5)
    assert v["peers"] == [("a", "h1:1"), ("b", "h2:2")]
    assert v["bind"] == "127.0.0.1" and v["segment_size"] == 64 << 20        # defaults
    v = _resolve(["--config", str(cfg)], {"HAREMQ_AMQP_PORT": "2222", "HAREMQ_LOG_JSON": "0"})
    assert v["amqp_port"] == 2222 and v["log_json"] is False                  # env over file
    v = _resolve(["--config", str(cfg), "--amqp-port", "3333"], {"HAREMQ_AMQP_PORT": "2222"})
    assert v["amqp_port"] == 3333                                              # flag over env
    v = _resolve([], {"HAREMQ_CONFIG": str(cfg)})
    assert v["name"] == "from-file"                                            # HAREMQ_CONFIG names the file


@pytest.mark.parametrize("text,value", [("1", True), ("0", False), ("true", True), ("FALSE", False),
                                        ("yes", True), ("off", False)])
def test_boolean_settings_accept_1_0_true_false(text, value):
    for name in ("HAREMQ_LOG_JSON", "HAREMQ_TLS_VERIFY_PEER", "HAREMQ_SKIP_CORRUPT", "HAREMQ_MANAGEMENT_TLS"):
        assert _resolve([], {name: text})[name[7:].lower()] is value
    assert _resolve(["--log-json"])["log_json"] is True
    assert _resolve([f"--log-json={text}"])["log_json"] is value


def test_env_settings_once_ignored_are_read():
    v = _resolve([], {"HAREMQ_SEGMENT_SIZE": "1048576", "HAREMQ_PEERS": "a=h1:1,b=h2:2",
                      "HAREMQ_PROMETHEUS_PER_QUEUE": "off"})
    assert v["segment_size"] == 1 << 20 and v["peers"] == [("a", "h1:1"), ("b", "h2:2")]
    assert v["prometheus_per_queue"] is False


@pytest.mark.parametrize("where,name", [
    ({"HAREMQ_AMQP_PORT": "abc"}, "HAREMQ_AMQP_PORT"),
    ({"HAREMQ_AMQP_PORT": "70000"}, "HAREMQ_AMQP_PORT"),
    ({"HAREMQ_LOG_LEVEL": "loud"}, "HAREMQ_LOG_LEVEL"),
    ({"HAREMQ_LOG_JSON": "maybe"}, "HAREMQ_LOG_JSON"),
    ({"HAREMQ_REPLICAS": "three"}, "HAREMQ_REPLICAS"),
    ({"HAREMQ_SEGMENT_SIZE": "big"}, "HAREMQ_SEGMENT_SIZE"),
    ({"HAREMQ_PEERS": "nonsense"}, "HAREMQ_PEERS"),
])
def test_bad_setting_is_one_line_naming_it_with_exit_2(tmp_path, where, name):
    r = haremq("node", "--data-dir", str(tmp_path / "d"), env=where, timeout=30)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert name in r.stderr


def test_bad_config_file_is_one_line_with_exit_2(tmp_path):
    for text, want in (('amqp_port = "abc"\n', "amqp_port"), ("nosuch = 1\n", "unknown setting 'nosuch'"),
                       ("amqp_port = \n", "not TOML")):
        cfg = tmp_path / "bad.toml"
        cfg.write_text(text)
        r = haremq("node", "--config", str(cfg), timeout=30)
        assert r.returncode == 2 and want in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    r = haremq("node", "--config", str(tmp_path / "missing.toml"), timeout=30)
    assert r.returncode == 2 and "missing.toml" in r.stderr


def test_help_never_reads_the_environment():
    r = haremq("--help", env={"HAREMQ_REPLICAS": "three", "HAREMQ_AMQP_PORT": "abc"})
    assert r.returncode == 0 and "Traceback" not in r.stderr
    r = haremq("node", "--help", env={"HAREMQ_AMQP_PORT": "abc"})
    assert r.returncode == 0 and "HAREMQ_AMQP_PORT" in r.stdout and "--config" in r.stdout


def test_version_comes_from_the_package_metadata():
    from importlib import metadata

    from haremq.node.broker.broker import VERSION
    r = haremq("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"haremq {metadata.version('haremq')}" \
        and VERSION == metadata.version("haremq")


def test_node_from_config_file_and_json_logs_from_env(tmp_path):
    """A node started with only --config (TOML) listens where the file says; HAREMQ_LOG_JSON=1 logs JSON."""
    port = free_port()
    cfg = tmp_path / "haremq.toml"
    cfg.write_text(f'amqp_port = {port}\ndata_dir = "{tmp_path / "data"}"\nname = "cfg"\n'
                   'management_port = 0\nprometheus_port = 0\nsegment_size = 1048576\n')
    log = open(tmp_path / "log", "w+")
    p = subprocess.Popen([sys.executable, "-m", "haremq.cluster.cli", "node", "--config", str(cfg)], stdout=log,
                         stderr=subprocess.STDOUT, cwd=ROOT, env=dict(os.environ, HAREMQ_LOG_JSON="1"),
                         start_new_session=True)
    try:
        wait_until(lambda: port_open(port, 0.2), timeout=30, message="the node never listened on the file's port")
        pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port)).close()
        log.seek(0)
        lines = [x for x in log.read().splitlines() if x.strip()]
        events = [json.loads(x) for x in lines]
        assert any(e.get("event") == "node started" for e in events), lines
    finally:
        p.terminate()
        p.wait(15)


# ---- health probes -----------------------------------------------------------------------------
def test_health_probe_is_not_logged_at_info(own_node):
    for _ in range(3):
        r = haremq("health", "--amqp-port", str(own_node.port))
        assert r.returncode == 0, r.stderr
    time.sleep(0.3)
    assert "connection lost" not in own_node.log_text(), own_node.log_tail()


# ---- perf: PerfTest's flags ------------------------------------------------------------------
def test_perf_multi_ack_is_dash_A(node, tmp_path):
    out = tmp_path / "a.json"
    r = haremq("perf", "-h", node.url, "-x", "1", "-y", "1", "-C", "200", "-q", "50", "-A", "10",
               "-u", "ops-perf-a", "--json", str(out), "--quiet", "--delete-after")
    assert r.returncode == 0, r.stderr
    s = json.loads(out.read_text())
    assert s["consumed"] == 200 and s["config"]["multi_ack_every"] == 10


@pytest.mark.parametrize("argv,flag", [(["-n", "5"], "-n"), (["-e", "amq.topic"], "-e"), (["-m", "10"], "-m"),
                                       (["--predeclared"], "--predeclared"), (["-H", "amqp://x"], "-H")])
def test_perf_refuses_perftest_flags_it_does_not_support(argv, flag):
    r = haremq("perf", "-h", "amqp://guest:guest@127.0.0.1:1/%2F", "-C", "1", *argv)
    assert r.returncode == 2 and flag in r.stderr and "PerfTest" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


# ---- ctl ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def one(tmp_path_factory):
    """A clustered node of one member: it serves `haremq ctl` on its cluster port."""
    d = tmp_path_factory.mktemp("ops-ctl")
    secret = d / "secret"
    secret.write_text(SECRET)
    m = ClusterMember("ops1", d / "ops1", free_port(), {}, secret)
    launch([m])
    yield m
    m.stop()


def ctl(m, *args, input=None, timeout=30):
    return haremq("ctl", "--node", f"{m.host}:{m.cluster_port}", "--cluster-secret-file", str(m.secret_file),
                  *args, input=input, timeout=timeout)


def ctl_json(m, *args):
    r = ctl(m, "--formatter", "json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_ctl_exit_codes_are_rabbitmqctl_s(one):
    r = haremq("ctl", "--node", f"127.0.0.1:{free_port()}", "cluster-status", env={"HAREMQ_CLUSTER_SECRET": "x"})
    assert r.returncode == 69 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert haremq("ctl", "no-such-command").returncode == 64
    assert haremq("ctl", "purge-queue").returncode == 64                       # missing argument
    r = ctl(one, "purge-queue", "no-such-queue")
    assert r.returncode == 65 and "no-such-queue" in r.stderr, r.stderr
    r = haremq("ctl", "--node", f"127.0.0.1:{one.cluster_port}", "cluster-status",
               env={"HAREMQ_CLUSTER_SECRET": "wrong"})
    assert r.returncode == 77, r.stderr
    bad = one.workdir / "bad.json"
    bad.write_text("{nope")
    assert ctl(one, "import-definitions", str(bad)).returncode == 65


def test_ctl_help_for_every_command():
    from haremq.node.ctl import build_parser
    top = haremq("ctl", "--help").stdout
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    helps = {a.dest: a.help for a in sub._choices_actions}
    for name in sub.choices:
        assert helps.get(name), f"ctl {name} has no help"
        assert name in top
    assert helps["sync-queue"] != helps["cancel-sync-queue"]


def test_ctl_json_formatter_and_list_queues_columns_and_vhost(one):
    conn = pika.BlockingConnection(pika.ConnectionParameters(one.host, one.port))
    ch = conn.channel()
    ch.queue_declare("ops.cols", durable=True)
    ch.basic_publish("", "ops.cols", b"x", pika.BasicProperties(delivery_mode=2))
    conn.close()
    assert ctl(one, "add-vhost", "ops-v").returncode == 0
    rows = ctl_json(one, "list-queues", "name", "messages")
    assert {"name": "ops.cols", "messages": 1} in rows and all(set(r) == {"name", "messages"} for r in rows)
    assert ctl_json(one, "list-queues", "-p", "ops-v") == []
    assert any(r["name"] == "ops.cols" for r in ctl_json(one, "list-queues", "-p", "/"))
    assert ctl(one, "list-queues", "name", "--json").stdout == ctl(one, "--formatter", "json", "list-queues",
                                                                   "name").stdout
    table = ctl(one, "list-queues", "name", "messages").stdout.splitlines()
    assert table[0].split() == ["name", "messages"]
    assert ctl(one, "list-queues", "nosuchcolumn").returncode == 64


def test_ctl_purge_and_delete_queue(one):
    conn = pika.BlockingConnection(pika.ConnectionParameters(one.host, one.port))
    ch = conn.channel()
    ch.queue_declare("ops.purge")
    for _ in range(3):
        ch.basic_publish("", "ops.purge", b"x")
    assert ctl_json(one, "purge-queue", "ops.purge") == {"message_count": 3}
    assert ch.queue_declare("ops.purge", passive=True).method.message_count == 0
    ch.basic_publish("", "ops.purge", b"x")
    ch.basic_consume("ops.purge", lambda *a: None)
    r = ctl(one, "delete-queue", "ops.purge", "--if-unused")
    assert r.returncode == 65 and "in use" in r.stderr, r.stderr
    conn.close()
    assert ctl(one, "delete-queue", "ops.purge").returncode == 0
    assert not any(r["name"] == "ops.purge" for r in ctl_json(one, "list-queues"))


def test_ctl_channels_consumers_and_close_connection(one):
    conn = pika.BlockingConnection(pika.ConnectionParameters(
        one.host, one.port, client_properties={"connection_name": "ops-victim"}))
    ch = conn.channel()
    ch.queue_declare("ops.cons")
    ch.basic_consume("ops.cons", lambda *a: None, consumer_tag="ops-tag")
    consumers = ctl_json(one, "list-consumers")
    assert any(c["consumer_tag"] == "ops-tag" and c["queue"]["name"] == "ops.cons" for c in consumers), consumers
    channels = ctl_json(one, "list-channels")
    assert channels and all("number" in c for c in channels)
    assert "ops-tag" in ctl(one, "list-consumers").stdout
    name = next(c["channel_details"]["connection_name"] for c in consumers if c["consumer_tag"] == "ops-tag")
    r = ctl(one, "close-connection", name, "go away")
    assert r.returncode == 0, r.stderr
    with pytest.raises(pika.exceptions.ConnectionClosed) as exc:
        conn.process_data_events(2)
        conn.process_data_events(2)
    assert "go away" in str(exc.value) or "320" in str(exc.value)
    assert ctl(one, "close-connection", "no such connection").returncode == 65


def test_ctl_add_user_reads_the_password_from_stdin(one):
    r = ctl(one, "add-user", "ops-stdin", input="s3cret\n")
    assert r.returncode == 0, r.stderr
    assert ctl(one, "set-permissions", "ops-stdin", ".*", ".*", ".*").returncode == 0
    pika.BlockingConnection(pika.ConnectionParameters(
        one.host, one.port, credentials=pika.PlainCredentials("ops-stdin", "s3cret"))).close()
    assert ctl(one, "add-user", "ops-empty", input="").returncode == 65


def test_ctl_import_definitions_live(one, tmp_path):
    data = {"vhosts": [{"name": "ops-defs"}],
            "users": [], "permissions": [{"user": "guest", "vhost": "ops-defs", "configure": ".*",
                                          "write": ".*", "read": ".*"}],
            "policies": [{"vhost": "ops-defs", "name": "ops-ttl", "pattern": "^ops", "apply-to": "queues",
                          "definition": {"message-ttl": 60000}, "priority": 0}],
            "exchanges": [{"name": "ops.x", "vhost": "ops-defs", "type": "topic", "durable": True}],
            "queues": [{"name": "ops.q", "vhost": "ops-defs", "durable": True, "arguments": {}}],
            "bindings": [{"source": "ops.x", "vhost": "ops-defs", "destination": "ops.q",
                          "destination_type": "queue", "routing_key": "a.#", "arguments": {}}]}
    f = tmp_path / "defs.json"
    f.write_text(json.dumps(data))
    r = ctl(one, "import-definitions", str(f))
    assert r.returncode == 0, r.stderr
    conn = pika.BlockingConnection(pika.ConnectionParameters(one.host, one.port, virtual_host="ops-defs"))
    ch = conn.channel()
    ch.basic_publish("ops.x", "a.b", b"routed")
    wait_until(lambda: ch.queue_declare("ops.q", passive=True).method.message_count == 1, timeout=5)
    conn.close()
    assert any(p["name"] == "ops-ttl" for p in ctl_json(one, "list-policies", "-p", "ops-defs"))


def test_ctl_await_startup_and_mirror_sync_check_on_a_lone_node(one):
    assert ctl(one, "await-startup").returncode == 0
    assert ctl(one, "await-online-synchronized-mirror").returncode == 0
    assert ctl(one, "check-if-node-is-mirror-sync-critical").returncode == 0
    r = haremq("ctl", "--node", f"127.0.0.1:{free_port()}", "--timeout", "1", "await-startup",
               env={"HAREMQ_CLUSTER_SECRET": "x"})
    assert r.returncode == 75, r.stderr


def test_ctl_drain_and_revive(one):
    assert ctl(one, "drain").returncode == 0
    try:
        wait_until(lambda: not port_open(one.port, 0.2, one.host), timeout=5)
        time.sleep(0.5)
        assert not port_open(one.port, 0.2, one.host)
    finally:
        assert ctl(one, "revive").returncode == 0
    wait_until(lambda: port_open(one.port, 0.2, one.host), timeout=5)
    pika.BlockingConnection(pika.ConnectionParameters(one.host, one.port)).close()


def test_mirror_sync_critical_node_waits_until_a_mirror_is_synchronised(tmp_path):
    """What the chart's preStop hook relies on: the master of a queue whose mirrors are not
    synchronised is critical (check exits 69, await times out with 75) until sync-queue."""
    from tests.clusters import proxied_cluster, queue_row, stop_cluster
    members, partition = proxied_cluster(tmp_path, failure_timeout=3.0)
    try:
        hare1, hare2, _hare3 = members
        conn = pika.BlockingConnection(pika.ConnectionParameters(hare1.host, hare1.port))
        ch = conn.channel()
        ch.queue_declare("ha.crit", durable=True)                 # homed on hare1: its master
        for i in range(10):
            ch.basic_publish("", "ha.crit", str(i).encode(), pika.BasicProperties(delivery_mode=2))
        conn.close()
        # manual sync: mirrors added to a queue that holds messages stay unsynchronised
        r = ctl(hare1, "set-policy", "ha", r"^ha\.", json.dumps({"ha-mode": "all", "ha-sync-mode": "manual"}),
                "--apply-to", "queues")
        assert r.returncode == 0, r.stderr
        wait_until(lambda: len(queue_row(hare1, "ha.crit")["mirrors"] or []) == 2, timeout=20)
        r = ctl(hare1, "check-if-node-is-mirror-sync-critical", "--formatter", "json")
        assert r.returncode == 69 and json.loads(r.stdout) == [{"vhost": "/", "name": "ha.crit", "node": "hare1"}]
        assert ctl(hare2, "check-if-node-is-mirror-sync-critical").returncode == 0     # only a mirror there
        r = ctl(hare1, "--timeout", "2", "await-online-synchronized-mirror")
        assert r.returncode == 75 and "timed out" in r.stderr, r.stderr
        assert ctl(hare1, "sync-queue", "ha.crit").returncode == 0
        r = ctl(hare1, "--timeout", "30", "await-online-synchronized-mirror")
        assert r.returncode == 0, r.stderr
    finally:
        stop_cluster(list(members), partition)
