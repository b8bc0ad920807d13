"""The cluster secret's defaults: a node refuses to start a cluster with the public example
secret (deploy/cluster-secret.example) or with none, unless told it is a test
(`--insecure-cluster`); a secret file may list several secrets (the first is sent, every one
is accepted), so that the secret can be rotated one member at a time."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.clusters import ClusterMember
from tests.conftest import IS_REF, PROJECT_ROOT, free_port, port_open, wait_until

pytestmark = pytest.mark.skipif(IS_REF, reason="starts its own nodes")
EXAMPLE = PROJECT_ROOT / "deploy" / "cluster-secret.example"


def _node(tmp_path, *args, env=None, wait: float = 20.0):
    """Run `haremq node` clustered; (exit status or None if still running, stderr, the process)."""
    cmd = [sys.executable, "-m", "haremq.cluster.cli", "node", "--name", "hare-s", "--data-dir", str(tmp_path / "data"),
           "--amqp-port", str(free_port()), "--cluster-port", str(free_port()), "--management-port", "0",
           "--prometheus-port", "0", *args]
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HAREMQ_CLUSTER_SECRET")}
    environ["HOME"] = str(tmp_path)          # the default secret file, if any, goes here
    environ.update(env or {})
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environ)
    try:
        code = proc.wait(wait)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None, proc.stderr.read(), proc
    return code, proc.stderr.read(), proc


def test_the_example_secret_is_the_file_in_deploy():
    from haremq.cluster.secret import EXAMPLE_SECRET
    assert EXAMPLE.read_text().strip() == EXAMPLE_SECRET


def test_a_node_refuses_the_example_secret(tmp_path):
    code, err, _ = _node(tmp_path, "--cluster-secret-file", str(EXAMPLE))
    assert code == 2, (code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "example" in lines[0] and "--insecure-cluster" in lines[0], lines[0]
    # given through the environment, the same
    code, err, _ = _node(tmp_path, env={"HAREMQ_CLUSTER_SECRET": EXAMPLE.read_text()})
    assert code == 2 and "example" in err, (code, err)


@pytest.mark.parametrize("how", ["empty file", "empty variable"])
def test_a_node_refuses_to_start_a_cluster_with_no_secret(tmp_path, how):
    if how == "empty file":
        empty = tmp_path / "empty"
        empty.write_text("\n")
        code, err, _ = _node(tmp_path, "--cluster-secret-file", str(empty))
    else:
        code, err, _ = _node(tmp_path, env={"HAREMQ_CLUSTER_SECRET": " "})
    assert code == 2, (code, err)
    assert len(err.strip().splitlines()) == 1 and "no cluster secret" in err, err


def test_insecure_cluster_starts_with_the_example_secret_and_says_so(tmp_path):
    port = free_port()
    cmd_args = ["--cluster-secret-file", str(EXAMPLE), "--insecure-cluster"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "haremq.cluster.cli", "node", "--name", "hare-i", "--data-dir", str(tmp_path / "data"),
         "--amqp-port", str(free_port()), "--cluster-port", str(port), "--management-port", "0",
         "--prometheus-port", "0", *cmd_args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ, HOME=str(tmp_path)))
    try:
        wait_until(lambda: port_open(port), 30)
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
    assert "--insecure-cluster" in out and "warning" in out.lower(), out


def test_the_rules_for_a_cluster_secret():
    from haremq.cluster.secret import EXAMPLE_SECRET, check
    # (refusal, warning) for: secret, TLS on, --insecure-cluster, the address the cluster port is on
    assert check(EXAMPLE_SECRET, False, False, "0.0.0.0")[0]
    assert check(EXAMPLE_SECRET, True, False, "0.0.0.0")[0], "TLS does not make a public secret secret"
    assert check("", True, False, "127.0.0.1")[0]
    assert check("s3cret\n" + EXAMPLE_SECRET, True, False, "0.0.0.0")[0], "accepting the example is the hole"
    refusal, warning = check(EXAMPLE_SECRET, False, True, "127.0.0.1")
    assert refusal is None and "--insecure-cluster" in warning
    # a real secret without TLS, reachable from other hosts: started, with a warning (as RabbitMQ
    # runs its inter-node link in clear unless told otherwise)
    refusal, warning = check("a-real-secret", False, False, "0.0.0.0")
    assert refusal is None and "TLS" in warning
    assert check("a-real-secret", False, False, "127.0.0.1") == (None, None), "loopback only: nothing to say"
    assert check("a-real-secret", True, False, "0.0.0.0") == (None, None)


def test_a_secret_file_of_several_lines_rotates_one_member_at_a_time(tmp_path):
    """The first line is what a member sends, every line is what it accepts: add the new secret
    as a second line everywhere, then make it the first, then drop the old one."""
    secret = tmp_path / "secret"
    secret.write_text("new-secret\nold-secret\n")
    member = ClusterMember("rot1", tmp_path / "rot1", free_port(), {}, secret).start()
    try:
        def ctl(secret_text):
            f = tmp_path / "ctl-secret"
            f.write_text(secret_text)
            return subprocess.run([sys.executable, "-m", "haremq.cluster.cli", "ctl", "--node",
                                   f"127.0.0.1:{member.cluster_port}", "--cluster-secret-file", str(f),
                                   "cluster-status"], capture_output=True, text=True, timeout=60)
        assert ctl("old-secret\n").returncode == 0
        assert ctl("new-secret\n").returncode == 0
        refused = ctl("another-secret\n")
        assert refused.returncode == 77, refused.stderr
    finally:
        member.stop()


def test_the_local_dev_cluster_still_starts(tmp_path):
    """`haremq cluster up` (what `make run` runs): three members on loopback with the user's own
    random secret (~/.haremq/cluster-secret, made on first use), no TLS, and no warning about it."""
    import random
    import signal
    # below the kernel's ephemeral range (32768 up): a client socket elsewhere cannot hold these
    base = random.Random().randrange(20000, 27000, 10)
    proc = subprocess.Popen([sys.executable, "-m", "haremq.cluster.cli", "cluster", "up", "--nodes", "3",
                             "--amqp-port", str(base), "--cluster-port", str(base + 5000),
                             "--management-port", "0", "--prometheus-port", "0", "--data-dir", str(tmp_path / "d")],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, HOME=str(tmp_path)), start_new_session=True)
    try:
        for i in range(3):
            wait_until(lambda i=i: port_open(base + i) or proc.poll() is not None, 60)
        assert proc.poll() is None, proc.communicate(timeout=10)[0]
        done = subprocess.run([sys.executable, "-m", "haremq.cluster.cli", "ctl", "--node", f"127.0.0.1:{base + 5000}",
                               "cluster-status", "--json"], capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, HOME=str(tmp_path)))
        assert done.returncode == 0, done.stderr
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        out = proc.communicate(timeout=60)[0]
    assert "no TLS" not in out and "insecure" not in out, out
    assert (tmp_path / ".haremq" / "cluster-secret").read_text().strip()
