"""The leader's watch over members: a member the majority agrees is down gets a node.down entry.

RabbitMQ deletes the exclusive queues of connections that lived on a node that went down,
removes their consumers and requeues what they had not acked (rabbit_amqqueue:on_node_down,
and each queue's handling of a channel going down). HareMQ does it through the metadata log,
so every member does it in the same order relative to every declare and delete:

- the metadata leader, while it sees a majority, proposes `NodeDown(node, since)` once for a
  member that a majority sees down (`Membership.agreed_down`, the test a failover uses), where
  `since` is the log index of the member's last return (node.restarted or node.resumed) as the
  leader has applied it;
- every member applies it (cluster/metadata.py `_node_down`): void if the member returned since,
  else its connections' exclusive queues are deleted, and the queue links they opened to queues
  mastered elsewhere end (consumers removed, unacked deliveries requeued as redelivered);
- a member that paused (pause-minority) proposes node.resumed before it serves again, so a
  decision taken on an older view of it never reaches the clients it serves after its return.

One entry per death: the log records which return each node.down followed (`MetadataMachine.down`),
so a new leader does not propose it again. A member that never announced itself (not started
yet) has no clients and gets none.
"""
from __future__ import annotations

import asyncio
import time

import structlog

from haremq.node.broker.commands import NodeDown
from haremq.node.tasks import TaskGroup

from haremq.cluster.membership.members import WatchRounds

TICK = 0.05          # a node.down follows the majority's agreement within a round


class DownWatch:
    def __init__(self, node):
        self.cluster = node                  # cluster.node.ClusterNode
        self.log = structlog.get_logger("haremq.cluster").bind(node=node.name)
        self.tasks = TaskGroup(f"down watch {node.name}")     # the ticker
        self._proposing: dict[str, int] = {}     # member -> the return its node.down in flight follows
        self._asked: dict[str, float] = {}       # member -> when the others' views of it were asked for
        self._rounds = WatchRounds()

    async def start(self) -> None:
        self.tasks.spawn(self._ticker())

    async def stop(self) -> None:
        await self.tasks.close()

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            try:
                self._tick()
            except Exception:  # noqa: BLE001 - one bad round must not stop the watch
                self.log.exception("down watch round failed")

    def _tick(self) -> None:
        now = time.monotonic()
        node = self.cluster
        metadata = node.metadata
        if not self._rounds.fresh(now, node.config.failure_timeout) or metadata.replaying:
            return
        membership = node.membership
        if node.raft.role != "leader" or not membership.has_majority:
            self._proposing.clear()
            return
        for name in list(membership.peers):
            since = metadata.returned.get(name)
            if since is None or metadata.down.get(name) == since or self._proposing.get(name) == since:
                continue
            if not membership.agreed_down(name):
                if not membership.is_up(name) and now - self._asked.get(name, 0.0) >= TICK * 4:
                    self._asked[name] = now
                    membership.ask_views(name)
                continue
            self._proposing[name] = since
            self.log.warning("member down as a majority sees it: its connections are gone", member=name)

            def done(result, err, name=name, since=since):
                if self._proposing.get(name) == since and (err is not None or not (result or {}).get("down")):
                    self._proposing.pop(name, None)       # tried again on a later round if still due
            node.submit(NodeDown(name, since), done, forward_if_deposed=False)
