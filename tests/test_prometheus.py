"""A real Prometheus server (Debian's `prometheus` package) scrapes a three-node cluster; the test
asks Prometheus's own HTTP API for `rabbitmq_queue_messages_ready` and HareMQ's series.
Skips when the prometheus binary is not installed (.ci/run installs it)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import urllib.parse
import urllib.request

import pika
import pytest

from tests.clusters import managed_cluster
from tests.conftest import IS_REF, free_port, port_open, unique_name, wait_until
from tests.management import http, q
from tests.test_management_cluster import NAMES

PROMETHEUS = os.environ.get("PROMETHEUS_BIN") or shutil.which("prometheus")
pytestmark = [
    pytest.mark.skipif(IS_REF, reason="starts its own cluster"),
    pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary (apt-get install prometheus)"),
]


@pytest.fixture
def scraped(tmp_path):
    members, partition = managed_cluster(tmp_path / "cluster")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    targets = [f"127.0.0.1:{m.prometheus_port}" for m in members.values()]
    config.write_text("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                      "scrape_configs:\n  - job_name: haremq\n    static_configs:\n"
                      f"      - targets: {json.dumps(targets)}\n")
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        wait_until(lambda: port_open(port, 0.2) or proc.poll() is not None, 30)
        assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
        yield members, port
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(15)
        log.close()
        for m in members.values():
            m.kill9()
        partition["close"]()


def query(port: int, expr: str) -> list:
    url = f"http://127.0.0.1:{port}/api/v1/query?query={urllib.parse.quote(expr)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        answer = json.load(response)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def test_prometheus_scrapes_every_member(scraped):
    members, port = scraped
    hare1, hare2 = members["hare1"], members["hare2"]
    name = unique_name("prom")
    assert http("PUT", hare2.management_port, f"/api/queues/%2F/{q(name)}", {"durable": True})[0] == 201
    c = pika.BlockingConnection(pika.URLParameters(hare1.url))     # published through another node
    ch = c.channel()
    ch.confirm_delivery()
    for i in range(7):
        ch.basic_publish("", name, b"x%d" % i, pika.BasicProperties(delivery_mode=2))
    c.close()

    def ready():
        rows = query(port, f'rabbitmq_queue_messages_ready{{queue="{name}"}}')
        return rows if rows and rows[0]["value"][1] == "7" else None
    rows = wait_until(ready, 60, 0.5)
    assert rows[0]["metric"]["vhost"] == "/" and rows[0]["metric"]["instance"] == f"127.0.0.1:{hare2.prometheus_port}"

    up = wait_until(lambda: (lambda r: r if len(r) == 3 else None)(query(port, "up == 1")), 30, 0.5)
    assert len(up) == 3
    terms = wait_until(lambda: (lambda r: r if len(r) == 3 else None)(query(port, "haremq_raft_term")), 30, 0.5)
    assert len({r["value"][1] for r in terms}) == 1            # every member in the same term
    leaders = query(port, "sum(haremq_raft_is_leader)")
    assert leaders[0]["value"][1] == "1"
    peers = wait_until(lambda: (lambda r: r if len(r) == 6 else None)(query(port, "haremq_peer_up == 1")), 30, 0.5)
    assert {r["metric"]["peer"] for r in peers} == set(NAMES)
    published = query(port, f'sum(rabbitmq_queue_messages_published_total{{queue="{name}"}})')
    assert published[0]["value"][1] == "7"
    assert query(port, "sum(rabbitmq_global_messages_received_total)")[0]["value"][1] != "0"
