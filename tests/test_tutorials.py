"""RabbitMQ's six tutorials (hello world, work queues, publish/subscribe, routing, topics, RPC),
as a new user runs them, with pika and aio-pika: against a single node and against each node of
a three-node cluster. On the cluster the tutorial's two programs run on different nodes (the
consumer on the node under test, the producer on the next one), as behind a load balancer.
"""
from __future__ import annotations

import asyncio
import threading
import uuid

import aio_pika
import pika
import pytest

from tests.conftest import pika_conn, unique_name, wait_until

TARGETS = ["node", "hare1", "hare2", "hare3"]


# the cluster members of TARGETS: one cluster for the module
pytestmark = pytest.mark.cluster(failure_timeout=1.5, shared=True)


@pytest.fixture(params=TARGETS)
def nodes(request):
    """(consumer's node, producer's node): one node twice, or two members of a cluster."""
    if request.param == "node":
        n = request.getfixturevalue("node")
        return n, n
    members = request.getfixturevalue("cluster")
    i = TARGETS.index(request.param) - 1
    return members[i], members[(i + 1) % 3]


def _drain(conn, ch, queue, count, timeout=10):
    """`count` bodies from `queue` with acks (a consumer as the tutorials write it)."""
    got = []

    def on_message(channel, method, _props, body):
        got.append(body)
        channel.basic_ack(method.delivery_tag)
    tag = ch.basic_consume(queue, on_message)
    wait_until(lambda: conn.process_data_events(0.05) or len(got) >= count, timeout=timeout,
               message=f"{len(got)} of {count} from {queue}")
    ch.basic_cancel(tag)
    return got


# ---- pika -------------------------------------------------------------------------------------

def test_pika_1_hello_world(nodes):
    receiver, sender = nodes
    queue = unique_name("hello")
    rconn = pika_conn(receiver)
    rch = rconn.channel()
    rch.queue_declare(queue)
    sch = pika_conn(sender).channel()
    sch.queue_declare(queue)
    sch.basic_publish("", queue, b"Hello World!")
    assert _drain(rconn, rch, queue, 1) == [b"Hello World!"]
    rch.queue_delete(queue)


def test_pika_2_work_queues(nodes):
    worker_node, sender = nodes
    queue = unique_name("task_queue")
    sch = pika_conn(sender).channel()
    sch.queue_declare(queue, durable=True)
    sch.confirm_delivery()
    tasks = [f"task {i}{'.' * (i % 3)}".encode() for i in range(20)]
    for body in tasks:
        sch.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent))
    workers = []
    for _ in range(2):
        conn = pika_conn(worker_node)
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.basic_qos(prefetch_count=1)
        workers.append((conn, ch, []))
    for _conn, ch, got in workers:
        ch.basic_consume(queue, lambda c, m, _p, b, got=got: (got.append(b), c.basic_ack(m.delivery_tag)))

    def done():
        for conn, _ch, _got in workers:
            conn.process_data_events(0.02)
        return sum(len(got) for *_x, got in workers) >= len(tasks)
    wait_until(done, timeout=15)
    everything = [b for *_x, got in workers for b in got]
    assert sorted(everything) == sorted(tasks)
    assert all(got for *_x, got in workers), "prefetch 1 should share the tasks between both workers"
    sch.queue_delete(queue)


def _subscriber(node, exchange, kind, keys):
    conn = pika_conn(node)
    ch = conn.channel()
    ch.exchange_declare(exchange, exchange_type=kind)
    queue = ch.queue_declare("", exclusive=True).method.queue
    assert queue.startswith("amq.gen-")
    for key in keys:
        ch.queue_bind(queue, exchange, routing_key=key)
    return conn, ch, queue


def _received(conn, ch, queue, expected):
    got = []
    ch.basic_consume(queue, lambda _c, m, _p, b: got.append((m.routing_key, b)), auto_ack=True)
    wait_until(lambda: conn.process_data_events(0.05) or len(got) >= len(expected), timeout=10,
               message=f"got {got}, expected {expected}")
    conn.process_data_events(0.2)        # nothing more should come
    return sorted(got)


def test_pika_3_publish_subscribe(nodes):
    receiver, sender = nodes
    exchange = unique_name("logs")
    subscribers = [_subscriber(receiver, exchange, "fanout", [""]) for _ in range(2)]
    sch = pika_conn(sender).channel()
    sch.exchange_declare(exchange, exchange_type="fanout")
    sch.confirm_delivery()
    for i in range(3):
        sch.basic_publish(exchange, "", f"log {i}".encode())
    for conn, ch, queue in subscribers:
        assert _received(conn, ch, queue, range(3)) == [("", f"log {i}".encode()) for i in range(3)]
    sch.exchange_delete(exchange)


def test_pika_4_routing(nodes):
    receiver, sender = nodes
    exchange = unique_name("direct_logs")
    errors = _subscriber(receiver, exchange, "direct", ["error"])
    everything = _subscriber(receiver, exchange, "direct", ["info", "warning", "error"])
    sch = pika_conn(sender).channel()
    sch.exchange_declare(exchange, exchange_type="direct")
    sch.confirm_delivery()
    for severity in ("info", "warning", "error", "debug"):
        sch.basic_publish(exchange, severity, severity.encode())
    assert _received(*errors, ["error"]) == [("error", b"error")]
    assert _received(*everything, ["info", "warning", "error"]) == sorted(
        [("info", b"info"), ("warning", b"warning"), ("error", b"error")])


def test_pika_5_topics(nodes):
    receiver, sender = nodes
    exchange = unique_name("topic_logs")
    q1 = _subscriber(receiver, exchange, "topic", ["*.orange.*"])
    q2 = _subscriber(receiver, exchange, "topic", ["*.*.rabbit", "lazy.#"])
    sch = pika_conn(sender).channel()
    sch.exchange_declare(exchange, exchange_type="topic")
    sch.confirm_delivery()
    keys = ["quick.orange.rabbit", "lazy.orange.elephant", "quick.orange.fox", "lazy.brown.fox",
            "lazy.pink.rabbit", "quick.brown.fox", "orange", "quick.orange.new.rabbit", "lazy.orange.new.rabbit"]
    for key in keys:
        sch.basic_publish(exchange, key, key.encode())
    want1 = ["quick.orange.rabbit", "lazy.orange.elephant", "quick.orange.fox"]
    want2 = ["quick.orange.rabbit", "lazy.orange.elephant", "lazy.brown.fox", "lazy.pink.rabbit",
             "lazy.orange.new.rabbit"]
    assert _received(*q1, want1) == sorted((k, k.encode()) for k in want1)
    assert _received(*q2, want2) == sorted((k, k.encode()) for k in want2)


def _fib(n: int) -> int:
    return n if n < 2 else _fib(n - 1) + _fib(n - 2)


def test_pika_6_rpc(nodes):
    server_node, client_node = nodes
    rpc_queue = unique_name("rpc_queue")
    sconn = pika_conn(server_node)
    sch = sconn.channel()
    sch.queue_declare(rpc_queue)
    sch.basic_qos(prefetch_count=1)

    def on_request(ch, method, props, body):
        ch.basic_publish("", props.reply_to, str(_fib(int(body))).encode(),
                         pika.BasicProperties(correlation_id=props.correlation_id))
        ch.basic_ack(method.delivery_tag)
    sch.basic_consume(rpc_queue, on_request)
    stop = threading.Event()
    server = threading.Thread(target=lambda: [sconn.process_data_events(0.05) for _ in iter(stop.is_set, True)])
    server.start()
    try:
        cconn = pika_conn(client_node)
        cch = cconn.channel()
        callback = cch.queue_declare("", exclusive=True).method.queue
        answers = {}
        cch.basic_consume(callback, lambda _c, _m, p, b: answers.__setitem__(p.correlation_id, b), auto_ack=True)
        for n in (1, 10, 20):
            cid = str(uuid.uuid4())
            cch.basic_publish("", rpc_queue, str(n).encode(),
                              pika.BasicProperties(reply_to=callback, correlation_id=cid))
            wait_until(lambda: cconn.process_data_events(0.05) or cid in answers, timeout=10)
            assert int(answers[cid]) == _fib(n)
    finally:
        stop.set()
        server.join(10)


# ---- aio-pika -----------------------------------------------------------------------------------

def run(coro, timeout=60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def _connect(node):
    return await aio_pika.connect(node.url, timeout=10)


async def _take(queue, count, no_ack=False, timeout=10):
    got = []
    async with queue.iterator(no_ack=no_ack) as messages:
        async for message in _within(messages, timeout):
            got.append((message.routing_key, message.body))
            if not no_ack:
                await message.ack()
            if len(got) >= count:
                break
    return got


async def _within(iterator, timeout):
    while True:
        yield await asyncio.wait_for(iterator.__anext__(), timeout)


def test_aio_pika_1_hello_world(nodes):
    receiver, sender = nodes
    name = unique_name("hello")

    async def main():
        async with await _connect(receiver) as rconn, await _connect(sender) as sconn:
            rch, sch = await rconn.channel(), await sconn.channel()
            queue = await rch.declare_queue(name)
            await sch.declare_queue(name)
            await sch.default_exchange.publish(aio_pika.Message(b"Hello World!"), routing_key=name)
            got = await _take(queue, 1)
            await queue.delete()
            return got
    assert run(main()) == [(name, b"Hello World!")]


def test_aio_pika_2_work_queues(nodes):
    worker_node, sender = nodes
    name = unique_name("task_queue")
    tasks = [f"task {i}{'.' * (i % 3)}".encode() for i in range(20)]

    async def main():
        async with await _connect(sender) as sconn:
            sch = await sconn.channel()
            await sch.declare_queue(name, durable=True)
            for body in tasks:
                await sch.default_exchange.publish(
                    aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key=name)
            results = [[], []]
            done = asyncio.Event()
            conns = [await _connect(worker_node) for _ in range(2)]
            for conn, got in zip(conns, results):
                ch = await conn.channel()
                await ch.set_qos(prefetch_count=1)
                queue = await ch.declare_queue(name, durable=True)

                async def work(message, got=got):
                    async with message.process():
                        got.append(message.body)
                        await asyncio.sleep(0.01)
                        if sum(map(len, results)) >= len(tasks):
                            done.set()
                await queue.consume(work)
            await asyncio.wait_for(done.wait(), 20)
            for conn in conns:
                await conn.close()
            await sch.queue_delete(name)
            return results
    results = run(main())
    assert sorted(results[0] + results[1]) == sorted(tasks)
    assert all(results), "prefetch 1 should share the tasks between both workers"


async def _aio_subscriber(conn, exchange_name, kind, keys):
    ch = await conn.channel()
    exchange = await ch.declare_exchange(exchange_name, kind)
    queue = await ch.declare_queue(exclusive=True)
    assert queue.name.startswith("amq.gen-")
    for key in keys:
        await queue.bind(exchange, routing_key=key)
    return queue


TOPIC_KEYS = ["quick.orange.rabbit", "lazy.orange.elephant", "quick.orange.fox", "lazy.brown.fox",
              "lazy.pink.rabbit", "quick.brown.fox", "orange", "quick.orange.new.rabbit", "lazy.orange.new.rabbit"]


@pytest.mark.parametrize("kind,bindings,sent,wanted", [
    ("fanout", [[""], [""]], ["a", "b", "c"], [["a", "b", "c"], ["a", "b", "c"]]),
    ("direct", [["error"], ["info", "warning", "error"]], ["info", "warning", "error", "debug"],
     [["error"], ["error", "info", "warning"]]),
    ("topic", [["*.orange.*"], ["*.*.rabbit", "lazy.#"]], TOPIC_KEYS,
     [["lazy.orange.elephant", "quick.orange.fox", "quick.orange.rabbit"],
      ["lazy.brown.fox", "lazy.orange.elephant", "lazy.orange.new.rabbit", "lazy.pink.rabbit",
       "quick.orange.rabbit"]]),
], ids=["3_publish_subscribe", "4_routing", "5_topics"])
def test_aio_pika_exchanges(nodes, kind, bindings, sent, wanted):
    receiver, sender = nodes
    name = unique_name(f"{kind}_logs")

    async def main():
        async with await _connect(receiver) as rconn, await _connect(sender) as sconn:
            queues = [await _aio_subscriber(rconn, name, kind, keys) for keys in bindings]
            sch = await sconn.channel(publisher_confirms=True)
            exchange = await sch.declare_exchange(name, kind)
            for key in sent:
                await exchange.publish(aio_pika.Message(key.encode()), routing_key=key if kind != "fanout" else "")
            out = []
            for queue, want in zip(queues, wanted):
                got = await _take(queue, len(want), no_ack=True)
                out.append(sorted(b.decode() for _k, b in got))
            await exchange.delete()
            return out
    assert run(main()) == wanted


def test_aio_pika_6_rpc(nodes):
    server_node, client_node = nodes
    name = unique_name("rpc_queue")

    async def main():
        async with await _connect(server_node) as sconn, await _connect(client_node) as cconn:
            sch = await sconn.channel()
            await sch.set_qos(prefetch_count=1)
            requests = await sch.declare_queue(name)

            async def on_request(message):
                async with message.process():
                    n = int(message.body)
                    await sch.default_exchange.publish(
                        aio_pika.Message(str(_fib(n)).encode(), correlation_id=message.correlation_id),
                        routing_key=message.reply_to)
            await requests.consume(on_request)

            cch = await cconn.channel()
            callback = await cch.declare_queue(exclusive=True)
            futures: dict[str, asyncio.Future] = {}

            async def on_response(message):
                futures[message.correlation_id].set_result(int(message.body))
            await callback.consume(on_response, no_ack=True)
            answers = []
            for n in (1, 10, 20):
                cid = str(uuid.uuid4())
                futures[cid] = asyncio.get_running_loop().create_future()
                await cch.default_exchange.publish(
                    aio_pika.Message(str(n).encode(), correlation_id=cid, reply_to=callback.name), routing_key=name)
                answers.append(await asyncio.wait_for(futures[cid], 10))
            await requests.delete(if_unused=False)
            return answers
    assert run(main()) == [_fib(1), _fib(10), _fib(20)]


# ---- server-named queues across a cluster ---------------------------------------------------------

@pytest.mark.parametrize("exclusive", [True, False], ids=["exclusive", "shared"])
def test_server_named_queue_declared_anywhere_is_usable_everywhere(cluster, exclusive):
    """A server-named queue declared on each member in turn: bound, published to and consumed
    from every member (its owner's connection only, when exclusive), then deleted."""
    for i, home in enumerate(cluster):
        others = [cluster[(i + 1) % 3], cluster[(i + 2) % 3]]
        conn = pika_conn(home)
        ch = conn.channel()
        queue = ch.queue_declare("", exclusive=exclusive, auto_delete=not exclusive).method.queue
        assert queue.startswith("amq.gen-")
        ch.queue_bind(queue, "amq.direct", routing_key=queue)
        users = [ch] if exclusive else [pika_conn(m).channel() for m in others]
        for user in users:
            user.queue_declare(queue, passive=True)
            user.queue_bind(queue, "amq.fanout")
        for n, member in enumerate(cluster):
            sender = pika_conn(member).channel()
            sender.confirm_delivery()
            sender.basic_publish("amq.direct", queue, b"%d" % n)
        assert ch.queue_declare(queue, passive=True).method.message_count == 3
        for user in users:
            got = wait_until(lambda: user.basic_get(queue, auto_ack=True)[2], timeout=10)
            assert got in (b"0", b"1", b"2")
        if not exclusive:
            assert users[0].queue_declare(queue, passive=True).method.message_count == 1
            users[1].queue_delete(queue)
        else:
            ch.queue_delete(queue)
        for member in cluster:
            probe = pika_conn(member).channel()
            wait_until(lambda: _missing(probe, queue), timeout=10, message=f"{queue} still on {member.name}")


def _missing(ch, queue) -> bool:
    try:
        ch.queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker as err:
        assert err.reply_code == 404
        return True
    return False


def test_declare_bind_delete_cycles_of_server_named_queues_on_every_node(cluster):
    """Tutorial 3's subscriber restarted over and over (Celery's pidbox does this): 30 cycles of
    declare, bind to amq.direct, delete on each member."""
    for member in cluster:
        ch = pika_conn(member).channel()
        for _ in range(30):
            queue = ch.queue_declare("", exclusive=True).method.queue
            ch.queue_bind(queue, "amq.direct", routing_key=queue)
            ch.queue_delete(queue)
