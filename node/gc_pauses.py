"""The garbage collector's full passes, timed and logged when long.

CPython's full collection walks every container object the process holds; it
runs on whichever thread allocates and stops the event loop until it ends. A
node with 100,000 queues holds over a million of them, and one pass then takes
about a second: long enough for a Raft follower to call an election or for the
other members to miss this node's answers. The node cannot avoid the passes,
but it says when one was long, so a stall in the logs has a named cause.
"""
from __future__ import annotations

import gc
import sys
import time

import structlog

LONG_PAUSE = 0.2        # seconds: a full pass longer than this is logged


class GCPauses:
    """Watches full (generation 2) collections while installed: how many, and the longest."""

    def __init__(self, node: str, long_pause: float = LONG_PAUSE):
        self.long_pause = long_pause
        self.log = structlog.get_logger("haremq.gc").bind(node=node)
        self.full_passes = 0
        self.longest = 0.0
        self._started = 0.0

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def remove(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
            return
        seconds = time.perf_counter() - self._started
        self.full_passes += 1
        self.longest = max(self.longest, seconds)
        if seconds >= self.long_pause:
            self.log.warning("a full garbage collection stopped the node", seconds=round(seconds, 3),
                             collected=info.get("collected", 0), allocated_blocks=sys.getallocatedblocks())
