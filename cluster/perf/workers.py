"""Producer and consumer processes of `haremq perf`.

Why one OS process per producer and per consumer: a Python event loop tops
out at one core, and a single process driving many connections would be
the bottleneck long before the broker. Each worker is forked from the
parent, runs its own uvloop loop and one connection (amqp.py's Conn), and
talks to the parent through

* `Shared.slots`: a shared int64 array, one row of counters per worker,
  written by the worker's 100 ms ticker and read by the parent for the live
  progress line and by the consumers to know when everything is drained;
* `Shared.ctl`: start time, stop level and the drain target, set by the parent;
* `Shared.queue`: "ready" notes and, at the end, each worker's result
  (counters, latency samples, CPU time).
"""
from __future__ import annotations

import array
import asyncio
import os
import signal
import time
from dataclasses import dataclass, field

from pamqp import commands as pc

from .amqp import STAMP, STAMP_SIZE, AMQPError, BrokerURL, Conn, ack_frame, open_conn, publish_template
from .stats import Samples, cpu_self

try:
    import uvloop
    _run = uvloop.run
except ImportError:  # pragma: no cover - uvloop is a dependency; plain asyncio still works
    _run = asyncio.run

mono = time.monotonic_ns

# one row of Shared.slots per worker
SENT, CONFIRMED, NACKED, RETURNED, CONSUMED, FOREIGN, P50, P95, P99, STATE, REDELIVERED, BLOCKED = range(12)
SLOT = 12
RUNNING, FINISHED = 0, 1          # STATE: a producer is FINISHED once it stopped publishing and
                                  # waited for its confirms, a consumer once it stopped consuming
# Shared.ctl
T0, STOP, TARGET = range(3)       # TARGET: messages the consumers should see (-1: not known yet)
STOP_PUBLISHING, STOP_NOW = 1, 2


@dataclass
class RunConfig:
    urls: list[BrokerURL]
    producers: int = 1
    consumers: int = 1
    size: int = 12
    rate: float = 0.0
    queue: str = "haremq-perf"
    queue_args: dict = field(default_factory=dict)
    persistent: bool = False
    mandatory: bool = False
    confirm: int = 0
    prefetch: int = 0
    multi_ack_every: int = 1
    autoack: bool = False
    time_s: float | None = None
    count: int | None = None
    batch: int = 50
    drain_timeout: float = 30.0
    drain_idle: float = 3.0
    run_id: int = 1
    parent_pid: int = field(default_factory=os.getpid)


class Shared:
    def __init__(self, ctx, n_workers: int):
        self.slots = ctx.RawArray("q", SLOT * max(1, n_workers))
        self.ctl = ctx.RawArray("q", 3)
        self.ctl[TARGET] = -1
        self.queue = ctx.Queue()

    def row(self, worker: int) -> int:
        return worker * SLOT


class Worker:
    """What producers and consumers share: connection, ticker, start and stop."""

    role = "worker"

    def __init__(self, cfg: RunConfig, idx: int, worker_no: int, shared: Shared):
        self.cfg = cfg
        self.idx = idx
        self.shared = shared
        self.base = shared.row(worker_no)
        # producers then consumers, round-robin over the URLs: with x=1 y=1 and two nodes the
        # producer is on the first node (where the queue was declared) and the consumer on the second
        self.url = cfg.urls[worker_no % len(cfg.urls)]
        self.lat = Samples()
        self.conn: Conn | None = None
        self.finished = False
        self.error: str | None = None
        self.t0 = 0

    def name(self) -> str:
        return f"{self.role} {self.idx}"

    async def wait_start(self) -> int:
        ctl = self.shared.ctl
        while not ctl[T0]:
            if ctl[STOP] >= STOP_NOW or os.getppid() != self.cfg.parent_pid:
                raise AMQPError("stopped before the start")
            await asyncio.sleep(0.002)
        self.t0 = ctl[T0]
        while mono() < self.t0:
            await asyncio.sleep(0.001)
        return self.t0

    def counters(self) -> dict:
        raise NotImplementedError

    def publish_counters(self) -> None:
        s, b = self.shared.slots, self.base
        for k, v in self.counters().items():
            s[b + k] = v
        s[b + BLOCKED] = self.conn.blocked_count if self.conn else 0

    async def ticker(self) -> None:
        """Every 100 ms: counters to the parent; every second: the interval's latency percentiles."""
        next_sec = self.t0 + 1_000_000_000
        s, b = self.shared.slots, self.base
        while not self.finished:
            await asyncio.sleep(0.1)
            self.publish_counters()
            self.lat.thin()
            now = mono()
            if now >= next_sec:
                p = self.lat.interval()
                s[b + P50], s[b + P95], s[b + P99] = p if p else (-1, -1, -1)
                while next_sec <= now:
                    next_sec += 1_000_000_000
            if os.getppid() != self.cfg.parent_pid:   # the parent died: do not linger
                self.shared.ctl[STOP] = STOP_NOW
            self.wake()

    def wake(self) -> None:
        pass

    def result(self, cpu_s: float, t_end: int) -> dict:
        return {"kind": "result", "role": self.role, "idx": self.idx, "error": self.error,
                "cpu_s": cpu_s, "wall_s": (t_end - self.t0) / 1e9, "t_end": t_end,
                "lat_ns": self.lat.values.tobytes(), "lat_max_ns": self.lat.max,
                "lat_stride": self.lat.stride,
                "blocked": self.conn.blocked_count if self.conn else 0, **self.counters_named()}

    def counters_named(self) -> dict:
        names = {SENT: "sent", CONFIRMED: "confirmed", NACKED: "nacked", RETURNED: "returned",
                 CONSUMED: "consumed", FOREIGN: "foreign", REDELIVERED: "redelivered"}
        return {names[k]: v for k, v in self.counters().items()}


class Producer(Worker):
    """Publishes batches as fast as the confirm window, the rate limit and TCP allow."""

    role = "producer"

    def __init__(self, *a):
        super().__init__(*a)
        self.sent = self.confirmed = self.nacked = self.returned = 0
        self.settled = 0                 # confirmed + nacked
        self.low = 0                     # every tag <= low is settled
        self.out_of_order: set[int] = set()
        cap = 1
        while cap < 2 * max(1, self.cfg.confirm):
            cap *= 2
        self.cap = cap                   # ring of publish times indexed by tag % cap
        self.ring = array.array("q", bytes(8 * cap))
        self.waiter: asyncio.Future | None = None
        self.t_last_pub = 0
        self.t_last_confirm = 0

    def counters(self) -> dict:
        return {SENT: self.sent, CONFIRMED: self.confirmed, NACKED: self.nacked, RETURNED: self.returned}

    def wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def on_return(self) -> None:
        self.returned += 1

    def on_confirm(self, now: int, tag: int, multiple: int, nack: bool) -> None:
        """Settle one tag or every tag up to `tag`; sample the latency of every stride-th tag."""
        low, ring, cap, lat = self.low, self.ring, self.cap, self.lat
        oo = self.out_of_order
        if multiple:
            if tag <= low:
                return
            done_before = {t for t in oo if t <= tag} if oo else ()
            if done_before:
                oo.difference_update(done_before)
            k = tag - low - len(done_before)
            step = lat.stride
            vals = lat.values
            for t in range(((low + step) // step) * step, tag + 1, step):
                if t not in done_before:
                    vals.append(now - ring[t % cap])
            d = now - ring[(low + 1) % cap]      # the oldest of them waited longest
            self.low = tag
        else:
            if tag <= low or tag in oo:
                return
            k = 1
            d = now - ring[tag % cap]
            if not tag & lat.mask:
                lat.values.append(d)
            if tag == low + 1:
                low = tag
                while low + 1 in oo:
                    oo.discard(low + 1)
                    low += 1
                self.low = low
            else:
                oo.add(tag)
        if d > lat.max:
            lat.max = d
        if nack:
            self.nacked += k
        else:
            self.confirmed += k
        self.settled += k
        self.t_last_confirm = now
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def run(self) -> dict:
        cfg = self.cfg
        self.conn = conn = await open_conn(self.url, name=f"haremq-perf {self.name()}")
        if cfg.confirm:
            await conn.rpc(pc.Confirm.Select(), pc.Confirm.SelectOk)
        conn.on_confirm = self.on_confirm
        conn.on_return = self.on_return
        conn.on_lost = self.wake
        self.shared.queue.put({"kind": "ready", "role": self.role, "idx": self.idx})
        t0 = await self.wait_start()
        cpu0 = cpu_self()
        tick = asyncio.ensure_future(self.ticker())
        try:
            await self.publish(conn, t0)
            await self.await_confirms(conn)
        finally:
            self.finished = True
            tick.cancel()
        if conn.closed.done():
            self.error = f"{self.name()}: {conn.closed.result()}"
        t_end = mono()
        cpu1 = cpu_self()
        self.publish_counters()
        self.shared.slots[self.base + STATE] = FINISHED
        await conn.close()
        return {**self.result(cpu1 - cpu0, t_end), "t_last_pub": self.t_last_pub,
                "t_last_confirm": self.t_last_confirm}

    async def publish(self, conn: Conn, t0: int) -> None:
        cfg = self.cfg
        loop = asyncio.get_running_loop()
        head, tail = publish_template(cfg.queue, cfg.size, cfg.persistent, cfg.mandatory, conn.frame_max)
        stamped = cfg.size >= STAMP_SIZE
        plain = head + tail
        pack, run_id = STAMP.pack, cfg.run_id
        window, cap, ring = cfg.confirm, self.cap, self.ring
        batch = max(1, min(cfg.batch, (256 * 1024) // max(1, len(plain) + STAMP_SIZE)))   # <= ~256 KiB a write
        if window:
            batch = min(batch, window)
        stop_at = t0 + int(cfg.time_s * 1e9) if cfg.time_s else None
        count, rate = cfg.count or 0, cfg.rate
        ctl = self.shared.ctl
        writable = conn.writable
        while True:
            now = mono()
            if (stop_at is not None and now >= stop_at) or (count and self.sent >= count) \
                    or ctl[STOP] or conn.closed.done():
                return
            if not writable.is_set():       # TCP back pressure (or connection.blocked)
                try:
                    await asyncio.wait_for(writable.wait(), 0.1)
                except asyncio.TimeoutError:
                    pass
                continue
            seq = self.sent
            n = batch
            if window:
                n = min(n, window - (seq - self.settled), self.low + cap - seq)
                if n <= 0:
                    self.waiter = loop.create_future()
                    await self.waiter
                    continue
            if count and count - seq < n:
                n = count - seq
            if rate:
                due = int(rate * (now - t0) / 1e9) + 1 - seq
                if due <= 0:
                    await asyncio.sleep(max(0.0005, (seq + 1) / rate - (now - t0) / 1e9))
                    continue
                n = min(n, due)
            # one batch shares its publish time, so the whole batch is one repeated message
            conn.write((head + pack(now, run_id) + tail if stamped else plain) * n)
            if window:
                a, b = (seq + 1) % cap, (seq + n) % cap
                stamp = array.array("q", [now])
                if a <= b:
                    ring[a:b + 1] = stamp * n
                else:
                    ring[a:] = stamp * (cap - a)
                    ring[:b + 1] = stamp * (b + 1)
            self.sent = seq + n
            self.t_last_pub = now
            await asyncio.sleep(0)

    async def await_confirms(self, conn: Conn) -> None:
        """After the last publish: wait (bounded) for the confirms still out."""
        if not self.cfg.confirm:
            return
        deadline = mono() + int(self.cfg.drain_timeout * 1e9)
        loop = asyncio.get_running_loop()
        while self.sent > self.settled and not conn.closed.done() and mono() < deadline \
                and self.shared.ctl[STOP] < STOP_NOW:
            self.waiter = loop.create_future()
            await self.waiter          # a confirm, a lost connection or the ticker wakes us


class Consumer(Worker):
    """Consumes and acks (every N with multiple=true) until the run's messages are drained."""

    role = "consumer"

    def __init__(self, *a):
        super().__init__(*a)
        self.consumed = self.foreign = self.redelivered = 0
        self.unacked = 0
        self.last_tag = 0
        self.pending_acks: list[bytes] = []
        self.t_last_msg = 0
        self.consumed_in_window: int | None = None
        self.stop_reason = ""
        cfg = self.cfg
        every = max(1, cfg.multi_ack_every)
        if cfg.prefetch:     # acking every N > prefetch would wait forever for the N-th message
            every = min(every, cfg.prefetch)
        self.ack_every = every

    def counters(self) -> dict:
        return {CONSUMED: self.consumed, FOREIGN: self.foreign, REDELIVERED: self.redelivered}

    def on_deliver(self, now: int, tag: int, ts: int, run: int, redelivered: int) -> None:
        if run == self.run_id or not self.own_only:
            self.consumed += 1
            self.t_last_msg = now
            if ts:
                d = now - ts
                if d >= 0:
                    lat = self.lat
                    if d > lat.max:
                        lat.max = d
                    if not self.consumed & lat.mask:
                        lat.values.append(d)
        else:
            self.foreign += 1                  # left in the queue by an earlier run or another client
        if redelivered:
            self.redelivered += 1
        if not self.autoack:
            self.unacked += 1
            self.last_tag = tag
            if self.unacked >= self.ack_every:
                self.pending_acks.append(ack_frame(tag, self.ack_every > 1))
                self.unacked = 0

    def flush_acks(self) -> None:
        """Once per read: all acks of that read in one write (one syscall, same frames)."""
        if self.pending_acks:
            self.conn.write(b"".join(self.pending_acks))
            self.pending_acks.clear()

    async def run(self) -> dict:
        cfg = self.cfg
        # with no producers, or no stamp to tell runs apart, every delivery counts as consumed
        self.own_only = cfg.producers > 0 and cfg.size >= STAMP_SIZE
        self.run_id, self.autoack = cfg.run_id, cfg.autoack
        self.conn = conn = await open_conn(self.url, name=f"haremq-perf {self.name()}")
        conn.on_deliver = self.on_deliver
        conn.on_read_end = self.flush_acks
        if not cfg.autoack and cfg.prefetch:
            await conn.rpc(pc.Basic.Qos(prefetch_count=cfg.prefetch), pc.Basic.QosOk)
        await conn.rpc(pc.Basic.Consume(queue=cfg.queue, consumer_tag=f"haremq-perf-c{self.idx}",
                                        no_ack=cfg.autoack), pc.Basic.ConsumeOk)
        self.shared.queue.put({"kind": "ready", "role": self.role, "idx": self.idx})
        t0 = await self.wait_start()
        cpu0 = cpu_self()
        tick = asyncio.ensure_future(self.ticker())
        try:
            await self.consume(conn, t0)
        finally:
            self.finished = True
            tick.cancel()
        if not cfg.autoack and self.unacked and not conn.closed.done():
            self.pending_acks.append(ack_frame(self.last_tag, True))
            self.flush_acks()
        t_end = mono()
        cpu1 = cpu_self()
        await conn.close()
        self.publish_counters()
        self.shared.slots[self.base + STATE] = FINISHED
        if self.consumed_in_window is None:
            self.consumed_in_window = self.consumed
        return {**self.result(cpu1 - cpu0, t_end), "t_last_msg": self.t_last_msg,
                "consumed_in_window": self.consumed_in_window, "stop_reason": self.stop_reason}

    async def consume(self, conn: Conn, t0: int) -> None:
        """Deliveries arrive through callbacks; this loop only decides when to stop."""
        cfg, ctl, slots = self.cfg, self.shared.ctl, self.shared.slots
        window_end = t0 + int(cfg.time_s * 1e9) if cfg.time_s else None
        consumer_rows = [self.shared.row(cfg.producers + i) for i in range(cfg.consumers)]
        idle_ns, drain_ns = int(cfg.drain_idle * 1e9), int(cfg.drain_timeout * 1e9)
        target_seen_at = None
        while True:
            await asyncio.sleep(0.02)
            now = mono()
            if window_end is not None and self.consumed_in_window is None and now >= window_end:
                self.consumed_in_window = self.consumed
            if conn.closed.done() or conn.cancelled:
                self.error = f"{self.name()}: {conn.close_reason or conn.closed.result()}"
                self.stop_reason = "connection lost"
                return
            if ctl[STOP] >= STOP_NOW:
                self.stop_reason = "stopped"
                return
            target = ctl[TARGET]
            if target < 0:
                continue
            if target_seen_at is None:
                target_seen_at = now
            slots[self.base + CONSUMED] = self.consumed
            if sum(slots[r + CONSUMED] for r in consumer_rows) >= target:
                self.stop_reason = "all consumed"
                return
            if now - max(self.t_last_msg, target_seen_at) > idle_ns:
                self.stop_reason = f"nothing delivered for {cfg.drain_idle:g}s"
                return
            if now - target_seen_at > drain_ns:
                self.stop_reason = f"drain timeout {cfg.drain_timeout:g}s"
                return


def worker_main(role: str, idx: int, worker_no: int, cfg: RunConfig, shared: Shared) -> None:
    """Entry point of a forked worker: run, then post the result (or the error) to the parent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # Ctrl-C is the parent's to handle
    cls = Producer if role == "producer" else Consumer
    w = cls(cfg, idx, worker_no, shared)
    try:
        res = _run(w.run())
    except AMQPError as exc:
        res = {"kind": "result", "role": role, "idx": idx, "error": f"{w.name()}: {exc}", "fatal": True}
    except Exception as exc:  # noqa: BLE001 - reported by the parent in one line
        res = {"kind": "result", "role": role, "idx": idx, "error": f"{w.name()}: {exc!r}", "fatal": True}
    shared.slots[w.base + STATE] = FINISHED
    shared.queue.put(res)
