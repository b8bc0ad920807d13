"""Publishes packed by hand on a queue link: what goes in comes out, in order, between other calls."""
from pamqp import commands as spec
from pamqp.header import ContentHeader

from haremq.cluster.links.codec import message_from_parts, pack_publishes, unpack_publishes
from haremq.cluster.links.link import with_publishes_packed
from haremq.cluster.rpc import cluster_pb2 as pb


def _props(**kwargs) -> bytes:
    """The property bytes a client sends (a content header's flags and list, without its head)."""
    return ContentHeader(0, 0, spec.Basic.Properties(**kwargs)).marshal()[12:]


def _message(exchange, routing_key, body, publish_id=0, **props):
    return message_from_parts(exchange, routing_key, _props(**props), body, publish_id)


def test_packed_publishes_come_back_as_sent():
    sent = [
        (1, _message("", "q", b"", publish_id=0)),
        (2, _message("amq.topic", "søren.ünïcode.key", b"x" * 200_000, publish_id=2**63 - 1,
                     delivery_mode=2, priority=7, expiration="60000", headers={"a": 1})),
        (0, _message("e" * 255, "r" * 255, bytes(range(256)), publish_id=5)),
    ]
    got = unpack_publishes(pack_publishes(sent))
    assert [seq for seq, _m in got] == [1, 2, 0]
    for (_s, a), (_t, b) in zip(sent, got):
        assert (b.exchange, b.routing_key, bytes(b.props_raw), bytes(b.body), b.publish_id) == \
               (a.exchange, a.routing_key, bytes(a.props_raw), bytes(a.body), a.publish_id)
        assert (b.persistent, b.priority, b.expiration) == (a.persistent, a.priority, a.expiration)
    assert got[1][1].persistent and got[1][1].priority == 7


def test_an_empty_run_packs_to_nothing():
    assert unpack_publishes(pack_publishes([])) == []


def test_runs_of_publishes_keep_their_place_among_other_calls():
    settle = pb.QueueCall(settle=pb.QueueCall.Settle(ids=[3], mode=0))
    get = pb.QueueCall(get=pb.QueueCall.Get(no_ack=True))
    p = [(n, _message("", "q", str(n).encode())) for n in range(1, 6)]
    calls = with_publishes_packed([p[0], p[1], settle, p[2], get, p[3], p[4]])
    kinds = [c.WhichOneof("call") for c in calls]
    assert kinds == ["publishes", "settle", "publishes", "get", "publishes"]
    bodies = [[bytes(m.body) for _s, m in unpack_publishes(c.publishes.packed)]
              for c in calls if c.WhichOneof("call") == "publishes"]
    assert bodies == [[b"1", b"2"], [b"3"], [b"4", b"5"]]
    assert with_publishes_packed([settle, get]) == [settle, get]


def test_a_batch_stops_growing_at_its_byte_budget():
    """Many large bodies piled up go in several messages, not one past gRPC's limit."""
    import asyncio

    from haremq.cluster.links.link import BATCH_BYTES, piled_up, publish_weight

    big = BATCH_BYTES // 3 + 1
    items: asyncio.Queue = asyncio.Queue()
    for n in range(2, 8):
        items.put_nowait((n, _message("", "q", b"x" * big)))
    items.put_nowait(None)
    first = (1, _message("", "q", b"x" * big))
    batches = []
    batch, ended = piled_up(items, first, publish_weight)
    batches.append([seq for seq, _m in batch])
    while not ended:
        batch, ended = piled_up(items, items.get_nowait(), publish_weight)
        batches.append([seq for seq, _m in batch if seq])
    assert batches == [[1, 2, 3], [4, 5, 6], [7]]


def test_a_body_heavier_than_the_budget_goes_alone():
    import asyncio

    from haremq.cluster.links.link import BATCH_BYTES, piled_up, publish_weight

    items: asyncio.Queue = asyncio.Queue()
    items.put_nowait((2, _message("", "q", b"small")))
    batch, ended = piled_up(items, (1, _message("", "q", b"x" * (BATCH_BYTES + 1))), publish_weight)
    assert [seq for seq, _m in batch] == [1] and not ended and items.qsize() == 1
