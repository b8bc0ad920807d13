"""Membership that follows `kubectl scale`: members found by DNS as a StatefulSet names them
(PREFIX-N.SERVICE), and a fourth one that starts later joins the running three.

Names resolve through /etc/hosts (tests/clusters.py HostNames), every member has a loopback
address of its own and, as pods do, the same ports."""
from __future__ import annotations

import json
import random
import shutil
import time

import pika

from haremq.cluster.membership.discovery import dns_members
from tests.clusters import (SECRET, ClusterMember, HostNames, control, ctl, ctl_json, launch, plain_cluster,
                            proxied_cluster, stop_cluster)
from tests.conftest import free_port, wait_until


def test_dns_members_follow_what_resolves():
    names = {"hare-0.svc", "hare-1.svc", "hare-2.svc", "hare-3.svc"}
    got = dns_members("hare-1", "svc", 25672, 3, resolve=names.__contains__)
    assert got == {f"hare-{i}": f"hare-{i}.svc:25672" for i in range(4)}
    # the hint covers members DNS does not answer for yet; this node's own ordinal always counts
    assert set(dns_members("hare-4", "svc", 1, 3, resolve=lambda _h: False)) == {f"hare-{i}" for i in range(5)}
    assert set(dns_members("hare-0", "svc", 1, None, resolve=lambda _h: False)) == {"hare-0"}


def test_a_fourth_member_from_dns_joins_the_running_three(tmp_path):
    hosts = HostNames()
    service = f"{hosts.tag}.haremq.test"
    base = f"127.0.{random.randint(100, 250)}"
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    amqp_port, cluster_port = free_port(), free_port()

    def member(i: int) -> ClusterMember:
        hosts.point(f"hare-{i}.{service}", f"{base}.{10 + i}")
        m = ClusterMember(f"hare-{i}", tmp_path / f"hare-{i}", cluster_port, {}, secret, failure_timeout=3.0)
        m.port = amqp_port
        m.host = f"{base}.{10 + i}"
        m.extra_args = ["--peers-dns", service, "--replicas", "3"]
        return m

    members = [member(i) for i in range(3)]
    try:
        launch(members)
        wait_until(lambda: len(ctl_json(members[0], "cluster-status")["running"]) == 3, timeout=20)
        conn = pika.BlockingConnection(pika.ConnectionParameters(members[0].host, amqp_port))
        ch = conn.channel()
        ch.queue_declare("scale.q", durable=True)
        ch.basic_publish("", "scale.q", b"before", pika.BasicProperties(delivery_mode=2))
        conn.close()

        fourth = member(3)                        # kubectl scale --replicas 4: the pod's args are unchanged
        launch([fourth])
        members.append(fourth)
        for m in members:
            wait_until(lambda m=m: sorted(ctl_json(m, "cluster-status")["running"]) ==
                       [f"hare-{i}" for i in range(4)], timeout=30,
                       message=f"{m.name} does not count four members running:\n{m.log_tail()}")
        # the newcomer has the metadata (the log from its start) and serves the queue homed on hare-0
        conn = pika.BlockingConnection(pika.ConnectionParameters(fourth.host, amqp_port))
        ch = conn.channel()
        method, _props, body = ch.basic_get("scale.q", auto_ack=True)
        assert body == b"before"
        ch.queue_declare("scale.new", durable=True)
        conn.close()
        wait_until(lambda: any(r["name"] == "scale.new" for r in ctl_json(members[0], "list-queues")), timeout=10)
        # four members: one down leaves a majority (3 of 4), and the cluster keeps its metadata
        members[1].kill9()
        wait_until(lambda: ctl_json(members[0], "cluster-status")["majority"], timeout=10)
        r = ctl(members[0], "add-vhost", "scaled")
        assert r.returncode == 0, r.stderr
        wait_until(lambda: any(v["name"] == "scaled" for v in ctl_json(fourth, "list-vhosts")), timeout=10)
    finally:
        stop_cluster(members, {"close": lambda: None})
        hosts.close()


def test_placement_is_the_logs_after_a_scale_out_a_failover_and_restarts(tmp_path):
    """Mirrors and quorum members are placed on the members the log records, so a member that
    joined later (its peer list has four names from its start), one restarted with another peer
    list, one that loads a snapshot and one that replays its whole log all say the same."""
    hosts = HostNames()
    service = f"{hosts.tag}.haremq.test"
    base = f"127.0.{random.randint(100, 250)}"
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    amqp_port, cluster_port = free_port(), free_port()

    def member(i: int) -> ClusterMember:
        hosts.point(f"hare-{i}.{service}", f"{base}.{10 + i}")
        m = ClusterMember(f"hare-{i}", tmp_path / f"hare-{i}", cluster_port, {}, secret, failure_timeout=3.0)
        m.port = amqp_port
        m.host = f"{base}.{10 + i}"
        m.extra_args = ["--peers-dns", service, "--replicas", "3"]
        return m

    def records(m) -> dict:
        return {(r["vhost"], r["name"]): (r["master"], r["epoch"], r["mirrors"], r.get("members"))
                for r in control(m, "queue_records")}

    members = [member(i) for i in range(3)]
    members[2].env = {"HAREMQ_RAFT_SNAPSHOT_ENTRIES": "20"}     # loads a snapshot and the log after it
    try:
        launch(members)
        wait_until(lambda: len(ctl_json(members[0], "cluster-status")["running"]) == 3, timeout=20)
        control(members[0], "broker_call", method="set_policy",
                args=["/", "ha-all", "^place[.]c", {"ha-mode": "all", "ha-sync-mode": "automatic"}, "queues", 0])
        conn = pika.BlockingConnection(pika.ConnectionParameters(members[0].host, amqp_port))
        ch = conn.channel()
        ch.queue_declare("place.c", durable=True)
        ch.queue_declare("place.q", durable=True, arguments={"x-queue-type": "quorum"})
        for i in range(40):                   # entries enough for hare-2's snapshots
            ch.queue_declare(f"filler.{i}", durable=True)
        conn.close()

        fourth = member(3)
        launch([fourth])
        members.append(fourth)
        for m in members:
            wait_until(lambda m=m: len(ctl_json(m, "cluster-status")["running"]) == 4, timeout=30,
                       message=f"{m.name} does not count four members running:\n{m.log_tail()}")
        members[0].kill9()                    # the master of both
        wait_until(lambda: all(records(members[1]).get(("/", q), ("hare-0",))[0] != "hare-0"
                               for q in ("place.c", "place.q")), timeout=30,
                   message="the queues never failed over from hare-0")
        for m in (members[0], members[2], fourth):      # each replays: a new peer list, a snapshot, all
            if m is not members[0]:
                m.kill9()
            m.start(timeout=60)
        for m in members:
            wait_until(lambda m=m: len(ctl_json(m, "cluster-status")["running"]) == 4, timeout=30)

        def agreed():
            views = [records(m) for m in members]
            picked = [{k: v for k, v in view.items() if k[1].startswith("place.")} for view in views]
            return picked if all(p == picked[0] for p in picked) and len(picked[0]) == 2 else None
        views = wait_until(agreed, timeout=20, message="the members place the queues differently: "
                           + "; ".join(f"{m.name} {records(m)}" for m in members))
        master, _epoch, mirrors, _group = views[0][("/", "place.c")]
        assert "hare-3" in mirrors + [master]     # ha-mode all took the newcomer in, on every member
    finally:
        stop_cluster(members, {"close": lambda: None})
        hosts.close()


def _joiner(tmp_path, members, name: str = "hare4") -> ClusterMember:
    """A member-to-be on an empty data dir: `--peer` for the running members and `--join-as`
    its own address, as a node outside Kubernetes joins."""
    port = free_port()
    joiner = ClusterMember(name, tmp_path / name, port, {m.name: f"127.0.0.1:{m.cluster_port}" for m in members},
                           members[0].secret_file)
    joiner.extra_args = ["--join-as", f"127.0.0.1:{port}"]
    return joiner


def test_a_member_joins_by_static_peers_and_joins_again_after_it_was_forgotten(tmp_path):
    """Outside Kubernetes: a node started on an empty data dir with `--peer` for the running
    members and `--join-as` its own address is added through the log; killed and forgotten
    (`haremq ctl forget-node`), the same name joins afresh on an empty disk. Between, the whole
    cluster restarts: the three learn of it from their logs again."""
    members = plain_cluster(tmp_path)
    fourth = _joiner(tmp_path, members)
    policy = json.dumps({"ha-mode": "all", "ha-sync-mode": "automatic"})
    try:
        assert ctl(members[0], "set-policy", "ha-all", "^joined[.]", policy, "--apply-to", "queues").returncode == 0
        conn = pika.BlockingConnection(pika.URLParameters(members[0].url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("joined.q", durable=True)
        ch.basic_publish("", "joined.q", b"before", pika.BasicProperties(delivery_mode=2))
        conn.close()

        def four_running(m) -> bool:
            return sorted(ctl_json(m, "cluster-status")["running"]) == ["hare1", "hare2", "hare3", "hare4"]
        for round_ in range(2):
            launch([fourth])
            for m in (*members, fourth):
                wait_until(lambda m=m: four_running(m), timeout=30,
                           message=f"round {round_}: {m.name} does not count hare4:\n{m.log_tail()}")
            row = wait_until(lambda: next((r for r in ctl_json(fourth, "list-queues") if r["name"] == "joined.q"
                                           and "hare4" in (r.get("synchronised_mirrors") or [])), None),
                             timeout=30, message=f"round {round_}: hare4 never held a synchronised mirror")
            assert row["messages"] == 1
            if round_ == 0:     # a power cut: the others learn of hare4 from the log again, not their --peer lists
                for m in (*members, fourth):
                    m.kill9()
                launch([*members, fourth])
                for m in (*members, fourth):
                    wait_until(lambda m=m: four_running(m), timeout=30,
                               message=f"after a restart {m.name} does not count hare4:\n{m.log_tail()}")
            fourth.kill9()
            wait_until(lambda: ctl(members[1], "forget-node", "hare4").returncode == 0, timeout=20)
            assert "hare4" not in ctl_json(members[0], "cluster-status")["running"]
            shutil.rmtree(fourth.data_dir)
        conn = pika.BlockingConnection(pika.URLParameters(members[2].url))
        assert conn.channel().basic_get("joined.q", auto_ack=True)[2] == b"before"
        conn.close()
    finally:
        stop_cluster([*members, fourth])


def test_a_member_restarts_while_one_its_peer_list_lacks_leads(tmp_path):
    """A member's `--peer` list names the first three; the fourth joined through the log and
    now leads it. Killed and restarted on its data, the member hears of the fourth first from
    the fourth's appends, before it has applied the member.add that names it: it follows it and
    serves, instead of refusing the leader until its election timer goes and the cluster's
    leadership with it. The fourth is named hare0: a dead leader's successor stands by name."""
    members = plain_cluster(tmp_path)
    fourth = _joiner(tmp_path, members, "hare0")
    everyone = {m.name: m for m in (*members, fourth)}
    try:
        launch([fourth])

        def four_running(m) -> bool:
            return sorted(ctl_json(m, "cluster-status")["running"]) == sorted(everyone)
        for m in everyone.values():
            wait_until(lambda m=m: four_running(m), timeout=30, message=f"{m.name} does not count hare0")

        def leader_seen_by(m) -> str | None:
            status = ctl_json(m, "cluster-status")
            return status["leader"] if status["leader"] and status["majority"] else None
        for _ in range(8):          # depose leaders until the fourth leads (each restarted at once)
            leader = wait_until(lambda: leader_seen_by(fourth), timeout=30, message="no leader")
            if leader == "hare0":
                break
            everyone[leader].kill9()
            wait_until(lambda old=leader: leader_seen_by(fourth) not in (None, old), timeout=30,
                       message=f"no leader after {leader} was killed")
            launch([everyone[leader]])
            wait_until(lambda m=everyone[leader]: four_running(m), timeout=30,
                       message=f"{leader} does not count four after its restart:\n{everyone[leader].log_tail()}")
        assert leader_seen_by(fourth) == "hare0"
        restarted = members[2]
        restarted.kill9()
        launch([restarted])
        wait_until(lambda: leader_seen_by(restarted) == "hare0" and four_running(restarted), timeout=30,
                   message=f"hare3 does not follow hare0 after its restart:\n{restarted.log_tail()}")
        conn = pika.BlockingConnection(pika.URLParameters(restarted.url))
        ch = conn.channel()
        ch.confirm_delivery()
        ch.queue_declare("after.restart", durable=True)
        ch.basic_publish("", "after.restart", b"x", pika.BasicProperties(delivery_mode=2))
        conn.close()
    finally:
        stop_cluster(list(everyone.values()))


def test_a_joining_member_is_not_sent_away_by_a_member_behind_the_log(tmp_path):
    """hare2 is cut from the leader, hare1 (it still sees hare3), while hare4 joins: the other
    three commit its member.add and hare4 applies it, but hare2 has not. hare2 answers hare4's
    pings "not a member"; from a member that has not applied our member.add that says nothing,
    and hare4 stays. Healed, hare2 counts it too. Then the same for hare4 forgotten and joining
    again."""
    members, partition = proxied_cluster(tmp_path)
    by_name = {m.name: m for m in members}
    fourth = None
    try:
        for _ in range(3):     # hare1 leads: a dead leader's successor stands by name
            leader = wait_until(lambda: ctl_json(by_name["hare1"], "cluster-status")["leader"], timeout=30)
            if leader == "hare1":
                break
            by_name[leader].kill9()
            wait_until(lambda old=leader: ctl_json(by_name["hare1"], "cluster-status")["leader"] not in (None, old),
                       timeout=30)
            launch([by_name[leader]])
        assert ctl_json(by_name["hare1"], "cluster-status")["leader"] == "hare1"
        fourth = _joiner(tmp_path, members)
        for round_ in ("a first join", "a join after it was forgotten"):
            partition["bridge"]("hare2")
            wait_until(lambda: "hare2" not in ctl_json(by_name["hare1"], "cluster-status")["running"], timeout=30)
            launch([fourth])
            wait_until(lambda: "hare4" in ctl_json(by_name["hare3"], "cluster-status")["running"], timeout=30,
                       message=f"{round_}: hare4 never joined:\n{fourth.log_tail()}")
            time.sleep(3.0)      # hare4 pings hare2 all the while
            assert fourth.proc.poll() is None, f"{round_}: hare4 stopped:\n{fourth.log_tail()}"
            assert "hare4" not in ctl_json(by_name["hare2"], "cluster-status")["running"]
            partition["heal"]()
            wait_until(lambda: "hare4" in ctl_json(by_name["hare2"], "cluster-status")["running"], timeout=30,
                       message=f"{round_}: hare2 never counted hare4:\n{by_name['hare2'].log_tail()}")
            assert fourth.proc.poll() is None, f"{round_}: hare4 stopped:\n{fourth.log_tail()}"
            # forgotten: joining again on an empty disk, it replays its first member.add and the
            # forget before the member.add it asks for now
            fourth.kill9()
            wait_until(lambda: ctl(by_name["hare1"], "forget-node", "hare4").returncode == 0, timeout=20)
            shutil.rmtree(fourth.data_dir)
    finally:
        partition["close"]()
        stop_cluster([*members, *([fourth] if fourth else [])])
