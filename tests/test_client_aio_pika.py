"""aio-pika and aiormq against the broker: the README's checks, plus the two behaviours they found
(issue 17): channel 65535 on a connection with channel_max 2047, and unbinding auto-delete
exchanges bound to each other."""
from __future__ import annotations

import asyncio

import aio_pika
import aiormq
import pytest
from pamqp import commands as spec

from tests.conftest import unique_name


@pytest.fixture(scope="module")
def node(node_or_cluster_member):
    """A single node, then a three-node cluster's member that is not the metadata leader."""
    return node_or_cluster_member


async def ignore(_message) -> None:
    return None


def run(coro, timeout=30):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def connect(node, url: str | None = None):
    return await aio_pika.connect(url or node.url, timeout=10)


def test_round_trip(node):
    async def main():
        async with await connect(node) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(exclusive=True)
            await ch.default_exchange.publish(
                aio_pika.Message(b"hello", content_type="text/plain", headers={"n": 1}), q.name)
            msg = await q.get(timeout=10, no_ack=True)
            return msg.body, msg.content_type, msg.headers["n"]
    assert run(main()) == (b"hello", "text/plain", 1)


def test_publisher_confirms(node):
    async def main():
        async with await connect(node) as conn:
            ch = await conn.channel(publisher_confirms=True)
            q = await ch.declare_queue(exclusive=True)
            confirms = await asyncio.gather(*(ch.default_exchange.publish(aio_pika.Message(b"%d" % i), q.name)
                                              for i in range(50)))
            declared = await ch.declare_queue(q.name, passive=True)
            return confirms, declared.declaration_result.message_count
    confirms, count = run(main())
    assert all(isinstance(c, spec.Basic.Ack) for c in confirms) and count == 50


def test_consumer_cancel_notification(node):
    # the queue is deleted from another connection: aiormq drops the consumer on basic.cancel
    async def main():
        async with await connect(node) as conn, await connect(node) as other:
            ch = await conn.channel()
            name = unique_name("aiocancel")
            q = await ch.declare_queue(name, auto_delete=False)
            tag = await q.consume(ignore)
            consumers = (await ch.get_underlay_channel()).consumers
            assert tag in consumers
            await (await other.channel()).queue_delete(name)
            while tag in consumers:
                await asyncio.sleep(0.05)
            return True
    assert run(main()) is True


def test_refused_login(node):
    async def main():
        with pytest.raises(aiormq.exceptions.ProbableAuthenticationError) as ei:
            await connect(node, node.url.replace("guest:guest@", "guest:wrong@"))
        return str(ei.value)
    assert "ACCESS_REFUSED - Login was refused" in run(main())


def test_message_larger_than_frame_max(node):
    body = b"L" * (3 * 131072 + 17)

    async def main():
        async with await connect(node) as conn:
            ch = await conn.channel(publisher_confirms=True)
            q = await ch.declare_queue(exclusive=True)
            await ch.default_exchange.publish(aio_pika.Message(body), q.name)
            return (await q.get(timeout=10, no_ack=True)).body
    assert run(main()) == body


def test_queue_deleted_under_own_consumer(node):
    async def main():
        async with await connect(node) as conn:
            ch = await conn.channel()
            q = await ch.declare_queue(unique_name("aiodel"), auto_delete=False)
            tag = await q.consume(ignore)
            ok = await q.delete(if_unused=False, if_empty=False)
            consumers = (await ch.get_underlay_channel()).consumers
            while tag in consumers:                  # the cancel follows delete-ok
                await asyncio.sleep(0.05)
            await ch.declare_queue(exclusive=True)   # the channel goes on
            return ok
    assert isinstance(run(main()), spec.Queue.DeleteOk)


def test_aiormq_channel_65535_with_channel_max_2047(node):
    # channel_max is how many channels may be open, not the highest channel id
    async def main():
        conn = await aiormq.connect(node.url)
        try:
            assert conn.connection_tune.channel_max == 2047
            ch = await conn.channel(channel_number=65535)
            declared = await ch.queue_declare(exclusive=True)
            await ch.basic_publish(b"hi", routing_key=declared.queue)
            got = await ch.basic_get(declared.queue, no_ack=True)
            return ch.number, got.body
        finally:
            await conn.close()
    assert run(main()) == (65535, b"hi")


def test_unbinding_auto_delete_exchanges_bound_to_each_other(node):
    # S -> D -> queue: unbinding the queue deletes D (its last binding as a source) and so S;
    # unbinding D from S afterwards succeeds, as on RabbitMQ
    async def main():
        async with await connect(node) as conn:
            ch = await conn.channel()
            s = await ch.declare_exchange(unique_name("S"), aio_pika.ExchangeType.DIRECT, auto_delete=True)
            d = await ch.declare_exchange(unique_name("D"), aio_pika.ExchangeType.DIRECT, auto_delete=True)
            await d.bind(s, routing_key="k")
            q = await ch.declare_queue(exclusive=True)
            await q.bind(d, routing_key="k")
            await s.publish(aio_pika.Message(b"through"), routing_key="k")
            got = await q.get(timeout=10, no_ack=True)
            await q.unbind(d, routing_key="k")
            await d.unbind(s, routing_key="k")
            return got.body
    assert run(main()) == b"through"
