"""Bodies of queued persistent messages live on disk, not in memory: a million 1 KiB
messages queued keep the node's RSS under 400 MB, and a consumer drains them at full speed."""
from __future__ import annotations

import os
import threading
import time

import pytest
from pamqp import commands as spec

from tests.conftest import IS_REF, message_count, pika_conn, raw_socket

pytestmark = [pytest.mark.skipif(IS_REF, reason="reads the node process's memory"), pytest.mark.slow]

N = int(os.environ.get("HAREMQ_RSS_MESSAGES", "1000000"))
RSS_LIMIT_KB = 400 * 1024


def rss_kb(pid: int, field: str = "VmHWM") -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


@pytest.mark.timeout(480)     # a million confirmed publishes and a drain: minutes on a loaded machine
def test_million_persistent_messages_stay_on_disk(fresh_node):
    node = fresh_node
    q = "mem.million"
    c = pika_conn(node)
    c.channel().queue_declare(q, durable=True)
    c.close()      # idle through a publish that takes minutes on a loaded machine: its heartbeats would lapse
    pub = raw_socket(node)
    pub.open_channel(1)
    pub.rpc(spec.Confirm.Select(), 1, spec.Confirm.SelectOk)
    one = pub.publish_bytes(1, "", q, b"m" * 1024, spec.Basic.Properties(delivery_mode=2))
    batch = 500
    chunk = one * batch
    confirmed = 0
    sent = 0
    started = time.monotonic()
    while confirmed < N:
        # keep at most 4 batches unconfirmed (a confirm window of 2,000)
        while sent < N and sent - confirmed < 4 * batch:
            pub.send_bytes(chunk if N - sent >= batch else one * (N - sent))
            sent += min(batch, N - sent)
        _, frame = pub.recv_frame(timeout=30)
        if isinstance(frame, spec.Basic.Ack):
            confirmed = frame.delivery_tag if frame.multiple else max(confirmed, frame.delivery_tag)
        assert not isinstance(frame, spec.Basic.Nack), frame
    publish_s = time.monotonic() - started
    c = pika_conn(node)
    ch = c.channel()
    assert message_count(ch, q) == N
    peak_kb = rss_kb(node.proc.pid)
    assert peak_kb < RSS_LIMIT_KB, f"peak RSS {peak_kb // 1024} MB with {N} messages queued"

    # drain with one no-ack consumer on a raw socket, counting bytes, not parsing frames
    cons = raw_socket(node)
    cons.open_channel(1)
    cons.rpc(spec.Basic.Consume(queue=q, no_ack=True), 1, spec.Basic.ConsumeOk)
    started = time.monotonic()
    stop = threading.Event()

    def read_and_discard():
        cons.sock.settimeout(0.5)
        while not stop.is_set():
            try:
                if not cons.sock.recv(1 << 20):
                    return
            except OSError:
                continue

    reader = threading.Thread(target=read_and_discard, daemon=True)
    reader.start()
    deadline = time.monotonic() + 180
    while message_count(ch, q) and time.monotonic() < deadline:
        time.sleep(0.1)
    drain_s = time.monotonic() - started
    stop.set()
    reader.join(5)
    assert message_count(ch, q) == 0
    peak_kb = rss_kb(node.proc.pid)
    assert peak_kb < RSS_LIMIT_KB, f"peak RSS {peak_kb // 1024} MB while draining"
    print(f"\n{N} x 1 KiB persistent: published+confirmed in {publish_s:.1f} s "
          f"({N / publish_s:.0f}/s), drained in {drain_s:.1f} s ({N / drain_s:.0f}/s), "
          f"peak RSS {peak_kb // 1024} MB")
