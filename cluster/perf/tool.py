"""`haremq perf`: a PerfTest-style load tool for any AMQP 0-9-1 broker.

    haremq perf -h amqp://guest:guest@127.0.0.1:5672/%2F -x 1 -y 1 -s 1024 \\
        -f persistent -c 1000 -q 300 -A 50 -u perf -z 10 --json out.json

The flags are PerfTest's, so its users feel at home (`-h` is the broker URI
as in PerfTest; help is `--help`). Producers and consumers each run in
their own process (workers.py) over a minimal client (amqp.py), so
the tool can load a broker several times faster than one Python process
could; the summary reports the tool's own CPU so a reader can tell when the
tool, not the broker, was the limit.

This module holds the command line, the run's orchestration (queue setup,
start, live progress, drain, stop) and the JSON summary.
"""
from __future__ import annotations

import argparse
import array
import asyncio
import json
import multiprocessing as mp
import os
import queue as queue_mod
import random
import signal
import sys
import time

from pamqp import commands as pc

from .amqp import AMQPError, BrokerURL, URLError, open_conn, parse_url
from .stats import cpu_self, machine_cpu, proc_cpu, summary_ms
from .workers import (CONFIRMED, CONSUMED, FINISHED, NACKED, P50, P99, RETURNED, SENT, SLOT, STATE, STOP,
                      STOP_NOW, STOP_PUBLISHING, T0, TARGET, RunConfig, Shared, worker_main)

PROG = "haremq perf"
mono = time.monotonic_ns


class UsageError(Exception):
    """A bad flag or value: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print the whole usage; we want one line
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, add_help=False, description=__doc__.split("\n\n")[0],
                formatter_class=argparse.RawDescriptionHelpFormatter,
                epilog="Without -z or -C it runs until Ctrl-C (the first stops publishing and drains, "
                       "the second stops at once).")
    a = p.add_argument
    a("--help", action="help", help="show this help and exit")
    a("-h", "--uri", action="append", metavar="URL",
      help="broker URL, amqp://user:pass@host:port/vhost (repeatable or comma-separated: "
           "producers and consumers are spread over them; default amqp://guest:guest@localhost:5672/%%2F)")
    a("-x", "--producers", type=int, default=1, help="producer count (default 1)")
    a("-y", "--consumers", type=int, default=1, help="consumer count (default 1)")
    a("-s", "--size", type=int, default=12, help="message size in bytes (default 12; below 12 "
      "no latency is measured)")
    a("-r", "--rate", type=float, default=0, help="publish rate limit per producer, msg/s (default: none)")
    a("-u", "--queue", default="haremq-perf", help="queue to publish to and consume from "
      "(declared if missing; default haremq-perf)")
    a("-f", "--flag", action="append", default=[], choices=["persistent", "mandatory"],
      help="message flag, repeatable: persistent (delivery mode 2, queue declared durable), mandatory")
    a("-c", "--confirm", type=int, default=0, metavar="N",
      help="publisher confirms with at most N unconfirmed messages per producer (default: no confirms)")
    a("-q", "--qos", type=int, default=0, metavar="N", help="consumer prefetch count (default: unlimited)")
    a("-A", "--multi-ack-every", type=int, default=0, metavar="N",
      help="ack every N messages with multiple=true (default: ack each message), as PerfTest's -A")
    a("-n", "--ctxsize", type=int, default=0, metavar="N",
      help="PerfTest's consumer transaction size: only 0 (no transactions) is supported")
    a("-a", "--autoack", action="store_true", help="consume with no-ack")
    a("-z", "--time", type=float, metavar="SECONDS", help="publish for this long, then drain and stop")
    a("-C", "--pmessages", type=int, metavar="N", help="messages per producer, then drain and stop")
    a("--json", metavar="FILE", help="write the JSON summary to FILE ('-' for stdout)")
    a("-qa", "--queue-args", type=queue_arguments, default={}, metavar="K=V,...",
      help="queue arguments, as PerfTest's: x-queue-type=quorum,x-max-length=1000 (whole numbers "
           "are sent as numbers, true/false as booleans)")
    a("--recreate", action="store_true", help="delete and re-declare the queue before the run")
    a("--delete-after", action="store_true", help="delete the queue after the run")
    a("--drain-timeout", type=float, default=30.0, metavar="SECONDS",
      help="after publishing stops, wait at most this long for confirms and for consumers (default 30)")
    a("--broker-pid", type=int, action="append", default=[], metavar="PID",
      help="also report this broker process's CPU (repeatable)")
    a("--quiet", action="store_true", help="no live progress line")
    return p


# PerfTest flags whose meaning haremq perf does not have: refused by name, so a pasted PerfTest
# command line never silently means something else.
PERFTEST_UNSUPPORTED = {
    "-m": "--ptxsize (producer transactions)", "--ptxsize": "--ptxsize (producer transactions)",
    "-D": "--cmessages (consumer message count)", "--cmessages": "--cmessages (consumer message count)",
    "-e": "--exchange", "--exchange": "--exchange", "-t": "--type (exchange type)", "--type": "--type",
    "-k": "--routing-key", "--routing-key": "--routing-key", "-K": "--random-routing-key",
    "--random-routing-key": "--random-routing-key", "-p": "--predeclared", "--predeclared": "--predeclared",
    "-i": "--interval", "--interval": "--interval", "-R": "--consumer-rate", "--consumer-rate": "--consumer-rate",
    "-L": "--consumer-latency", "--consumer-latency": "--consumer-latency", "-M": "--framemax",
    "--framemax": "--framemax", "-b": "--heartbeat", "--heartbeat": "--heartbeat", "-o": "--output-file",
    "--output-file": "--output-file", "-X": "--producer-channel-count", "--producer-channel-count":
    "--producer-channel-count", "-Y": "--consumer-channel-count", "--consumer-channel-count":
    "--consumer-channel-count", "-P": "--publishing-interval", "--publishing-interval": "--publishing-interval",
    "-H": "--uris (use -h, repeatable or comma-separated)", "--uris": "--uris (use -h)",
    "-ad": "--auto-delete", "--auto-delete": "--auto-delete",
    "-ms": "--use-millis", "--use-millis": "--use-millis", "-l": "--legacy-metrics",
    "--legacy-metrics": "--legacy-metrics", "-st": "--shutdown-timeout", "--shutdown-timeout": "--shutdown-timeout",
    "-sb": "--skip-binding-queues", "--skip-binding-queues": "--skip-binding-queues",
}


def queue_arguments(text: str) -> dict:
    """PerfTest's `--queue-args` form: comma-separated key=value pairs."""
    out: dict = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"{pair!r}: expected key=value")
        if value.lstrip("-").isdigit():
            out[key] = int(value)
        elif value in ("true", "false"):
            out[key] = value == "true"
        else:
            out[key] = value
    return out


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, RunConfig]:
    for arg in argv:
        if arg == "--":
            break
        flag = arg.split("=", 1)[0]
        if flag in PERFTEST_UNSUPPORTED:
            raise UsageError(f"{flag}: PerfTest's {PERFTEST_UNSUPPORTED[flag]} is not supported by haremq perf")
    ns = build_parser().parse_args(argv)
    if ns.ctxsize:
        raise UsageError("-n: PerfTest's consumer transaction size (--ctxsize) is not supported; "
                         "for multi-ack use -A N")
    urls = [parse_url(u.strip()) for arg in (ns.uri or ["amqp://guest:guest@localhost:5672/%2F"])
            for u in arg.split(",") if u.strip()]
    if not urls:
        raise UsageError("-h: no URL given")
    checks = [(ns.producers < 0, "-x must be >= 0"), (ns.consumers < 0, "-y must be >= 0"),
              (ns.producers + ns.consumers == 0, "-x 0 -y 0: nothing to run"),
              (ns.size < 0, "-s must be >= 0"), (ns.rate < 0, "-r must be >= 0"),
              (ns.confirm < 0, "-c must be >= 0"), (not 0 <= ns.qos <= 65535, "-q must be 0..65535"),
              (ns.multi_ack_every < 0, "-A must be >= 0"),
              (ns.time is not None and ns.time <= 0, "-z must be > 0"),
              (ns.pmessages is not None and ns.pmessages <= 0, "-C must be > 0"),
              (not ns.queue or len(ns.queue.encode()) > 255, "-u: queue name must be 1..255 bytes"),
              (ns.drain_timeout < 0, "--drain-timeout must be >= 0")]
    for bad, msg in checks:
        if bad:
            raise UsageError(msg)
    cfg = RunConfig(urls=urls, producers=ns.producers, consumers=ns.consumers, size=ns.size,
                    rate=ns.rate, queue=ns.queue, persistent="persistent" in ns.flag,
                    mandatory="mandatory" in ns.flag, confirm=ns.confirm, prefetch=ns.qos,
                    multi_ack_every=max(1, ns.multi_ack_every), autoack=ns.autoack,
                    queue_args=ns.queue_args, time_s=ns.time, count=ns.pmessages, drain_timeout=ns.drain_timeout,
                    run_id=random.randrange(1, 1 << 32))  # noqa: S311 - tells runs apart, not a secret
    return ns, cfg


# --------------------------------------------------------------------------- queue setup

async def _queue_op(urls: list[BrokerURL], cfg: RunConfig, recreate: bool = False, delete: bool = False) -> None:
    """Delete (recreate, delete) and declare the queue on every distinct URL, the first URL first.

    On a cluster the later declarations are no-ops (the queue lives where the
    first URL points); on separate brokers each one gets its queue.
    """
    distinct = list(dict.fromkeys(urls))
    steps = ([("delete", u) for u in distinct] if recreate or delete else []) \
        + ([("declare", u) for u in distinct] if not delete else [])
    for what, url in steps:
        conn = await open_conn(url, name="haremq-perf setup")
        try:
            if what == "delete":
                await conn.rpc(pc.Queue.Delete(queue=cfg.queue), pc.Queue.DeleteOk)
            else:
                # a quorum (or stream) queue is durable whatever the messages are
                durable = cfg.persistent or "x-queue-type" in cfg.queue_args
                await conn.rpc(pc.Queue.Declare(queue=cfg.queue, durable=durable, arguments=cfg.queue_args),
                               pc.Queue.DeclareOk)
        except AMQPError as exc:
            raise AMQPError(f"queue {cfg.queue!r} on {url.host}:{url.port}: {exc}") from None
        finally:
            await conn.close()


# --------------------------------------------------------------------------- the run

class Run:
    """Forks the workers, starts them together, prints progress, collects the results."""

    def __init__(self, ns: argparse.Namespace, cfg: RunConfig):
        self.ns, self.cfg = ns, cfg
        self.n = cfg.producers + cfg.consumers
        self.ctx = mp.get_context("fork")
        self.shared = Shared(self.ctx, self.n)
        self.procs: list = []
        self.results: dict[int, dict] = {}
        self.per_second: list[dict] = []
        self.t0 = 0

    def rows(self, role: str) -> range:
        x = self.cfg.producers
        return range(x) if role == "producer" else range(x, self.n)

    def total(self, field: int, role: str) -> int:
        s = self.shared.slots
        return sum(s[w * SLOT + field] for w in self.rows(role))

    def start_workers(self) -> None:
        for role in ("consumer", "producer"):   # consumers first: subscribed before the first publish
            for w in self.rows(role):
                idx = w if role == "producer" else w - self.cfg.producers
                p = self.ctx.Process(target=worker_main, args=(role, idx, w, self.cfg, self.shared),
                                     daemon=True, name=f"haremq-perf-{role}-{idx}")
                p.start()
                self.procs.append(p)

    def wait_ready(self, timeout: float = 30.0) -> None:
        ready, deadline = 0, time.monotonic() + timeout
        while ready < self.n:
            try:
                msg = self.shared.queue.get(timeout=0.1)
            except queue_mod.Empty:
                if time.monotonic() > deadline:
                    raise AMQPError(f"workers not connected after {timeout:g}s") from None
                if any(p.exitcode not in (None, 0) for p in self.procs):
                    raise AMQPError("a worker process died while connecting") from None
                continue
            if msg["kind"] == "ready":
                ready += 1
            else:
                raise AMQPError(msg["error"])

    def stop_workers(self) -> None:
        self.shared.ctl[STOP] = STOP_NOW
        for p in self.procs:
            p.join(timeout=5)
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=2)

    def on_sigint(self, *_):
        ctl = self.shared.ctl
        if ctl[STOP] >= STOP_NOW:
            raise KeyboardInterrupt
        ctl[STOP] += 1
        what = "stopping publishers, draining (Ctrl-C again to stop now)" if ctl[STOP] == STOP_PUBLISHING \
            else "stopping now"
        print(f"{PROG}: {what}", file=sys.stderr, flush=True)

    def execute(self) -> dict:
        cfg, ctl, slots = self.cfg, self.shared.ctl, self.shared.slots
        self.start_workers()
        try:
            self.wait_ready()
        except BaseException:
            self.stop_workers()
            raise
        old = signal.signal(signal.SIGINT, self.on_sigint)
        try:
            return self._measure(cfg, ctl, slots)
        finally:
            signal.signal(signal.SIGINT, old)

    def _measure(self, cfg: RunConfig, ctl, slots) -> dict:
        pids = self.ns.broker_pid
        m0, b0, p0 = machine_cpu(), {p: proc_cpu(p) for p in pids}, cpu_self()
        self.t0 = t0 = mono() + 50_000_000
        ctl[T0] = t0
        next_line, prev, prev_at = t0 + 1_200_000_000, self.snapshot(), t0
        window_end = t0 + int(cfg.time_s * 1e9) if cfg.time_s else None
        while len(self.results) < self.n:
            try:
                msg = self.shared.queue.get(timeout=0.05)
                if msg["kind"] == "result":
                    self.results[len(self.results)] = msg
            except queue_mod.Empty:
                pass
            now = mono()
            if ctl[TARGET] < 0:
                producers_done = all(slots[w * SLOT + STATE] == FINISHED for w in self.rows("producer"))
                if cfg.producers == 0:
                    producers_done = ctl[STOP] > 0 or (window_end is not None and now >= window_end)
                if producers_done:
                    ctl[TARGET] = self.total(SENT, "producer") - self.total(RETURNED, "producer")
            if now >= next_line:
                cur = self.snapshot()
                self.progress(cur, prev, (now - t0) / 1e9, (now - prev_at) / 1e9)
                prev, prev_at = cur, now
                next_line += 1_000_000_000
            if len(self.results) + self._dead() >= self.n:
                break
        t_end = mono()
        m1, b1, p1 = machine_cpu(), {p: proc_cpu(p) for p in pids}, cpu_self()
        for p in self.procs:
            p.join(timeout=10)
        return self.summarize(t_end, m0, m1, b0, b1, p1 - p0)

    def _dead(self) -> int:
        """Workers that exited without posting a result (killed): counted as failed."""
        gone = sum(1 for p in self.procs if p.exitcode not in (None, 0))
        if gone and len(self.results) + gone >= self.n:
            try:  # a last result may still be in the pipe
                while True:
                    msg = self.shared.queue.get(timeout=0.5)
                    if msg["kind"] == "result":
                        self.results[len(self.results)] = msg
            except queue_mod.Empty:
                pass
            return self.n - len(self.results)
        return 0

    # progress ---------------------------------------------------------------
    def snapshot(self) -> dict:
        return {"sent": self.total(SENT, "producer"), "confirmed": self.total(CONFIRMED, "producer"),
                "nacked": self.total(NACKED, "producer"), "consumed": self.total(CONSUMED, "consumer")}

    def worst(self, role: str, field: int) -> float | None:
        """Max over workers of one interval percentile (µs -> ms); None if no worker measured any."""
        s = self.shared.slots
        vals = [s[w * SLOT + field] for w in self.rows(role) if s[w * SLOT + field] >= 0]
        return max(vals) / 1000 if vals else None

    def progress(self, cur: dict, prev: dict, elapsed: float, dt: float) -> None:
        """One line per second on stderr: this interval's rates and latency percentiles."""
        d = {k: round((cur[k] - prev[k]) / dt) for k in cur}
        self.per_second.append({"t": round(elapsed, 1), **d})
        if self.ns.quiet:
            return
        out = cur["sent"] - cur["confirmed"] - cur["nacked"]
        parts = [f"{elapsed:5.0f}s", f"sent {d['sent']:>7,}/s"]
        if self.cfg.confirm:
            parts.append(f"confirmed {d['confirmed']:>7,}/s")
        if self.cfg.consumers:
            parts.append(f"consumed {d['consumed']:>7,}/s")
        if self.cfg.confirm:
            parts.append(f"outstanding {out:,}")
        for label, role, on in (("confirm", "producer", self.cfg.confirm),
                                ("e2e", "consumer", self.cfg.consumers and self.cfg.size >= 12)):
            lo, hi = self.worst(role, P50), self.worst(role, P99)
            if on and lo is not None:
                parts.append(f"{label} p50 {lo:.2f} p99 {hi:.2f} ms")
        print("  ".join(parts), file=sys.stderr, flush=True)

    # summary ----------------------------------------------------------------
    def summarize(self, t_end, m0, m1, b0, b1, parent_cpu) -> dict:
        cfg, t0 = self.cfg, self.t0
        res = list(self.results.values())
        prods = [r for r in res if r["role"] == "producer" and not r.get("fatal")]
        cons = [r for r in res if r["role"] == "consumer" and not r.get("fatal")]
        errors = [r["error"] for r in res if r.get("error")]
        if len(res) < self.n:
            errors.append(f"{self.n - len(res)} worker process(es) died without a result")
        sent = sum(r["sent"] for r in prods)
        confirmed = sum(r["confirmed"] for r in prods)
        nacked = sum(r["nacked"] for r in prods)
        consumed = sum(r["consumed"] for r in cons)
        def span(key: str, rows: list[dict]) -> float:   # seconds from the start to the last event
            return max(((r[key] - t0) / 1e9 for r in rows if r.get(key)), default=0.0)

        def rate(n: int, secs: float) -> float:
            return round(n / max(secs, 1e-3), 1) if n else 0.0

        pub_s, conf_s, cons_s = span("t_last_pub", prods), span("t_last_confirm", prods), span("t_last_msg", cons)
        wall = (t_end - t0) / 1e9
        if not cfg.producers:          # consumers only: they drained for the whole run
            cons_s = wall
        out = {
            "sent": sent, "confirmed": confirmed, "nacked": nacked,
            "returned": sum(r["returned"] for r in prods),
            "consumed": consumed,
            "outstanding": sent - confirmed - nacked,
            "other_consumed": sum(r["foreign"] for r in cons),
            "redelivered": sum(r["redelivered"] for r in cons),
            "publish_rate": rate(sent, pub_s),
            "confirm_rate": rate(confirmed, conf_s) if cfg.confirm else None,
            "consume_rate": rate(consumed, cons_s) if cons else None,
            "consume_rate_in_window": (rate(sum(r["consumed_in_window"] for r in cons), cfg.time_s)
                                       if cons and cfg.time_s else None),
            "confirm_latency_ms": merged_latency(prods) if cfg.confirm else None,
            "e2e_latency_ms": merged_latency(cons),
            "publish_window_s": round(pub_s, 3),
            "duration_s": round(wall, 3),
            "client_cpu": client_cpu(prods + cons, parent_cpu, wall),
            "machine_cpu": None,
            "connection_blocked": sum(r.get("blocked", 0) for r in prods),
            "consumer_stop": [r.get("stop_reason") for r in cons],
            "errors": errors,
            "per_second": self.per_second,
            "config": config_dict(cfg),
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(time.time() - wall)),
        }
        cores = os.cpu_count() or 1
        busy = (m1[0] - m0[0]) / wall if wall > 0 else 0.0
        broker = {str(p): round((b1[p] - b0[p]) / wall, 3) for p in b0
                  if b0[p] is not None and b1.get(p) is not None and wall > 0}
        client_cores = out["client_cpu"]["total"]["cores"]
        out["machine_cpu"] = {
            "cores": cores, "busy_cores": round(busy, 3), "client_cores": client_cores,
            "broker_cores": broker or None,
            "other_cores": round(max(0.0, busy - client_cores - sum(broker.values())), 3),
        }
        return out


def merged_latency(rows: list[dict]) -> dict | None:
    """All workers' samples at one common stride (so no worker is over-weighted), as ms."""
    rows = [r for r in rows if r.get("lat_ns")]
    if not rows:
        return None
    stride = max(r["lat_stride"] for r in rows)
    vals = array.array("q")
    for r in rows:
        a = array.array("q")
        a.frombytes(r["lat_ns"])
        vals.extend(a[::stride // r["lat_stride"]])
    return summary_ms(vals, max(r["lat_max_ns"] for r in rows))


def client_cpu(rows: list[dict], parent_cpu: float, wall: float) -> dict:
    procs = [{"role": r["role"], "idx": r["idx"], "cpu_s": round(r["cpu_s"], 3), "wall_s": round(r["wall_s"], 3),
              "share_of_core": round(r["cpu_s"] / max(r["wall_s"], 1e-9), 3)} for r in rows]
    total = sum(r["cpu_s"] for r in rows) + parent_cpu
    return {"processes": procs, "parent_cpu_s": round(parent_cpu, 3),
            "total": {"cpu_s": round(total, 3), "wall_s": round(wall, 3),
                      "cores": round(total / max(wall, 1e-9), 3)}}


def config_dict(cfg: RunConfig) -> dict:
    d = {k: v for k, v in vars(cfg).items() if k not in ("urls", "parent_pid")}
    d["urls"] = [str(u) for u in cfg.urls]
    return d


def print_summary(s: dict) -> None:
    def lat(name, d):
        return f"{name} ms p50 {d['p50']} p95 {d['p95']} p99 {d['p99']} max {d['max']}" if d else f"{name} -"
    cpu = s["client_cpu"]
    busiest = max(cpu["processes"], key=lambda p: p["share_of_core"], default=None)
    print(f"sent {s['sent']:,} ({s['publish_rate']:,.0f} msg/s)  confirmed {s['confirmed']:,}  "
          f"nacked {s['nacked']:,}  returned {s['returned']:,}  outstanding {s['outstanding']:,}  "
          f"consumed {s['consumed']:,} ({(s['consume_rate'] or 0):,.0f} msg/s)", file=sys.stderr)
    print(f"{lat('confirm latency', s['confirm_latency_ms'])}  |  {lat('e2e latency', s['e2e_latency_ms'])}",
          file=sys.stderr)
    if busiest:
        print(f"client cpu {cpu['total']['cores']:.2f} cores (busiest: {busiest['role']} {busiest['idx']} "
              f"at {busiest['share_of_core']:.0%} of a core)  machine busy {s['machine_cpu']['busy_cores']:.2f} "
              f"of {s['machine_cpu']['cores']} cores", file=sys.stderr)


def run(ns: argparse.Namespace, cfg: RunConfig) -> dict:
    asyncio.run(_queue_op(cfg.urls, cfg, recreate=ns.recreate))
    summary = Run(ns, cfg).execute()
    if ns.delete_after:
        try:
            asyncio.run(_queue_op(cfg.urls, cfg, delete=True))
        except AMQPError as exc:
            summary["errors"].append(f"--delete-after: {exc}")
    return summary


def main(argv: list[str]) -> int:
    """Entry point of `haremq perf`; every failure is one line on stderr and a non-zero status."""
    try:
        ns, cfg = parse_args(argv)
        summary = run(ns, cfg)
        if ns.json:
            text = json.dumps(summary, indent=1)
            if ns.json == "-":
                print(text)
            else:
                with open(ns.json, "w") as f:
                    f.write(text + "\n")
    except UsageError as exc:
        print(f"{PROG}: {exc} (see {PROG} --help)", file=sys.stderr)
        return 2
    except (AMQPError, URLError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"{PROG}: {exc.filename or ''}{': ' if exc.filename else ''}{exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    print_summary(summary)
    if summary["errors"]:
        print(f"{PROG}: {summary['errors'][0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
