"""Placement is the log's: every member, whatever peer list it started with, replays one log to
the same masters, mirrors and quorum members, and a snapshot plus the rest of the log gives what
the whole log gives.

The log is one a scaled-out cluster writes: three members, policies and queues of every kind,
a fourth member added (a StatefulSet scaled to 4), queues homed on it, a failover, a member
forgotten, a later leader's noop with the members it sees. It is replayed in-process by members
that each hold a different peer list (one joined later, one restarted with a `--peer` removed,
one that knows a member that never joined): a member that worked out placement from its own
peers would place these queues otherwise.
"""
from __future__ import annotations

import json

import pytest

from haremq.cluster.mirroring.policy import QUORUM_DEFAULTS
from haremq.node.broker import commands as C
from tests.test_raft_snapshot_state import in_loop

HA_TWO = {"ha-mode": "exactly", "ha-params": 2, "ha-sync-mode": "automatic"}
QUORUM = {"x-queue-type": "quorum"}


def declare(name: str, home: str, arguments: dict | None = None) -> C.Command:
    return C.QueueDeclare(vhost="/", name=name, durable=True, exclusive=False, auto_delete=False,
                          arguments=arguments or {}, home=home)


def policy(name: str, pattern: str, definition: dict) -> C.Command:
    return C.BrokerCall("set_policy", ["/", name, pattern, definition, "queues", 0])


COMMANDS: list[C.Command] = [
    C.Noop(leader="hare1", members=["hare1", "hare2", "hare3"]),
    C.NodeRestarted("hare1", "i1"), C.NodeRestarted("hare2", "i2"), C.NodeRestarted("hare3", "i3"),
    policy("two", "^two", HA_TWO),
    policy("all", "^all", {"ha-mode": "all", "ha-sync-mode": "automatic"}),
    # a catch-all the quorum queues must not take (ha-* keys are for classic queues only)
    policy("loose", "^q", {"ha-promote-on-failure": "always", "ha-sync-mode": "manual"}),
    declare("two.1", "hare1"), declare("two.2", "hare2"), declare("two.3", "hare3"),
    declare("all.1", "hare1"), declare("q.1", "hare1", QUORUM), declare("q.2", "hare3", QUORUM),
    declare("q.small", "hare3", {**QUORUM, "x-quorum-initial-group-size": 2}),
    C.MemberAdd("hare4", "127.0.0.1:1"), C.NodeRestarted("hare4", "i4"),
    declare("two.4", "hare4"), declare("all.4", "hare4"), declare("q.4", "hare4", QUORUM),
    C.QueueMember(vhost="/", name="q.1", node="hare4", add=True),
    C.QueueMirrorSynced(vhost="/", name="two.1", node="hare2", epoch=1, incarnation="i2"),
    C.QueueMirrorSynced(vhost="/", name="all.1", node="hare3", epoch=1, incarnation="i3"),
    C.QueueMirrorSynced(vhost="/", name="all.1", node="hare4", epoch=1, incarnation="i4"),
    # hare1 dies: its classic queues fail over to their oldest synchronised mirrors
    C.NodeDown("hare1", since=2),
    C.QueuePromote(vhost="/", name="two.1", home="hare2", epoch=2, from_epoch=1),
    C.QueuePromote(vhost="/", name="all.1", home="hare3", epoch=2, from_epoch=1),
    C.NodeRestarted("hare1", "i1b"),
    C.MemberForget("hare2"),
    declare("two.5", "hare3"), declare("all.5", "hare1"), declare("q.5", "hare4", QUORUM),
    # a later leader sees other members; placement follows member.add and member.forget only
    C.Noop(leader="hare3", members=["hare1", "hare3", "hare4", "hare9"]),
    declare("two.6", "hare4"), declare("q.6", "hare1", QUORUM),
]
ENTRIES = [(i, 1, json.dumps(c.to_json()).encode()) for i, c in enumerate(COMMANDS, start=1)]
STORE_IDS = [i for i, c in enumerate(COMMANDS, start=1) if isinstance(c, C.QueueDeclare)]

# (the member replaying, the peers it was started with)
VIEWS = [
    ("hare3", {"hare1", "hare2"}),                   # started before hare4 joined
    ("hare4", {"hare1", "hare2", "hare3"}),          # joined later
    ("hare1", {"hare3"}),                            # restarted with --peer hare4 and hare2 removed
    ("hare3", {"hare1", "hare2", "hare4", "hare5"}),  # knows one that never joined
]


def placement(member) -> dict:
    """Every queue's master, mirrors, quorum members, in-sync set and epoch, as this member
    holds them."""
    return {f"{vhost}/{name}": {"home": s.home, "mirrors": list(s.mirrors),
                                "group": None if s.group is None else list(s.group),
                                "synced": list(s.synced), "epoch": s.epoch,
                                "definition": dict(s.definition)}
            for (vhost, name), s in sorted(member.mirroring.states.items())}


def replayed(member, name: str, peers: set, entries) -> object:
    m = member(name, STORE_IDS)
    m.membership.peers = {p: None for p in peers}
    m.replay(entries)
    return m


@in_loop
def test_every_member_places_every_queue_the_same_whatever_its_peer_list(member):
    placements = [placement(replayed(member, name, peers, ENTRIES)) for name, peers in VIEWS]
    first = placements[0]
    for (name, peers), other in zip(VIEWS[1:], placements[1:]):
        assert other == first, f"{name} started with peers {sorted(peers)}"
    # what the log says, not what any one peer list would give
    assert first["//two.4"]["home"] == "hare4" and len(first["//two.4"]["mirrors"]) == 1
    # hare2 forgotten: ha-mode all places on the members left (hare9 never joined)
    assert set(first["//all.4"]["mirrors"]) == {"hare1", "hare3"}
    assert set(first["//all.5"]["mirrors"]) == {"hare3", "hare4"}
    # two.1 failed over to hare2, which was then forgotten with no synchronised mirror: it went
    assert "//two.1" not in first and first["//all.1"]["home"] == "hare3"
    assert sorted(first["//q.1"]["group"]) == ["hare1", "hare2", "hare3", "hare4"]
    assert len(first["//q.small"]["group"]) == 2
    assert len(first["//q.6"]["group"]) == 3 and "hare9" not in first["//q.6"]["group"]
    assert "hare2" not in first["//q.6"]["group"] and "hare2" not in first["//all.5"]["mirrors"]
    for key, state in first.items():
        if state["group"] is not None:
            assert state["definition"] == QUORUM_DEFAULTS, (key, state["definition"])


@pytest.mark.parametrize("view", range(len(VIEWS)))
@in_loop
def test_a_snapshot_then_the_tail_places_what_the_whole_log_places(view, member):
    name, peers = VIEWS[view]
    whole = replayed(member, name, peers, ENTRIES)
    expected = (placement(whole), whole.state())
    for cut in range(1, len(ENTRIES)):
        before = replayed(member, name, peers, ENTRIES[:cut])
        # the snapshot restored on a member with yet another peer list
        after = member(name, STORE_IDS)
        after.membership.peers = {p: None for p in VIEWS[(view + 1) % len(VIEWS)][1]}
        after.metadata.restore(cut, before.snapshot())
        after.replay(ENTRIES[cut:])
        assert (placement(after), after.state()) == expected, \
            f"snapshot after entry {cut} ({COMMANDS[cut - 1].op})"
