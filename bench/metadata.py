"""Metadata at scale, next to RabbitMQ: connections, queue declares and deletes, restart (issue 35).

    python -m haremq.bench.metadata --queues 10000 --connections 1000 [--batch 200]
        [--churn 30000] [--cluster] [--brokers haremq,rabbitmq] [--rabbit-port PORT] [--json out.json]
        [--skip publish|restart|delete]

What an application with many queues does (one queue per user, device,
tenant or RPC reply), on one node of each broker in the same run, with
aiormq:

1. start the node (fresh data dir) and time it until a client can connect;
2. open N connections, one channel each (connections/s, RSS per connection);
3. declare Q durable queues, `--batch` at a time, spread over the channels;
   the rate is reported for the first and the last `--bucket` queues, so a
   rate that falls as queues accumulate shows, and so are the node's own CPU
   time and the bytes it wrote to storage per declare in each bucket (from
   /proc: on a shared machine the rates move with the other load, the
   node's CPU per declare much less); RSS per queue;
4. publish one persistent message to each queue with confirms, then
   basic.get each (the same batches);
5. `--churn N`: N times what an RPC client does per request, a server-named
   exclusive queue declared, bound to amq.direct and deleted (three metadata
   changes that leave nothing), `--batch` cycles at a time (cycles/s), and
   the metadata's size on disk before and after (HareMQ: the Raft log and
   snapshot, or meta.bin and its log; RabbitMQ: Mnesia's files; neither's
   message store): it must be bounded by what exists, not by the history;
6. close the connections, stop the node and start it again: the time from
   the start until a client finds the last queue is the restart time with Q
   queues (and the churn) behind it, next to the fresh node's start;
7. reconnect and delete every queue, `--batch` at a time (first and last
   buckets again).

`--cluster`: three nodes of each broker on this machine, clustered (HareMQ
with static peers, RabbitMQ with `rabbitmqctl join_cluster`); every client
connects to the first node, whose RSS, CPU and writes are the ones read;
queues are not mirrored on either (no policy), so each declare is one change
of the cluster's metadata; a restart stops and starts the three.

`--skip PHASE` leaves out a phase and every one after it (`publish`: the
declares are the last phase; `restart`; `delete`): at 100,000 queues
RabbitMQ's stop alone can take longer than five minutes.

Before the declares and the deletes the bench waits until the node has
written nothing for a second (a new HareMQ store zeroes its first segments
ahead of the writes), so that the bytes counted are the phase's own.

RabbitMQ is a throw-away node of Debian's rabbitmq-server on --rabbit-port,
with its data under the bench's work directory as ../shared/bench/rabbitmq_ref.sh
and bench/compare start theirs, but with the file-descriptor limit RabbitMQ's
documentation asks for (`ulimit -n`, here --nofile, by default this shell's
hard limit; HareMQ runs with the same): started through Debian's wrapper
(`su rabbitmq`) it gets a soft limit of 1,024, and with 1,000 connections
open its queues then crash with `emfile` and publishes are nacked. When run
as root, the bench starts RabbitMQ's own script as user rabbitmq with that
limit, as the wrapper would but for the limit. If a broker still accepts
fewer than N connections the bench goes on with those it got and says how
many. Each figure is printed with the machine's load
average before the phase and the share of a core the client used (near 1.0:
the client was the limit). Figures are printed, never asserted.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import pwd
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiormq
from pamqp import commands as pc

from .failover import free_port, port_open

ROOT = Path(__file__).resolve().parent.parent


def rss_kb(pid: int | None) -> int:
    if not pid:
        return 0
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def nofile_limit(n: int):
    """A preexec_fn: the child may open n files (`ulimit -n n`)."""
    def raise_limit():
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))
    return raise_limit


def open_files_limit(pid: int | None) -> int | None:
    try:
        with open(f"/proc/{pid}/limits") as fh:
            for line in fh:
                if line.startswith("Max open files"):
                    return int(line.split()[3])
    except (OSError, ValueError, TypeError):
        pass
    return None


def load_average() -> float:
    return os.getloadavg()[0]


def log(msg: str) -> None:
    print(f"[metadata {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- the brokers ----------------------------------------------------------------------------------
class HareNode:
    label = "HareMQ"

    def __init__(self, work: Path, nofile: int, name: str = "hare-meta", extra: list[str] | None = None):
        self.data = work / "haremq"
        self.name = name
        self.port = free_port()
        self.nofile = nofile
        self.extra = extra or []
        self.proc: subprocess.Popen | None = None

    def launch(self) -> None:
        self.data.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "haremq.cluster.cli", "node", "--name", self.name, "--data-dir", str(self.data),
                "--amqp-port", str(self.port), "--bind", "127.0.0.1",
                "--log-level", os.environ.get("HAREMQ_BENCH_LOG", "warning"), *self.extra]
        with open(self.data.parent / "haremq.log", "ab") as fh:
            self.proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=ROOT, start_new_session=True, preexec_fn=nofile_limit(self.nofile))

    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def version(self) -> str:
        from importlib.metadata import version
        try:
            return f"HareMQ {version('haremq')}"
        except Exception:  # noqa: BLE001
            return "HareMQ"

    def data_dirs(self) -> list[Path]:
        return [self.data]

    def metadata_files(self) -> list[Path]:
        """What holds the metadata: the Raft log and snapshot (clustered), or meta.bin and the
        meta-*.log files (a single node); not the message store."""
        return [*self.data.glob("meta*"), *(self.data / "raft").glob("*")]


class HareCluster:
    """Three HareMQ nodes on loopback, with static peers; clients use the first."""

    label = "HareMQ"

    def __init__(self, work: Path, nofile: int, size: int = 3):
        secret = work / "cluster-secret"
        work.mkdir(parents=True, exist_ok=True)
        secret.write_text("bench-metadata-cluster-secret")
        cluster_ports = [free_port() for _ in range(size)]
        names = [f"hare{i + 1}" for i in range(size)]
        self.nodes = []
        for i, name in enumerate(names):
            extra = ["--cluster-port", str(cluster_ports[i]), "--cluster-secret-file", str(secret),
                     "--management-port", "0", "--prometheus-port", "0"]
            for j, peer in enumerate(names):
                if j != i:
                    extra += ["--peer", f"{peer}=127.0.0.1:{cluster_ports[j]}"]
            self.nodes.append(HareNode(work / name, nofile, name, extra))
        self.port = self.nodes[0].port

    def launch(self) -> None:
        for node in self.nodes:
            node.launch()

    def pid(self) -> int | None:
        return self.nodes[0].pid()

    def alive(self) -> bool:
        return any(node.alive() for node in self.nodes)

    def stop(self) -> None:
        for node in self.nodes:            # all at once, as `docker compose down` does
            if node.alive():
                os.killpg(node.proc.pid, signal.SIGTERM)
        for node in self.nodes:
            node.stop()

    def version(self) -> str:
        return self.nodes[0].version() + f", {len(self.nodes)} nodes"

    def data_dirs(self) -> list[Path]:
        return [node.data for node in self.nodes]

    def metadata_files(self) -> list[Path]:
        return [f for node in self.nodes for f in node.metadata_files()]


class RabbitNode:
    """A throw-away rabbitmq-server on 127.0.0.1:port (as ../shared/bench/rabbitmq_ref.sh starts one)."""

    label = "RabbitMQ"

    def __init__(self, work: Path, port: int, nofile: int):
        self.port = port
        self.nofile = nofile
        self.name = f"meta{port}@localhost"
        self.base = work / f"rmq-{port}"
        self.wrapper: subprocess.Popen | None = None
        self._pid: int | None = None

    def env(self) -> dict:
        return dict(os.environ, RABBITMQ_NODENAME=self.name, RABBITMQ_NODE_PORT=str(self.port),
                    RABBITMQ_DIST_PORT=str(self.port + 20000), RABBITMQ_NODE_IP_ADDRESS="127.0.0.1",
                    RABBITMQ_MNESIA_BASE=str(self.base / "mnesia"), RABBITMQ_LOG_BASE=str(self.base / "log"),
                    RABBITMQ_ENABLED_PLUGINS_FILE=str(self.base / "enabled_plugins"))

    def ctl(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(["rabbitmqctl", "-n", self.name, *args], capture_output=True, text=True,
                              timeout=timeout, env=self.env())

    def launch(self) -> None:
        if not shutil.which("rabbitmq-server"):
            raise RuntimeError("rabbitmq-server is not installed (apt-get install rabbitmq-server)")
        if port_open(self.port):
            raise RuntimeError(f"port {self.port} is already in use (pick another --rabbit-port)")
        self.base.mkdir(parents=True, exist_ok=True)
        (self.base / "enabled_plugins").write_text("[].\n")
        if os.geteuid() == 0:   # Debian's wrapper re-executes as user rabbitmq when run as root
            subprocess.run(["chown", "-R", "rabbitmq:rabbitmq", str(self.base)], capture_output=True)
            os.chmod(self.base.parent, 0o755)
        self._pid = None
        env, argv, cwd, preexec = self.env(), ["rabbitmq-server"], None, nofile_limit(self.nofile)
        script = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
        if os.geteuid() == 0 and script.exists():
            # what Debian's wrapper does (su rabbitmq), keeping the file-descriptor limit
            user = pwd.getpwnam("rabbitmq")
            env.update(HOME=user.pw_dir, USER="rabbitmq", LOGNAME="rabbitmq")
            argv, cwd = [str(script)], user.pw_dir

            def preexec():
                nofile_limit(self.nofile)()
                os.setgroups([])
                os.setgid(user.pw_gid)
                os.setuid(user.pw_uid)
        with open(self.base / "server.out", "ab") as fh:
            self.wrapper = subprocess.Popen(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=cwd,
                                            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=preexec)

    def alive(self) -> bool:
        return self.wrapper is not None and self.wrapper.poll() is None

    def pid(self) -> int | None:
        if self._pid is None:
            r = self.ctl("eval", "list_to_integer(os:getpid()).", timeout=30)
            try:
                self._pid = int(r.stdout.strip())
            except ValueError:
                return None
        return self._pid

    def stop(self) -> None:
        try:
            self.ctl("stop", timeout=300)
        except subprocess.TimeoutExpired:
            # with 100,000 queues `rabbitmqctl stop` can outlast any wait: the node is killed
            log(f"RabbitMQ {self.name}: not stopped after 300 s, killed")
        if self.wrapper is not None:
            try:
                self.wrapper.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.wrapper.pid, signal.SIGKILL)
        self._pid = None

    def version(self) -> str:
        r = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "rabbitmq-server"], capture_output=True, text=True)
        return f"RabbitMQ {r.stdout.strip() or '?'}"

    def data_dirs(self) -> list[Path]:
        return [self.base / "mnesia"]

    def metadata_files(self) -> list[Path]:
        """Mnesia's files (its tables and their logs), not the message stores."""
        files = []
        for root, dirs, names in os.walk(self.base / "mnesia"):
            dirs[:] = [d for d in dirs if d not in ("msg_stores", "quorum", "stream")]
            files.extend(Path(root) / name for name in names)
        return files


class RabbitCluster:
    """Three RabbitMQ nodes on loopback (AMQP ports port..port+2), the second and third joined to
    the first with `rabbitmqctl join_cluster` at the first start; clients use the first."""

    label = "RabbitMQ"

    def __init__(self, work: Path, port: int, nofile: int, size: int = 3):
        self.nodes = [RabbitNode(work, port + i, nofile) for i in range(size)]
        self.port = port
        self.joined = False

    def launch(self) -> None:
        for node in self.nodes:
            node.launch()
        deadline = time.monotonic() + 300
        for node in self.nodes:
            while not port_open(node.port):
                if time.monotonic() > deadline or not node.alive():
                    raise RuntimeError(f"RabbitMQ node {node.name} did not start")
                time.sleep(0.2)
        if not self.joined:
            for node in self.nodes[1:]:
                for args in (("stop_app",), ("join_cluster", self.nodes[0].name), ("start_app",)):
                    r = node.ctl(*args)
                    if r.returncode != 0:
                        raise RuntimeError(f"rabbitmqctl {' '.join(args)} on {node.name}: {r.stderr.strip()}")
            self.joined = True

    def pid(self) -> int | None:
        return self.nodes[0].pid()

    def alive(self) -> bool:
        return any(node.alive() for node in self.nodes)

    def stop(self) -> None:
        for node in reversed(self.nodes):      # the first, stopped last, starts first again
            node.stop()

    def version(self) -> str:
        return self.nodes[0].version() + f", {len(self.nodes)} nodes"

    def data_dirs(self) -> list[Path]:
        return [d for node in self.nodes for d in node.data_dirs()]

    def metadata_files(self) -> list[Path]:
        return [f for node in self.nodes for f in node.metadata_files()]


def disk_bytes(files: list[Path]) -> int:
    """The bytes these files take on disk (allocated blocks)."""
    total = 0
    for path in files:
        try:
            total += path.stat().st_blocks * 512
        except OSError:
            pass
    return total


# ---- the client ---------------------------------------------------------------------------------------
class Clock:
    """Wall time, the client's CPU and the load average of one phase."""

    def __init__(self):
        self.load = load_average()
        self.wall = time.monotonic()
        self.cpu = time.process_time()

    def done(self) -> tuple[float, float]:
        wall = time.monotonic() - self.wall
        return wall, (time.process_time() - self.cpu) / wall if wall > 0 else 0.0


async def connect(url: str, timeout: float = 30):
    conn = await asyncio.wait_for(aiormq.connect(url), timeout)
    channel = await conn.channel()
    return conn, channel


async def open_connections(url: str, n: int, parallel: int = 50) -> tuple[list, list[str]]:
    """Up to n connections with a channel each, `parallel` opening at once; the errors of those that failed."""
    opened, errors = [], []
    for start in range(0, n, parallel):
        results = await asyncio.gather(*(connect(url) for _ in range(start, min(n, start + parallel))),
                                       return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                errors.append(f"{type(r).__name__}: {r}")
            else:
                opened.append(r)
        if errors and len(errors) >= parallel:
            break    # the broker refuses more: go on with what is open
    return opened, errors


async def close_connections(conns: list) -> None:
    for start in range(0, len(conns), 100):
        await asyncio.gather(*(c.close() for c, _ch in conns[start:start + 100]), return_exceptions=True)


def node_counters(pid: int | None) -> tuple[float, int]:
    """(CPU seconds, bytes written to storage) of a process so far, all its threads."""
    cpu, written = 0.0, 0
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        with open(f"/proc/{pid}/io") as fh:
            for line in fh:
                if line.startswith("write_bytes:"):
                    written = int(line.split()[1])
    except (OSError, ValueError, IndexError, TypeError):
        pass
    return cpu, written


async def batched(channels: list, names: list[str], batch: int, call, pid: int | None = None) -> list[tuple]:
    """call(channel, name) for every name, `batch` at a time (each on its own channel); per batch:
    (seconds, the node's CPU seconds, bytes the node wrote to storage)."""
    samples = []
    for start in range(0, len(names), batch):
        began, (cpu, written) = time.monotonic(), node_counters(pid)
        await asyncio.gather(*(call(channels[(start + i) % len(channels)], name)
                               for i, name in enumerate(names[start:start + batch])))
        cpu_after, written_after = node_counters(pid)
        samples.append((time.monotonic() - began, cpu_after - cpu, written_after - written))
    return samples


def bucket_rates(samples: list[tuple], batch: int, bucket: int, total: int) -> dict:
    """Operations/s over the first and the last `bucket` operations, and over all of them; the
    node's CPU (ms) and bytes written per operation in each bucket. The machine's other load
    moves the rates; the node's own CPU per operation much less."""
    per = max(1, bucket // batch)
    n = min(bucket, total)
    first = [sum(x) for x in zip(*samples[:per])]
    last = [sum(x) for x in zip(*samples[-per:])]
    wall = sum(s[0] for s in samples)
    buckets = [sum(s[0] for s in samples[i:i + per]) for i in range(0, len(samples), per)]
    return {"all": total / wall if wall else 0.0,
            "first": n / first[0] if first[0] else 0.0, "last": n / last[0] if last[0] else 0.0,
            "first_over_last": (last[0] / first[0]) if first[0] else 0.0,
            "cpu_ms_first": 1000 * first[1] / n, "cpu_ms_last": 1000 * last[1] / n,
            "cpu_last_over_first": (last[1] / first[1]) if first[1] else 0.0,
            "written_first": first[2] / n, "written_last": last[2] / n,
            "median_last_over_first": median_ratio(buckets),
            "bucket_seconds": [round(b, 4) for b in buckets]}


def median_ratio(buckets: list[float], spread: int = 10) -> float:
    """The typical bucket's time at the end over that at the start (the medians of `spread`
    buckets each): one pause (a snapshot, a collection, the machine's other load) landing in the
    last bucket moves the first/last ratio, not this one."""
    if len(buckets) < 2 * spread:
        spread = max(1, len(buckets) // 2)
    head, tail = statistics.median(buckets[:spread]), statistics.median(buckets[-spread:])
    return tail / head if head else 0.0


async def settle(pid: int | None, quiet: float = 1.0, timeout: float = 60) -> None:
    """Wait until the node has written nothing for `quiet` seconds (a new HareMQ store zeroes
    its first segments ahead of the writes), so that a phase's bytes are its own."""
    deadline = time.monotonic() + timeout
    before = node_counters(pid)[1]
    while time.monotonic() < deadline:
        await asyncio.sleep(quiet)
        now = node_counters(pid)[1]
        if now == before:
            return
        before = now


async def wait_ready(url: str, queue: str | None, timeout: float = 1200) -> float:
    """Seconds until a client connects (and finds `queue`, if given)."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        try:
            conn, channel = await connect(url, timeout=5)
            try:
                if queue is not None:
                    await channel.queue_declare(queue, passive=True)
            finally:
                await conn.close()
            return time.monotonic() - began
        except Exception:  # noqa: BLE001   not up yet
            await asyncio.sleep(0.05)
    raise RuntimeError(f"not ready after {timeout} s")


async def run_broker(node, args, out: dict) -> dict:
    """Every phase on one broker; `out` fills as they end (a failure keeps what came before)."""
    url = f"amqp://guest:guest@127.0.0.1:{node.port}/%2F"
    out["broker"] = node.version()
    names = [f"meta.{i:06d}" for i in range(args.queues)]
    began = time.monotonic()
    node.launch()          # a cluster's launch waits for its members and joins them
    try:
        await wait_ready(url, None)
        out["fresh_start_s"] = time.monotonic() - began
        rss0 = rss_kb(node.pid())
        out["rss_fresh_kb"] = rss0
        out["open_files_limit"] = open_files_limit(node.pid())

        log(f"{node.label}: {args.connections} connections")
        clock = Clock()
        conns, errors = await open_connections(url, args.connections)
        wall, cpu = clock.done()
        rss1 = rss_kb(node.pid())
        out["connections"] = {"opened": len(conns), "errors": len(errors), "first_error": errors[:1],
                              "rate": len(conns) / wall, "rss_per_kb": (rss1 - rss0) / max(1, len(conns)),
                              "load": clock.load, "client_cpu": cpu}
        channels = [ch for _c, ch in conns]
        if not channels:
            raise RuntimeError(f"no connection opened: {errors[:1]}")

        await settle(node.pid())
        log(f"{node.label}: declare {args.queues} durable queues, {args.batch} at a time")
        clock = Clock()
        times = await batched(channels, names, args.batch,
                              lambda ch, name: ch.queue_declare(name, durable=True), node.pid())
        wall, cpu = clock.done()
        rss2 = rss_kb(node.pid())
        out["declare"] = {**bucket_rates(times, args.batch, args.bucket, len(names)), "seconds": wall,
                          "rss_per_queue_kb": (rss2 - rss1) / len(names), "load": clock.load, "client_cpu": cpu}

        if "publish" in args.skip:
            return await finish(node, args, out, conns)
        log(f"{node.label}: publish one confirmed message to each")
        props = pc.Basic.Properties(delivery_mode=2)
        clock = Clock()

        failed = {"nacked": 0, "empty": 0}

        async def publish(ch, name):
            try:
                confirm = await ch.basic_publish(b"m" * 100, routing_key=name, properties=props)
            except aiormq.exceptions.DeliveryError:
                confirm = None
            if not isinstance(confirm, pc.Basic.Ack):
                failed["nacked"] += 1
        times = await batched(channels, names, args.batch, publish)
        wall, cpu = clock.done()
        out["publish"] = {"rate": len(names) / wall, "nacked": failed["nacked"], "load": clock.load,
                          "client_cpu": cpu}

        log(f"{node.label}: basic.get from each")
        clock = Clock()

        async def get(ch, name):
            message = await ch.basic_get(name, no_ack=True)
            if message.body != b"m" * 100:
                failed["empty"] += 1
        times = await batched(channels, names, args.batch, get)
        wall, cpu = clock.done()
        out["get"] = {"rate": len(names) / wall, "empty": failed["empty"], "load": clock.load, "client_cpu": cpu}

        if args.churn:
            log(f"{node.label}: {args.churn} server-named exclusive queues declared, bound and deleted")
            out["disk_before_churn_bytes"] = disk_bytes(node.metadata_files())

            async def cycle(ch, _i):
                declared = await ch.queue_declare("", exclusive=True)
                name = declared.queue
                await ch.queue_bind(name, "amq.direct", routing_key=name)
                await ch.queue_delete(name)
            clock = Clock()
            await batched(channels, list(range(args.churn)), args.batch, cycle)
            wall, cpu = clock.done()
            out["churn"] = {"cycles": args.churn, "rate": args.churn / wall, "seconds": wall,
                            "load": clock.load, "client_cpu": cpu}
            await asyncio.sleep(2)        # a snapshot under way ends
            out["disk_after_churn_bytes"] = disk_bytes(node.metadata_files())

        if "restart" in args.skip:
            return await finish(node, args, out, conns)
        log(f"{node.label}: restart with {args.queues} queues")
        await close_connections(conns)
        clock = Clock()
        node.stop()
        out["stop_s"] = time.monotonic() - clock.wall
        clock = Clock()
        node.launch()
        await wait_ready(url, names[-1])
        out["restart"] = {"seconds": time.monotonic() - clock.wall, "load": clock.load}
        out["metadata_on_disk_bytes"] = disk_bytes(node.metadata_files())
        out["rss_restarted_kb"] = rss_kb(node.pid())

        conns, errors = await open_connections(url, min(args.connections, len(conns)))
        if "delete" in args.skip:
            return await finish(node, args, out, conns)
        channels = [ch for _c, ch in conns]
        await settle(node.pid())
        log(f"{node.label}: delete them all, {args.batch} at a time")
        clock = Clock()
        times = await batched(channels, names, args.batch, lambda ch, name: ch.queue_delete(name), node.pid())
        wall, cpu = clock.done()
        out["delete"] = {**bucket_rates(times, args.batch, args.bucket, len(names)), "seconds": wall,
                         "load": clock.load, "client_cpu": cpu}
        await close_connections(conns)
    finally:
        if node.alive():
            node.stop()
    return out


async def finish(node, args, out: dict, conns: list) -> dict:
    """The phases after a skipped one are skipped too (each needs what the one before left)."""
    log(f"{node.label}: the remaining phases are skipped (--skip {','.join(sorted(args.skip))})")
    await close_connections(conns)
    return out


# ---- the report -------------------------------------------------------------------------------------
ROWS = [
    ("fresh node: start until a client connects, s", lambda r: r["fresh_start_s"], "lower"),
    ("file-descriptor limit of the node", lambda r: r["open_files_limit"], None),
    ("connections opened", lambda r: r["connections"]["opened"], None),
    ("connections/s", lambda r: r["connections"]["rate"], "higher"),
    ("RSS per connection, KB", lambda r: r["connections"]["rss_per_kb"], "lower"),
    ("declare/s, all queues", lambda r: r["declare"]["all"], "higher"),
    ("declare/s, first bucket", lambda r: r["declare"]["first"], "higher"),
    ("declare/s, last bucket", lambda r: r["declare"]["last"], "higher"),
    ("declare: last bucket's time / first's", lambda r: r["declare"]["first_over_last"], "lower"),
    ("declare: median of the last 10 buckets' time / the first 10's", lambda r: r["declare"]["median_last_over_first"],
     "lower"),
    ("declare: node CPU per queue, first bucket, ms", lambda r: r["declare"]["cpu_ms_first"], "lower"),
    ("declare: node CPU per queue, last bucket, ms", lambda r: r["declare"]["cpu_ms_last"], "lower"),
    ("declare: last bucket's node CPU / first's", lambda r: r["declare"]["cpu_last_over_first"], "lower"),
    ("declare: bytes written per queue, first bucket", lambda r: r["declare"]["written_first"], "lower"),
    ("declare: bytes written per queue, last bucket", lambda r: r["declare"]["written_last"], "lower"),
    ("RSS per queue, KB", lambda r: r["declare"]["rss_per_queue_kb"], "lower"),
    ("publish one confirmed message to each, msg/s", lambda r: r["publish"]["rate"], "higher"),
    ("publishes nacked", lambda r: r["publish"]["nacked"], None),
    ("basic.get from each, msg/s", lambda r: r["get"]["rate"], "higher"),
    ("basic.get found nothing", lambda r: r["get"]["empty"], None),
    ("churn: declare + bind + delete of a server-named exclusive queue, cycles/s", lambda r: r["churn"]["rate"],
     "higher"),
    ("metadata on disk before the churn, MB", lambda r: r["disk_before_churn_bytes"] / 1e6, "lower"),
    ("metadata on disk after the churn, MB", lambda r: r["disk_after_churn_bytes"] / 1e6, "lower"),
    ("metadata on disk after the restart, MB", lambda r: r["metadata_on_disk_bytes"] / 1e6, "lower"),
    ("restart with the queues until the last is found, s", lambda r: r["restart"]["seconds"], "lower"),
    ("restart / fresh start", lambda r: r["restart"]["seconds"] / r["fresh_start_s"], "lower"),
    ("delete/s, all queues", lambda r: r["delete"]["all"], "higher"),
    ("delete/s, first bucket", lambda r: r["delete"]["first"], "higher"),
    ("delete/s, last bucket", lambda r: r["delete"]["last"], "higher"),
    ("delete: node CPU per queue, first bucket, ms", lambda r: r["delete"]["cpu_ms_first"], "lower"),
    ("delete: node CPU per queue, last bucket, ms", lambda r: r["delete"]["cpu_ms_last"], "lower"),
    ("delete: bytes written per queue, first bucket", lambda r: r["delete"]["written_first"], "lower"),
    ("delete: bytes written per queue, last bucket", lambda r: r["delete"]["written_last"], "lower"),
]


def fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:,.2f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def report(results: dict, args) -> str:
    labels = list(results)
    lines = [f"{args.queues:,} durable queues ({args.batch} at a time, buckets of {args.bucket:,}), "
             f"{args.connections:,} connections asked for, {args.churn:,} churn cycles"
             f"{', three-node clusters' if args.cluster else ''}; "
             + ", ".join(r.get("broker", k) for k, r in results.items()),
             "", "| figure | " + " | ".join(labels) + (" | HareMQ/RabbitMQ |" if len(labels) == 2 else " |"),
             "|---" * (len(labels) + 1 + (len(labels) == 2)) + "|"]
    for name, get, _better in ROWS:
        cells = []
        values = []
        for label in labels:
            try:
                value = get(results[label])
            except (KeyError, TypeError):
                value = None
            values.append(value)
            cells.append("n/a" if value is None else fmt(value))
        ratio = ""
        if len(labels) == 2:
            a, b = values
            ratio = f" {a / b:.2f}x |" if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else " |"
        lines.append(f"| {name} | " + " | ".join(cells) + " |" + ratio)
    lines.append("")
    for label, r in results.items():
        if "error" in r:
            lines.append(f"{label}: {r['error']}")
        phases = {k: v for k, v in r.items() if isinstance(v, dict) and "load" in v}
        lines.append(f"{label}: load average before each phase " + ", ".join(
            f"{k} {v['load']:.2f}" for k, v in phases.items()) + "; client CPU share " + ", ".join(
            f"{k} {v['client_cpu']:.2f}" for k, v in phases.items() if "client_cpu" in v))
    return "\n".join(lines)


async def main_async(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="haremq-metadata-"))
    results: dict = {}
    try:
        for label in args.brokers:
            if args.cluster:
                node = HareCluster(work / "hare", args.nofile) if label == "haremq" else \
                    RabbitCluster(work, args.rabbit_port, args.nofile)
            else:
                node = HareNode(work, args.nofile) if label == "haremq" else \
                    RabbitNode(work, args.rabbit_port, args.nofile)
            results[node.label] = out = {}
            try:
                await run_broker(node, args, out)
            except Exception as exc:  # noqa: BLE001   one broker's failure is reported, not fatal
                log(f"{node.label}: {type(exc).__name__}: {exc}")
                out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--connections", type=int, default=1_000)
    parser.add_argument("--batch", type=int, default=200, help="operations in flight at once")
    parser.add_argument("--bucket", type=int, default=1_000, help="the first and last this many are timed apart")
    parser.add_argument("--churn", type=int, default=0,
                        help="server-named exclusive queues declared, bound and deleted before the restart")
    parser.add_argument("--cluster", action="store_true", help="three nodes of each broker, clustered")
    parser.add_argument("--brokers", default="haremq,rabbitmq")
    parser.add_argument("--rabbit-port", type=int, default=None,
                        help="RabbitMQ's AMQP port (its distribution port is this + 20000); default: a free one")
    parser.add_argument("--nofile", type=int, default=resource.getrlimit(resource.RLIMIT_NOFILE)[1],
                        help="each broker's file-descriptor limit (ulimit -n); default: the hard limit")
    parser.add_argument("--skip", default="", help="phases left out, with every phase after them: "
                        "publish (and get, churn), restart, delete; e.g. --skip publish for declares only")
    parser.add_argument("--json", help="write every figure to this file")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    args.brokers = [b.strip() for b in args.brokers.split(",") if b.strip()]
    args.skip = {p.strip() for p in args.skip.split(",") if p.strip()}
    unknown = args.skip - {"publish", "restart", "delete"}
    if unknown:
        parser.error(f"--skip: unknown phase {', '.join(sorted(unknown))}")
    if args.rabbit_port is None:
        args.rabbit_port = next(p for p in range(5695, 5790) if not any(
            port_open(p + i) or port_open(p + i + 20000) for i in range(3 if args.cluster else 1)))
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    import logging
    logging.getLogger("aiormq").setLevel(logging.CRITICAL)    # "connection refused" while a node starts
    results = asyncio.run(main_async(args))
    print(report(results, args))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": {**vars(args), "skip": sorted(args.skip)},
                                                "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
