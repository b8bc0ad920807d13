"""Three-node clusters for tests: members as real processes, proxies to cut links, `haremq ctl`."""
from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import Node, free_port, port_open, wait_until

SECRET = "test-cluster-secret"


class ClusterMember(Node):
    def __init__(self, name, workdir, cluster_port, peers, secret_file, failure_timeout: float = 1.5):
        Path(workdir).mkdir(parents=True, exist_ok=True)
        super().__init__(name, workdir)
        self.cluster_port = cluster_port
        self.peers = peers            # name -> host:port
        self.secret_file = secret_file
        self.failure_timeout = failure_timeout
        self.extra_args: list[str] = []

    def argv(self):
        argv = super().argv() + ["--cluster-port", str(self.cluster_port),
                                 "--cluster-secret-file", str(self.secret_file),
                                 "--failure-timeout", str(self.failure_timeout), *self.extra_args]
        for name, address in self.peers.items():
            argv += ["--peer", f"{name}={address}"]
        return argv


class Proxy:
    """A TCP proxy on loopback the test can cut and heal (a network partition without root)."""

    def __init__(self, target_port: int):
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.cut_off = threading.Event()
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.cut_off.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=2)
            except OSError:
                client.close()
                continue
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src, dst):
        try:
            while not self.cut_off.is_set():
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.close()
            except OSError:
                pass

    def cut(self):
        self.cut_off.set()
        for s in self.conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
                s.close()
            except OSError:
                pass
        self.conns = []

    def heal(self):
        self.cut_off.clear()

    def close(self):
        self.cut()
        self.listener.close()


def ctl(member, *args, timeout=20):
    return subprocess.run([sys.executable, "-m", "haremq.cluster.cli", "ctl", "--node", f"{member.host}:{member.cluster_port}",
                           "--cluster-secret-file", str(member.secret_file), *args],
                          capture_output=True, text=True, timeout=timeout,
                          cwd=str(Path(__file__).resolve().parent.parent))


def ctl_json(member, *args):
    r = ctl(member, *args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def queue_row(member, name):
    """The `list-queues` row of a queue, as `member` sees it (None if it has none)."""
    return next((r for r in ctl_json(member, "list-queues") if r["name"] == name), None)


def launch(members):
    """Start every member at once (each serves AMQP only once it sees a majority) and wait for all."""
    for m in members:
        m.data_dir.mkdir(parents=True, exist_ok=True)
        m._log_fh = open(m.log_path, "ab")
        m.proc = subprocess.Popen(m.argv(), stdout=m._log_fh, stderr=subprocess.STDOUT, start_new_session=True,
                                  cwd=str(Path(__file__).resolve().parent.parent))
    for m in members:
        wait_until(lambda m=m: port_open(m.port, 0.2, m.host), timeout=30,
                   message=f"{m.name} never served AMQP:\n{m.log_tail()}")


def proxied_cluster(tmp_path, failure_timeout: float = 1.5, extra_args: dict | None = None):
    """Three members; hare1 reaches the others (and they reach it) through proxies.
    Returns (members, partition) where partition["cut"]() isolates hare1 and ["heal"]() undoes it."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET)
    ports = {n: free_port() for n in ("hare1", "hare2", "hare3")}
    proxies = {n: Proxy(ports[n]) for n in ("hare2", "hare3")}        # hare1 -> hare2/3
    proxy_to_1 = {n: Proxy(ports["hare1"]) for n in ("hare2", "hare3")}  # hare2/3 -> hare1
    peers = {
        "hare1": {"hare2": f"127.0.0.1:{proxies['hare2'].port}", "hare3": f"127.0.0.1:{proxies['hare3'].port}"},
        "hare2": {"hare1": f"127.0.0.1:{proxy_to_1['hare2'].port}", "hare3": f"127.0.0.1:{ports['hare3']}"},
        "hare3": {"hare1": f"127.0.0.1:{proxy_to_1['hare3'].port}", "hare2": f"127.0.0.1:{ports['hare2']}"},
    }
    members = [ClusterMember(n, tmp_path / n, ports[n], peers[n], secret_file, failure_timeout)
               for n in ("hare1", "hare2", "hare3")]
    for m in members:
        m.extra_args = list((extra_args or {}).get(m.name, []))
    launch(members)
    all_proxies = (*proxies.values(), *proxy_to_1.values())
    partition = {"cut": lambda: [p.cut() for p in all_proxies],
                 # hare1 and one other cut from each other only (both still see the third)
                 "bridge": lambda name: [proxies[name].cut(), proxy_to_1[name].cut()],
                 "heal": lambda: [p.heal() for p in all_proxies],
                 "close": lambda: [p.close() for p in all_proxies]}
    return members, partition


# ---- members found by name, whose address can change (a Kubernetes pod restarted) ----------------
HOSTS = Path("/etc/hosts")


class HostNames:
    """Host names for members that a test can repoint: a pod keeps its DNS name and gets a new IP.

    The names go into /etc/hosts, so nodes resolve them exactly as they resolve a DNS name
    (getaddrinfo); each is unique to the test, and only the lines this object wrote (tagged)
    are touched. The file is replaced atomically under a lock: a lookup elsewhere on the machine
    never sees it half written. Skips the test where /etc/hosts cannot be written.
    """

    def __init__(self):
        if not (os.access(HOSTS, os.W_OK) and os.access(HOSTS.parent, os.W_OK)):
            pytest.skip("needs a writable /etc/hosts to repoint a member's name")
        self.tag = f"haremq-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.addresses: dict[str, str] = {}

    def name_for(self, member: str) -> str:
        return f"{member}-{self.tag}.haremq.test"

    def point(self, name: str, address: str) -> None:
        self.addresses[name] = address
        self._write()

    def close(self) -> None:
        self.addresses.clear()
        self._write()

    def _write(self) -> None:
        marker = f"# {self.tag}"
        with open(Path(tempfile.gettempdir()) / "haremq-test-hosts.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            mode = HOSTS.stat().st_mode & 0o777
            lines = [line for line in HOSTS.read_text().splitlines() if not line.endswith(marker)]
            lines += [f"{address} {name} {marker}" for name, address in self.addresses.items()]
            tmp = HOSTS.with_name(f".hosts.{self.tag}")
            tmp.write_text("".join(line + "\n" for line in lines))
            os.chmod(tmp, mode)
            os.replace(tmp, HOSTS)


def named_cluster(tmp_path, hosts: HostNames, addresses: dict[str, str], failure_timeout: float = 3.0):
    """Three members, each on a loopback address of its own (`addresses`: name -> 127.0.0.x),
    naming each other by host name as pods in a StatefulSet do. No proxies."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET)
    ports = {n: free_port() for n in addresses}
    for n, address in addresses.items():
        hosts.point(hosts.name_for(n), address)
    members = []
    for n, address in addresses.items():
        peers = {p: f"{hosts.name_for(p)}:{ports[p]}" for p in addresses if p != n}
        m = ClusterMember(n, tmp_path / n, ports[n], peers, secret_file, failure_timeout)
        m.host = address
        members.append(m)
    launch(members)
    return members


def control(member, command: str, timeout: float = 5.0, **arguments):
    """A `haremq ctl` command answered in-process (no interpreter to start): cheap enough to poll."""
    import grpc

    from haremq.cluster.rpc import cluster_pb2 as pb
    from haremq.cluster.rpc import cluster_pb2_grpc as pbg
    with grpc.insecure_channel(f"{member.host}:{member.cluster_port}") as channel:
        reply = pbg.ClusterStub(channel).Control(
            pb.ControlRequest(command=command, arguments=json.dumps(arguments).encode()),
            timeout=timeout, metadata=(("x-haremq-secret", SECRET),))
    assert reply.ok, reply.error
    return json.loads(reply.result) if reply.result else None


def leader_and_term(members) -> tuple[str, int] | None:
    """(Raft leader, term) if every running member names the same leader in the same term."""
    import grpc
    seen = set()
    for m in members:
        if m.is_running():
            try:
                status = control(m, "cluster_status", timeout=2.0)
            except grpc.RpcError:
                return None
            seen.add((status["leader"], status["term"]))
    if len(seen) != 1:
        return None
    leader, term = seen.pop()
    return (leader, term) if leader else None


def stop_cluster(members, partition=None) -> None:
    """Kill every member (a SIGSTOPped one is woken first, so it dies) and close the proxies
    (a plain cluster has none)."""
    for m in members:
        if m.proc is not None and m.proc.poll() is None:
            try:
                os.killpg(m.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        m.kill9()
    if partition is not None:
        partition["close"]()


class Cluster(list):
    """The `cluster` fixture's three running members, hare1, hare2 and hare3 in that order: a list
    (`hare1, hare2, hare3 = cluster`), and by name (`cluster["hare2"]`). `partition["cut"]()`
    isolates hare1 (every link to it runs through a proxy) and `partition["heal"]()` undoes it."""

    def __init__(self, members, partition):
        super().__init__(members)
        self.partition = partition

    def __getitem__(self, key):
        if isinstance(key, str):
            for member in self:
                if member.name == key:
                    return member
            raise KeyError(key)
        return super().__getitem__(key)

    def values(self) -> list:
        return list(self)


def managed_cluster(tmp_path, failure_timeout: float = 3.0):
    """proxied_cluster() whose members serve the management API and /metrics: each member's
    `management_port` and `prometheus_port`. Returns ({name: member}, partition)."""
    ports = {n: (free_port(), free_port()) for n in ("hare1", "hare2", "hare3")}
    extra = {n: ["--management-port", str(m), "--prometheus-port", str(p)] for n, (m, p) in ports.items()}
    members, partition = proxied_cluster(tmp_path, failure_timeout=failure_timeout, extra_args=extra)
    for m in members:
        m.management_port, m.prometheus_port = ports[m.name]
    return {m.name: m for m in members}, partition


@contextmanager
def running_cluster(tmp_path, failure_timeout: float = 3.0, management: bool = False) -> Iterator[Cluster]:
    """Three proxied members for the length of a `with`; every member is killed at the end (a
    SIGSTOPped one too) and the proxies closed. 3 s before a silent member is down: a shared
    2-core machine can starve a node for a second (a killed one, whose port refuses
    connections, is down at once)."""
    if management:
        by_name, partition = managed_cluster(tmp_path, failure_timeout)
        members = list(by_name.values())
    else:
        members, partition = proxied_cluster(tmp_path, failure_timeout)
    cluster = Cluster(members, partition)
    try:
        yield cluster
    finally:
        stop_cluster(list(cluster), partition)


# ---- a plain cluster for client tests ------------------------------------------------------------------

def plain_cluster(tmp_path, failure_timeout: float = 3.0):
    """Three members on loopback that reach each other directly (no proxies to cut)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET)
    ports = {n: free_port() for n in ("hare1", "hare2", "hare3")}
    members = [ClusterMember(n, tmp_path / n, ports[n], {p: f"127.0.0.1:{ports[p]}" for p in ports if p != n},
                             secret_file, failure_timeout)
               for n in ports]
    launch(members)
    return members


def not_the_leader(members, timeout: float = 30.0):
    """A member that is not the Raft metadata leader, once every member names the same leader."""
    leader, _term = wait_until(lambda: leader_and_term(members), timeout=timeout,
                               message="the members never agreed on a metadata leader")
    return next(m for m in members if m.name != leader)


def mirror_every_queue(member, vhost: str = "/") -> None:
    """Policy `ha-all`: every queue (but an exclusive one, as in RabbitMQ) mirrored on every
    member, synchronised automatically."""
    control(member, "broker_call", method="set_policy",
            args=[vhost, "ha-all", ".*", {"ha-mode": "all", "ha-sync-mode": "automatic"}, "queues", 0])
