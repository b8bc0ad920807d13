"""Membership and failure detection: every node pings every other node.

A member not heard from for longer than the failure timeout is down. A node
that cannot see a majority of the members (itself included) pauses: it stops
serving AMQP until it sees a majority again (pause-minority, MIR-5), so the
two sides of a partition never both accept work.

Members are named NAME=HOST:PORT, and HOST may be a DNS name whose address
changes when the member restarts (a Kubernetes pod keeps its name and gets a
new IP). gRPC would keep dialling the address it resolved (it re-resolves at
most every 30 s), so a node resolves each peer's name itself (getaddrinfo:
/etc/hosts, then DNS), dials the addresses it found, and resolves the name
again whenever a ping fails: a new address gets a new channel at once. A
member that pings us while we cannot reach it is alive, so our channel to it
is stale (an old address, or a reconnect backoff): it is dialled afresh.
"""
from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import grpc
import structlog

from haremq.node.tasks import TaskGroup

from haremq.cluster import transport
from haremq.cluster.rpc import cluster_pb2 as pb
from haremq.cluster.rpc import cluster_pb2_grpc as pbg
from haremq.cluster.secret import call_metadata

PING_INTERVAL = 0.25
STALL = 0.5               # a gap this long between two checks: this process was not running
RESOLVE_TIMEOUT = 2.0     # a name that does not resolve in this long keeps the channel it has
REDIAL_MIN_INTERVAL = 1.0  # a stale channel is replaced at most this often
CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 1000),
    ("grpc.keepalive_timeout_ms", 1000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", 256 << 20),
    ("grpc.max_send_message_length", 256 << 20),
    # a member that comes back is seen again within about a second
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # a channel dialled afresh connects at once rather than sharing a subchannel in backoff
    ("grpc.use_local_subchannel_pool", 1),
]
# The members' server takes the clients' keepalive pings (every second, with or without calls);
# by default it allows one without data every 5 minutes, and after two more it sent GOAWAY
# "too_many_pings": an idle connection between members was dropped every few seconds.
SERVER_OPTIONS = [
    *CHANNEL_OPTIONS,
    ("grpc.http2.min_ping_interval_without_data_ms", 500),
    ("grpc.http2.max_ping_strikes", 0),
]


def split_address(address: str) -> tuple[str, str]:
    """HOST:PORT (or [V6]:PORT) -> (host, port)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), port


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclass
class Peer:
    name: str
    address: str
    channel: grpc.aio.Channel | None = None
    stub: pbg.ClusterStub | None = None
    last_seen: float = 0.0
    paused: bool = False
    leader: str = ""
    refused: bool = False      # its port refuses connections: the process is gone, no need to wait
    probe: asyncio.Event | None = None
    sees_down: frozenset = frozenset()   # the members it said it considers down, in its last reply
    alarms: frozenset = frozenset()      # its own resource alarms, in its last reply
    target: str = ""                     # what the channel dials: `address` as it resolved
    dialled_at: float = 0.0
    redial: bool = False                 # it pinged us while we could not reach it
    resolving: asyncio.Future | None = None
    pinging: asyncio.Task | None = None     # its ping loop, ended when it is forgotten

    def is_up(self, now: float, timeout: float) -> bool:
        return self.last_seen > 0 and not self.refused and now - self.last_seen < timeout


class _WrongMember(Exception):
    """A ping answered by a member other than the one dialled."""


class WatchRounds:
    """The rounds of a leader's watch (failover, node.down): after a round that came this late
    (the process was stopped or starved), what it knows of the others is stale until they have
    been pinged again, so it decides nothing for a failure timeout."""

    STARVED = 0.5

    def __init__(self):
        self._last = 0.0
        self._quiet_until = 0.0

    def fresh(self, now: float, timeout: float) -> bool:
        if now - self._last > self.STARVED:
            self._quiet_until = now + timeout
        self._last = now
        return now >= self._quiet_until


class Membership:
    def __init__(self, name: str, peers: dict[str, str], secret: str, failure_timeout: float,
                 on_majority: Callable[[bool], None], tls=None, *,
                 on_alarms: Callable[[str, frozenset], None] | None = None,
                 on_removed: Callable[[str, int], None] | None = None):
        """on_majority(has_it) when this node gains or loses sight of a majority; on_alarms(name,
        alarms) when a member's own alarms change; on_removed(name, applied) when a member says
        this node was forgotten (`applied`: the last log index it has applied)."""
        self.name = name
        self.peers = {n: Peer(n, a) for n, a in peers.items() if n != name}
        self.secret = secret
        self.failure_timeout = failure_timeout
        self.on_majority = on_majority
        self.tls = tls
        self.has_majority: bool | None = None
        self.paused = False
        self.log = structlog.get_logger("haremq.cluster").bind(node=name)
        self.on_alarms = on_alarms
        self.on_removed = on_removed
        self._tasks = TaskGroup(f"membership {name}")   # ping loops, the watch, name lookups
        self._closing = TaskGroup(f"membership {name}: channels closing")   # awaited, not cut short, on stop
        self._last_check = time.monotonic()
        self._stalled_at = 0.0
        # getaddrinfo blocks: its own threads, so a slow DNS never holds up the store's or Raft's
        self._resolver = ThreadPoolExecutor(max_workers=2, thread_name_prefix="haremq-resolve")

    @property
    def size(self) -> int:
        return len(self.peers) + 1

    def metadata(self):
        return call_metadata(self.secret)

    async def start(self) -> None:
        peers = list(self.peers.values())
        targets = await asyncio.gather(*(self._resolve(p.address) for p in peers))
        for peer, target in zip(peers, targets):
            # a name that does not resolve yet is dialled as it is: gRPC resolves it meanwhile
            self._dial(peer, target or peer.address)
            peer.probe = asyncio.Event()
            peer.pinging = self._tasks.spawn(self._ping_loop(peer))
        self._tasks.spawn(self._watch())
        self._evaluate()

    async def stop(self) -> None:
        await self._tasks.close()          # ping loops, the watch, name lookups
        for peer in self.peers.values():
            if peer.channel is not None:
                await peer.channel.close()
        await self._closing.wait()
        self._resolver.shutdown(wait=False, cancel_futures=True)

    # ---- finding a member by name -------------------------------------------------------------
    async def _resolve(self, address: str) -> str | None:
        """The gRPC target for HOST:PORT as HOST resolves now (every address it has, sorted so
        that the same answer gives the same target), or None if it does not resolve."""
        host, port = split_address(address)
        if is_ip(host):
            return address
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(loop.run_in_executor(
                self._resolver, socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM), RESOLVE_TIMEOUT)
        except (OSError, asyncio.TimeoutError) as exc:
            self.log.debug("peer name does not resolve", address=address, error=str(exc) or "timeout")
            return None
        v4 = sorted({info[4][0] for info in infos if info[0] == socket.AF_INET})
        if v4:
            return "ipv4:" + ",".join(f"{ip}:{port}" for ip in v4)
        v6 = sorted({info[4][0] for info in infos if info[0] == socket.AF_INET6})
        return "ipv6:" + ",".join(f"[{ip}]:{port}" for ip in v6) if v6 else None

    def _dial(self, peer: Peer, target: str) -> None:
        """A new channel to `target`; the old one is closed once its calls had a moment to end."""
        host, _port = split_address(peer.address)
        options = list(CHANNEL_OPTIONS)
        if self.tls is not None and not is_ip(host):
            options.append(("grpc.ssl_target_name_override", host))   # its certificate names HOST
        old = peer.channel
        peer.channel = transport.channel(target, self.tls, options)
        peer.stub = pbg.ClusterStub(peer.channel)
        peer.target = target
        peer.dialled_at = time.monotonic()
        if old is not None:
            self._close_later(old.close(grace=1.0))

    def _close_later(self, closing) -> None:
        """A channel closing in the background: kept until it has, and awaited on stop."""
        self._closing.spawn(closing)

    def _reresolve(self, peer: Peer) -> None:
        """Resolve the peer's name again (in the background, one lookup at a time) and dial the
        new address if it moved, or the same one afresh if the peer is known to be alive."""
        if peer.resolving is not None and not peer.resolving.done():
            return

        async def run():
            target = await self._resolve(peer.address)
            if target is None or self.peers.get(peer.name) is not peer:
                return
            moved = target != peer.target
            stale = peer.redial and time.monotonic() - peer.dialled_at >= REDIAL_MIN_INTERVAL
            if not (moved or stale):
                return
            if moved:
                self.log.info("member has a new address: dialling it", member=peer.name, address=peer.address,
                              old=peer.target, new=target)
            else:
                self.log.info("member pings us but we cannot reach it: dialling it afresh", member=peer.name,
                              target=target)
            peer.redial = False
            self._dial(peer, target)
            if peer.probe is not None:
                peer.probe.set()            # ping it through the new channel now
        peer.resolving = self._tasks.spawn(run())

    def heard_from(self, name: str) -> None:
        """`name` pinged us: it is alive. If we cannot reach it, our channel is stale."""
        peer = self.peers.get(name)
        if peer is None or peer.channel is None or peer.is_up(time.monotonic(), self.failure_timeout):
            return
        peer.redial = True
        self._reresolve(peer)

    def add(self, name: str, address: str) -> bool:
        """A member that joined (a StatefulSet scaled out): counted from now on, then dialled and
        pinged like the others."""
        if name == self.name or name in self.peers:
            return False
        peer = self.peers[name] = Peer(name, address)
        peer.probe = asyncio.Event()
        self._dial(peer, address)          # as start() does for a name that does not resolve yet
        peer.pinging = self._tasks.spawn(self._ping_loop(peer))
        self.log.info("member added", member=name, address=address)
        self._evaluate()
        return True

    def forget(self, name: str) -> bool:
        peer = self.peers.pop(name, None)
        if peer is None:
            return False
        for task in (peer.pinging, peer.resolving):    # nothing uses its channel once it is closed
            if task is not None:
                task.cancel()
        if peer.channel is not None:
            self._close_later(peer.channel.close())
        self._evaluate()
        return True

    async def _ping_loop(self, peer: Peer) -> None:
        was_up = False
        while True:
            try:
                reply = await peer.stub.Ping(pb.PingRequest(node=self.name), timeout=1.0,
                                             metadata=self.metadata())
                if reply.node and reply.node != peer.name:
                    # another member has the address now (an IP reused after a restart)
                    if peer.last_seen and not peer.refused:
                        self.log.warning("another member answers at this member's old address",
                                         member=peer.name, answered=reply.node, target=peer.target)
                    raise _WrongMember()
                peer.last_seen = time.monotonic()
                peer.refused = False
                peer.redial = False
                peer.paused = reply.paused
                peer.leader = reply.leader
                peer.sees_down = frozenset(reply.down)
                if reply.not_member and self.on_removed is not None:
                    self.on_removed(peer.name, reply.commit_index)
                self._peer_alarms(peer, frozenset(reply.alarms))
                if not was_up:
                    self.log.info("member up", member=peer.name)
                    was_up = True
            except (grpc.aio.AioRpcError, _WrongMember) as exc:
                self._reresolve(peer)        # every failed ping: has its name moved?
                if isinstance(exc, _WrongMember):
                    peer.refused = bool(peer.last_seen)
                    if peer.refused:
                        self._evaluate()
                elif exc.code() == grpc.StatusCode.UNAUTHENTICATED and was_up is not None:
                    self.log.error("member refuses our cluster secret", member=peer.name)
                    was_up = None
                elif exc.code() == grpc.StatusCode.UNAVAILABLE:
                    self._after_stall()
                    # a connection that broke while this process was not running (keepalive) is
                    # no proof the member is gone: the next pings tell
                    if time.monotonic() - self._stalled_at >= self.failure_timeout:
                        self._refused(peer)
                if not peer.is_up(time.monotonic(), self.failure_timeout):
                    was_up = False
                    self._peer_alarms(peer, frozenset())     # a member that is down blocks nobody
            except asyncio.CancelledError:
                raise
            try:
                await asyncio.wait_for(peer.probe.wait(), PING_INTERVAL)
            except asyncio.TimeoutError:
                pass
            peer.probe.clear()

    def _refused(self, peer: Peer) -> None:
        """Its port refuses connections: the process is gone, it is down now."""
        if peer.last_seen and not peer.refused:
            peer.refused = True
            self.log.warning("member down: its port refuses connections", member=peer.name)
            self._evaluate()
            for other in self.peers.values():     # have the others' views of it refreshed
                if other is not peer and other.probe is not None:
                    other.probe.set()

    async def reachable(self, name: str, timeout: float = 0.25) -> bool:
        """Ping `name` now. False only if its port refuses us (which marks it down at once): a
        slow answer is no proof that it is gone."""
        peer = self.peers.get(name)
        if peer is None or peer.stub is None:
            return False
        try:
            reply = await peer.stub.Ping(pb.PingRequest(node=self.name), timeout=timeout, metadata=self.metadata())
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                return True
        else:
            if not reply.node or reply.node == peer.name:
                peer.last_seen = time.monotonic()
                return True
        self._refused(peer)
        return False

    def _peer_alarms(self, peer: Peer, alarms: frozenset) -> None:
        if alarms != peer.alarms:
            peer.alarms = alarms
            if self.on_alarms is not None:
                self.on_alarms(peer.name, alarms)

    def probe(self, name: str) -> None:
        """Something suggests `name` is gone (a stream to it broke): ping it now."""
        peer = self.peers.get(name)
        if peer is not None and peer.probe is not None:
            peer.probe.set()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            self._evaluate()

    def is_up(self, name: str) -> bool:
        self._after_stall()
        peer = self.peers.get(name)
        return name == self.name or (peer is not None and peer.is_up(time.monotonic(), self.failure_timeout))

    def down_members(self) -> list[str]:
        now = time.monotonic()
        return [p.name for p in self.peers.values() if not p.is_up(now, self.failure_timeout)]

    def ask_views(self, down: str) -> None:
        """`down` looks down here but the others have not said so yet: ping them now for their
        view instead of at their next round (a decision about it waits for a majority's word)."""
        for name in self.peers:
            if name != down and self.is_up(name):
                self.probe(name)

    def agreed_down(self, name: str) -> bool:
        """`name` is down as a majority of the members see it (this node and the peers it can
        reach), not merely in this node's view, which may be stale: a failover needs this."""
        now = time.monotonic()
        if name == self.name or self.is_up(name):
            return False
        if name not in self.peers:
            return True      # forgotten: not a member any more
        votes = 1 + sum(1 for p in self.peers.values()
                        if p.name != name and p.is_up(now, self.failure_timeout) and name in p.sees_down)
        return votes * 2 > self.size

    def up_members(self) -> list[str]:
        now = time.monotonic()
        return [self.name] + [p.name for p in self.peers.values() if p.is_up(now, self.failure_timeout)]

    def _after_stall(self) -> None:
        """This process did not run for a while (a long promotion, a swap, SIGSTOP): nothing
        could be heard from the others meanwhile, which says nothing about them. The time it
        lost is not counted against them; a member that is really gone shows at its next ping."""
        now = time.monotonic()
        lost = now - self._last_check - STALL
        self._last_check = now
        if lost > 0:
            self._stalled_at = now
            for peer in self.peers.values():
                if peer.last_seen:
                    peer.last_seen += lost

    def _evaluate(self) -> None:
        self._after_stall()
        up = self.up_members()
        majority = len(up) * 2 > self.size
        if majority != self.has_majority:
            first = self.has_majority is None
            self.has_majority = majority
            if not first or not majority:
                self.log.warning("majority " + ("regained" if majority else "lost"), up=up, members=self.size)
            self.paused = not majority      # pause-minority: what Ping answers and the status shows
            self.on_majority(majority)

    def status(self) -> list[dict]:
        now = time.monotonic()
        rows = [{"name": self.name, "address": "self", "up": True, "paused": self.paused, "self": True}]
        for peer in self.peers.values():
            rows.append({"name": peer.name, "address": peer.address, "dialling": peer.target,
                         "up": peer.is_up(now, self.failure_timeout),
                         "paused": peer.paused if peer.is_up(now, self.failure_timeout) else None,
                         "last_seen_s": round(now - peer.last_seen, 2) if peer.last_seen else None,
                         "self": False})
        return rows
