"""Resource alarms (ERR-4): the node's memory use and the free disk space under its data dir.

    haremq node --vm-memory-high-watermark 0.4 --disk-free-limit 50MB

As in RabbitMQ: the memory watermark is a fraction of the machine's RAM
(`0.4`, the default) or an absolute size (`1GB`, `536870912`); the node's
resident memory above it raises the `memory` alarm. Free space on the data
dir's file system below `--disk-free-limit` (default 50MB) raises the
`disk_free` alarm (the store's own write-failure alarm is `disk`; one does
not clear the other). Both are checked every second. While any alarm is on,
publishing connections get connection.blocked and are not read; consumers
keep going (Broker.set_alarm, Session.alarm_changed).

Sizes take RabbitMQ's units: k/kiB/K/KiB, M/MiB, G/GiB (powers of 1024) and
kB/KB, MB, GB (powers of 1000).
"""
from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import structlog

from .tasks import TaskGroup

DEFAULT_MEMORY_WATERMARK = "0.4"
DEFAULT_DISK_FREE_LIMIT = "50MB"
CHECK_INTERVAL = 1.0

_UNITS = {"": 1, "k": 1024, "kib": 1024, "kb": 1000, "m": 1024 ** 2, "mib": 1024 ** 2, "mb": 1000 ** 2,
          "g": 1024 ** 3, "gib": 1024 ** 3, "gb": 1000 ** 3, "t": 1024 ** 4, "tib": 1024 ** 4, "tb": 1000 ** 4}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """'50MB' -> 50000000, '1GiB' -> 1073741824, '4096' -> 4096."""
    if isinstance(text, int):
        return text
    found = _SIZE.match(str(text))
    if found is None or found.group(2).lower() not in _UNITS:
        raise ValueError(f"'{text}' is not a size (bytes, or a number with kB, MB, GB, KiB, MiB, GiB)")
    return int(float(found.group(1)) * _UNITS[found.group(2).lower()])


def memory_limit(watermark: str | float, total: int | None = None) -> int:
    """The memory watermark in bytes: a fraction of RAM (a number up to 1) or an absolute size
    (a number above 1, or with a unit)."""
    text = str(watermark).strip()
    try:
        fraction = float(text)
    except ValueError:
        return parse_size(text)
    if fraction < 0:
        raise ValueError(f"memory watermark {text} is negative")
    if fraction <= 1.0:
        return int(fraction * (total if total is not None else total_memory()))
    return int(fraction)


def total_memory() -> int:
    """RAM available to this process: the machine's, or a cgroup's limit if lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            value = Path(path).read_text().strip()
        except OSError:
            continue
        if value.isdigit() and 0 < int(value) < total:
            total = int(value)
    return total


def resident_memory() -> int:
    """This process's resident set size in bytes."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def disk_free(path: Path | str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class ResourceMonitor:
    """Checks memory and free disk every `interval` seconds and sets the broker's alarms."""

    def __init__(self, broker, data_dir: Path | str, memory_watermark: str = DEFAULT_MEMORY_WATERMARK,
                 disk_free_limit: str = DEFAULT_DISK_FREE_LIMIT, interval: float = CHECK_INTERVAL):
        self.broker = broker
        self.data_dir = Path(data_dir)
        self.interval = interval
        self.log = structlog.get_logger("haremq.alarms").bind(node=getattr(broker, "node_name", ""))
        self.memory_limit = 0
        self.disk_free_limit = 0
        self.set_memory_watermark(memory_watermark)
        self.set_disk_free_limit(disk_free_limit)
        self.memory_used = 0
        self.disk_available = 0
        self.tasks = TaskGroup("resource monitor")   # the periodic check

    def set_memory_watermark(self, watermark: str | float) -> int:
        self.memory_limit = memory_limit(watermark)
        return self.memory_limit

    def set_disk_free_limit(self, limit: str | int) -> int:
        self.disk_free_limit = parse_size(limit)
        return self.disk_free_limit

    def check(self) -> None:
        """One look at memory and disk; raises or clears the alarms."""
        self.memory_used = resident_memory()
        self._set("memory", self.memory_used > self.memory_limit,
                  used=self.memory_used, limit=self.memory_limit)
        try:
            self.disk_available = disk_free(self.data_dir)
        except OSError as exc:
            self.log.warning("cannot read free disk space", error=str(exc))
            return
        self._set("disk_free", self.disk_available < self.disk_free_limit,
                  free=self.disk_available, limit=self.disk_free_limit)

    def _set(self, name: str, active: bool, **figures) -> None:
        if active == (name in self.broker.alarms):
            return
        if active:
            self.log.warning(f"{name} alarm set", **figures)
        else:
            self.log.info(f"{name} alarm cleared", **figures)
        self.broker.set_alarm(name, active)

    def start(self) -> None:
        self.check()
        self.tasks.spawn(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.check()
            except Exception:  # noqa: BLE001 - a failed look must not stop the checks
                self.log.exception("resource check failed")

    async def stop(self) -> None:
        await self.tasks.close()

    def status(self) -> dict:
        return {"memory_used": self.memory_used, "memory_limit": self.memory_limit,
                "disk_free": self.disk_available, "disk_free_limit": self.disk_free_limit,
                "alarms": sorted(self.broker.alarms)}
