"""Numbers for the management API, /metrics and the web view, read when asked.

The data path only increments plain integer attributes (`published_total`,
`delivered_total`, `acked_total` on queues and channels, `confirmed` on a
channel's confirm tracker; the broker keeps those of closed channels). This
module reads them. A `Sampler` reads them every few seconds (RabbitMQ's
`collect_statistics_interval` is 5 s) to turn them into rates, keeps a few
minutes of the node's history for the web view, and notes what changed in the
cluster (members going down and up, queue masters moving) as a timeline,
looking every second.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING

from ..broker.ports import QueuePort
from ..tasks import TaskGroup

if TYPE_CHECKING:
    from .cluster_view import ClusterView

INTERVAL = 5.0          # seconds between samples
WATCH_INTERVAL = 1.0    # seconds between looks at the cluster's members and queue masters
HISTORY = 120           # samples kept: ten minutes
SAMPLE_CHUNK = 2_000    # queues read between two turns of the event loop: 100,000 queues never stall it
EVENTS = 200            # timeline entries kept
# what a sample keeps per vhost, from the counters of the vhost's queues on this node
VHOST_FIELDS = ("publish", "deliver_get", "ack", "messages_ready", "messages_unacknowledged")


def channels(broker):
    for session in list(broker.sessions):
        for channel in list(session.channels.values()):
            yield session, channel


def node_totals(broker) -> dict:
    """This node's message counters since it started: what its channels published, delivered,
    had acked and confirmed (closed channels included)."""
    published, delivered, acked, confirmed = broker.retired_totals
    for _session, channel in channels(broker):
        published += channel.published_total
        delivered += channel.delivered_total
        acked += channel.acked_total
        if channel.confirms is not None:
            confirmed += channel.confirms.confirmed
    return {"publish": published, "deliver_get": delivered, "ack": acked, "confirm": confirmed}


def local_queues(broker):
    """(vhost name, queue) for every queue whose messages live on this node."""
    for vname, vhost in list(broker.vhosts.items()):
        for queue in list(vhost.queues.values()):
            if not queue.remote:
                yield vname, queue


def queue_counters(queue: QueuePort) -> tuple[int, int, int]:
    return queue.published_total, queue.delivered_total, queue.acked_total


def rate(now_value, then_value, seconds) -> float:
    if seconds <= 0 or then_value is None:
        return 0.0
    return round(max(0, now_value - then_value) / seconds, 1)


class Sampler:
    """Rates and history from counters sampled every INTERVAL seconds, and the timeline."""

    def __init__(self, broker, view: ClusterView):
        self.broker = broker
        self.view = view
        self.history: deque = deque(maxlen=HISTORY)     # node samples: dicts with "t"
        self.events: deque = deque(maxlen=EVENTS)
        self._queues: dict[tuple[str, str], tuple[float, tuple[int, int, int]]] = {}
        self._queue_rates: dict[tuple[str, str], tuple[float, float, float]] = {}
        self._node_rates = {"publish": 0.0, "deliver_get": 0.0, "ack": 0.0, "confirm": 0.0}
        self._members: dict[str, str] = {}
        self._masters: dict[tuple[str, str], tuple[str, int]] = {}
        self.tasks = TaskGroup("statistics sampler")   # the sampling loop

    def start(self) -> None:
        self.tasks.spawn(self._run())

    async def stop(self) -> None:
        await self.tasks.close()

    async def _run(self) -> None:
        await self.sample()
        ticks = 0
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            ticks += 1
            if ticks * WATCH_INTERVAL >= INTERVAL:
                ticks = 0
                await self.sample()
            else:
                self.watch()

    async def sample(self) -> None:
        """One sample of every counter, read SAMPLE_CHUNK queues at a time: a node with many
        queues goes on serving between the chunks (a node restarted with 100,000 queues takes
        its first sample while its clients come back)."""
        now = time.time()
        totals = node_totals(self.broker)
        ready = unacked = 0
        seen = {}
        by_vhost: dict[str, list[int]] = {}
        for n, (vname, queue) in enumerate(local_queues(self.broker), 1):
            if n % SAMPLE_CHUNK == 0:
                await asyncio.sleep(0)
            key = (vname, queue.name)
            counters = queue_counters(queue)
            before = self._queues.get(key)
            if before is not None:
                dt = now - before[0]
                published, delivered, acked = (rate(a, b, dt) for a, b in zip(counters, before[1]))
                self._queue_rates[key] = (published, delivered, acked)
            seen[key] = (now, counters)
            ready += queue.message_count
            unacked += queue.unacked
            sums = by_vhost.setdefault(vname, [0, 0, 0, 0, 0])
            for i, value in enumerate((*counters, queue.message_count, queue.unacked)):
                sums[i] += value
        self._queues = seen
        self._queue_rates = {k: v for k, v in self._queue_rates.items() if k in seen}
        if self.history:
            last = self.history[-1]
            dt = now - last["t"]
            self._node_rates = {k: rate(totals[k], last[k], dt) for k in self._node_rates}
        self.history.append({"t": now, **totals, "messages_ready": ready, "messages_unacknowledged": unacked,
                             "vhosts": {v: dict(zip(VHOST_FIELDS, sums)) for v, sums in by_vhost.items()}})
        self._watch_cluster(now)

    def queue_rates(self, vhost: str, name: str) -> tuple[float, float, float]:
        return self._queue_rates.get((vhost, name), (0.0, 0.0, 0.0))

    @property
    def node_rates(self) -> dict:
        return dict(self._node_rates)

    def visible_history(self, sees_all: bool, can_see) -> list[dict]:
        """The samples as one user may see them: whole for administrators and monitoring users;
        for others only the vhosts `can_see(vhost)` allows, the totals summed from their queues'
        counters (a channel's counts are not kept by vhost, so `confirm` is left out)."""
        if sees_all:
            return [dict(s) for s in self.history]
        out = []
        for sample in self.history:
            vhosts = {v: dict(f) for v, f in sample.get("vhosts", {}).items() if can_see(v)}
            row = {"t": sample["t"], **{f: sum(v[f] for v in vhosts.values()) for f in VHOST_FIELDS},
                   "vhosts": vhosts}
            out.append(row)
        return out

    def visible_events(self, sees_all: bool, can_see) -> list[dict]:
        """Timeline entries about a vhost's queue for those who may see that vhost; entries about
        the cluster's members for administrators and monitoring users (as /api/nodes)."""
        if sees_all:
            return list(self.events)
        return [e for e in self.events if e.get("vhost") is not None and can_see(e["vhost"])]

    # ---- the timeline ------------------------------------------------------------------------
    def note(self, kind: str, text: str, **fields) -> None:
        self.events.append({"time": round(time.time(), 3), "kind": kind, "text": text, **fields})

    def _watch_cluster(self, now: float) -> None:
        members = {member.name: member.state for member in self.view.members()}
        for name, state in members.items():
            before = self._members.get(name)
            if before is not None and before != state:
                self.note("member", f"{name} is {state}", node=name, state=state)
        self._members = members
        masters = {}
        for placement in self.view.placements():
            key = placement.key
            masters[key] = (placement.home, placement.epoch)
            was = self._masters.get(key)
            if was is not None and was != masters[key]:
                self.note("failover", f"queue '{key[1]}' in vhost '{key[0]}': master {was[0]} -> {placement.home} "
                          f"(epoch {placement.epoch})", vhost=key[0], queue=key[1], old=was[0], new=placement.home,
                          epoch=placement.epoch)
        self._masters = masters

    def watch(self) -> None:
        """Check the cluster for changes now (the web view polls faster than INTERVAL)."""
        self._watch_cluster(time.time())
