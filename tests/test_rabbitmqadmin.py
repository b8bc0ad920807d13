"""rabbitmqadmin, the management plugin's own CLI (shipped in Debian's rabbitmq-server package),
against HareMQ's management API: declare, publish, list, get, purge, delete, export and import.
Skips when rabbitmqadmin is not installed (it is never a CI dependency)."""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.conftest import IS_REF, unique_name, wait_until
from tests.management import ManagedNode

RABBITMQADMIN = shutil.which("rabbitmqadmin")
pytestmark = [pytest.mark.skipif(IS_REF, reason="starts its own node"),
              pytest.mark.skipif(RABBITMQADMIN is None, reason="no rabbitmqadmin (Debian's rabbitmq-server has it)")]


@pytest.fixture
def node(tmp_path):
    n = ManagedNode("hare-admin", tmp_path).start()
    yield n
    n.stop()


def admin(node, *args, check=True):
    r = subprocess.run([RABBITMQADMIN, "-H", "127.0.0.1", "-P", str(node.management_port), "-u", "guest",
                        "-p", "guest", *args], capture_output=True, text=True, timeout=30)
    if check:
        assert r.returncode == 0, (r.stdout, r.stderr)
    return r


def test_rabbitmqadmin_drives_the_api(node, tmp_path):
    name = unique_name("adm")
    assert "queue declared" in admin(node, "declare", "queue", f"name={name}", "durable=true").stdout
    for i in range(3):
        assert "Message published" in admin(node, "publish", f"routing_key={name}", f"payload=p{i}").stdout

    def listed():
        rows = json.loads(admin(node, "-f", "raw_json", "list", "queues", "name", "messages", "node").stdout)
        return next((r for r in rows if r["name"] == name and r.get("messages") == 3), None)
    row = wait_until(listed, 15, 0.5)
    assert row["node"] == "hare-admin"
    got = json.loads(admin(node, "-f", "raw_json", "get", f"queue={name}", "ackmode=ack_requeue_false").stdout)
    assert got[0]["payload"] == "p0" and got[0]["message_count"] == 2
    assert "queue purged" in admin(node, "purge", "queue", f"name={name}").stdout
    assert "No items" not in admin(node, "list", "nodes", "name").stdout
    assert "hare-admin" in admin(node, "show", "overview").stdout

    exported = tmp_path / "defs.json"
    admin(node, "export", str(exported))
    data = json.loads(exported.read_text())
    assert any(qu["name"] == name for qu in data["queues"])
    assert "queue deleted" in admin(node, "delete", "queue", f"name={name}").stdout
    assert admin(node, "list", "queues", "name").stdout.count(name) == 0
    admin(node, "import", str(exported))
    wait_until(lambda: name in admin(node, "list", "queues", "name").stdout, 15, 0.5)

    r = subprocess.run([RABBITMQADMIN, "-H", "127.0.0.1", "-P", str(node.management_port), "-u", "guest",
                        "-p", "wrong", "list", "queues"], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "Access refused" in r.stderr     # rabbitmqadmin's words for a 401
