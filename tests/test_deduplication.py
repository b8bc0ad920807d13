"""Queue-level message deduplication (x-message-deduplication, x-cache-size, x-cache-ttl): a
message whose id was seen within the cache is confirmed and not enqueued again, on one node,
after a kill -9 and restart, and after a failover of a mirrored queue."""
from __future__ import annotations

import decimal
import json
import time

import pika
import pytest

from tests.conftest import IS_REF, pika_conn, unique_name, wait_until
from tests.management import ManagedNode, q as quoted

pytestmark = pytest.mark.skipif(IS_REF, reason="deduplication is a plugin on RabbitMQ")

PERSISTENT = 2


def _declare(ch, name, size=100, ttl=None, durable=False, **extra):
    args = {"x-message-deduplication": True, "x-cache-size": size, **extra}
    if ttl is not None:
        args["x-cache-ttl"] = ttl
    ch.queue_declare(name, durable=durable, arguments=args)


def _publish(ch, queue, body, message_id=None, header=None, persistent=False):
    headers = {"x-deduplication-header": header} if header is not None else None
    ch.basic_publish("", queue, body, pika.BasicProperties(message_id=message_id, headers=headers,
                                                           delivery_mode=PERSISTENT if persistent else None))


def _bodies(ch, queue):
    got = []
    while True:
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append(body)


# ---- the pieces, without a node --------------------------------------------------------------------
def test_id_cache_bounds_by_size_and_ttl():
    from haremq.node.broker.deduplication import IdCache
    cache = IdCache(3, ttl=1000)
    for i, key in enumerate((b"a", b"b", b"c", b"d")):
        cache.add(key, 10_000 + i)
    assert [k for k, _ in cache.seen.items()] == [b"b", b"c", b"d"]      # a, the oldest, evicted
    assert cache.contains(b"b", 10_500) and not cache.contains(b"b", 11_001)   # beyond the TTL
    cache.replace([(b"x", 1), (b"y", 2)])
    assert cache.entries() == []                                         # long expired


def _key(**props):
    from pamqp import commands

    from haremq.node.broker.deduplication import message_key
    from haremq.node.protocol.properties import encode_properties
    return message_key(encode_properties(commands.Basic.Properties(**props)))


def test_an_id_keeps_its_amqp_type():
    # as the plugin, which keys its cache by the header's value: 1 and <<"1">> are two ids
    import datetime

    def header(value):
        return _key(headers={"x-deduplication-header": value})
    values = [1, "1", 1.0, True, decimal.Decimal("1"), datetime.datetime.fromtimestamp(1, datetime.timezone.utc),
              [1], ["1"], {"k": 1}, {"k": "1"}, 0, False, "True", "1.0"]
    keys = [header(v) for v in values]
    assert None not in keys and len(set(keys)) == len(values), keys
    assert header("1") == b"1" and _key(message_id="1") == b"1"       # strings: as logs always held them
    assert header(bytearray(b"1")) == header("1")                    # a byte array is a string, as in the plugin
    assert header(2 ** 40) == header(2 ** 40) != header(str(2 ** 40))   # every integer width: one type
    # a string that is not UTF-8 cannot pass for a typed id, nor a typed id for it
    assert header(bytearray(b"\xffi1")) != header(1)
    assert header(bytearray(b"\xffS\xffi1")) != header(bytearray(b"\xffi1"))


def test_an_empty_id_is_no_id():
    for empty in ("", bytearray(), [], {}, None):
        assert _key(headers={"x-deduplication-header": empty}) is None, empty
        assert _key(headers={"x-deduplication-header": empty}, message_id="m") == b"m", empty
    assert _key(message_id="") is None and _key() is None


class _Clock:
    """Stands in for the `time` module in node/broker/deduplication.py: a wall clock that can
    be stepped, and a monotonic one that only moves forward."""

    def __init__(self):
        self.wall, self.mono = 1_700_000_000.0, 5_000.0

    def time(self) -> float:
        return self.wall

    def monotonic(self) -> float:
        return self.mono

    def sleep(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds

    def step(self, seconds: float) -> None:       # NTP, or an operator, sets the wall clock
        self.wall += seconds

    def ms(self) -> int:
        return int(self.wall * 1000)


@pytest.fixture
def clock(monkeypatch):
    from haremq.node.broker import deduplication as dd
    c = _Clock()
    monkeypatch.setattr(dd, "time", c)
    monkeypatch.setattr(dd, "_anchor", None, raising=False)    # read the wall clock afresh
    return c


def _queue(ttl):
    from haremq.node.broker.queue import Queue
    return Queue(unique_name("dd"), "/", arguments={"x-message-deduplication": True, "x-cache-size": 100,
                                                    "x-cache-ttl": ttl})


def _enqueued(queue, message_id) -> bool:
    """Publish a message with this id to an in-memory queue; whether it was enqueued."""
    from pamqp import commands

    from haremq.node.broker.message import Message
    from haremq.node.protocol.properties import encode_properties
    before = queue.message_count
    queue.publish(Message("", queue.name, encode_properties(commands.Basic.Properties(message_id=message_id)), b"x"))
    return queue.message_count == before + 1


def test_a_step_of_the_wall_clock_moves_no_ttl(clock):
    q = _queue(ttl=1000)
    assert _enqueued(q, "back")
    clock.step(-3600)              # the wall clock goes back an hour
    clock.sleep(0.9)
    assert not _enqueued(q, "back")
    clock.sleep(0.2)               # the TTL has run out: the id counts no longer (not an hour more)
    assert _enqueued(q, "back")

    assert _enqueued(q, "ahead")
    clock.step(+3600)              # forward an hour: the id still counts for its TTL
    clock.sleep(0.5)
    assert not _enqueued(q, "ahead")
    clock.sleep(0.6)
    assert _enqueued(q, "ahead")


def test_stamps_from_another_clock_count_at_most_the_ttl_here(clock):
    """A promoted mirror inherits its old master's stamps (and a restarted node its log's):
    one from that clock's future counts as seen now, so the id lives a TTL here at most; one
    from a clock behind expires early by the difference, no more."""
    from haremq.node.broker.paged_queue import PagedQueue
    q = _queue(ttl=1000)
    now = clock.ms()
    copy = PagedQueue(None, 0, None, False, lambda _message, _at: 0.0)      # an empty mirror's
    q.take_over(copy, [(b"future", now + 3_600_000), (b"behind", now - 300)])
    clock.sleep(0.6)
    assert not _enqueued(q, "future") and not _enqueued(q, "behind")
    clock.sleep(0.2)               # 0.8 s: 'behind' was stamped 1.1 s ago by its clock
    assert _enqueued(q, "behind") and not _enqueued(q, "future")
    clock.sleep(0.3)               # 1.1 s since the promotion: 'future' no longer counts (not for an hour)
    assert _enqueued(q, "future")

    from haremq.node.broker.deduplication import IdCache
    mirror = IdCache(10)           # a mirror applies its master's stamps as they come
    mirror.add(b"m", clock.ms() + 3_600_000)
    assert mirror.entries() == [(b"m", clock.ms())]


def test_enqueue_records_carry_the_id_and_old_records_read_the_same():
    from haremq.node.store import records as rec
    plain = rec.enqueue(7, 42, 0, b"\x02ex", b"\x02rk", b"\x00\x00", b"body")
    tagged = rec.enqueue(7, 42, 0, b"\x02ex", b"\x02rk", b"\x00\x00", b"body", (b"id-1", 1234))
    for record in (plain, tagged):
        rtype, start, end = rec.check(record, 0)
        assert rtype == rec.ENQUEUE
        assert rec.parse_enqueue(record[start:end]) == (7, 42, rec.FLAG_DEDUP if record is tagged else 0,
                                                       "ex", "rk", b"\x00\x00", b"body")
    assert rec.parse_enqueue_dedup(tagged, rec.HEADER_SIZE) == (b"id-1", 1234)
    assert rec.without_dedup(tagged) == plain          # what compaction copies
    ids = rec.dedup_ids(7, [(b"a", 1), (b"bb", 2)], True)
    rtype, start, end = rec.check(ids, 0)
    assert rtype == rec.DEDUP_IDS and rec.parse_dedup_ids(ids[start:end]) == (7, True, [(b"a", 1), (b"bb", 2)])


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """This module's node, with the management API (policies, queue objects)."""
    n = ManagedNode("hare-dedup", tmp_path_factory.mktemp("dedup")).start()
    yield n
    n.stop()


@pytest.fixture
def cch(node):
    conn = pika_conn(node)
    ch = conn.channel()
    ch.confirm_delivery()
    yield ch
    if conn.is_open:
        conn.close()


def test_duplicates_by_message_id_are_confirmed_and_dropped(cch):
    q = unique_name("dd")
    _declare(cch, q)
    for i in range(3):
        for _ in range(3):   # every publish is confirmed (confirm_delivery raises on a nack)
            _publish(cch, q, f"m{i}".encode(), message_id=f"id{i}")
    _publish(cch, q, b"no-id")
    _publish(cch, q, b"no-id")     # neither header nor message_id: enqueued normally
    assert _bodies(cch, q) == [b"m0", b"m1", b"m2", b"no-id", b"no-id"]


def test_the_header_wins_over_message_id(cch):
    q = unique_name("dd")
    _declare(cch, q)
    _publish(cch, q, b"a", message_id="same", header="h1")
    _publish(cch, q, b"b", message_id="same", header="h2")     # another header: not a duplicate
    _publish(cch, q, b"c", message_id="other", header="h1")    # the header was seen: a duplicate
    _publish(cch, q, b"d", message_id="h2")                    # ids share one space
    assert _bodies(cch, q) == [b"a", b"b"]


def test_an_integer_and_a_string_id_with_the_same_text_are_two_ids(cch):
    q = unique_name("dd")
    _declare(cch, q)
    _publish(cch, q, b"int", header=1)
    _publish(cch, q, b"str", header="1")            # not the integer's duplicate
    _publish(cch, q, b"int-again", header=1)
    _publish(cch, q, b"str-again", header="1")
    _publish(cch, q, b"mid", message_id="1")        # a message_id is a string: the string's duplicate
    _publish(cch, q, b"decimal", header=decimal.Decimal(1))
    _publish(cch, q, b"bool", header=True)
    assert _bodies(cch, q) == [b"int", b"str", b"decimal", b"bool"]


def test_an_empty_id_deduplicates_nothing(cch):
    q = unique_name("dd")
    _declare(cch, q)
    for i in range(2):
        _publish(cch, q, b"empty-header-%d" % i, header="")
        _publish(cch, q, b"empty-id-%d" % i, message_id="")
        _publish(cch, q, b"empty-header-with-id-%d" % i, message_id="m", header="")   # the message_id decides
    assert _bodies(cch, q) == [b"empty-header-0", b"empty-id-0", b"empty-header-with-id-0",
                               b"empty-header-1", b"empty-id-1"]


def test_an_id_outlives_its_message(cch):
    q = unique_name("dd")
    _declare(cch, q)
    _publish(cch, q, b"first", header="k")
    assert _bodies(cch, q) == [b"first"]      # consumed and acked
    _publish(cch, q, b"again", header="k")
    assert _bodies(cch, q) == []


def test_cache_ttl(cch):
    q = unique_name("dd")
    _declare(cch, q, ttl=600)
    _publish(cch, q, b"1", message_id="x")
    _publish(cch, q, b"2", message_id="x")      # within the TTL: dropped
    time.sleep(0.8)
    _publish(cch, q, b"3", message_id="x")      # beyond it: a new message
    _publish(cch, q, b"4", message_id="x")
    assert _bodies(cch, q) == [b"1", b"3"]


def test_cache_size_evicts_the_oldest_id(cch):
    q = unique_name("dd")
    _declare(cch, q, size=3)
    for i in range(4):
        _publish(cch, q, f"{i}".encode(), message_id=f"id{i}")     # id0 is evicted by id3
    _publish(cch, q, b"0-again", message_id="id0")
    _publish(cch, q, b"3-again", message_id="id3")
    assert _bodies(cch, q) == [b"0", b"1", b"2", b"3", b"0-again"]


@pytest.mark.parametrize("args, text", [
    ({"x-message-deduplication": True}, "x-cache-size"),
    ({"x-message-deduplication": True, "x-cache-size": 0}, "x-cache-size"),
    ({"x-message-deduplication": True, "x-cache-size": -5}, "x-cache-size"),
    ({"x-message-deduplication": True, "x-cache-size": "10"}, "x-cache-size"),
    ({"x-message-deduplication": True, "x-cache-size": 10, "x-cache-ttl": 0}, "x-cache-ttl"),
    ({"x-message-deduplication": True, "x-cache-size": 10, "x-cache-ttl": "1s"}, "x-cache-ttl"),
    ({"x-message-deduplication": "yes", "x-cache-size": 10}, "x-message-deduplication"),
])
def test_bad_arguments_are_refused_with_406(node, args, text):
    conn = pika_conn(node)
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
        ch.queue_declare(unique_name("bad"), arguments=args)
    assert err.value.reply_code == 406
    assert text in err.value.reply_text and "PRECONDITION_FAILED" in err.value.reply_text
    assert ch.is_closed and conn.is_open
    conn.close()


def test_deduplication_by_policy(node, cch):
    q = unique_name("ddpol")
    policy = f"/api/policies/%2F/{quoted('dd-' + q)}"
    status, body, _ = node.api("PUT", policy, {"pattern": f"^{q}$", "apply-to": "queues",
                                               "definition": {"message-deduplication": True, "cache-size": 10}})
    assert status in (201, 204), body
    cch.queue_declare(q)
    _publish(cch, q, b"a", message_id="p")
    _publish(cch, q, b"b", message_id="p")
    assert _bodies(cch, q) == [b"a"]
    status, body, _ = node.api("GET", f"/api/queues/%2F/{quoted(q)}")
    assert status == 200 and body["dedup_cache_size"] == 1 and body["dedup_dropped"] == 1, body
    status, body, _ = node.api("PUT", policy, {"pattern": f"^{q}$", "apply-to": "queues",
                                               "definition": {"message-deduplication": True, "cache-size": 0}})
    assert status == 400, body           # RabbitMQ's validation: a positive integer
    assert node.api("DELETE", policy)[0] == 204
    _publish(cch, q, b"c", message_id="p")     # no policy: no deduplication
    assert _bodies(cch, q) == [b"c"]


# ---- durability: kill -9 and restart ---------------------------------------------------------------
@pytest.fixture
def own(tmp_path):
    nodes = []

    def make(*extra):
        n = ManagedNode("hare-dd-own", tmp_path, list(extra))
        nodes.append(n)
        return n.start()
    yield make
    for n in nodes:
        n.kill9()


def _restarted(n):
    n.kill9()
    n.start(timeout=60)
    conn = pika_conn(n)
    ch = conn.channel()
    ch.confirm_delivery()
    return ch


def test_ids_survive_kill9_also_of_consumed_and_acked_messages(own):
    n = own()
    ch = pika_conn(n).channel()
    ch.confirm_delivery()
    _declare(ch, "dd.durable", size=1000, durable=True)
    for i in range(20):
        _publish(ch, "dd.durable", f"m{i}".encode(), message_id=f"id{i}", persistent=True)
    acker = ch.connection.channel()
    acker.tx_select()       # tx.commit returns once the acks are durable
    for _ in range(10):     # the first ten are consumed and acked before the kill
        method, _p, _b = acker.basic_get("dd.durable")
        acker.basic_ack(method.delivery_tag)
    acker.tx_commit()
    ch = _restarted(n)
    for i in range(25):     # all twenty again, and five new ones
        _publish(ch, "dd.durable", f"again{i}".encode(), message_id=f"id{i}", persistent=True)
    assert _bodies(ch, "dd.durable") == [f"m{i}".encode() for i in range(10, 20)] + \
        [f"again{i}".encode() for i in range(20, 25)]
    status, body, _ = n.api("GET", "/api/queues/%2F/dd.durable")
    assert body["dedup_cache_size"] == 25 and body["dedup_dropped"] == 20, body


def test_ids_outlive_the_segments_of_their_messages_and_compaction(own):
    # small segments: those of consumed messages are removed and a pinned one is compacted;
    # the ids are written again before each goes, so a restart still knows every one
    n = own("--segment-size", str(256 * 1024))
    conn = pika_conn(n)
    ch = conn.channel()
    ch.confirm_delivery()
    _declare(ch, "dd.compact", size=10_000, durable=True)
    _publish(ch, "dd.compact", b"pinned", message_id="pinned", persistent=True)
    pinned, _, _ = ch.basic_get("dd.compact")                       # held unacked throughout
    acker = conn.channel()
    acker.tx_select()
    body = b"z" * 1000
    for r in range(8):
        for i in range(600):
            _publish(ch, "dd.compact", body, message_id=f"{r}.{i}", persistent=True)
        for _ in range(600):
            m, _, _ = acker.basic_get("dd.compact")
            acker.basic_ack(m.delivery_tag)
        acker.tx_commit()

    def files():
        return [p for p in (n.data_dir / "msgs").glob("*.seg") if _has_records(p)]
    wait_until(lambda: len(files()) <= 4, timeout=30, message="segments were never removed")
    ch.basic_nack(pinned.delivery_tag, requeue=True)
    ch = _restarted(n)
    _publish(ch, "dd.compact", b"pinned-again", message_id="pinned", persistent=True)
    for r in range(8):
        for i in range(600):
            _publish(ch, "dd.compact", b"again", message_id=f"{r}.{i}", persistent=True)
    _publish(ch, "dd.compact", b"new", message_id="new", persistent=True)
    assert _bodies(ch, "dd.compact") == [b"pinned", b"new"]


def _has_records(path) -> bool:
    try:
        with open(path, "rb") as f:
            return any(f.read(9))
    except FileNotFoundError:
        return False


# ---- replicated: a mirrored queue's ids on the promoted mirror ---------------------------------------
def _master(member, name, not_on=()):
    from tests.clusters import queue_row
    return wait_until(lambda: (lambda r: r if r and r["master"] not in not_on and r.get("state") != "down"
                               else None)(queue_row(member, name)), timeout=30)


def _publish_until_confirmed(ch, queue, body, message_id):
    """A publish after a failover: nacked while the queue has no master yet, then confirmed."""
    deadline = time.monotonic() + 20
    while True:
        try:
            return _publish(ch, queue, body, message_id=message_id, persistent=True)
        except pika.exceptions.NackError:
            assert time.monotonic() < deadline, "still nacked 20 s after the kill"
            time.sleep(0.1)


def test_ids_survive_master_failovers_of_a_mirrored_queue(cluster):
    # the ids come before the mirrors: these learn them from the sync, not from the live stream
    from tests.clusters import ctl, ctl_json, queue_row
    hare1, hare2, hare3 = cluster
    conn = pika.BlockingConnection(pika.URLParameters(hare2.url))
    ch = conn.channel()
    _declare(ch, "dd.ha", size=1000, durable=True)
    conn.close()
    conn = pika.BlockingConnection(pika.URLParameters(hare1.url))    # maybe through another node
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(100):
        _publish(ch, "dd.ha", f"m{i}".encode(), message_id=f"id{i}", persistent=True)
    for _ in range(50):          # half of them consumed and acked before the master dies
        method, _p, _b = ch.basic_get("dd.ha")
        ch.basic_ack(method.delivery_tag)
    conn.close()
    master = queue_row(hare1, "dd.ha")["node"]
    r = ctl(hare1, "set-policy", "ha", r"^dd\.", json.dumps({"ha-mode": "all", "ha-sync-mode": "automatic"}),
            "--apply-to", "queues")
    assert r.returncode == 0, r.stderr
    wait_until(lambda: len((queue_row(hare1, "dd.ha") or {}).get("synchronised_mirrors") or []) == 2, timeout=30)
    old = {"hare1": hare1, "hare2": hare2, "hare3": hare3}[master]
    others = [m for m in cluster if m is not old]

    old.kill9()
    row = _master(others[0], "dd.ha", not_on=(old.name,))
    first = {"hare1": hare1, "hare2": hare2, "hare3": hare3}[row["master"]]
    conn = pika.BlockingConnection(pika.URLParameters(first.url))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(100):
        _publish_until_confirmed(ch, "dd.ha", b"again", f"id{i}")
    _publish(ch, "dd.ha", b"new1", message_id="new1", persistent=True)
    conn.close()
    rows = {r["name"]: r for r in ctl_json(first, "list-queues", "name", "messages", "dedup_cache_size",
                                           "dedup_dropped")}
    assert rows["dd.ha"]["messages"] == 51, rows
    assert rows["dd.ha"]["dedup_cache_size"] == 101 and rows["dd.ha"]["dedup_dropped"] == 100, rows

    # the old master comes back as a mirror (a full sync brings it the ids), and the new master
    # dies too: whichever mirror takes over (fully synced, or reconciled) knows every id
    old.start(timeout=60)
    survivor = next(m for m in others if m is not first)
    wait_until(lambda: sorted((queue_row(survivor, "dd.ha") or {}).get("synchronised_mirrors") or [])
               == sorted([old.name, survivor.name]), timeout=60)
    first.kill9()
    _master(survivor, "dd.ha", not_on=(first.name,))
    conn = pika.BlockingConnection(pika.URLParameters(survivor.url))
    ch = conn.channel()
    ch.confirm_delivery()
    for i in range(100):
        _publish_until_confirmed(ch, "dd.ha", b"third", f"id{i}")
    _publish(ch, "dd.ha", b"new1-again", message_id="new1", persistent=True)
    _publish(ch, "dd.ha", b"new2", message_id="new2", persistent=True)
    bodies = _bodies(ch, "dd.ha")
    conn.close()
    assert sorted(bodies) == sorted([f"m{i}".encode() for i in range(50, 100)] + [b"new1", b"new2"]), bodies
