"""Cluster foundation: three real nodes, membership over gRPC with the cluster secret,
failure detection, pause-minority under a partition, `haremq ctl` (MIR-5, ERR-3)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pika
import pytest

from tests.clusters import (SECRET, ClusterMember, control, ctl, ctl_json, launch, leader_and_term, queue_row)
from tests.conftest import IS_REF, free_port, port_open, wait_until

pytestmark = [pytest.mark.skipif(IS_REF, reason="starts and kills cluster node processes"),
              pytest.mark.cluster(failure_timeout=1.5)]


def test_cluster_status_lists_three_members_all_up(cluster):
    members = cluster
    status = wait_until(lambda: (lambda s: s if all(m["up"] for m in s["members"]) else None)(
        ctl_json(members[1], "cluster-status")), timeout=10)
    assert sorted(m["name"] for m in status["members"]) == ["hare1", "hare2", "hare3"]
    assert status["majority"] is True and status["paused"] is False
    human = ctl(members[0], "cluster-status")
    assert human.returncode == 0 and "hare3" in human.stdout


def test_list_queues_spans_the_cluster(cluster):
    members = cluster
    for m in members:
        c = pika.BlockingConnection(pika.URLParameters(m.url))
        c.channel().queue_declare(f"q.on.{m.name}", durable=True)
        c.close()
    rows = ctl_json(members[0], "list-queues")
    homes = {r["name"]: r["node"] for r in rows}
    assert homes == {"q.on.hare1": "hare1", "q.on.hare2": "hare2", "q.on.hare3": "hare3"}


def test_calls_without_the_secret_are_refused(cluster):
    from haremq.cluster.rpc import cluster_pb2 as pb
    from haremq.cluster.rpc import cluster_pb2_grpc as pbg
    members = cluster
    with grpc.insecure_channel(f"127.0.0.1:{members[0].cluster_port}") as channel:
        stub = pbg.ClusterStub(channel)
        for metadata in ((), (("x-haremq-secret", "wrong"),)):
            with pytest.raises(grpc.RpcError) as ei:
                stub.Control(pb.ControlRequest(command="cluster_status"), timeout=5, metadata=metadata)
            assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
        reply = stub.Control(pb.ControlRequest(command="cluster_status"), timeout=5,
                             metadata=(("x-haremq-secret", SECRET),))
        assert reply.ok
    bad = tempfile_secret(members[0].secret_file.parent)
    r = subprocess.run([sys.executable, "-m", "haremq.cluster.cli", "ctl", "--node", f"127.0.0.1:{members[0].cluster_port}",
                        "--cluster-secret-file", str(bad), "cluster-status"], capture_output=True, text=True,
                       timeout=20)
    assert r.returncode == 77 and "refused the cluster secret" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_stream_that_ends_before_its_first_message_is_answered_not_raised(cluster):
    """A member that dies as it opens a link or a mirror stream sends nothing: the handler ends
    the call cleanly (before, the link handler raised inside its generator, which grpc reported
    as UNKNOWN, or as a traceback when the caller was already gone)."""
    from haremq.cluster.rpc import cluster_pb2_grpc as pbg
    member = cluster[0]
    with grpc.insecure_channel(f"127.0.0.1:{member.cluster_port}") as channel:
        stub = pbg.ClusterStub(channel)
        md = (("x-haremq-secret", SECRET),)
        assert list(stub.QueueSession(iter([]), metadata=md, timeout=5)) == []
        assert list(stub.Mirror(iter([]), metadata=md, timeout=5)) == []
    assert "Traceback" not in member.log_text()


def test_a_follower_whose_raft_log_fails_stops_with_one_error_not_a_traceback_per_call(cluster):
    """Fail-stop: the append that fails is logged once, and the calls its peers make while it
    stops are answered UNAVAILABLE (before, each raised out of the servicer: a traceback each)."""
    wait_until(lambda: leader_and_term(cluster) is not None, timeout=15)
    leader_name, _term = leader_and_term(cluster)
    leader = next(m for m in cluster if m.name == leader_name)
    follower = next(m for m in cluster if m.name != leader_name)
    log = follower.data_dir / "raft" / "log.jsonl"
    log.rename(log.with_suffix(".old"))
    log.mkdir()                                # every append to its log fails from now on (EISDIR)
    connection = pika.BlockingConnection(pika.URLParameters(leader.url))
    channel = connection.channel()
    for i in range(5):                         # the majority is the other two: these succeed
        channel.queue_declare(f"raft.fail.{i}", durable=True)
    connection.close()
    assert follower.proc.wait(20) == 1
    text = follower.log_text()
    assert "raft storage failed: stopping the node" in text
    assert "Traceback" not in text and "raised by servicer method" not in text


def tempfile_secret(directory: Path) -> Path:
    path = directory / "wrong-secret"
    path.write_text("not-the-secret")
    return path


def test_killed_member_is_reported_down_and_survivors_serve(cluster):
    members = cluster
    members[2].kill9()
    wait_until(lambda: not next(m for m in ctl_json(members[0], "cluster-status")["members"]
                                if m["name"] == "hare3")["up"], timeout=10, message="hare3 never reported down")
    frame = ctl(members[0], "watch", "--once")
    assert frame.returncode == 0, frame.stderr
    hare3_row = next(line for line in frame.stdout.splitlines() if "hare3" in line)
    assert "down" in hare3_row
    for m in members[:2]:
        c = pika.BlockingConnection(pika.URLParameters(m.url))
        ch = c.channel()
        ch.queue_declare("still.here")
        ch.basic_publish("", "still.here", b"x")
        c.close()


def test_minority_side_pauses_and_resumes_after_healing(cluster):
    members, partition = cluster, cluster.partition
    hare1 = members[0]
    c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", hare1.port))
    closed = []
    partition["cut"]()
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not closed:
            try:
                c.process_data_events(time_limit=0.2)
            except pika.exceptions.ConnectionClosedByBroker as exc:
                closed.append(exc.reply_code)
        assert closed == [320], "the cut-off node did not close its AMQP connections with 320"
        wait_until(lambda: not port_open(hare1.port, 0.2), timeout=5, message="minority node still accepts AMQP")
        # the majority side keeps serving
        c2 = pika.BlockingConnection(pika.URLParameters(members[1].url))
        c2.channel().queue_declare("majority.side")
        c2.close()
    finally:
        partition["heal"]()
    wait_until(lambda: port_open(hare1.port, 0.2), timeout=15, message="hare1 did not resume after healing")
    pika.BlockingConnection(pika.URLParameters(hare1.url)).close()


@pytest.mark.parametrize("away", ["stopped", "partitioned"])
def test_a_returning_member_does_not_raise_the_term_while_the_leader_is_healthy(cluster, away):
    """A member that was stopped (SIGSTOP) or cut off, and comes back, must not call an election
    that deposes the leader the other two still follow (pre-vote, leader stickiness): the leader
    and the Raft term stay the same throughout, and the member follows that leader again."""
    members, partition = cluster, cluster.partition
    leader, term = wait_until(lambda: leader_and_term(members), timeout=15)
    if away == "stopped":
        returning = next(m for m in members if m.name != leader)
    else:
        returning = members[0]                   # the proxies cut hare1 off
        if leader == returning.name:             # let the other two elect one of themselves first
            returning.kill9()
            leader, term = wait_until(lambda: (lambda lt: lt if lt and lt[0] != returning.name else None)(
                leader_and_term(members[1:])), timeout=15)
            returning.start(timeout=60)
            wait_until(lambda: leader_and_term(members) == (leader, term), timeout=15)
    others = [m for m in members if m is not returning]
    pauses = returning.log_path.read_text().count("pausing:")
    if away == "stopped":
        os.killpg(returning.proc.pid, signal.SIGSTOP)
    else:
        partition["cut"]()
    try:
        time.sleep(4.0)      # past the failure timeout and several election timeouts
    finally:
        if away == "stopped":
            os.killpg(returning.proc.pid, signal.SIGCONT)
        else:
            partition["heal"]()
    back = time.monotonic()
    views, rejoined = set(), None
    while time.monotonic() < back + 4.0:
        statuses = {}
        for m in members:
            try:
                statuses[m.name] = control(m, "cluster_status", timeout=2.0)
            except grpc.RpcError:
                pass
        views.update((st["leader"], st["term"]) for n, st in statuses.items() if n != returning.name)
        own = statuses.get(returning.name)
        if rejoined is None and own and (own["leader"], own["term"]) == (leader, term) and all(
                n in statuses and next(r for r in statuses[n]["members"] if r["name"] == returning.name)["up"]
                for n in (m.name for m in others)):
            rejoined = time.monotonic() - back
        time.sleep(0.05)
    if away == "stopped":
        # the stopped process heard nobody while it did not run, which says nothing about the
        # others: it must not pause (and close its clients) as if it had lost the majority
        assert returning.log_path.read_text().count("pausing:") == pauses, returning.log_tail()
    print(f"\n{returning.name} {away} for 4 s: up again for the others, following {leader}, after "
          f"{rejoined if rejoined is None else round(rejoined, 2)} s; the others saw (leader, term) "
          f"{sorted(views, key=str)}, term {term} before")
    assert views == {(leader, term)}, "the leader changed or the term rose while a member came back"
    assert rejoined is not None, f"{returning.name} never rejoined under {leader}:\n{returning.log_tail()}"
    assert leader_and_term(members) == (leader, term)


def test_generated_grpc_modules_match_the_proto():
    pytest.importorskip("grpc_tools")
    r = subprocess.run([sys.executable, "-m", "haremq.cluster.rpc.generate", "--check"], capture_output=True, text=True,
                       cwd=str(Path(__file__).resolve().parent.parent), timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ctl_against_nothing_gives_one_line_error():
    port = free_port()
    r = subprocess.run([sys.executable, "-m", "haremq.cluster.cli", "ctl", "--node", f"127.0.0.1:{port}", "--timeout", "2",
                        "cluster-status"], capture_output=True, text=True, timeout=30,
                       cwd=str(Path(__file__).resolve().parent.parent), env=dict(os.environ,
                                                                                   HAREMQ_CLUSTER_SECRET="x"))
    assert r.returncode == 69  # rabbitmqctl: node unreachable
    assert len(r.stderr.strip().splitlines()) == 1 and "cannot reach" in r.stderr


# ---- any node serves any queue (MIR-7) and replicated metadata ------------------------------

def _chan(member, confirm=False, prefetch=None):
    c = pika.BlockingConnection(pika.URLParameters(member.url))
    ch = c.channel()
    if confirm:
        ch.confirm_delivery()
    if prefetch:
        ch.basic_qos(prefetch_count=prefetch)
    return c, ch


def _pump(connection, seconds):
    """Let a blocking connection take deliveries for `seconds`: for checks that nothing more comes."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        connection.process_data_events(0.05)


def test_queue_on_one_node_used_through_the_others(cluster):
    members = cluster
    hare1, hare2, hare3 = members
    c1, ch1 = _chan(hare1)
    ch1.queue_declare("mir7.q", durable=True)
    c2, ch2 = _chan(hare2, confirm=True)
    for i in range(300):
        ch2.basic_publish("", "mir7.q", str(i).encode(), properties=pika.BasicProperties(delivery_mode=2))
    assert ch1.queue_declare("mir7.q", passive=True).method.message_count == 300   # on its home
    c3, ch3 = _chan(hare3, prefetch=10)
    m, _, b = ch3.basic_get("mir7.q")
    assert (b, m.redelivered) == (b"0", False)
    ch3.basic_nack(m.delivery_tag, requeue=True)
    got, first_redelivered, max_unacked, unacked = [], None, 0, 0
    for method, _, body in ch3.consume("mir7.q", inactivity_timeout=5):
        assert method is not None, f"stalled after {len(got)}"
        if first_redelivered is None:
            first_redelivered = method.redelivered
        got.append(int(body))
        unacked += 1
        max_unacked = max(max_unacked, unacked)
        if len(got) % 5 == 0:
            ch3.basic_ack(method.delivery_tag, multiple=True)
            unacked = 0
        if len(got) == 300:
            break
    ch3.cancel()
    assert got == list(range(300))
    assert first_redelivered is True
    assert max_unacked <= 10, "prefetch not honoured through the remote link"
    assert ch1.queue_declare("mir7.q", passive=True).method.message_count == 0


def test_global_prefetch_caps_a_channel_consuming_queues_homed_elsewhere(cluster):
    # QOS-1: global=true caps the channel as a whole, wherever its queues live
    members = cluster
    hare1, hare2, hare3 = members
    for member in (hare1, hare3):
        _, ch = _chan(member)
        ch.queue_declare(f"qos.on.{member.name}")
        for i in range(20):
            ch.basic_publish("", f"qos.on.{member.name}", str(i).encode())
    c, ch = _chan(hare2)
    ch.basic_qos(prefetch_count=6, global_qos=True)
    got = []
    ch.basic_consume("qos.on.hare1", lambda _c, m, _p, b: got.append((m.consumer_tag, m.delivery_tag)))
    tag3 = ch.basic_consume("qos.on.hare3", lambda _c, m, _p, b: got.append((m.consumer_tag, m.delivery_tag)))
    _pump(c, 1.5)
    assert len(got) == 6, f"{len(got)} unacked deliveries under a global prefetch of 6"
    ch.basic_ack(got[1][1])                        # one place frees one delivery
    c.process_data_events(0.5)
    assert len(got) == 7
    ch.basic_cancel(tag3)                          # what waited for that consumer goes back home
    ch.basic_ack(got[-1][1], multiple=True)        # every place is free
    wait_until(lambda: c.process_data_events(0.05) or len(got) >= 13, timeout=5)
    c.process_data_events(0.5)
    assert len(got) == 13 and all(t != tag3 for t, _d in got[7:])
    _, ch3 = _chan(hare3)
    on_hare3 = sum(1 for t, _d in got if t == tag3)
    wait_until(lambda: ch3.queue_declare("qos.on.hare3", passive=True).method.message_count == 20 - on_hare3,
               timeout=5)
    c.close()


def test_per_message_expiration_through_another_node(cluster):
    # PUB: a message's own `expiration` works the same when published via a node that is not
    # the queue's home (it is checked there against the queue's x-message-ttl)
    members = cluster
    hare1, hare2, _ = members
    _, ch1 = _chan(hare1)
    ch1.queue_declare("exp.remote", arguments={"x-message-ttl": 60000})
    c, ch2 = _chan(hare2, confirm=True)
    ch2.basic_publish("", "exp.remote", b"stays", properties=pika.BasicProperties(expiration="60000"))
    ch2.basic_publish("", "exp.remote", b"goes", properties=pika.BasicProperties(expiration="200"))
    ch2.basic_publish("", "exp.remote", b"queue ttl")
    assert ch1.queue_declare("exp.remote", passive=True).method.message_count == 3
    m, _, body = ch1.basic_get("exp.remote", auto_ack=True)
    assert body == b"stays"
    time.sleep(0.5)                                  # "goes" is at the head now, and past its time
    m, _, body = ch1.basic_get("exp.remote", auto_ack=True)
    assert body == b"queue ttl"
    c.close()


def test_consumer_priority_through_another_node(cluster):
    # x-priority reaches the queue's home: the higher consumer takes everything it has room for
    members = cluster
    hare1, hare2, _ = members
    _, ch1 = _chan(hare1)
    ch1.queue_declare("prio.remote")
    c, ch = _chan(hare2, prefetch=10)
    got = {"low": [], "high": []}
    ch.basic_consume("prio.remote", lambda _c, m, _p, b: got["low"].append(b), arguments={"x-priority": 0})
    ch.basic_consume("prio.remote", lambda _c, m, _p, b: got["high"].append(b), arguments={"x-priority": 5})
    wait_until(lambda: ch1.queue_declare("prio.remote", passive=True).method.consumer_count == 2, timeout=5)
    for i in range(4):
        ch1.basic_publish("", "prio.remote", str(i).encode())
    wait_until(lambda: c.process_data_events(0.05) or len(got["low"]) + len(got["high"]) == 4, timeout=5)
    assert got == {"low": [], "high": [b"0", b"1", b"2", b"3"]}
    c.close()


def test_direct_reply_to_across_nodes(cluster):
    # RPC with amq.rabbitmq.reply-to: the requester on hare1, the server on hare2
    members = cluster
    hare1, hare2, _ = members
    cc, client = _chan(hare1)
    sc, server = _chan(hare2)
    server.queue_declare("rpc.requests")
    replies = []
    client.basic_consume("amq.rabbitmq.reply-to", lambda _c, m, p, b: replies.append((p.correlation_id, b)),
                         auto_ack=True)
    for i in range(3):
        client.basic_publish("", "rpc.requests", str(i).encode(),
                             pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id=f"c-{i}"))
    for _ in range(3):
        method, props, body = wait_until(lambda: (r := server.basic_get("rpc.requests", auto_ack=True))[0] and r,
                                         timeout=5)
        for part in range(100):                     # many replies to one request keep their order
            server.basic_publish("", props.reply_to, f"{body.decode()}.{part}".encode(),
                                 pika.BasicProperties(correlation_id=props.correlation_id))
    wait_until(lambda: cc.process_data_events(0.05) or len(replies) == 300, timeout=10)
    assert replies == [(f"c-{i}", f"{i}.{part}".encode()) for i in range(3) for part in range(100)]
    # a reply for a requester that is gone is dropped, and mandatory ones come back on its own node
    cc.close()
    server.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        server.basic_publish("", "amq.rabbitmq.reply-to.bm9uZQ.gone", b"late", mandatory=True)
    sc.close()


def test_queue_delete_conditions_through_another_node(cluster):
    # queue.delete if-empty / if-unused asked on a node that is not the home: the home's counts
    # decide, and a refused delete leaves the queue on every node
    members = cluster
    hare1, hare2, hare3 = members
    c1, ch1 = _chan(hare1)
    ch1.queue_declare("del.remote")
    ch1.basic_publish("", "del.remote", b"x")
    ch1.basic_publish("", "del.remote", b"y")
    for if_empty, if_unused, text in ((True, False, "not empty"), (False, True, "in use")):
        if if_unused:
            ch1.basic_consume("del.remote", lambda *a: None)
        _, ch2 = _chan(hare2)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
            ch2.queue_delete("del.remote", if_empty=if_empty, if_unused=if_unused)
        assert (ei.value.reply_code, ei.value.reply_text) == (
            406, f"PRECONDITION_FAILED - queue 'del.remote' in vhost '/' {text}")
        for member in members:
            assert any(r["name"] == "del.remote" for r in ctl_json(member, "list-queues")), member.name
    c1.close()
    _, ch3 = _chan(hare3)
    wait_until(lambda: ch3.queue_declare("del.remote", passive=True).method.consumer_count == 0, timeout=5)
    assert ch3.queue_delete("del.remote", if_unused=True).method.message_count == 2
    for member in members:
        assert not any(r["name"] == "del.remote" for r in ctl_json(member, "list-queues")), member.name


def test_forget_node_removes_a_dead_member_for_good(cluster):
    # ctl forget-node: refused for a member that is up; for a dead one, every member (and one
    # that restarts later) forgets it, and its unmirrored queues go, as in RabbitMQ
    members = cluster
    hare1, hare2, hare3 = members

    def ch_for(name):
        return _chan(next(m for m in members if m.name == name))[1]
    _, ch3 = _chan(hare3, confirm=True)
    ch3.queue_declare("fg.plain", durable=True)
    r = ctl(hare1, "set-policy", "ha", r"^fg\.ha", json.dumps({"ha-mode": "all", "ha-sync-mode": "automatic"}),
            "--apply-to", "queues")
    assert r.returncode == 0, r.stderr
    ch3.queue_declare("fg.ha", durable=True)
    wait_until(lambda: sorted((queue_row(hare1, "fg.ha") or {}).get("synchronised_mirrors") or [])
               == ["hare1", "hare2"], timeout=10)
    for i in range(3):
        ch3.basic_publish("", "fg.ha", str(i).encode(), properties=pika.BasicProperties(delivery_mode=2))
    r = ctl(hare1, "forget-node", "hare3")
    assert r.returncode != 0 and "is up" in r.stderr
    r = ctl(hare1, "forget-node", "hare9")
    assert r.returncode != 0 and "not a member" in r.stderr
    hare3.kill9()
    wait_until(lambda: not next(m for m in ctl_json(hare1, "cluster-status")["members"]
                                if m["name"] == "hare3")["up"], timeout=10)
    r = ctl(hare1, "forget-node", "hare3")
    assert r.returncode == 0, r.stderr
    for member in (hare1, hare2):
        status = ctl_json(member, "cluster-status")
        assert sorted(m["name"] for m in status["members"]) == ["hare1", "hare2"], member.name
        assert not any(q["name"] == "fg.plain" for q in ctl_json(member, "list-queues")), member.name
    # the mirrored one failed over, and its mirrors are placed on the two left
    row = wait_until(lambda: (lambda r: r if r and r["master"] != "hare3" and "hare3" not in (r["mirrors"] or [])
                              else None)(queue_row(hare1, "fg.ha")), timeout=15)
    assert sorted([row["master"], *row["mirrors"]]) == ["hare1", "hare2"]
    assert ch_for(row["master"]).queue_declare("fg.ha", passive=True).method.message_count == 3
    hare2.kill9()
    hare2.start()
    wait_until(lambda: ctl_json(hare2, "cluster-status")["majority"], timeout=20)
    assert sorted(m["name"] for m in ctl_json(hare2, "cluster-status")["members"]) == ["hare1", "hare2"]
    _, ch2 = _chan(hare2)
    ch2.queue_declare("fg.after", durable=True)      # the two of them are a working cluster
    # the forgotten node started again on its old data stops, saying why, and disturbs no one
    leader = ctl_json(hare1, "cluster-status")["leader"]
    try:
        hare3.start()
    except RuntimeError:
        pass                                          # it may stop before its AMQP port opens
    wait_until(lambda: hare3.proc.poll() is not None, timeout=20, message="the forgotten node kept running")
    assert hare3.proc.returncode == 1
    assert "removed from the cluster" in hare3.log_tail()
    assert ctl_json(hare1, "cluster-status")["leader"] == leader
    for member in (hare1, hare2):     # nothing went on pinging the forgotten member's closed channel
        assert "background task failed" not in member.log_text(), member.name


def test_exclusive_consumer_conflicts_through_another_node_fail_the_consume(cluster):
    # basic.consume via a node that is not the home: consume-ok only once the home has the
    # consumer, so an exclusive-use conflict there fails the consume itself (403)
    members = cluster
    hare1, hare2, _ = members
    _, ch1 = _chan(hare1)
    ch1.queue_declare("excl.cons")
    ch1.basic_consume("excl.cons", lambda *a: None)
    for exclusive in (True, False):
        if not exclusive:
            c1, other = _chan(hare1)
            other.queue_declare("excl.cons2")
            other.basic_consume("excl.cons2", lambda *a: None, exclusive=True)
        _, ch2 = _chan(hare2)
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
            ch2.basic_consume("excl.cons" if exclusive else "excl.cons2", lambda *a: None, exclusive=exclusive)
        assert ei.value.reply_code == 403 and "in exclusive use" in ei.value.reply_text
    c, ch2 = _chan(hare2)
    ch2.basic_consume("excl.cons", lambda *a: None)        # a plain consumer is fine
    assert ch1.queue_declare("excl.cons", passive=True).method.consumer_count == 2   # at consume-ok already


def test_raising_a_global_prefetch_reaches_consumers_of_queues_homed_elsewhere(cluster):
    # QOS-4: a new prefetch applies to consumers that already exist, wherever their queue lives
    members = cluster
    hare1, hare2, _ = members
    _, ch1 = _chan(hare1)
    ch1.queue_declare("qos.raise")
    for i in range(20):
        ch1.basic_publish("", "qos.raise", str(i).encode())
    c, ch = _chan(hare2)
    ch.basic_qos(prefetch_count=2, global_qos=True)
    got = []
    ch.basic_consume("qos.raise", lambda _c, m, _p, b: got.append(b))
    _pump(c, 0.8)
    assert len(got) == 2
    ch.basic_qos(prefetch_count=5, global_qos=True)
    _pump(c, 0.8)
    assert len(got) == 5
    c.close()


def test_unacked_remote_deliveries_requeue_when_the_client_goes(cluster):
    members = cluster
    hare1, hare2, _ = members
    c1, ch1 = _chan(hare1)
    ch1.queue_declare("mir7.requeue")
    for i in range(5):
        ch1.basic_publish("", "mir7.requeue", str(i).encode())
    c2, ch2 = _chan(hare2)
    taken = [ch2.basic_get("mir7.requeue")[2] for _ in range(3)]
    assert taken == [b"0", b"1", b"2"]
    c2.close()
    wait_until(lambda: ch1.queue_declare("mir7.requeue", passive=True).method.message_count == 5, timeout=5)
    m, _, b = ch1.basic_get("mir7.requeue", auto_ack=True)
    assert (b, m.redelivered) == (b"0", True)


def test_exchanges_and_bindings_are_replicated(cluster):
    members = cluster
    hare1, hare2, hare3 = members
    _, ch3 = _chan(hare3)
    ch3.exchange_declare("mir7.topic", "topic", durable=True)
    _, ch2 = _chan(hare2)
    ch2.queue_declare("mir7.bound")
    ch2.queue_bind("mir7.bound", "mir7.topic", "a.#")
    _, ch1 = _chan(hare1, confirm=True)
    ch1.basic_publish("mir7.topic", "a.b.c", b"routed", mandatory=True)
    with pytest.raises(pika.exceptions.UnroutableError):
        ch1.basic_publish("mir7.topic", "z.b", b"nowhere", mandatory=True)
    m, _, b = ch2.basic_get("mir7.bound", auto_ack=True)
    assert b == b"routed"
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch3.queue_declare("mir7.bound", durable=True)      # inequivalent, decided by the cluster
    assert ei.value.reply_code == 406


def test_home_node_down_then_rejoins_with_its_durable_queues(cluster):
    members = cluster
    hare1, hare2, hare3 = members
    _, ch1 = _chan(hare1)
    ch1.queue_declare("mir7.durable", durable=True)
    ch1.queue_declare("mir7.transient")
    _, ch2 = _chan(hare2, confirm=True)
    for i in range(100):
        ch2.basic_publish("", "mir7.durable", str(i).encode(), properties=pika.BasicProperties(delivery_mode=2))
    hare1.kill9()
    time.sleep(2)
    _, ch3 = _chan(hare3)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        ch3.basic_get("mir7.durable")
    assert ei.value.reply_code == 404 and "down" in ei.value.reply_text
    rows = {r["name"]: r for r in ctl_json(hare2, "list-queues")}
    assert rows["mir7.durable"]["node"] == "hare1" and rows["mir7.durable"]["state"] == "down"
    hare1.start()
    wait_until(lambda: next(m for m in ctl_json(hare3, "cluster-status")["members"] if m["name"] == "hare1")["up"],
               timeout=10, message="hare3 never saw hare1 come back")
    _, ch3 = _chan(hare3)
    bodies = []
    while True:
        m, _, b = ch3.basic_get("mir7.durable", auto_ack=True)
        if m is None:
            break
        bodies.append(int(b))
    assert bodies == list(range(100))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
        _chan(hare2)[1].queue_declare("mir7.transient", passive=True)
    assert ei.value.reply_code == 404


def test_users_and_permissions_made_with_ctl_work_on_every_node(cluster):
    members = cluster
    for args in (("add-vhost", "mir7v"), ("add-user", "carol", "pw"),
                 ("set-permissions", "-p", "mir7v", "carol", "^carol\\.", ".*", ".*")):
        r = ctl(members[0], *args)
        assert r.returncode == 0, r.stderr
    for m in members:
        url = f"amqp://carol:pw@127.0.0.1:{m.port}/mir7v"
        c = pika.BlockingConnection(pika.URLParameters(url))
        ch = c.channel()
        ch.queue_declare(f"carol.{m.name}")
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as ei:
            ch.queue_declare(f"dave.{m.name}")
        assert ei.value.reply_code == 403
    # admin calls run by an allow-list of names, never any Broker attribute a request names
    from haremq.cluster.rpc import cluster_pb2 as pb
    from haremq.cluster.rpc import cluster_pb2_grpc as pbg
    with grpc.insecure_channel(f"127.0.0.1:{members[1].cluster_port}") as channel:
        for method, read in (("restore", False), ("_snapshot", True), ("add_user", True)):
            arguments = json.dumps({"method": method, "args": [], "read": read}).encode()
            reply = pbg.ClusterStub(channel).Control(pb.ControlRequest(command="broker_call", arguments=arguments),
                                                     timeout=5, metadata=(("x-haremq-secret", SECRET),))
            assert not reply.ok and f"does not support '{method}'" in reply.error


def test_cluster_port_with_mutual_tls(tmp_path):
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    files = {"cert": tmp_path / "member.pem", "key": tmp_path / "member.key", "ca": tmp_path / "ca.pem"}
    cert.cert_chain_pems[0].write_to_path(str(files["cert"]))
    cert.private_key_pem.write_to_path(str(files["key"]))
    ca.cert_pem.write_to_path(str(files["ca"]))
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET)
    ports = {n: free_port() for n in ("hare1", "hare2", "hare3")}
    tls_args = ["--cluster-tls-cert", str(files["cert"]), "--cluster-tls-key", str(files["key"]),
                "--cluster-tls-ca", str(files["ca"])]

    class TLSMember(ClusterMember):
        def argv(self):
            return super().argv() + tls_args

    # peers by name: a node dials the address the name resolves to and checks the certificate
    # against the name
    members = [TLSMember(n, tmp_path / n, ports[n],
                         {o: f"localhost:{ports[o]}" for o in ports if o != n}, secret_file) for n in ports]
    try:
        launch(members)
        r = ctl(members[0], "--tls-cert", str(files["cert"]), "--tls-key", str(files["key"]),
                "--tls-ca", str(files["ca"]), "cluster-status", "--json")
        assert r.returncode == 0, r.stderr
        assert all(m["up"] for m in json.loads(r.stdout)["members"])
        plain = ctl(members[0], "--timeout", "3", "cluster-status")
        assert plain.returncode == 69 and len(plain.stderr.strip().splitlines()) == 1
        c = pika.BlockingConnection(pika.URLParameters(members[1].url))
        c.channel().queue_declare("over.tls")
        c.close()
    finally:
        for m in members:
            m.kill9()


def test_dead_letters_and_auto_delete_across_nodes(cluster):
    members = cluster
    hare1, hare2, hare3 = members
    _, ch2 = _chan(hare2)
    ch2.queue_declare("mir7.dlq")                               # homed on hare2
    _, ch1 = _chan(hare1)
    ch1.queue_declare("mir7.src", arguments={"x-dead-letter-exchange": "",
                                             "x-dead-letter-routing-key": "mir7.dlq"})
    ch1.basic_publish("", "mir7.src", b"dead")
    m, _, _ = ch1.basic_get("mir7.src")
    ch1.basic_reject(m.delivery_tag, requeue=False)
    got = wait_until(lambda: ch2.basic_get("mir7.dlq", auto_ack=True)[2], timeout=5,
                     message="dead letter never reached the queue on another node")
    assert got == b"dead"
    # an auto-delete queue on hare3 goes away everywhere when its last consumer leaves
    c3, ch3 = _chan(hare3)
    ch3.queue_declare("mir7.auto", auto_delete=True)
    tag = ch3.basic_consume("mir7.auto", lambda *a: None)
    ch3.basic_cancel(tag)

    def gone_on_hare1():
        try:
            _chan(hare1)[1].queue_declare("mir7.auto", passive=True)
            return False
        except pika.exceptions.ChannelClosedByBroker as exc:
            return exc.reply_code == 404
    wait_until(gone_on_hare1, timeout=5, message="auto-delete queue still known on hare1")


def test_metadata_changes_go_on_after_the_leader_dies(cluster):
    members = cluster
    leader = wait_until(lambda: ctl_json(members[0], "cluster-status")["leader"], timeout=10)
    victim = next(m for m in members if m.name == leader)
    survivors = [m for m in members if m is not victim]
    victim.kill9()
    for m in survivors:      # an election happens meanwhile; the declare waits for it
        c, ch = _chan(m)
        ch.queue_declare(f"after.leader.{m.name}", durable=True)
        c.close()
    new_leader = wait_until(lambda: ctl_json(survivors[0], "cluster-status")["leader"], timeout=10)
    assert new_leader in {m.name for m in survivors}


def test_publisher_gets_nacks_not_a_closed_channel_when_a_home_dies(cluster):
    # CONF-5 across nodes: a publish the broker cannot take responsibility for is nacked
    members = cluster
    hare1, hare2, _ = members
    _, ch1 = _chan(hare1)
    ch1.queue_declare("home.dies", durable=True)
    _, ch2 = _chan(hare2)
    ch2.queue_declare("home.stays")
    c, pub = _chan(hare2, confirm=True)
    pub.basic_publish("", "home.dies", b"before", properties=pika.BasicProperties(delivery_mode=2))
    hare1.kill9()
    wait_until(lambda: not next(m for m in ctl_json(hare2, "cluster-status")["members"]
                                if m["name"] == "hare1")["up"], timeout=10)
    with pytest.raises(pika.exceptions.NackError):
        pub.basic_publish("", "home.dies", b"while down", properties=pika.BasicProperties(delivery_mode=2))
    pub.basic_publish("", "home.stays", b"still fine")             # the same channel goes on
    assert ch2.queue_declare("home.stays", passive=True).method.message_count == 1


def test_a_publish_while_the_home_looks_down_for_a_moment_is_confirmed(cluster):
    # a member the others did not hear from for a moment (paused, starved, just started) is
    # no dead home: a publish to its unmirrored queue waits the blip out instead of a nack
    hare1, hare2, hare3 = cluster
    _, ch3 = _chan(hare3)
    ch3.queue_declare("home.blips", durable=True)
    c, pub = _chan(hare2, confirm=True)
    os.kill(hare3.proc.pid, signal.SIGSTOP)
    try:
        wait_until(lambda: not next(m for m in ctl_json(hare2, "cluster-status")["members"]
                                    if m["name"] == "hare3")["up"], timeout=15)
    finally:
        os.kill(hare3.proc.pid, signal.SIGCONT)
    pub.basic_publish("", "home.blips", b"during the blip", properties=pika.BasicProperties(delivery_mode=2))
    _, ch3 = _chan(hare3)
    assert ch3.basic_get("home.blips", auto_ack=True)[2] == b"during the blip"


def test_tx_commit_through_another_node_survives_a_kill_of_each_home(cluster):
    # CONF-8: commit-ok means durable on every home node, so a kill -9 right after loses nothing
    members = cluster
    hare1, hare2, hare3 = members
    for member in members:
        _, ch = _chan(member)
        ch.queue_declare(f"tx.on.{member.name}", durable=True)
    c, ch = _chan(hare2)
    ch.exchange_declare("tx.fan", "fanout", durable=True)
    for member in members:
        ch.queue_bind(f"tx.on.{member.name}", "tx.fan")
    ch.tx_select()
    for i in range(50):
        ch.basic_publish("tx.fan", "", str(i).encode(), properties=pika.BasicProperties(delivery_mode=2))
    ch.tx_commit()
    c.close()
    hare1.kill9()
    hare3.kill9()             # hare2 alone pauses (pause-minority) until they are back
    hare1.start()
    hare3.start()
    for member in (hare1, hare3):
        wait_until(lambda m=member: next(x for x in ctl_json(hare2, "cluster-status")["members"]
                                         if x["name"] == m.name)["up"], timeout=15)
    for member in members:
        _, ch = _chan(member)
        got = []
        while True:
            m, _, b = ch.basic_get(f"tx.on.{member.name}", auto_ack=True)
            if m is None:
                break
            got.append(int(b))
        assert got == list(range(50)), member.name


def test_purge_from_another_node(cluster):
    members = cluster
    hare1, hare2, _ = members
    _, ch1 = _chan(hare1)
    ch1.queue_declare("purge.me")
    for _ in range(7):
        ch1.basic_publish("", "purge.me", b"x")
    _, ch2 = _chan(hare2)
    assert ch2.queue_purge("purge.me").method.message_count == 7
    assert ch1.queue_declare("purge.me", passive=True).method.message_count == 0


def test_passive_declare_via_another_node_reports_the_home_counts(cluster):
    members = cluster
    hare1, _, hare3 = members
    _, ch1 = _chan(hare1)
    ch1.queue_declare("counted")
    ch1.basic_consume("counted", lambda *a: None)
    _, ch3 = _chan(hare3)
    for _ in range(3):
        ch3.basic_publish("", "counted", b"x")
    ok = ch3.queue_declare("counted", passive=True).method
    assert ok.consumer_count == 1
    ok2 = ch3.queue_declare("counted").method        # an equivalent redeclare, through the cluster
    assert ok2.consumer_count == 1


# ---- Raft's election rules, in-process (no nodes: the rules a returning member is held to) ----------
class _Members:
    """What Raft asks of membership, as plain state: which peers are up (as last seen) and which
    are truly alive (what pinging one now finds), and the majority."""

    def __init__(self, peers):
        self.peers = {p: object() for p in peers}
        self.up = set(peers)
        self.alive = set(peers)
        self.pinged = []

    size = property(lambda self: len(self.peers) + 1)
    has_majority = property(lambda self: (len(self.up) + 1) * 2 > self.size)

    def is_up(self, name):
        return name in self.up

    def probe(self, name):
        pass

    async def reachable(self, name):
        self.pinged.append(name)
        if name not in self.alive:
            self.up.discard(name)
        return name in self.alive


def test_pre_vote_and_leader_stickiness_keep_the_term(tmp_path):
    import asyncio

    from haremq.cluster.raft.shell import ELECTION_MIN, Raft, RaftStorage
    from haremq.cluster.rpc import cluster_pb2 as pb

    async def scenario():
        members = _Members(["hare1", "hare3"])
        raft = Raft("hare2", members, RaftStorage(tmp_path / "raft"), lambda i, c: None)
        raft.storage.term = 5
        await raft.on_append_entries(pb.AppendRequest(term=5, leader="hare1", prev_log_index=0))
        assert raft.leader == "hare1" and raft.hears_from_leader()

        def ask(term, pre_vote):
            return raft.on_request_vote(pb.VoteRequest(term=term, candidate="hare3", pre_vote=pre_vote))
        # hare3 comes back while hare1 leads: neither a pre-vote nor a real vote is granted,
        # and the term stays
        for pre_vote in (True, False):
            reply = await ask(6, pre_vote)
            assert not reply.granted and reply.term == 5 and raft.term == 5 and raft.storage.voted_for is None
        assert members.pinged == ["hare1"]     # a pre-vote has the leader checked at once
        # the leader has just died, unnoticed so far: the pre-vote's ping finds it gone
        members.alive.discard("hare1")
        reply = await ask(6, True)
        assert reply.granted and raft.term == 5 and raft.storage.voted_for is None   # a pre-vote changes nothing
        assert members.pinged == ["hare1", "hare1"] and not members.is_up("hare1")
        assert not (await ask(5, True)).granted        # a pre-vote must be for a later term
        reply = await ask(6, False)
        assert reply.granted and raft.term == 6 and raft.storage.voted_for == "hare3"
        # the new leader is followed; once silent for the minimum election timeout, it is not
        members.up.add("hare3")
        await raft.on_append_entries(pb.AppendRequest(term=6, leader="hare3", prev_log_index=0))
        assert raft.hears_from_leader()
        raft.machine.leader_heard -= ELECTION_MIN
        assert not raft.hears_from_leader()
        # a leader counts as heard from while it sees a majority, and no longer without one
        raft.machine.role = "leader"
        assert raft.hears_from_leader()
        members.up.clear()
        assert not raft.hears_from_leader()
    asyncio.run(scenario())
