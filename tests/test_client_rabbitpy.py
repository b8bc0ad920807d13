"""rabbitpy against the broker: it found that body frames of frame_max payload bytes and the
403 close of a refused login must work as in RabbitMQ (issue 17). Runs tests/rabbitpy_client.py
in a subprocess with .tools/rabbitpy on PYTHONPATH (rabbitpy needs pamqp 4; `make test` installs
it there); skips without it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import PROJECT_ROOT

RABBITPY_DIR = PROJECT_ROOT / ".tools" / "rabbitpy"

pytestmark = pytest.mark.skipif(not (RABBITPY_DIR / "rabbitpy").is_dir(),
                                reason="needs rabbitpy in .tools/rabbitpy (make test installs it)")


@pytest.fixture(scope="module")
def node(node_or_cluster_member):
    """A single node, then a three-node cluster's member that is not the metadata leader."""
    return node_or_cluster_member


def run_rabbitpy(node, scenario: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(RABBITPY_DIR))
    proc = subprocess.run([sys.executable, str(PROJECT_ROOT / "tests" / "rabbitpy_client.py"), scenario, node.url],
                          capture_output=True, text=True, timeout=60, env=env, cwd=str(RABBITPY_DIR))
    assert proc.returncode == 0, f"rabbitpy {scenario} failed:\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_round_trip(node):
    assert run_rabbitpy(node, "roundtrip") == {"body": "hello", "content_type": "text/plain"}


def test_publisher_confirms(node):
    assert run_rabbitpy(node, "confirms") == {"acked": True, "count": 20}


def test_message_larger_than_frame_max(node):
    # rabbitpy's body frames carry frame_max (131072) payload bytes
    assert run_rabbitpy(node, "large") == {"size": 3 * 131072 + 17, "same": True}


def test_refused_login_is_access_refused(node):
    # a socket closed under the client's close-ok was a reset, some of the time: try a few
    for _ in range(5):
        result = run_rabbitpy(node, "refused_login")
        assert result["refused"] and result["error"] == "AMQPAccessRefused", result
        assert "403" in result["text"] and "ACCESS_REFUSED - Login was refused" in result["text"]


def test_queue_deleted_under_consumer_is_a_cancellation(node):
    assert run_rabbitpy(node, "queue_deleted_under_consumer") == {"got": ["one"], "cancelled": True}
