"""amqplib (Node.js), the client the README names for JavaScript, against the broker.

Each test runs one scenario of tests/js/compat.js in a `node` subprocess; the
package is installed by `make test` (npm install in tests/js). Skips when
Node.js or the package is missing.
"""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.conftest import PROJECT_ROOT

JS_DIR = PROJECT_ROOT / "tests" / "js"
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(
    NODE is None or not (JS_DIR / "node_modules" / "amqplib").is_dir(),
    reason="needs Node.js and amqplib (make test runs npm install in tests/js)")


@pytest.fixture(scope="module")
def node(node_or_cluster_member):
    """A single node, then a three-node cluster's member that is not the metadata leader."""
    return node_or_cluster_member


def run_js(node, scenario: str) -> dict:
    proc = subprocess.run([NODE, str(JS_DIR / "compat.js"), scenario, node.url.replace("/%2F", "")],
                          capture_output=True, text=True, timeout=60, cwd=str(JS_DIR))
    assert proc.returncode == 0, f"amqplib {scenario} failed:\n{proc.stderr}\n{proc.stdout}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_round_trip(node):
    assert run_js(node, "roundtrip") == {"body": "hello", "contentType": "text/plain", "n": 1}


def test_publisher_confirms(node):
    assert run_js(node, "confirms") == {"count": 50}


def test_consumer_cancel_notification(node):
    assert run_js(node, "cancel_notify") == {"cancelled": True}


def test_refused_login(node):
    result = run_js(node, "refused_login")
    assert result["refused"] and "403 (ACCESS-REFUSED)" in result["message"], result


def test_message_larger_than_frame_max(node):
    assert run_js(node, "large") == {"size": 3 * 131072 + 17, "same": True}


def test_queue_deleted_under_own_consumer(node):
    # delete-ok comes before the basic.cancel: amqplib otherwise ends the channel
    assert run_js(node, "queue_deleted_under_consumer") == {"messageCount": 0, "cancelled": True}


def test_close_right_after_a_flood_completes(node):
    # sendToQueue until it returns false, then connection.close: close-ok, no reset
    result = run_js(node, "flood_close")
    assert result["closed"] is True and result["sent"] > 1, result
