"""Go's amqp091-go against the broker. Built in GOPATH mode from Debian's packages
(golang-go, golang-github-rabbitmq-amqp091-go-dev; `make test` installs them when apt is
there); skips without them."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PROJECT_ROOT

GO = shutil.which("go")
GOPATH = Path("/usr/share/gocode")
SOURCE = PROJECT_ROOT / "tests" / "go" / "compat.go"

pytestmark = pytest.mark.skipif(
    GO is None or not (GOPATH / "src/github.com/rabbitmq/amqp091-go").is_dir(),
    reason="needs Go and amqp091-go from Debian (golang-go, golang-github-rabbitmq-amqp091-go-dev)")


@pytest.fixture(scope="module")
def node(node_or_cluster_member):
    """A single node, then a three-node cluster's member that is not the metadata leader."""
    return node_or_cluster_member


@pytest.fixture(scope="module")
def go_client(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("go") / "compat-go"
    env = dict(os.environ, GOPATH=str(GOPATH), GO111MODULE="off",
               GOCACHE=str(out.parent / "cache"))
    proc = subprocess.run([GO, "build", "-o", str(out), str(SOURCE)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, f"go build failed:\n{proc.stderr}"
    return out


def run_go(go_client, node, scenario: str) -> dict:
    proc = subprocess.run([str(go_client), scenario, node.url.replace("/%2F", "/")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, f"amqp091-go {scenario} failed:\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_round_trip(go_client, node):
    assert run_go(go_client, node, "roundtrip") == {"body": "hello", "content_type": "text/plain"}


def test_publisher_confirms(go_client, node):
    assert run_go(go_client, node, "confirms") == {"acked": 20}


def test_consumer_cancel_notification(go_client, node):
    assert run_go(go_client, node, "cancel_notify") == {"cancelled": "go-consumer"}


def test_refused_login(go_client, node):
    result = run_go(go_client, node, "refused_login")
    assert result["refused"] and "403" in result["error"], result


def test_message_larger_than_frame_max(go_client, node):
    assert run_go(go_client, node, "large") == {"size": 3 * 131072 + 17, "same": True}


def test_queue_deleted_under_own_consumer(go_client, node):
    assert run_go(go_client, node, "queue_deleted_under_consumer") == {"cancelled": "go-consumer", "deleted": 0}


def test_channel_exception_with_close(go_client, node):
    # amqp091-go's TestChannelExceptionWithCloseIssue43: channel.close 404 (a publish to a missing
    # exchange) crossing the client's Channel.Close(); the connection's other channel goes on
    assert run_go(go_client, node, "exception_with_close") == {"rounds": 100}
