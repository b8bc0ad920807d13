"""Mirrored queues on one node: the log's record of each queue, and what this node does about it.

Every node keeps an `HAState` per queue, changed only by metadata entries
(declare, policy change, promote, mirror synced/dropped, node restarted), so
all nodes agree on each queue's master, epoch and synchronised mirrors. From
that record a node knows its part: master (a `Replicator` on its `Queue`),
mirror (a `MirrorQueue` fed by the master's stream) or neither.

Failover (MIR-4): the metadata leader watches the masters. When a master's
node is down, it proposes "promote" with epoch + 1 for the oldest synchronised
mirror that is up (or, with ha-promote-on-failure=always, any mirror). The
queue stays down rather than losing data when there is none. The entry moves
the queue everywhere at once: the new master takes its mirror's copy over as its
queue, what was delivered and not acked coming back redelivered; other nodes re-link
their publishers and consumers to it; a deposed master that comes back finds
itself fenced by the epoch and rejoins as a mirror.
"""
from __future__ import annotations

import asyncio
import time

import structlog

from haremq.node.broker.commands import Command, QueuePromote
from haremq.node.protocol.replies import AMQPError, ReplyCode
from haremq.node.broker.policy import winning
from haremq.node.broker.queue import is_quorum
from haremq.node.broker.queue_arguments import int_arg
from haremq.node.tasks import TaskGroup

from haremq.cluster.membership.members import WatchRounds
from haremq.cluster.mirroring.election import elect
from haremq.cluster.mirroring.mirror import MirrorQueue
from haremq.cluster.mirroring.mirrored_queue import mirror_queue, unmirror_queue
from haremq.cluster.mirroring.policy import QUORUM_DEFAULTS, HAState, quorum_group
from haremq.cluster.mirroring.replicator import Replicator

TICK = 0.02         # the leader's watch: a promotion follows a master's death within a round
RESENT_FOR = 60.0        # seconds: publishers' nodes send theirs again within a failover
STREAM_CATCH_UP = 2.0     # how long a mirror stream waits for this node's log to catch up
ELECTION_RETRY = 0.2      # seconds before a quorum queue's election that found no majority is held again


class Mirroring:
    def __init__(self, node):
        self.cluster = node                  # cluster.node.ClusterNode
        self.node = node.name
        self.broker = node.broker
        self.log = structlog.get_logger("haremq.mirroring").bind(node=node.name)
        self.states: dict[tuple[str, str], HAState] = {}
        # the states that have mirrors (entries may be stale; checked against `states`): the
        # leader's watch looks only at these. A round over every state, 50 a second, took a
        # fifth of the leader's CPU at 100,000 queues.
        self.mirrored: dict[tuple[str, str], HAState] = {}
        self.replicators: dict[tuple[str, str], Replicator] = {}
        self.mirrors: dict[tuple[str, str], MirrorQueue] = {}
        self.stopping: set[str] = set()      # nodes that said they are shutting down
        self.incarnations: dict[str, str] = {}   # member -> its latest node.restarted's incarnation
        self._promoting: dict[tuple[str, str], int] = {}
        self._leaderless: set[tuple[str, str]] = set()   # quorum queues whose election found no majority
        self._adopted: dict[tuple[str, str], tuple[set, float]] = {}   # publish ids a promotion brought
        self._removed_ids: set = set()      # those the promoted mirror saw removed lately
        self._recent_ids: set = set()       # those of its newest messages
        # a promotion here: the mirrors that were in sync with the old master, and the newest key
        # this node brought; their copies are reconciled with this one, not copied again
        self.reconcile_offers: dict[tuple[str, str], tuple[set, int]] = {}
        self.tasks = TaskGroup(f"mirroring {node.name}")   # the ticker, each mirror link's stream
        self._rounds = WatchRounds()

    # ---- what components ask of the node ----------------------------------------------------
    @property
    def members(self) -> list[str]:
        """The members placement reads: the log's (never this node's own peer list, which a node
        that joined later or restarted with other --peer flags may hold otherwise)."""
        logged = self.cluster.metadata.placement_members
        if logged is not None:
            return logged
        return sorted([self.node, *self.cluster.membership.peers])

    def peer(self, name: str):
        return self.cluster.membership.peers.get(name)

    def is_up(self, name: str) -> bool:
        return self.cluster.membership.is_up(name)

    def call_metadata(self):
        return self.cluster.membership.metadata()

    def probe(self, name: str) -> None:
        self.cluster.membership.probe(name)

    def submit(self, command: Command, done) -> None:
        """Propose a metadata entry; done(ok) when it is applied here or has failed."""
        self.cluster.submit(command, lambda _result, err: done(err is None))

    async def start(self) -> None:
        self.tasks.spawn(self._ticker())

    async def stop(self) -> None:
        for replicator in self.replicators.values():
            replicator.close(False)
        await self.tasks.close()

    # ---- the log's record ------------------------------------------------------------------
    def _definition(self, vhost_name: str, queue_name: str, quorum: bool = False) -> dict:
        if quorum:
            return dict(QUORUM_DEFAULTS)
        vhost = self.broker.vhosts.get(vhost_name)
        policy = winning(vhost.policies.values(), "queue", queue_name) if vhost is not None else None
        return {k: v for k, v in policy.definition.items() if k.startswith("ha-")} if policy is not None else {}

    def declared(self, queue, home: str, store_id: int) -> None:
        """queue.declare applied (a new queue; exclusive queues are never mirrored)."""
        if queue.exclusive_owner is not None:
            return
        key = (queue.vhost, queue.name)
        state = HAState(queue.vhost, queue.name, home, durable=queue.durable, store_id=store_id)
        if is_quorum(queue.arguments):
            state.group = quorum_group(queue.arguments, home, self.members)
        self.states[key] = state
        self._place(state)

    def deleted(self, vhost: str, name: str) -> None:
        key = (vhost, name)
        self.states.pop(key, None)
        self.mirrored.pop(key, None)
        replicator = self.replicators.pop(key, None)
        if replicator is not None:
            replicator.close(True)       # RabbitMQ confirms publishes to a queue deleted meanwhile
        mirror = self.mirrors.pop(key, None)
        if mirror is not None:
            mirror.close()

    def policies_changed(self) -> None:
        for state in list(self.states.values()):
            self._place(state)

    def member_forgotten(self, node: str) -> None:
        """A member left for good: mirrors are placed on the members left. Queues it mastered
        keep their mirrors until the leader promotes one (it is down for good)."""
        self.stopping.discard(node)
        for state in list(self.states.values()):
            if state.home != node:
                self._place(state)

    def member_changed(self, vhost: str, name: str, node: str, add: bool) -> bool:
        """queue.member applied: a quorum-declared queue's group gains or loses `node`. Checked
        again in log order (the proposer checked against its own view); False if nothing changed."""
        state = self.states.get((vhost, name))
        if state is None or state.group is None:
            raise AMQPError(ReplyCode.NOT_FOUND, f"no quorum queue '{name}' in vhost '{vhost}'")
        if add:
            if node in state.group or node not in self.members:
                return False
            state.group.append(node)
        else:
            if node not in state.group:
                return False
            if node == state.home:
                raise AMQPError(ReplyCode.PRECONDITION_FAILED,
                                f"{node} is the leader of quorum queue '{name}' in vhost '{vhost}': "
                                "it cannot be removed while it leads")
            state.group.remove(node)
            if node in state.synced:
                state.synced.remove(node)
        self.log.info("quorum queue members changed", vhost=vhost, queue=name, members=state.group)
        self._place(state)
        return True

    def _place(self, state: HAState) -> None:
        """Compute the mirrors from the policy and take this node's part."""
        state.definition = self._definition(state.vhost, state.name, state.group is not None)
        state.mirrors = state.placement(self.members)
        state.synced = [n for n in state.synced if n in state.mirrors]
        self._take_part(state)

    @property
    def replaying(self) -> bool:
        """The node replays the metadata log after a start (cluster/metadata.py): the states are
        rebuilt but no replicator, mirror stream or failover acts on them until `replayed()`."""
        return self.cluster.metadata.replaying

    def replayed(self) -> None:
        """The log is replayed: take this node's part in every queue, as the log's end says."""
        for state in list(self.states.values()):
            self._take_part(state)

    def _take_part(self, state: HAState) -> None:
        key = state.key
        if state.mirrors:
            self.mirrored[key] = state
        else:
            self.mirrored.pop(key, None)
        queue = self._queue(state)
        remote = queue if queue is not None and queue.remote else None
        if remote is not None:
            remote.mirrored = bool(state.mirrors)
            remote.epoch = state.epoch
            remote.can_fail_over = lambda: state.successor(self.is_up, shutdown=state.home in self.stopping) is not None
        if self.replaying:
            return
        if self.node not in state.mirrors:
            mirror = self.mirrors.pop(key, None)
            if mirror is not None:
                mirror.close()
        replicator = self.replicators.get(key)
        if state.home == self.node and queue is not None and not queue.remote and state.mirrors:
            if replicator is None or replicator.closed:
                replicator = self.replicators[key] = Replicator(self, state)
                mirror_queue(queue, replicator)
            else:
                replicator.set_mirrors(state.mirrors)
        elif replicator is not None:
            self.replicators.pop(key)
            if queue is not None:
                unmirror_queue(queue, replicator)
            replicator.close(state.home == self.node)

    def _queue(self, state: HAState):
        vhost = self.broker.vhosts.get(state.vhost)
        return vhost.queues.get(state.name) if vhost is not None else None

    def mirror_for(self, state: HAState) -> MirrorQueue:
        mirror = self.mirrors.get(state.key)
        if mirror is None:
            store = self.broker.store if state.durable else None
            handle = self._queue(state)       # the copy has the queue's shape: a priority queue's levels
            max_priority = int_arg(handle.arguments, "x-max-priority") if handle is not None else None
            mirror = self.mirrors[state.key] = MirrorQueue(state.vhost, state.name, store,
                                                            state.store_id if store is not None else 0,
                                                            persist_all=state.group is not None,
                                                            max_priority=max_priority)
        return mirror

    def check_stream(self, vhost: str, name: str, epoch: int, master: str) -> str:
        """Why a mirror stream must be refused (MIR-5 fencing), or '' to take it."""
        if self.replaying:
            return "this node is replaying the metadata log"
        state = self.states.get((vhost, name))
        if state is None:
            return f"no queue '{name}' in vhost '{vhost}' here"
        if epoch != state.epoch or master != state.home:
            return f"stale epoch: the log says master {state.home} epoch {state.epoch}"
        if self.node not in state.mirrors:
            return f"{self.node} is not a mirror of queue '{name}'"
        return ""

    async def admit_stream(self, vhost: str, name: str, epoch: int, master: str,
                           timeout: float = STREAM_CATCH_UP) -> str:
        """check_stream, but a refusal that only says this node is behind on the metadata log
        (a restarted node the master reached before the leader: no such queue here yet, an older
        epoch, not yet a mirror) waits briefly for the log to catch up, so the mirror syncs at
        once instead of the master retrying. A stale master (older epoch) is refused at once."""
        deadline = time.monotonic() + timeout
        while True:
            refusal = self.check_stream(vhost, name, epoch, master)
            state = self.states.get((vhost, name))
            behind = (self.replaying or state is None or state.epoch < epoch
                      or (state.epoch == epoch and state.home == master))
            if not refusal or not behind or time.monotonic() >= deadline:
                if refusal and behind:
                    self.log.info("mirror stream refused: the metadata log did not catch up", vhost=vhost,
                                  queue=name, master=master, epoch=epoch, reason=refusal)
                return refusal
            await asyncio.sleep(0.01)

    def check_link(self, vhost: str, name: str, epoch: int) -> str:
        """A queue link from another node with an older (or newer) view of the master."""
        if self.replaying:
            return f"queue '{name}' in vhost '{vhost}': this node is replaying the metadata log"
        state = self.states.get((vhost, name))
        if state is None or not epoch or (state.epoch == epoch and state.home == self.node):
            return ""
        return f"queue '{name}' in vhost '{vhost}' has moved (epoch {state.epoch}, master {state.home})"

    async def caught_up(self, vhost: str, name: str, epoch: int, timeout: float = 3.0) -> None:
        """Wait (a little) until this node has applied the failover a peer already knows of."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.states.get((vhost, name))
            if not self.replaying and (state is None or not epoch or state.epoch >= epoch):
                return
            await asyncio.sleep(0.01)

    # ---- entries ---------------------------------------------------------------------------------
    def promoted(self, c: dict, become_master, become_remote) -> bool:
        """queue.promote: the master moves to c["home"] with epoch c["epoch"]. False if stale."""
        state = self.states.get((c["vhost"], c["name"]))
        if state is None or state.epoch != c["from_epoch"] or c["home"] == state.home:
            return False
        # checked again in log order: the leader chose from its view, and an entry committed
        # since (a mirror dropped from the in-sync set) may have made its choice unsafe
        if not self._may_promote(state, c):
            return False
        old_home = state.home
        replicas = state.group if state.group is not None and c.get("incarnation") else state.synced
        survivors = {node for node in replicas if node not in (c["home"], old_home)}
        state.epoch = c["epoch"]
        state.home = c["home"]
        state.synced = []
        state.mirrors = state.placement(self.members)
        self._promoting.pop(state.key, None)
        self.log.warning("queue master moved", vhost=state.vhost, queue=state.name, old=old_home,
                         new=state.home, epoch=state.epoch)
        queue = self._queue(state)
        if queue is None:
            return True
        replicator = self.replicators.pop(state.key, None)
        if replicator is not None:
            unmirror_queue(queue, replicator)
            replicator.close(False)            # a deposed master confirms nothing more
        if state.home == self.node:
            mirror = self.mirrors.pop(state.key, None)
            self._removed_ids = set(getattr(mirror, "removed_ids", ()))
            self._recent_ids = set(mirror.recent_ids.values()) if mirror is not None else set()
            if mirror is not None and mirror.whole and survivors:
                self.reconcile_offers[state.key] = (survivors, mirror.last_key)
            become_master(state, queue, mirror)
            self._removed_ids = self._recent_ids = set()
        elif not queue.remote:
            become_remote(state, queue)
        else:
            queue.rehome(state.home, state.epoch)
        self._take_part(state)
        return True

    def _may_promote(self, state: HAState, c: dict) -> bool:
        """Checked again in log order: the leader chose from its view, and an entry committed
        since (a mirror dropped from the in-sync set, a member restarted) may have made its
        choice unsafe. A quorum queue's member was elected as holding the most (it counts
        whatever the in-sync set says); a classic queue's mirror must be synchronised."""
        home = c["home"]
        if state.group is not None and c.get("incarnation"):
            known = self.incarnations.get(home)
            if home in state.group and (known is None or known == c["incarnation"]):
                return True
            self.log.warning("promotion refused: that member is no longer the one elected", vhost=state.vhost,
                             queue=state.name, member=home, epoch=state.epoch)
            return False
        forced = state.promote_rule(c.get("shutdown", False)) == "always" and home in state.mirrors
        if home not in state.synced and not forced:
            self.log.warning("promotion refused: that mirror is not synchronised", vhost=state.vhost,
                             queue=state.name, mirror=home, epoch=state.epoch)
            return False
        return True

    def mirror_synced(self, c: dict) -> bool:
        state = self.states.get((c["vhost"], c["name"]))
        if state is None or state.epoch != c["epoch"] or c["node"] not in state.mirrors:
            return False
        incarnation = c.get("incarnation", "")
        if incarnation and incarnation != self.incarnations.get(c["node"], ""):
            self.log.warning("mirror not synchronised: it restarted since the master streamed to it",
                             vhost=state.vhost, queue=state.name, mirror=c["node"])
            return False
        if c["node"] not in state.synced:
            state.synced.append(c["node"])
            self.log.info("mirror synchronised", vhost=state.vhost, queue=state.name, mirror=c["node"])
        self._synced_changed(state)
        return True

    def mirror_dropped(self, c: dict) -> None:
        state = self.states.get((c["vhost"], c["name"]))
        if state is None or state.epoch != c["epoch"] or c["node"] not in state.synced:
            return
        state.synced.remove(c["node"])
        self.log.warning("mirror dropped from the in-sync set", vhost=state.vhost, queue=state.name,
                         mirror=c["node"])
        self._synced_changed(state)

    def node_restarted(self, node: str, incarnation: str = "") -> None:
        """A restarted node's mirrors start empty: they are no longer synchronised."""
        self.stopping.discard(node)
        self.incarnations[node] = incarnation
        for state in self.states.values():
            if node in state.synced:
                state.synced.remove(node)
                self._synced_changed(state)

    def _synced_changed(self, state: HAState) -> None:
        replicator = self.replicators.get(state.key)
        if replicator is not None:
            replicator.on_synced_changed()

    # ---- the leader's watch, and housekeeping ------------------------------------------------
    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            try:
                self._tick()
            except Exception:  # noqa: BLE001 - never let one bad round stop failover
                self.log.exception("mirroring round failed")

    def _tick(self) -> None:
        now = time.monotonic()
        timeout = self.cluster.config.failure_timeout
        if not self._rounds.fresh(now, timeout) or self.replaying:
            return
        for replicator in list(self.replicators.values()):
            replicator.tick(now, timeout)
        if self.cluster.raft.role != "leader" or not self.cluster.membership.has_majority:
            return
        membership = self.cluster.membership
        for key, state in list(self.mirrored.items()):
            if self.states.get(key) is not state or not state.mirrors:
                del self.mirrored[key]       # deleted, replaced (a snapshot loaded) or no longer mirrored
                continue
            if state.home == self.node:
                continue
            if not membership.agreed_down(state.home):
                if not membership.is_up(state.home):
                    membership.ask_views(state.home)
                continue
            if self._promoting.get(state.key) == state.epoch:
                continue
            self._promoting[state.key] = state.epoch
            if state.group is not None:
                self.tasks.spawn(self._elect(state))
                continue
            successor = state.successor(self.is_up, shutdown=state.home in self.stopping)
            if successor is None:
                self._promoting.pop(state.key, None)
                continue
            self._promote(state, successor)

    def _promote(self, state: HAState, successor: str, incarnation: str = "") -> None:
        self.log.warning("master down: promoting a mirror", vhost=state.vhost, queue=state.name,
                         old=state.home, new=successor, epoch=state.epoch + 1)

        def done(result, err, key=state.key):
            if err is not None or not (result or {}).get("promoted"):
                self._promoting.pop(key, None)     # tried again on a later tick
        self.cluster.submit(QueuePromote(state.vhost, state.name, successor, state.epoch + 1, state.epoch,
                                         state.home in self.stopping, incarnation), done, forward_if_deposed=False)

    async def _elect(self, state: HAState) -> None:
        """A quorum queue's leader is down: promote the member an election finds holding the
        most, or try again after a while (fewer than a majority answered with a whole copy)."""
        key, epoch = state.key, state.epoch
        chosen = await elect(self, state)
        current = self.states.get(key) is state and state.epoch == epoch
        if current and chosen is not None:
            self._leaderless.discard(key)
            self._promote(state, chosen.node, chosen.incarnation)
            return
        if current:
            if key not in self._leaderless:
                self._leaderless.add(key)
                self.log.warning("quorum queue leader down: waiting for a majority of its members with a whole copy",
                                 vhost=state.vhost, queue=state.name, members=state.group, epoch=epoch)
            await asyncio.sleep(ELECTION_RETRY)
        if self._promoting.get(key) == epoch:
            self._promoting.pop(key)

    # ---- publishes sent again to a new master (CONF-4) --------------------------------------------
    def adopted(self, queue, acked_here=frozenset()) -> None:
        """A promoted mirror's messages: the publish ids of the newest, and of those it saw
        removed lately or this node's clients acked (maybe before the mirror had them), which a
        publisher's node may send again (it never saw them confirmed), are remembered for a while."""
        ids = self._recent_ids | self._removed_ids | acked_here   # consumed already: they must not come back
        key = (queue.vhost, queue.name)
        if ids:
            self._adopted[key] = (ids, time.monotonic() + RESENT_FOR)
        else:
            self._adopted.pop(key, None)

    def holds_already(self, queue, message) -> bool:
        """A publish sent again after a failover that the promoted mirror already had."""
        if not message.publish_id or not self._adopted:
            return False
        key = (queue.vhost, queue.name)
        ids, until = self._adopted.get(key, (None, 0.0))
        if ids is None or time.monotonic() > until:
            self._adopted.pop(key, None)
            return False
        return message.publish_id in ids

    @staticmethod
    def confirm_held(queue, fn) -> None:
        """fn(ok) once what the queue holds now is as safe as a new publish would be."""
        queue.when_safe(fn)

    # ---- ctl ---------------------------------------------------------------------------------
    def status(self, vhost: str, name: str) -> dict:
        state = self.states.get((vhost, name))
        if state is None or (not state.mirrors and state.group is None):
            return {}
        row = state.as_json()
        if state.group is not None:     # a quorum queue, with the names RabbitMQ's HTTP API gives
            row.update(type="quorum", leader=state.home,
                       online=[n for n in state.group if n == self.node or self.is_up(n)])
        replicator = self.replicators.get(state.key)
        if replicator is not None:
            links = replicator.status()["links"]
            row["mirror_states"] = {n: link["state"] for n, link in links.items()}
            row["sync_progress"] = {n: link["sync"] for n, link in links.items() if link["sync"]}
        return row

    def sync(self, vhost: str, name: str, cancel: bool = False) -> dict:
        replicator = self.replicators.get((vhost, name))
        if replicator is None:
            raise LookupError(f"queue '{name}' in vhost '{vhost}' is not a mirrored queue mastered here")
        started = []
        for node, link in replicator.links.items():
            if cancel and link.phase == "syncing":
                link.restart(force_sync=False)
                started.append(node)
            elif not cancel and link.phase not in ("synced", "catching", "proposing"):
                link.restart(force_sync=True)
                started.append(node)
        return {"queue": name, "mirrors": started}
