"""Latency samples, percentiles and CPU accounting for the load tool."""
from __future__ import annotations

import array
import os
import resource

CLK_TCK = os.sysconf("SC_CLK_TCK")


class Samples:
    """Latencies in ns, every `stride`-th message, memory bounded.

    Keeping every sample makes percentiles exact; past `cap` samples the
    buffer keeps every other one and the stride doubles, so a long run keeps
    an even sample of the whole run in bounded memory. The maximum is kept
    exactly on the side.
    """

    def __init__(self, cap: int = 1 << 21):
        self.cap = cap
        self.values = array.array("q")
        self.stride = 1
        self.mask = 0          # record when seq & mask == 0 (stride is a power of two)
        self.max = 0
        self.mark = 0          # start of the current progress interval

    def thin(self) -> None:
        """Called off the hot path (the 100 ms ticker): halve the buffer if it is full."""
        if len(self.values) > self.cap:
            self.values = self.values[::2]
            self.stride *= 2
            self.mask = self.stride - 1
            self.mark = len(self.values)

    def interval(self) -> tuple[int, int, int] | None:
        """p50/p95/p99 in µs of the samples since the last call (for the progress line)."""
        recent = self.values[self.mark:]
        if len(recent) > 20_000:            # a progress line needs no more; keep the ticker cheap
            recent = recent[::len(recent) // 10_000]
        recent = sorted(recent)
        self.mark = len(self.values)
        if not recent:
            return None
        return tuple(pick(recent, q) // 1000 for q in (50, 95, 99))


def pick(sorted_vals, q: float):
    """Nearest-rank percentile of an already sorted sequence."""
    k = min(len(sorted_vals) - 1, max(0, int(round(q / 100.0 * (len(sorted_vals) - 1)))))
    return sorted_vals[k]


def summary_ms(values_ns: array.array, exact_max_ns: int) -> dict | None:
    """{p50, p95, p99, max, mean, samples} in ms, or None when nothing was measured."""
    if not values_ns:
        return None
    s = sorted(values_ns)
    out = {f"p{q}": round(pick(s, q) / 1e6, 3) for q in (50, 95, 99)}
    out["max"] = round(max(exact_max_ns, s[-1]) / 1e6, 3)
    out["mean"] = round(sum(s) / len(s) / 1e6, 3)
    out["samples"] = len(s)
    return out


def cpu_self() -> float:
    """CPU seconds (user + system) this process has used."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def proc_cpu(pid: int) -> float | None:
    """CPU seconds of another process (and its reaped children are not counted), from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
        return (int(parts[11]) + int(parts[12])) / CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, from /proc/stat."""
    try:
        with open("/proc/stat") as f:
            vals = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0, 0.0
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    total = sum(vals[:8])  # guest time is already inside user
    return (total - idle) / CLK_TCK, total / CLK_TCK
