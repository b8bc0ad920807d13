"""The same flows through aio-pika (aiormq underneath), an asyncio client."""
import asyncio

import aio_pika
import aiormq
import pytest
from pamqp import commands as spec

from tests.conftest import unique_name

REPLY_TO = "amq.rabbitmq.reply-to"


def run(coro, timeout=30):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def connect(node):
    return await aio_pika.connect(node.url + "?heartbeat=30", timeout=10)


def test_publish_with_confirms(node):
    async def main():
        async with await connect(node) as conn:
            ch = await conn.channel(publisher_confirms=True)
            q = await ch.declare_queue(unique_name("aio"), exclusive=True)
            confirms = [await ch.default_exchange.publish(aio_pika.Message(b"%d" % i), q.name)
                        for i in range(5)]
            assert all(isinstance(c, spec.Basic.Ack) for c in confirms), confirms
            covered = set()
            for c in confirms:
                covered |= set(range(1, c.delivery_tag + 1)) if c.multiple else {c.delivery_tag}
            assert covered == {1, 2, 3, 4, 5}
            q2 = await ch.declare_queue(q.name, passive=True)
            assert q2.declaration_result.message_count == 5
    run(main())


def test_reject_publish_overflow_is_a_delivery_error(node):
    # CONF-5 as seen by aio-pika: a nack fails the publish
    async def main():
        async with await connect(node) as conn:
            ch = await conn.channel(publisher_confirms=True)
            q = await ch.declare_queue(unique_name("aiofull"), exclusive=True, arguments={
                "x-max-length": 1, "x-overflow": "reject-publish"})
            await ch.default_exchange.publish(aio_pika.Message(b"1"), q.name)
            with pytest.raises(aio_pika.exceptions.DeliveryError) as ei:
                await ch.default_exchange.publish(aio_pika.Message(b"2"), q.name)
            assert isinstance(ei.value.frame, spec.Basic.Nack)
    run(main())


def test_mandatory_unroutable_is_returned(node):
    async def main():
        async with await connect(node) as conn:
            ch = await conn.channel(publisher_confirms=True, on_return_raises=True)
            with pytest.raises(aio_pika.exceptions.DeliveryError) as ei:
                x = await ch.get_exchange("amq.direct", ensure=False)
                await x.publish(
                    aio_pika.Message(b"x"), unique_name("nowhere"), mandatory=True)
            frame = ei.value.frame
            assert isinstance(frame, spec.Basic.Return)
            assert (frame.reply_code, frame.reply_text) == (312, "NO_ROUTE")
    run(main())


def test_consume_with_manual_ack(node):
    async def main():
        async with await connect(node) as conn:
            ch = await conn.channel(publisher_confirms=True)
            await ch.set_qos(prefetch_count=5)
            q = await ch.declare_queue(unique_name("aiocons"), exclusive=True)
            for i in range(10):
                await ch.default_exchange.publish(aio_pika.Message(b"%d" % i), q.name)
            got = []
            async with q.iterator() as it:
                async for message in it:
                    got.append((int(message.body), message.delivery_tag, message.redelivered))
                    if len(got) == 3:
                        await message.nack(requeue=True)  # comes back at the head
                    else:
                        await message.ack()
                    if len(got) == 11:
                        break
            # prefetch 5: 3..4 were already in flight when 2 was requeued, so 2 comes
            # back after those; every message is seen once, 2 twice
            assert sorted(b for b, _, _ in got) == sorted(list(range(10)) + [2])
            assert [b for b, _, _ in got][:3] == [0, 1, 2]
            redelivered = [(b, r) for b, _, r in got if r]
            assert redelivered == [(2, True)]
            assert [t for _, t, _ in got] == list(range(1, 12))
            await asyncio.sleep(0.1)
            q2 = await ch.declare_queue(q.name, passive=True)
            assert q2.declaration_result.message_count == 0
    run(main())


def test_rpc_with_direct_reply_to(node):
    async def main():
        async with await connect(node) as server_conn, await connect(node) as client_conn:
            sch = await server_conn.channel()
            rq = await sch.declare_queue(unique_name("aiorpc"), auto_delete=True)

            async def serve(message: aio_pika.abc.AbstractIncomingMessage):
                async with message.process():
                    assert message.reply_to.startswith(REPLY_TO + ".")
                    n = int(message.body)
                    await sch.default_exchange.publish(
                        aio_pika.Message(b"%d" % (n * n), correlation_id=message.correlation_id),
                        routing_key=message.reply_to)

            await rq.consume(serve)

            cch = await client_conn.channel()
            replies = asyncio.Queue()
            reply_q = await cch.get_queue(REPLY_TO, ensure=False)

            async def on_reply(message):
                replies.put_nowait(message)

            await reply_q.consume(on_reply, no_ack=True)
            for n in (3, 7):
                await cch.default_exchange.publish(
                    aio_pika.Message(b"%d" % n, reply_to=REPLY_TO, correlation_id=f"c{n}"),
                    routing_key=rq.name)
            got = {}
            for _ in range(2):
                m = await asyncio.wait_for(replies.get(), 10)
                got[m.correlation_id] = int(m.body)
            assert got == {"c3": 9, "c7": 49}
    run(main())


def test_channel_error_keeps_connection(node):
    async def main():
        async with await connect(node) as conn:
            ch = await conn.channel()
            name = unique_name("aiomissing")
            with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity) as ei:
                await ch.declare_queue(name, passive=True)
            assert ei.value.args == (f"NOT_FOUND - no queue '{name}' in vhost '/'",)
            ch2 = await conn.channel()
            q = await ch2.declare_queue(exclusive=True)
            assert q.name.startswith("amq.gen-")
    run(main())
