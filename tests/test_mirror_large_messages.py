"""Mirror sync with messages whose batch of 1,000 would pass the channel's 256 MiB limit: the
sync is cut by bytes, so a restarted mirror of a queue of large messages gets back in sync."""
from __future__ import annotations

import pika
import pytest

from tests.clusters import control, mirror_every_queue
from tests.conftest import pika_conn, unique_name, wait_until

pytestmark = pytest.mark.cluster(failure_timeout=3.0)

COUNT = 300
BODY = b"m" * (1 << 20)      # 300 MiB in all


def _row(member, name):
    return next((r for r in control(member, "list_queues", local=True) if r["name"] == name), None)


def test_a_restarted_mirror_of_a_queue_of_large_messages_gets_back_in_sync(cluster):
    hare1, hare2, _hare3 = cluster
    mirror_every_queue(hare1)
    name = unique_name("large.sync")
    ch = pika_conn(hare1).channel()
    ch.queue_declare(name, durable=True)
    wait_until(lambda: sorted((_row(hare1, name) or {}).get("synchronised_mirrors") or []) == ["hare2", "hare3"],
               timeout=20)
    ch.confirm_delivery()
    for _ in range(COUNT):
        ch.basic_publish("", name, BODY, pika.BasicProperties(delivery_mode=2))
    hare2.kill9()
    hare2.start(timeout=60)
    wait_until(lambda: "hare2" in ((_row(hare1, name) or {}).get("synchronised_mirrors") or []), timeout=60,
               message="the restarted mirror never got back in sync:\n" + hare1.log_tail())
    assert _row(hare1, name)["messages"] == COUNT


HUNDRED_MIB = 100 << 20


@pytest.mark.xfail(strict=False, reason="open (issue 43): in one CI run of two the publisher stalled past 120 s "
                   "in the first publish; it passed in 18.7 s on its own")
def test_three_100_mib_messages_through_a_member_that_is_not_the_master(cluster):
    """Three 100 MiB messages published with confirms through hare2 to a queue mastered on hare1
    and mirrored on all three: each crosses a queue link and two mirror streams. Every one is
    confirmed, no member is counted down on the way (a node that stalls on one message past the
    failure timeout has its clients closed with 320), and a consumer on hare3 gets them whole."""
    hare1, hare2, hare3 = cluster
    mirror_every_queue(hare1)
    name = unique_name("large.remote")
    pika_conn(hare1).channel().queue_declare(name, durable=True)
    wait_until(lambda: sorted((_row(hare1, name) or {}).get("synchronised_mirrors") or []) == ["hare2", "hare3"],
               timeout=20)
    logged_before = {m.name: m.log_path.stat().st_size for m in cluster}
    conn = pika_conn(hare2, heartbeat=0)
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(3):
        ch.basic_publish("", name, bytes([65 + i]) * HUNDRED_MIB, pika.BasicProperties(delivery_mode=2))
    conn.close()
    for member in cluster:
        with open(member.log_path, "rb") as f:
            f.seek(logged_before[member.name])
            since = f.read().decode(errors="replace")
        assert "member down" not in since and "majority lost" not in since, since[-4000:]
    wait_until(lambda: (_row(hare1, name) or {}).get("messages") == 3, timeout=30)
    ch = pika_conn(hare3, heartbeat=0).channel()
    for i in range(3):
        _method, _props, body = ch.basic_get(name, auto_ack=True)
        assert body is not None and len(body) == HUNDRED_MIB and body[:1] == body[-1:] == bytes([65 + i])
