"""Direct reply-to under back pressure: a requester that stops reading its replies does not make
the node buffer them without limit. A reply that its requester's connection cannot take now
(its output is over the high-water mark, as a queue's deliveries would wait) is dropped, and
returned to the replier (312 NO_ROUTE) when published mandatory, as for a requester that is
gone; a node forwarding replies to another node holds a bounded amount for it."""
from __future__ import annotations

import asyncio
import socket
import time

import pika
from pamqp import commands as spec

from tests.conftest import needs_process, pika_conn, raw_socket, wait_until
from tests.inprocess import InProcessNode

REPLY_TO = "amq.rabbitmq.reply-to"
pytestmark = needs_process


def _held_for(node: InProcessNode, client_port: int) -> int:
    """Bytes the node holds for the connection from `client_port`: frames not yet handed to the
    socket and the socket's write buffer."""
    def held():
        for protocol in list(node.node.amqp.protocols):
            session = protocol.session
            if session is not None and session.peer[1] == client_port:
                out = sum(len(b) for b in session.conn._out)
                return out + (protocol.transport.get_write_buffer_size() if protocol.transport else 0)
        return 0
    return node.call(held)


def test_a_requester_that_does_not_read_does_not_fill_the_node(tmp_path):
    with InProcessNode(tmp_path) as n:
        requester = raw_socket(n, rcvbuf=64 * 1024)
        requester.open_channel(1)
        requester.rpc(spec.Basic.Consume(queue=REPLY_TO, no_ack=True, consumer_tag="replies"), 1,
                      spec.Basic.ConsumeOk)
        server = pika_conn(n)
        sch = server.channel()
        sch.queue_declare("rpc.flow")
        requester.publish(1, "", "rpc.flow", b"request", spec.Basic.Properties(reply_to=REPLY_TO))
        _method, props, _body = wait_until(lambda: (r := sch.basic_get("rpc.flow", auto_ack=True))[0] and r, 10)
        returned = []
        sch.add_on_return_callback(lambda ch, method, p, body: returned.append((method.reply_code, p.correlation_id)))
        reply = b"r" * (512 * 1024)
        count = 200                                           # 100 MiB of replies, never read
        for i in range(count):
            sch.basic_publish("", props.reply_to, reply, pika.BasicProperties(correlation_id=str(i)),
                              mandatory=True)
        server.process_data_events(1)
        held = _held_for(n, requester.sock.getsockname()[1])
        assert held < 16 << 20, f"the node holds {held} bytes of replies for a requester that does not read"
        wait_until(lambda: server.process_data_events(0.1) or returned, 10)
        assert {code for code, _ in returned} == {312}

        # the requester reads again: what was not returned arrives, whole and in order
        requester.record = False
        delivered = []
        deadline = time.monotonic() + 60
        while len(delivered) + len(returned) < count:
            assert time.monotonic() < deadline, (len(delivered), len(returned))
            server.process_data_events(0)
            try:
                _ch, frame = requester.recv_frame(timeout=0.5)
            except socket.timeout:
                continue
            if isinstance(frame, spec.Basic.Deliver):
                _ch, header = requester.recv_frame(timeout=20)
                size, body = header.body_size, b""
                while len(body) < size:
                    body += requester.recv_frame(timeout=20)[1].value
                assert body == reply
                delivered.append(header.properties.correlation_id)
        assert delivered == sorted(delivered, key=int)
        assert sorted(delivered + [c for _, c in returned], key=int) == [str(i) for i in range(count)]


def test_replies_waiting_for_another_node_are_bounded():
    """A node sends the replies for another node's requesters in batches, one call at a time;
    while that node does not answer, what waits for it is bounded: `forward` says False past
    it (the reply is then dropped, or returned to a mandatory replier)."""
    from haremq.cluster.links.reply_to import MAX_WAITING_BYTES, ReplyForwarder
    from haremq.node.broker.message import Message

    class Stub:
        calls = 0

        async def Replies(self, batch, timeout, metadata):  # noqa: N802 - the gRPC method's name
            Stub.calls += 1
            await asyncio.sleep(3600)

    class Peer:
        stub = Stub()

    class Membership:
        name = "here"
        peers = {"there": Peer()}

        def is_up(self, node):
            return True

        def metadata(self):
            return ()

    async def run():
        forwarder = ReplyForwarder(Membership())
        body = b"x" * (1 << 20)
        message = Message("", "amq.rabbitmq.reply-to.x.y", b"\x00\x00", body)
        taken = 0
        while forwarder.forward("there", "amq.rabbitmq.reply-to.x.y", message):
            taken += 1
            await asyncio.sleep(0)
            assert taken < 10_000, "forward never refuses"
        assert taken * len(body) <= MAX_WAITING_BYTES + 2 * len(body)
        await forwarder.stop()
    asyncio.run(run())
