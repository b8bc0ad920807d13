"""A snapshot of the cluster's metadata stands in for the entries it covers.

The metadata log of a real three-node cluster (tests/fixtures/cluster-4ff821a.tar.gz, written
by HareMQ before snapshots existed: mirrored and exclusive queues, server-named ones by the
hundred, bindings, users, permissions, policies, a failover, node restarts and a node marked
down) is replayed in-process into a broker, as a restarting member does (history: nothing is
acted on). For many cut points S, restoring the snapshot taken after S and replaying the
entries after it gives the same state, and leaves the same recovered messages with the same
queues, as replaying the whole log; and that log still loads as it is.
"""
from __future__ import annotations

import asyncio
import inspect
import json
import tarfile
from pathlib import Path

import pytest

from haremq.cluster.metadata import MetadataMachine
from haremq.cluster.raft.shell import SnapshotRefused
from haremq.cluster.mirroring.manager import Mirroring
from haremq.cluster.raft.storage import RaftStorage
from haremq.node.broker.broker import Broker
from haremq.node.store.store import MessageStore

FIXTURE = Path(__file__).parent / "fixtures" / "cluster-4ff821a.tar.gz"


class Members:
    """The membership a member's state machine asks about: fixed peers, all up."""

    def __init__(self, peers):
        self.peers = {p: None for p in peers}

    def is_up(self, _name):
        return True

    def metadata(self):
        return ()

    def probe(self, _name):
        pass


class Member:
    """A member's state machine and mirroring over a broker and its store, without sockets (what
    cluster/node.py's ClusterNode wires together); what the store recovered is stood in by ids
    under each store id (they are only moved about, never read)."""

    def __init__(self, name: str, store_ids, directory: Path):
        self.name = name
        self.store = MessageStore(directory, name, segment_size=1 << 20)
        self.store.open()
        self.broker = Broker(name, self.store)
        self.membership = Members({"hare1", "hare2", "hare3"} - {name})
        self.mirroring = Mirroring(self)
        self.metadata = MetadataMachine(
            name, self.broker, lambda _n: None, self.membership.metadata, self.membership.is_up,
            # what the store recovered: three messages under every store id a declare may have used
            recovered={i: [i * 10 + k for k in range(3)] for i in store_ids}, mirroring=self.mirroring,
            on_add=lambda n, _a: self.membership.peers.setdefault(n, None),
            on_forget=lambda n: self.membership.peers.pop(n, None))

    def replay(self, entries) -> None:
        for index, _term, command in entries:
            self.metadata.apply(index, command)

    def snapshot(self) -> dict:
        encode, _records = self.metadata.snapshot()
        return json.loads(encode())

    def state(self) -> dict:
        """Everything the state machine holds, in a canonical order; a user's password hash
        aside (each broker salts its own default guest)."""
        snap = self.snapshot()
        snap["users"] = sorted((name, tags) for name, _hash, _alg, tags in snap["users"])
        for key in ("permissions", "ha", "stopping"):
            snap[key] = sorted(snap[key], key=json.dumps)
        snap["vhosts"] = sorted(({k: sorted(v, key=json.dumps) if isinstance(v, list) else v
                                  for k, v in vhost.items()} for vhost in snap["vhosts"]), key=lambda v: v["name"])
        messages = {}
        for vname, vhost in self.broker.vhosts.items():
            for queue in vhost.queues.values():
                if not queue.remote:
                    messages[f"{vname}/{queue.name}"] = list(queue.backing.tail)
        return {"state": snap, "messages": messages,
                "recovered": {k: list(v) for k, v in sorted(self.metadata.recovered.items())}}


class MemberFactory:
    """Members made for one test, each on a store of its own, in the test's event loop."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.made: list[Member] = []

    def __call__(self, name, store_ids) -> Member:
        self.made.append(Member(name, store_ids, self.directory / f"m{len(self.made)}"))
        return self.made[-1]

    async def close(self) -> None:
        for m in self.made:
            await m.store.close()


def in_loop(test):
    """Run a test in an event loop (a store needs one), its members closed at the end."""
    def run(*args, tmp_path, **kwargs):
        async def body():
            member = MemberFactory(tmp_path)
            try:
                test(*args, member=member, **kwargs)
            finally:
                await member.close()
        asyncio.run(body())
    run.__name__ = test.__name__
    params = [p for p in inspect.signature(test).parameters.values() if p.name != "member"]
    params.append(inspect.Parameter("tmp_path", inspect.Parameter.KEYWORD_ONLY))
    run.__signature__ = inspect.Signature(params)
    return run


@pytest.fixture(scope="module")
def cluster_dirs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fixture")
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(out, filter="data")
    return out


@pytest.fixture(scope="module")
def entries(cluster_dirs) -> list[tuple[int, int, bytes]]:
    storage = RaftStorage(cluster_dirs / "hare1" / "data" / "raft")
    return [(i, t, c) for i, (t, c) in enumerate(storage.entries, start=1)]


def test_a_log_written_before_snapshots_loads_as_it_is(cluster_dirs, entries):
    for name in ("hare1", "hare2", "hare3"):
        storage = RaftStorage(cluster_dirs / name / "data" / "raft")
        assert storage.snapshot_index == 0 and storage.snapshot_body is None
        assert storage.last_index > 1000
    ops = {json.loads(c)["op"] for _i, _t, c in entries}
    # what the fixture holds, so that the cut points below cover it
    assert {"queue.declare", "queue.delete", "bind", "queue.promote", "queue.mirror_synced",
            "node.restarted", "broker.call", "exchange.declare"} <= ops, ops


@pytest.mark.parametrize("name", ["hare1", "hare2"])
@in_loop
def test_a_snapshot_then_the_tail_gives_what_the_whole_log_gives(entries, name, member):
    store_ids = [i for i, _t, c in entries if json.loads(c)["op"] == "queue.declare"]
    whole = member(name, store_ids)
    whole.replay(entries)
    expected = whole.state()
    assert expected["state"]["ha"] and expected["messages"], "the fixture masters mirrored queues here"
    ops = [json.loads(c)["op"] for _i, _t, c in entries]
    interesting = [i for i, op in enumerate(ops, start=1) if op in ("queue.promote", "node.restarted", "node.down",
                                                                   "broker.call", "queue.mirror_synced")]
    cuts = sorted({1, len(entries) // 3, len(entries) // 2, len(entries) - 1, len(entries),
                   *interesting[::max(1, len(interesting) // 12)]})
    for cut in cuts:
        before = member(name, store_ids)
        before.replay(entries[:cut])
        snapshot = before.snapshot()
        after = member(name, store_ids)
        after.metadata.restore(cut, snapshot)
        assert after.snapshot() == snapshot or after.state()["state"] == before.state()["state"], cut
        after.replay(entries[cut:])
        assert after.state() == expected, f"snapshot after entry {cut} ({ops[cut - 1]})"


@in_loop
def test_a_snapshot_replaces_what_a_replaying_member_held_and_a_live_one_refuses_it(entries, member):
    store_ids = [i for i, _t, c in entries if json.loads(c)["op"] == "queue.declare"]
    whole = member("hare1", store_ids)
    whole.replay(entries)
    cut = len(entries) // 2
    before = member("hare1", store_ids)
    before.replay(entries[:cut])
    # a member that replayed part of its own log gets a later snapshot from the leader:
    # its queues give their messages back, and the snapshot's state takes over
    behind = member("hare1", store_ids)
    behind.replay(entries[:cut // 2])
    behind.metadata.restore(cut, before.snapshot())
    behind.replay(entries[cut:])
    assert behind.state() == whole.state()
    behind.metadata.replaying = False          # serving clients now
    with pytest.raises(SnapshotRefused):
        behind.metadata.restore(len(entries), whole.snapshot())
