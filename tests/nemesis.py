"""A randomized fault schedule (a nemesis, as Jepsen runs them) on a cluster of three members (four while a spare has joined).

From a seed, a sequence of faults: SIGKILL of a queue's master, of any member or of the
metadata leader (restarted at once or left down for a few faults), a member's disk lost (killed,
its data dir wiped, started empty), a fourth member joining on an empty disk and later
SIGKILLed and forgotten (scale-out and scale-in, the same name again each time), SIGSTOP/SIGCONT, a member
cut off from the others, a bridge (two members cut from each other, both still seeing the
third), and whole-cluster restarts (all members SIGKILLed at once, a power cut, or stopped in
turn, as `docker compose down`). Meanwhile a publisher with confirms and a consumer with manual
acks run on every member, against queues of each kind: mirrored on all members, on exactly
two, on two named nodes, quorum-declared, deduplicating (its publishers retry until confirmed,
with the same message id), and a transient non-durable one; some messages are identical.

After the schedule every fault is healed, the cluster settles, and the queues are drained. The
checker (Jepsen's total-queue) holds each queue to what RabbitMQ promises of its kind: every
confirmed message of a durable queue is delivered (identical messages are counted: as many
delivered as confirmed), nothing is delivered that was never published, and a node's log has no
internal error. Duplicates and unflagged redeliveries are counted and reported.

    python -m tests.nemesis --seed 7 --faults 200      # a long run; prints a table
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pika

from tests.clusters import SECRET, ClusterMember, Proxy, control, ctl, leader_and_term
from tests.conftest import free_port, port_open, wait_until

NAMES = ("hare1", "hare2", "hare3")
SPARE = "hare4"                     # joins (scale-out) and is forgotten (scale-in) during a run
PERSISTENT = pika.BasicProperties(delivery_mode=2)


@dataclass(frozen=True)
class QueueKind:
    name: str
    durable: bool = True
    arguments: dict = field(default_factory=dict)
    strict: bool = True              # every confirmed message must come back
    dedup: bool = False              # publishers retry with the same message id until confirmed


QUEUES = (
    QueueKind("nem.all"),
    QueueKind("nem.two"),
    QueueKind("nem.nodes"),
    QueueKind("nem.quorum", arguments={"x-queue-type": "quorum"}),
    QueueKind("nem.dedup", arguments={"x-message-deduplication": True, "x-cache-size": 1_000_000}, dedup=True),
    # a non-durable queue does not survive its members' restarts (RabbitMQ's promise): reported only
    QueueKind("nem.transient", durable=False, strict=False),
)
POLICIES = (
    ("nem-all", r"^nem\.(all|quorum|dedup|transient)$", {"ha-mode": "all", "ha-sync-mode": "automatic"}),
    ("nem-two", r"^nem\.two$", {"ha-mode": "exactly", "ha-params": 2, "ha-sync-mode": "automatic"}),
    ("nem-nodes", r"^nem\.nodes$", {"ha-mode": "nodes", "ha-params": ["hare1", "hare2"],
                                    "ha-sync-mode": "automatic"}),
)
DISK_MB = 512                       # each member's data filesystem, for the disk-full fault
IDENTICAL = b"tick"                 # every tenth message of a publisher, on every queue but dedup


# ---- the cluster: every link between two members through a proxy the nemesis can cut ------------

class Mesh:
    def __init__(self, workdir: Path, failure_timeout: float = 3.0):
        workdir.mkdir(parents=True, exist_ok=True)
        secret_file = workdir / "secret"
        secret_file.write_text(SECRET)
        ports = {n: free_port() for n in (*NAMES, SPARE)}
        self.proxies = {(a, b): Proxy(ports[b]) for a in (*NAMES, SPARE) for b in NAMES if a != b}   # a -> b
        self.members = [ClusterMember(n, workdir / n, ports[n],
                                      {p: f"127.0.0.1:{self.proxies[(n, p)].port}" for p in NAMES if p != n},
                                      secret_file, failure_timeout) for n in NAMES]
        # the spare is not in the others' peer lists: it asks to join at an address every member
        # dials (its own proxy, so cutting the spare off cuts every link to it)
        self.to_spare = Proxy(ports[SPARE])
        self.spare = ClusterMember(SPARE, workdir / SPARE, ports[SPARE],
                                   {p: f"127.0.0.1:{self.proxies[(SPARE, p)].port}" for p in NAMES},
                                   secret_file, failure_timeout)
        self.spare.extra_args = ["--join-as", f"127.0.0.1:{self.to_spare.port}"]
        self.joined = False                 # the spare is a member now
        self.by_name = {m.name: m for m in (*self.members, self.spare)}
        self.small_disks = all(self._small_disk(m.data_dir) for m in self.by_name.values())

    def names(self) -> tuple[str, ...]:
        """The members now: the three, and the spare while it has joined."""
        return (*NAMES, SPARE) if self.joined else NAMES

    @staticmethod
    def _small_disk(path: Path) -> bool:
        """Each member's data dir on a filesystem of its own (a tmpfs), which the disk-full fault
        fills; where mounting is not allowed (not root), that fault is left out."""
        path.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0:
            return False
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(path)],
                              capture_output=True)
        return done.returncode == 0

    def fill_disk(self, name: str) -> Path:
        """Take every free byte of a member's data filesystem (its own small one, never the
        machine's); the file returned gives them back."""
        if not os.path.ismount(self.by_name[name].data_dir):
            raise RuntimeError(f"{name}'s data dir is not a filesystem of its own: not filling it")
        filler = self.by_name[name].data_dir / "nemesis-filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            for size in (1 << 20, 4096, 1):
                try:
                    while os.write(fd, b"\0" * size):
                        pass
                except OSError:
                    pass
        finally:
            os.close(fd)
        return filler

    def wipe(self, name: str) -> None:
        """Everything in a member's data dir goes (the dir itself may be a mount point)."""
        data_dir = self.by_name[name].data_dir
        for child in (data_dir.iterdir() if data_dir.exists() else ()):
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()

    def start(self, names=None) -> None:
        for name in names or self.names():
            m = self.by_name[name]
            if m.proc is not None and m.proc.poll() is None:
                continue
            m.data_dir.mkdir(parents=True, exist_ok=True)
            m._log_fh = open(m.log_path, "ab")
            m.proc = subprocess.Popen(m.argv(), stdout=m._log_fh, stderr=subprocess.STDOUT, start_new_session=True,
                                      cwd=str(Path(__file__).resolve().parent.parent))

    def wait_serving(self, names=None, timeout: float = 60) -> None:
        for name in names or self.names():
            m = self.by_name[name]
            try:
                wait_until(lambda m=m: port_open(m.port, 0.2, m.host), timeout=timeout)
            except AssertionError:
                raise AssertionError(f"{m.name} never served AMQP: {self.process_state(name)}\n"
                                     f"{m.log_path.read_text(errors='replace')[-6000:]}") from None

    def process_state(self, name: str) -> str:
        """What a member's process is doing (its state, CPU seconds and, with py-spy installed,
        every thread's stack): a node that never serves may be stuck or spinning."""
        proc = self.by_name[name].proc
        if proc is None or proc.poll() is not None:
            return f"exited ({None if proc is None else proc.returncode})"
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        state = f"pid {proc.pid} state {fields[0]}, cpu {(int(fields[11]) + int(fields[12])) / os.sysconf('SC_CLK_TCK'):.1f} s"
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if os.path.exists(spy):
            dump = subprocess.run([spy, "dump", "--pid", str(proc.pid)], capture_output=True, text=True, timeout=30)
            state += "\n" + dump.stdout[-8000:]
        return state

    def running(self, name: str) -> bool:
        m = self.by_name[name]
        return m.proc is not None and m.proc.poll() is None

    def signal(self, name: str, sig) -> None:
        m = self.by_name[name]
        if m.proc is not None and m.proc.poll() is None:
            try:
                os.killpg(m.proc.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self, name: str) -> None:
        self.signal(name, signal.SIGCONT)
        self.by_name[name].kill9()

    def stop(self, name: str) -> None:
        self.signal(name, signal.SIGCONT)
        self.by_name[name].stop()

    def cut(self, a: str, b: str) -> None:
        for pair in ((a, b), (b, a)):
            # every member dials the spare through one proxy: cutting one of its links cuts all
            (self.to_spare if pair[1] == SPARE else self.proxies[pair]).cut()

    def heal(self) -> None:
        for proxy in (*self.proxies.values(), self.to_spare):
            proxy.heal()

    def close(self) -> None:
        for name in self.by_name:
            self.kill(name)
        for proxy in (*self.proxies.values(), self.to_spare):
            proxy.close()
        if self.small_disks:
            for m in self.by_name.values():
                subprocess.run(["umount", "-l", str(m.data_dir)], capture_output=True)


# ---- the load ---------------------------------------------------------------------------------

class Load:
    """A publisher (confirms) and a consumer (manual acks, prefetch 20) per member; each goes to
    the next member when its own is down or paused."""

    def __init__(self, mesh: Mesh, seed: int):
        self.mesh = mesh
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.published = {q.name: set() for q in QUEUES}
        self.confirmed = {q.name: Counter() for q in QUEUES}
        self.consumed = {q.name: Counter() for q in QUEUES}
        self.unflagged = {q.name: 0 for q in QUEUES}      # a distinct message delivered again, not flagged
        self.nacked = 0
        self.seed = seed
        self.threads = [threading.Thread(target=fn, args=(i,), daemon=True, name=f"{fn.__name__}-{i}")
                        for i in range(len(NAMES)) for fn in (self._publish, self._consume)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def _connect(self, i: int):
        members = self.mesh.members
        for k in range(len(members)):
            m = members[(i + k) % len(members)]
            if not self.mesh.running(m.name):
                continue
            try:
                return pika.BlockingConnection(pika.URLParameters(
                    m.url + "?heartbeat=5&socket_timeout=5&blocked_connection_timeout=10"))
            except Exception:  # noqa: BLE001 - down, paused or in the minority: try the next
                continue
        time.sleep(0.2)
        return None

    def _publish(self, i: int) -> None:
        rng = random.Random(self.seed * 100 + i)
        n = 0
        retry: dict[str, bytes] = {}          # dedup queue: the message to send again until confirmed
        while not self.stop.is_set():
            conn = self._connect(i)
            if conn is None:
                continue
            try:
                ch = conn.channel()
                _declare_queues(ch)           # as an application does when it (re)connects
                ch.confirm_delivery()
                while not self.stop.is_set():
                    queue = QUEUES[rng.randrange(len(QUEUES))]
                    if queue.dedup:
                        body = retry.get(queue.name)
                        if body is None:
                            n += 1
                            body = f"{queue.name}|p{i}|{n}".encode()
                            retry[queue.name] = body
                        props = pika.BasicProperties(delivery_mode=2, message_id=body.decode())
                    else:
                        n += 1
                        body = IDENTICAL if n % 10 == 0 else f"{queue.name}|p{i}|{n}".encode()
                        props = PERSISTENT if queue.durable else None
                    with self.lock:
                        self.published[queue.name].add(body)
                    try:
                        ch.basic_publish("", queue.name, body, props)
                    except pika.exceptions.NackError:
                        with self.lock:
                            self.nacked += 1
                        time.sleep(0.05)
                        continue
                    with self.lock:
                        self.confirmed[queue.name][body] += 1
                    if queue.dedup:
                        retry.pop(queue.name, None)
                    time.sleep(0.003)
            except Exception:  # noqa: BLE001 - the member went away: go on elsewhere
                time.sleep(0.1)
            finally:
                _close(conn)

    def _consume(self, i: int) -> None:
        """A channel per queue: one queue unavailable (its master down, a non-durable queue gone
        with a restart) does not stop the others; its channel is opened again a moment later."""
        while not self.stop.is_set():
            conn = self._connect(i + 1)
            if conn is None:
                continue
            try:
                channels: dict[str, object] = {}
                retry_at: dict[str, float] = {}
                while not self.stop.is_set():
                    now = time.monotonic()
                    for queue in QUEUES:
                        ch = channels.get(queue.name)
                        if (ch is None or not ch.is_open) and now >= retry_at.get(queue.name, 0.0):
                            channels[queue.name] = self._consumer(conn, queue)
                            if channels[queue.name] is None:
                                retry_at[queue.name] = now + 0.5
                    conn.process_data_events(0.1)
            except Exception:  # noqa: BLE001 - the member went away: again, elsewhere
                time.sleep(0.2)
            finally:
                _close(conn)

    def _consumer(self, conn, queue: QueueKind):
        try:
            ch = conn.channel()
            ch.queue_declare(queue.name, durable=queue.durable, arguments=queue.arguments or None)
            ch.basic_qos(prefetch_count=20)

            def on_message(ch_, method, _props, body):
                self.record(queue.name, body, method.redelivered)
                ch_.basic_ack(method.delivery_tag)
            ch.basic_consume(queue.name, on_message)
            return ch
        except pika.exceptions.ChannelClosedByBroker:
            return None

    def record(self, queue: str, body: bytes, redelivered: bool) -> None:
        with self.lock:
            seen = self.consumed[queue][body]
            self.consumed[queue][body] += 1
            if seen and not redelivered and body != IDENTICAL:
                self.unflagged[queue] += 1


def _close(conn) -> None:
    try:
        if conn is not None:
            conn.close()
    except Exception:  # noqa: BLE001 - already gone with its member
        pass


# ---- the faults -------------------------------------------------------------------------------

class Nemesis:
    """Applies faults from a seed; at most one member is away at a time, but for whole-cluster
    restarts (so the cluster keeps a majority between them)."""

    KINDS = ("kill-master", "kill-member", "kill-leader", "pause", "isolate", "bridge", "restart-all", "disk-full",
             "reset", "disk-lost", "scale")
    WEIGHTS = (4, 3, 2, 2, 2, 2, 1, 2, 2, 2, 2)

    def __init__(self, mesh: Mesh, seed: int, log=print):
        self.mesh = mesh
        self.rng = random.Random(seed)
        self.down: str | None = None            # a member killed and left down
        self.down_for = 0
        self.log = log
        self.counts: Counter = Counter()

    def step(self, index: int) -> str:
        kind = self.rng.choices(self.KINDS, self.WEIGHTS)[0]
        if kind == "disk-full" and not self.mesh.small_disks:
            kind = "pause"
        if self.down is not None and kind not in ("restart-all",):
            self.down_for -= 1
            if self.down_for <= 0:
                what = f"start {self.down} (left down)"
                self.mesh.start([self.down])
                self.mesh.wait_serving([self.down])
                self.down = None
                return self._done(index, "restart-left-down", what)
            kind = "wait"
        what = getattr(self, "_" + kind.replace("-", "_"))()
        return self._done(index, kind, what)

    def _done(self, index: int, kind: str, what: str) -> str:
        self.counts[kind] += 1
        line = f"fault {index}: {kind}: {what}"
        self.log(line)
        time.sleep(self.rng.uniform(0.3, 2.0))       # the load runs between faults
        return line

    def _wait(self) -> str:
        return f"{self.down} still down"

    def _alive(self) -> list[str]:
        return [n for n in self.mesh.names() if self.mesh.running(n)]

    def _kill(self, name: str) -> str:
        self.mesh.kill(name)
        if self.rng.random() < 0.3:
            self.down, self.down_for = name, self.rng.randint(1, 3)
            return f"SIGKILL {name}, left down for {self.down_for} faults"
        time.sleep(self.rng.uniform(0.0, 4.0))
        self.mesh.start([name])
        self.mesh.wait_serving([name])
        return f"SIGKILL {name}, started again"

    def _kill_master(self) -> str:
        queue = self.rng.choice(QUEUES).name
        master = None
        for name in self._alive():
            try:
                rows = control(self.mesh.by_name[name], "list_queues", timeout=2.0)
            except Exception:  # noqa: BLE001
                continue
            row = next((r for r in rows or [] if r.get("name") == queue), None)
            if row is not None:
                master = row.get("master") or row.get("node")
                break
        if master not in self._alive():
            master = self.rng.choice(self._alive())
        return f"master of {queue}: " + self._kill(master)

    def _kill_member(self) -> str:
        return self._kill(self.rng.choice(self._alive()))

    def _kill_leader(self) -> str:
        found = leader_and_term([m for m in self.mesh.members if self.mesh.running(m.name)])
        leader = found[0] if found and found[0] in self._alive() else self.rng.choice(self._alive())
        return "leader: " + self._kill(leader)

    def _pause(self) -> str:
        name = self.rng.choice(self._alive())
        seconds = self.rng.uniform(0.5, 6.0)
        self.mesh.signal(name, signal.SIGSTOP)
        time.sleep(seconds)
        self.mesh.signal(name, signal.SIGCONT)
        return f"SIGSTOP {name} for {seconds:.1f} s"

    def _isolate(self) -> str:
        name = self.rng.choice(self._alive())
        seconds = self.rng.uniform(1.0, 8.0)
        for other in self.mesh.names():
            if other != name:
                self.mesh.cut(name, other)
        time.sleep(seconds)
        self.mesh.heal()
        return f"{name} cut off for {seconds:.1f} s"

    def _bridge(self) -> str:
        a, b = self.rng.sample(list(NAMES), 2)
        seconds = self.rng.uniform(1.0, 8.0)
        self.mesh.cut(a, b)
        time.sleep(seconds)
        self.mesh.heal()
        return f"{a} and {b} cut from each other (both see the third) for {seconds:.1f} s"

    def _reset(self) -> str:
        """Every connection between a member and the others reset at once, the member alive and
        reachable again at once (a blip: nobody should take it for dead)."""
        name = self.rng.choice(self._alive())
        for other in self.mesh.names():
            if other != name:
                self.mesh.cut(name, other)
        self.mesh.heal()
        return f"{name}'s connections to the others reset"

    def _disk_lost(self) -> str:
        """A member's disk lost: SIGKILLed, its data dir wiped (a replaced volume), started empty
        at once or after a while. What it held must be on the others: every confirm on a mirrored
        or quorum queue rests on more than one disk."""
        name = self.rng.choice(self._alive())
        self.mesh.kill(name)
        self.mesh.wipe(name)
        seconds = self.rng.choice([0.0, self.rng.uniform(0.0, 8.0)])
        time.sleep(seconds)
        self.mesh.start([name])
        self.mesh.wait_serving([name])
        return f"{name}'s disk lost: SIGKILLed, wiped, started empty after {seconds:.1f} s"

    def _disk_full(self) -> str:
        """A member's disk full for a while: publishes are nacked (the disk alarm); a member that
        cannot write its metadata log stops, and is started again once there is room."""
        name = self.rng.choice(self._alive())
        seconds = self.rng.uniform(1.0, 6.0)
        filler = self.mesh.fill_disk(name)
        time.sleep(seconds)
        filler.unlink()
        if self.mesh.running(name):
            return f"{name}'s disk full for {seconds:.1f} s"
        self.mesh.by_name[name].kill9()           # reap it
        self.mesh.start([name])
        self.mesh.wait_serving([name])
        return f"{name}'s disk full for {seconds:.1f} s: it stopped, started again"

    def _restart_all(self) -> str:
        power_cut = self.rng.random() < 0.5
        for name in self.mesh.names():
            (self.mesh.kill if power_cut else self.mesh.stop)(name)
        self.down = None
        time.sleep(self.rng.uniform(0.0, 2.0))
        self.mesh.start()
        self.mesh.wait_serving()
        return "whole cluster " + ("SIGKILLed at once" if power_cut else "stopped in turn") + ", started again"

    def _scale(self) -> str:
        """Scale-out: the spare starts on an empty data dir and asks the members to add it (its
        entry in the metadata log places mirrors on it); scale-in: it is SIGKILLed and forgotten
        (`haremq ctl forget-node`), so the same name joins afresh next time."""
        mesh = self.mesh
        if not mesh.joined:
            mesh.wipe(SPARE)
            mesh.joined = True
            mesh.start([SPARE])
            mesh.wait_serving([SPARE])
            wait_until(lambda: any(SPARE in self._running(name) for name in NAMES if mesh.running(name)),
                       timeout=60, interval=0.5, message=f"{SPARE} never joined:\n{mesh.spare.log_tail()}")
            return f"{SPARE} joined on an empty disk: {len(mesh.names())} members"
        mesh.kill(SPARE)

        def forgotten() -> bool:
            for name in NAMES:
                if mesh.running(name):
                    done = ctl(mesh.by_name[name], "forget-node", SPARE, timeout=20)
                    if done.returncode == 0 or "is not a member" in done.stderr:
                        return True
            return False
        wait_until(forgotten, timeout=60, interval=1.0, message=f"{SPARE} was never forgotten")
        mesh.joined = False
        mesh.wipe(SPARE)
        return f"{SPARE} SIGKILLed and forgotten: {len(mesh.names())} members"

    def _running(self, name: str) -> list[str]:
        try:
            return (control(self.mesh.by_name[name], "cluster_status", timeout=2.0) or {}).get("running") or []
        except Exception:  # noqa: BLE001
            return []

    def heal(self) -> None:
        self.mesh.heal()
        for name in self.mesh.by_name:
            self.mesh.signal(name, signal.SIGCONT)
        self.mesh.start()
        self.mesh.wait_serving()
        self.down = None


# ---- one run --------------------------------------------------------------------------------------

def _rows(mesh: Mesh) -> dict:
    for m in mesh.members:
        try:
            return {r["name"]: r for r in control(m, "list_queues", timeout=3.0) or []}
        except Exception:  # noqa: BLE001
            continue
    return {}


def _settled(mesh: Mesh) -> bool:
    rows = _rows(mesh)
    for q in QUEUES:
        row = rows.get(q.name)
        if row is None or row.get("state", "running") != "running":
            return False
        if row.get("mirrors") and sorted(row.get("synchronised_mirrors") or []) != sorted(row["mirrors"]):
            return False
    return True


def _declare_queues(ch) -> None:
    for q in QUEUES:
        ch.queue_declare(q.name, durable=q.durable, arguments=q.arguments or None)


def _declare(mesh: Mesh) -> None:
    for name, pattern, definition in POLICIES:
        r = ctl(mesh.members[0], "set-policy", name, pattern, json.dumps(definition), "--apply-to", "queues")
        assert r.returncode == 0, r.stderr
    conn = pika.BlockingConnection(pika.URLParameters(mesh.members[0].url))
    _declare_queues(conn.channel())
    conn.close()


def _drain(mesh: Mesh, load: Load) -> None:
    """Whatever is left in each queue, through basic.get on any member."""
    for q in QUEUES:
        for m in mesh.members:
            try:
                conn = pika.BlockingConnection(pika.URLParameters(m.url))
            except Exception:  # noqa: BLE001
                continue
            try:
                ch = conn.channel()
                while True:
                    method, _props, body = ch.basic_get(q.name, auto_ack=True)
                    if method is None:
                        break
                    load.record(q.name, body, method.redelivered)
                break
            except Exception:  # noqa: BLE001 - try it through the next member
                continue
            finally:
                _close(conn)


INTERNAL = ("internal error", "Traceback")


def run(seed: int, faults: int, workdir: Path, log=print, failure_timeout: float = 3.0) -> dict:
    """One schedule; returns the tally (see `check`)."""
    mesh = Mesh(workdir, failure_timeout)
    load = Load(mesh, seed)
    nemesis = Nemesis(mesh, seed, log)
    started = time.monotonic()
    log(f"nemesis seed {seed}: {faults} faults, data in {workdir}")
    try:
        mesh.start()
        mesh.wait_serving()
        _declare(mesh)
        wait_until(lambda: _settled(mesh), timeout=60, interval=0.3, message="the queues never settled")
        load.start()
        time.sleep(1.0)
        for index in range(1, faults + 1):
            nemesis.step(index)
        nemesis.heal()
        try:
            wait_until(lambda: _settled(mesh), timeout=120, interval=0.5)
            settled = True
        except AssertionError:
            settled = False
        time.sleep(2.0)
        load.finish()
        _drain(mesh, load)
        logs = {name: m.log_text() for name, m in mesh.by_name.items()}
    finally:
        mesh.close()
    tally = check(load, logs)
    tally.update(seed=seed, faults=faults, settled=settled, seconds=round(time.monotonic() - started),
                 fault_counts=dict(nemesis.counts))
    return tally


def check(load: Load, logs: dict) -> dict:
    per_queue = {}
    for q in QUEUES:
        confirmed, consumed, published = load.confirmed[q.name], load.consumed[q.name], load.published[q.name]
        lost = {b: n - consumed[b] for b, n in confirmed.items() if consumed[b] < n}
        per_queue[q.name] = {
            "strict": q.strict,
            "confirmed": sum(confirmed.values()),
            "consumed": sum(consumed.values()),
            "lost": sum(lost.values()),
            "lost_examples": [b.decode() for b in list(lost)[:3]],
            "never_published": sum(n for b, n in consumed.items() if b not in published),
            "duplicates": sum(n - 1 for b, n in consumed.items() if n > 1 and b != IDENTICAL),
            "unflagged_redeliveries": load.unflagged[q.name],
        }
    internal = {name: [line for line in text.splitlines() if any(s in line for s in INTERNAL)][:3]
                for name, text in logs.items()}
    return {"queues": per_queue, "nacked": load.nacked,
            "internal_errors": {k: v for k, v in internal.items() if v}}


def violations(tally: dict) -> list[str]:
    found = []
    for name, row in tally["queues"].items():
        if row["strict"] and row["lost"]:
            found.append(f"{name}: {row['lost']} confirmed messages lost, e.g. {row['lost_examples']}")
        if row["never_published"]:
            found.append(f"{name}: {row['never_published']} delivered that were never published")
    if tally["internal_errors"]:
        found.append(f"internal errors in the nodes' logs: {tally['internal_errors']}")
    if tally["queues"]["nem.all"]["confirmed"] == 0:
        found.append("nothing was confirmed")
    return found


def table(tallies: list[dict]) -> str:
    head = ["seed", "faults", "seconds", "queue", "confirmed", "consumed", "lost", "dups", "unflagged", "settled"]
    rows = [head]
    for t in tallies:
        for name, q in t["queues"].items():
            rows.append([str(t["seed"]), str(t["faults"]), str(t["seconds"]), name + ("" if q["strict"] else " *"),
                         str(q["confirmed"]), str(q["consumed"]), str(q["lost"]), str(q["duplicates"]),
                         str(q["unflagged_redeliveries"]), str(t["settled"])])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    lines.append("* reported only: a non-durable queue does not survive the restart of the members holding it")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, action="append", help="a seed (repeat for several); default: random")
    parser.add_argument("--faults", type=int, default=200)
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    seeds = args.seed or [random.SystemRandom().randrange(1, 10**6)]
    tallies, failed = [], False
    for seed in seeds:
        workdir = args.workdir or Path(tempfile.mkdtemp(prefix=f"haremq-nemesis-{seed}-"))
        tally = run(seed, args.faults, workdir / f"seed-{seed}" if args.workdir else workdir)
        tallies.append(tally)
        print(json.dumps(tally, sort_keys=True), flush=True)
        for v in violations(tally):
            failed = True
            print(f"VIOLATION (seed {seed}): {v}", flush=True)
    print(table(tallies))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
