"""Each client library the README names declares a quorum queue with its own API (pika, aio-pika,
Celery's kombu with `x-queue-type`, amqplib through Node.js) on a three-node cluster with no
policy, and then, as an application written for RabbitMQ's quorum queues expects:

- a poison message that its consumer keeps returning is dead-lettered after x-delivery-limit
  returns (reason `delivery_limit`), each redelivery carrying x-delivery-count;
- the leader's node is SIGKILLed under confirmed load: no confirmed message is lost, the
  publisher's confirms resume on the new leader, and the consumer (on another node) carries on
  without consuming again; every redelivery it gets carries x-delivery-count.

The publisher is on hare2, the consumer on hare3, the queue is declared through hare1 (its
leader: the declaring node first), which is killed once a share of the load is confirmed."""
from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import threading
import time

import pika
import pytest

from tests.clusters import queue_row
from tests.conftest import IS_REF, PROJECT_ROOT, unique_name, wait_until

TOTAL = 300           # confirmed messages each publisher sends
KILL_AT = 100         # the leader's node is killed once this many are confirmed
LIMIT = 2             # x-delivery-limit of the queue: the poison message is delivered LIMIT + 1 times
POISON = b"poison"
JS_DIR = PROJECT_ROOT / "tests" / "js"
NODE = shutil.which("node")

pytestmark = [pytest.mark.skipif(IS_REF, reason="starts and kills cluster node processes"),
              pytest.mark.timeout(300),     # a failover and a restart each, on a shared machine
              pytest.mark.cluster(management=True, shared=True)]


def quorum_arguments(dead: str) -> dict:
    return {"x-queue-type": "quorum", "x-delivery-limit": LIMIT, "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dead}


class Seen:
    """What a consumer got: (body, redelivered, x-delivery-count), from any thread."""

    def __init__(self):
        self.lock = threading.Lock()
        self.rows: list[tuple[bytes, bool, int | None]] = []

    def add(self, body: bytes, redelivered: bool, headers: dict | None) -> None:
        count = (headers or {}).get("x-delivery-count")
        with self.lock:
            self.rows.append((bytes(body), bool(redelivered), count))

    def bodies(self) -> set:
        with self.lock:
            return {row[0] for row in self.rows}

    def snapshot(self) -> list:
        with self.lock:
            return list(self.rows)


class Run:
    """One client's run: names, the cluster, and the checks every client must pass."""

    def __init__(self, cluster, client: str):
        self.hare1, self.hare2, self.hare3 = cluster
        self.name, self.dead = unique_name(f"qq.{client}"), unique_name(f"qq.{client}.dead")
        self.seen = Seen()
        self.confirmed: list[bytes] = []
        self.killed_at = 0.0
        self.first_confirm_after_kill = 0.0

    def led_by_hare1(self) -> None:
        row = wait_until(lambda: (lambda r: r if r and sorted(r["synchronised_mirrors"] or []) == ["hare2", "hare3"]
                                  else None)(queue_row(self.hare2, self.name)), timeout=30,
                         message="the quorum queue never had two synchronised followers")
        assert (row["type"], row["leader"], row["members"]) == ("quorum", "hare1", ["hare1", "hare2", "hare3"])

    def kill_leader(self) -> None:
        self.hare1.kill9()
        self.killed_at = time.monotonic()

    def note_confirm(self, body: bytes) -> None:
        self.confirmed.append(body)
        if self.killed_at and not self.first_confirm_after_kill:
            self.first_confirm_after_kill = time.monotonic()

    def poison_dead_lettered(self) -> None:
        """The poison message: delivered LIMIT + 1 times, then in the dead-letter queue."""
        def dead_letter():
            with pika.BlockingConnection(pika.URLParameters(self.hare2.url)) as conn:
                method, props, body = conn.channel().basic_get(self.dead, auto_ack=True)
                return (props, body) if method is not None else None
        props, body = wait_until(dead_letter, timeout=30, message="the poison message was never dead-lettered")
        assert body == POISON
        death = props.headers["x-death"][0]
        assert (death["reason"], death["queue"], death["count"]) == ("delivery_limit", self.name, 1)
        counts = [count for body, _redelivered, count in self.seen.snapshot() if body == POISON]
        assert counts == [None, *range(1, LIMIT + 1)]

    def nothing_confirmed_lost(self) -> None:
        assert len(set(self.confirmed)) == TOTAL
        wait_until(lambda: not set(self.confirmed) - self.seen.bodies(), timeout=60,
                   message="some confirmed messages never reached the consumer")
        rows = self.seen.snapshot()
        redelivered = [row for row in rows if row[1]]
        assert all(count is not None and count >= 1 for _body, _r, count in redelivered), \
            [row for row in redelivered if row[2] is None][:5]
        after = [row for row in rows if row[0] not in (POISON,) and int(row[0]) >= KILL_AT]
        assert after, "the consumer got nothing published after the leader's death"
        print(f"confirms resumed {self.first_confirm_after_kill - self.killed_at:.2f} s after the SIGKILL; "
              f"{len(redelivered)} redeliveries, {len(rows)} deliveries")

    def restart(self) -> None:
        self.hare1.start(timeout=60)


@pytest.fixture
def run_for(cluster):
    runs = []

    def make(client: str) -> Run:
        runs.append(Run(cluster, client))
        return runs[-1]
    yield make
    for run in runs:
        if run.hare1.proc is None or run.hare1.proc.poll() is not None:
            run.restart()


# ---- pika ----------------------------------------------------------------------------------------------

def test_pika(run_for):
    run = run_for("pika")
    with pika.BlockingConnection(pika.URLParameters(run.hare1.url)) as conn:
        ch = conn.channel()
        ch.queue_declare(run.dead, durable=True, arguments={"x-queue-type": "quorum"})
        ch.queue_declare(run.name, durable=True, arguments=quorum_arguments(run.dead))
    run.led_by_hare1()

    consumer_conn = pika.BlockingConnection(pika.URLParameters(run.hare3.url))
    consumer_ch = consumer_conn.channel()
    consumer_ch.basic_qos(prefetch_count=20)

    def on_message(ch, method, props, body):
        run.seen.add(body, method.redelivered, props.headers)
        if body == POISON:
            ch.basic_nack(method.delivery_tag, requeue=True)
        else:
            ch.basic_ack(method.delivery_tag)
    consumer_ch.basic_consume(run.name, on_message)
    consuming = threading.Thread(target=consumer_ch.start_consuming, daemon=True)
    consuming.start()
    try:
        with pika.BlockingConnection(pika.URLParameters(run.hare2.url)) as conn:
            ch = conn.channel()
            ch.confirm_delivery()
            ch.basic_publish("", run.name, POISON)
            run.poison_dead_lettered()
            for i in range(TOTAL):
                body = b"%d" % i
                while True:
                    try:
                        ch.basic_publish("", run.name, body, pika.BasicProperties(delivery_mode=2))
                        break
                    except pika.exceptions.NackError:
                        continue     # not confirmed: send it again
                run.note_confirm(body)
                if len(run.confirmed) == KILL_AT:
                    run.kill_leader()
        run.nothing_confirmed_lost()
        assert consuming.is_alive(), "the consumer stopped"
    finally:
        consumer_conn.add_callback_threadsafe(consumer_ch.stop_consuming)
        consuming.join(10)
        consumer_conn.close()


# ---- aio-pika --------------------------------------------------------------------------------------------

def test_aio_pika(run_for):
    import aio_pika
    run = run_for("aiopika")

    async def main():
        async with await aio_pika.connect(run.hare1.url) as conn:
            ch = await conn.channel()
            await ch.declare_queue(run.dead, durable=True, arguments={"x-queue-type": "quorum"})
            await ch.declare_queue(run.name, durable=True, arguments=quorum_arguments(run.dead))
        await asyncio.get_running_loop().run_in_executor(None, run.led_by_hare1)
        async with await aio_pika.connect(run.hare3.url) as consumer_conn, \
                await aio_pika.connect(run.hare2.url) as publisher_conn:
            consumer_ch = await consumer_conn.channel()
            await consumer_ch.set_qos(prefetch_count=20)
            queue = await consumer_ch.get_queue(run.name, ensure=False)

            async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                run.seen.add(message.body, message.redelivered, message.headers)
                if message.body == POISON:
                    await message.nack(requeue=True)
                else:
                    await message.ack()
            tag = await queue.consume(on_message)
            ch = await publisher_conn.channel(publisher_confirms=True)
            await ch.default_exchange.publish(aio_pika.Message(POISON), run.name)
            await asyncio.get_running_loop().run_in_executor(None, run.poison_dead_lettered)
            for i in range(TOTAL):
                body = b"%d" % i
                while True:
                    try:
                        await ch.default_exchange.publish(
                            aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), run.name)
                        break
                    except aio_pika.exceptions.DeliveryError:
                        continue
                run.note_confirm(body)
                if len(run.confirmed) == KILL_AT:
                    run.kill_leader()
            await asyncio.get_running_loop().run_in_executor(None, run.nothing_confirmed_lost)
            assert not consumer_ch.is_closed, "the consumer's channel closed"
            await queue.cancel(tag)
    asyncio.run(asyncio.wait_for(main(), 300))


# ---- Celery's kombu ------------------------------------------------------------------------------------------

def test_kombu(run_for):
    import kombu
    from amqp.exceptions import MessageNacked
    run = run_for("kombu")
    exchange = kombu.Exchange("", type="direct")
    queue = kombu.Queue(run.name, exchange, routing_key=run.name, durable=True,
                        queue_arguments=quorum_arguments(run.dead))
    dead = kombu.Queue(run.dead, exchange, routing_key=run.dead, durable=True,
                       queue_arguments={"x-queue-type": "quorum"})
    with kombu.Connection(run.hare1.url) as conn:
        dead(conn.default_channel).declare()
        queue(conn.default_channel).declare()
    run.led_by_hare1()

    stop = threading.Event()
    failures: list[BaseException] = []

    def consume():
        try:
            with kombu.Connection(run.hare3.url) as conn:
                def on_message(message):
                    run.seen.add(message.body, message.delivery_info.get("redelivered"), message.headers)
                    if message.body == POISON:
                        message.requeue()
                    else:
                        message.ack()
                with conn.Consumer(queue, on_message=on_message, prefetch_count=20, auto_declare=False):
                    while not stop.is_set():
                        try:
                            conn.drain_events(timeout=0.5)
                        except TimeoutError:
                            pass
        except BaseException as exc:   # noqa: BLE001 - reported by the test
            failures.append(exc)
    consumer = threading.Thread(target=consume, daemon=True)
    consumer.start()
    try:
        with kombu.Connection(run.hare2.url, transport_options={"confirm_publish": True}) as conn:
            producer = conn.Producer(serializer="raw")
            producer.publish(POISON, exchange="", routing_key=run.name, content_type="application/data",
                             content_encoding="binary")
            run.poison_dead_lettered()
            for i in range(TOTAL):
                body = b"%d" % i
                while True:
                    try:
                        producer.publish(body, exchange="", routing_key=run.name, delivery_mode=2,
                                         content_type="application/data", content_encoding="binary")
                        break
                    except MessageNacked:
                        continue
                run.note_confirm(body)
                if len(run.confirmed) == KILL_AT:
                    run.kill_leader()
        run.nothing_confirmed_lost()
        assert consumer.is_alive() and not failures, failures
    finally:
        stop.set()
        consumer.join(10)


# ---- amqplib (Node.js) ---------------------------------------------------------------------------------------

@pytest.mark.skipif(NODE is None or not (JS_DIR / "node_modules" / "amqplib").is_dir(),
                    reason="needs Node.js and amqplib (make test runs npm install in tests/js)")
def test_amqplib(run_for):
    """tests/js/quorum_failover.js declares, consumes and publishes; it prints `kill` once KILL_AT
    are confirmed and this test kills the leader's node then, and one JSON line at the end."""
    run = run_for("amqplib")
    urls = [m.url.replace("/%2F", "") for m in (run.hare1, run.hare2, run.hare3)]
    declared = subprocess.run([NODE, str(JS_DIR / "quorum_failover.js"), "declare", *urls, run.name, run.dead,
                               str(LIMIT), str(TOTAL), str(KILL_AT)], capture_output=True, text=True, timeout=60,
                              cwd=str(JS_DIR))
    assert declared.returncode == 0, declared.stderr
    run.led_by_hare1()
    proc = subprocess.Popen([NODE, str(JS_DIR / "quorum_failover.js"), "load", *urls, run.name, run.dead,
                             str(LIMIT), str(TOTAL), str(KILL_AT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=str(JS_DIR))
    result = None
    try:
        for line in proc.stdout:
            line = line.strip()
            if line == "kill":
                run.kill_leader()
            elif line.startswith("{"):
                result = json.loads(line)
        assert proc.wait(240) == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    for row in result["seen"]:
        run.seen.add(row["body"].encode(), row["redelivered"], row["headers"])
    run.confirmed = [body.encode() for body in result["confirmed"]]
    run.poison_dead_lettered()
    run.first_confirm_after_kill = run.killed_at + result["resumedAfterKill"] / 1000.0
    run.nothing_confirmed_lost()
