"""The chart's day-2 parts, rendered with `helm template`: the preStop hook and its grace period,
membership that follows `kubectl scale`, extraVolumes / extraVolumeMounts and a definitions
ConfigMap. The preStop command is run against a real node, as the kubelet would run it."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pika
import pytest

from haremq.node import ctl as node_ctl
from haremq.cluster.cli import _peers
from tests.clusters import SECRET, ClusterMember, launch
from tests.conftest import free_port, port_open, wait_until
from tests.test_deploy import (KUBE_VALIDATE, ROOT, _container, _node_argv, _statefulset, docs, needs_helm,
                               parse_node_args, render)


def _values(tmp_path, text: str):
    f = tmp_path / "values.yaml"
    f.write_text(text)
    return f


def _pre_stop(container) -> str:
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["sh", "-c"], command
    return command[2]


@needs_helm
def test_pre_stop_awaits_a_synchronised_mirror_then_drains_within_the_grace_period():
    sts = _statefulset(docs(render()))
    script = _pre_stop(_container(sts))
    steps = [s.strip() for s in script.split(";") if s.strip()]
    assert "await-online-synchronized-mirror" in steps[0] and " drain" in steps[1] and steps[-1] == "exit 0"
    grace = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    for step in steps[:2]:
        argv = shlex.split(step)
        assert argv[:2] == ["haremq", "ctl"]
        args = node_ctl.build_parser().parse_args(argv[2:])      # the command line ctl itself accepts
        assert args.node.startswith("127.0.0.1:") and args.timeout < grace
    assert grace >= 600


@needs_helm
def test_grace_period_and_pre_stop_are_configurable(tmp_path):
    sts = _statefulset(docs(render(_values(tmp_path, "terminationGracePeriodSeconds: 900\n"))))
    assert sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 900
    assert "--timeout 840" in _pre_stop(_container(sts))
    sts = _statefulset(docs(render(_values(tmp_path, "preStop:\n  enabled: false\n"))))
    assert "lifecycle" not in _container(sts)


@needs_helm
def test_pods_added_by_kubectl_scale_are_members():
    """The pod template does not change with `kubectl scale`: a pod with a higher ordinal finds every
    member below it by DNS (and itself), and the running members add it when it joins."""
    sts = _statefulset(docs(render()))
    name, headless = sts["metadata"]["name"], sts["spec"]["serviceName"]
    container = _container(sts)
    assert not any(re.fullmatch(r"--peer", a) for a in container["args"])
    args = parse_node_args(_node_argv(container, f"{name}-4", "mq"))     # scaled from 3 to 5
    domain = f"{headless}.mq.svc.cluster.local"
    assert _peers(vars(args)) == {f"{name}-{i}": f"{name}-{i}.{domain}:{args.cluster_port}" for i in range(4)}


@needs_helm
def test_extra_volumes_and_mounts(tmp_path):
    values = _values(tmp_path, """\
extraVolumes:
  - name: conf
    configMap:
      name: my-haremq-config
extraVolumeMounts:
  - name: conf
    mountPath: /etc/haremq/conf
    readOnly: true
extraArgs: ["--config", "/etc/haremq/conf/haremq.toml"]
""")
    sts = _statefulset(docs(render(values)))
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["conf"]["configMap"]["name"] == "my-haremq-config"
    container = _container(sts)
    assert {"name": "conf", "mountPath": "/etc/haremq/conf", "readOnly": True} in container["volumeMounts"]
    assert container["args"][-2:] == ["--config", "/etc/haremq/conf/haremq.toml"]


@needs_helm
@pytest.mark.parametrize("values,configmap", [
    ('definitions:\n  content: \'{"queues": [{"name": "q1", "vhost": "/"}]}\'\n', "t-haremq-definitions"),
    ("definitions:\n  existingConfigMap: my-defs\n  key: defs.json\n", "my-defs"),
])
def test_definitions_config_map(tmp_path, values, configmap):
    manifests = docs(render(_values(tmp_path, values)))
    sts = _statefulset(manifests)
    container = _container(sts)
    args = parse_node_args(_node_argv(container, "t-haremq-0", "mq"))
    mount = next(m for m in container["volumeMounts"] if m["name"] == "definitions")
    assert str(args.definitions).startswith(mount["mountPath"] + "/")
    volume = next(v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "definitions")
    assert volume["configMap"]["name"] == configmap
    made = [m for m in manifests if m["kind"] == "ConfigMap"]
    if configmap == "t-haremq-definitions":
        (cm,) = made
        key = volume["configMap"]["items"][0]["key"]
        assert json.loads(cm["data"][key]) == {"queues": [{"name": "q1", "vhost": "/"}]}
    else:
        assert not made


@needs_helm
@pytest.mark.skipif(KUBE_VALIDATE is None, reason="no kubernetes-validate")
def test_day2_manifests_validate(tmp_path):
    values = _values(tmp_path, "definitions:\n  content: '{}'\nextraVolumes:\n  - name: x\n    emptyDir: {}\n"
                               "extraVolumeMounts:\n  - name: x\n    mountPath: /x\n")
    out = tmp_path / "rendered.yaml"
    out.write_text(render(values))
    done = subprocess.run([KUBE_VALIDATE, "--strict", "-k", "1.30.0", str(out)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@needs_helm
def test_pre_stop_command_runs_against_a_node(tmp_path):
    """The hook, as the kubelet runs it in the pod (haremq on PATH, the secret from the env),
    against a real member: it returns, and the node no longer takes clients."""
    script = _pre_stop(_container(_statefulset(docs(render()))))
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    m = ClusterMember("pre0", tmp_path / "pre0", free_port(), {}, secret)
    launch([m])
    try:
        script = script.replace("127.0.0.1:25672", f"127.0.0.1:{m.cluster_port}")
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "haremq").write_text(f"#!/bin/sh\ncd {shlex.quote(str(ROOT))} && exec "
                                        f"{shlex.quote(sys.executable)} -m haremq.cluster.cli \"$@\"\n")
        (bin_dir / "haremq").chmod(0o755)
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HAREMQ_CLUSTER_SECRET_FILE": str(secret)}
        done = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        assert "error" not in done.stderr.lower(), done.stderr
        wait_until(lambda: not port_open(m.port, 0.2, m.host), timeout=5)
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            pika.BlockingConnection(pika.ConnectionParameters(m.host, m.port, connection_attempts=1))
    finally:
        m.stop()


@needs_helm
def test_the_charts_generated_cluster_tls_runs_a_cluster(tmp_path):
    """The CA and member certificate the chart generates, as the pods get them: three members
    form a cluster over mutual TLS with them (dialling each other by a name the certificate
    holds), `haremq ctl` with the pod's environment reaches it, and a caller without a
    certificate does not."""
    import base64
    import os

    from tests.test_deploy import _secret
    manifests = docs(render())
    tls = _secret(manifests, "t-haremq-cluster-tls")
    tls_dir = tmp_path / "cluster-tls"
    tls_dir.mkdir()
    for key in ("ca.crt", "tls.crt", "tls.key"):
        (tls_dir / key).write_bytes(base64.b64decode(tls["data"][key]))
    container = _container(_statefulset(manifests))
    argv = _node_argv(container, "t-haremq-0", "mq")
    tls_args = []
    for flag in ("--cluster-tls-cert", "--cluster-tls-key", "--cluster-tls-ca"):
        tls_args += [flag, argv[argv.index(flag) + 1].replace("/etc/haremq/cluster-tls", str(tls_dir))]
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    ports = {n: free_port() for n in ("t-haremq-0", "t-haremq-1", "t-haremq-2")}

    class PodMember(ClusterMember):
        def argv(self):
            return super().argv() + tls_args

    members = [PodMember(n, tmp_path / n, ports[n], {o: f"localhost:{ports[o]}" for o in ports if o != n}, secret)
               for n in ports]
    pod_env = {e["name"]: e["value"].replace("/etc/haremq/cluster-tls", str(tls_dir)) for e in container["env"]
               if "value" in e and e["name"].startswith("HAREMQ_CLUSTER_TLS")}
    try:
        launch(members)

        def status(env):
            return subprocess.run([sys.executable, "-m", "haremq.cluster.cli", "ctl", "--node",
                                   f"127.0.0.1:{ports['t-haremq-1']}", "--cluster-secret-file", str(secret),
                                   "--timeout", "5", "cluster-status", "--json"],
                                  capture_output=True, text=True, timeout=60, env=env)
        clean = {k: v for k, v in os.environ.items() if not k.startswith("HAREMQ_CLUSTER_TLS")}
        done = wait_until(lambda: (lambda r: r if r.returncode == 0 and all(
            m["up"] for m in json.loads(r.stdout)["members"]) else None)(status(dict(clean, **pod_env))), 30)
        assert len(json.loads(done.stdout)["members"]) == 3
        assert status(clean).returncode == 69, "a caller without a certificate got through"
    finally:
        for m in members:
            m.kill9()
