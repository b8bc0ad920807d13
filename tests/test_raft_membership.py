"""Membership changes through Raft's shell (cluster/raft/shell.py): one at a time (Raft thesis 4.1).

In-process, without sockets: the leader's followers are answered by hand, so what is
committed when is up to the test.
"""
from __future__ import annotations

import asyncio
import json
import time
from types import SimpleNamespace

from haremq.cluster.raft.messages import AppendReply, AppendRequest, VoteReply
from haremq.cluster.raft.shell import Raft, RaftStorage
from haremq.cluster.rpc import cluster_pb2 as pb
from haremq.node.broker.commands import MemberAdd, MemberForget


class Members:
    """Peers that never answer a call (no stub): the test answers for them."""

    def __init__(self, name, peers):
        self.name = name
        self.peers = {p: SimpleNamespace(name=p, stub=None) for p in peers}

    size = property(lambda self: len(self.peers) + 1)
    has_majority = True

    def is_up(self, name):
        return True

    def up_members(self):
        return [self.name]       # no follower to wait for once a change is applied here

    def metadata(self):
        return ()


async def lead(raft: Raft) -> None:
    """Past the election timeout, every peer says yes to the pre-vote and then to the vote."""
    machine, now = raft.machine, time.monotonic() + 2.0
    requests = machine.tick(now).messages
    while machine.role != "leader":
        ready = None
        for request in requests:
            ready = machine.on_vote_reply(request, VoteReply(request.to, request.term, True), now)
            if ready.messages or machine.role == "leader":
                break
        await raft._carry_out(ready)
        requests = [m for m in ready.messages if hasattr(m, "pre_vote")]


async def follower_holds(raft: Raft, index: int) -> None:
    """hare2 answers that it holds the log up to `index`: with us, a majority of three."""
    machine = raft.machine
    request = AppendRequest("hare2", machine.term, "hare1", 0, 0, (), machine.commit_index)
    await raft._carry_out(machine.on_append_reply(request, AppendReply("hare2", machine.term, True, index),
                                                  time.monotonic()))


def test_the_leader_proposes_a_membership_change_only_once_the_last_one_is_applied(tmp_path):
    async def scenario():
        applied = []
        raft = Raft("hare1", Members("hare1", ["hare2", "hare3"]), RaftStorage(tmp_path / "raft"),
                    lambda i, c: applied.append(json.loads(c)["op"]))
        await lead(raft)
        log = raft.machine.persistent
        assert raft.role == "leader" and log.last_index == 1 and raft.commit_index == 0   # its noop
        add = asyncio.ensure_future(raft.propose(MemberAdd("hare4", "127.0.0.1:1").to_json()))
        await asyncio.sleep(0.05)
        assert log.last_index == 1, "a change proposed before the new leader's first entry committed"
        # forwarded by another member: refused at once (it retries), not queued
        forwarded = pb.ProposeRequest(command=json.dumps(MemberForget("hare3").to_json()).encode())
        reply = await asyncio.wait_for(raft.on_propose(forwarded), 1.0)
        assert not reply.ok and "membership change" in reply.error and log.last_index == 1
        await follower_holds(raft, 1)
        await asyncio.sleep(0.05)
        assert log.last_index == 2 and not add.done()          # the add, waiting to commit
        forget = asyncio.ensure_future(raft.propose(MemberForget("hare3").to_json()))
        other = asyncio.ensure_future(raft.propose({"op": "x"}))
        await asyncio.sleep(0.05)
        # the forget waits for the add to commit; other commands do not
        assert [json.loads(c)["op"] for _t, c in log.entries] == ["noop", "member.add", "x"]
        await follower_holds(raft, 3)
        await asyncio.wait_for(asyncio.gather(add, other), 1.0)
        await asyncio.sleep(0.05)
        assert [json.loads(c)["op"] for _t, c in log.entries][3:] == ["member.forget"]
        await follower_holds(raft, 4)
        await asyncio.wait_for(forget, 1.0)
        await raft.stop()
        return applied

    assert asyncio.run(scenario()) == ["noop", "member.add", "x", "member.forget"]
