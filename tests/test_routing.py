"""PUB-1 / PUB-2: exchanges, bindings, routing, alternate exchanges, mandatory."""
import pika
import pytest
from pika.exceptions import ChannelClosedByBroker, UnroutableError

from tests.conftest import message_count, unique_name, wait_until


def declare_queue(ch, prefix="rq"):
    q = unique_name(prefix)
    ch.queue_declare(q, auto_delete=False, exclusive=True)
    return q


def drain(ch, q):
    """Bodies of every ready message in ``q`` (basic.get until get-empty)."""
    out = []
    while True:
        m, _, b = ch.basic_get(q, auto_ack=True)
        if m is None:
            return out
        out.append(b)


def headers(**h):
    return pika.BasicProperties(headers=h)


# ------------------------------------------------------------------ default and amq.*

def test_default_exchange_routes_by_queue_name(ch):
    # PUB-1
    q = declare_queue(ch)
    ch.basic_publish("", q, b"hello")
    assert drain(ch, q) == [b"hello"]


def test_default_exchange_unknown_name_is_unroutable(ch):
    # PUB-2
    with pytest.raises(UnroutableError) as ei:
        ch.basic_publish("", unique_name("nobody"), b"x", mandatory=True)
    ret = ei.value.messages[0].method
    assert (ret.reply_code, ret.reply_text) == (312, "NO_ROUTE")


@pytest.mark.parametrize("name,kind", [("amq.direct", "direct"), ("amq.fanout", "fanout"),
                                       ("amq.topic", "topic"), ("amq.headers", "headers"),
                                       ("amq.match", "headers")])
def test_predeclared_exchanges_exist(ch, name, kind):
    # PUB-1
    ch.exchange_declare(name, passive=True)
    ch.exchange_declare(name, kind, durable=True)  # equivalent redeclare is allowed


@pytest.mark.parametrize("name,kind", [("amq.direct", "direct"), ("amq.fanout", "fanout"),
                                       ("amq.topic", "topic"), ("amq.match", "headers")])
def test_predeclared_exchanges_route(ch, name, kind):
    # PUB-1
    q = declare_queue(ch)
    args = {"x-match": "all", "k": "v"} if kind == "headers" else None
    ch.queue_bind(q, name, routing_key="rk.1", arguments=args)
    ch.basic_publish(name, "rk.1", b"m", properties=headers(k="v"))
    assert drain(ch, q) == [b"m"]


# ------------------------------------------------------------------ direct / fanout

def test_direct_exchange_routes_on_exact_key(ch):
    # PUB-1
    x = unique_name("direct")
    ch.exchange_declare(x, "direct", auto_delete=True)
    qa1, qb, qa2 = declare_queue(ch), declare_queue(ch), declare_queue(ch)
    ch.queue_bind(qa1, x, "a")
    ch.queue_bind(qb, x, "b")
    ch.queue_bind(qa2, x, "a")
    ch.basic_publish(x, "a", b"1")
    ch.basic_publish(x, "b", b"2")
    ch.basic_publish(x, "A", b"3")  # keys are case-sensitive
    assert (drain(ch, qa1), drain(ch, qb), drain(ch, qa2)) == ([b"1"], [b"2"], [b"1"])


def test_queue_bound_twice_gets_one_copy(ch):
    # PUB-1
    x = unique_name("direct")
    ch.exchange_declare(x, "direct", auto_delete=True)
    q = declare_queue(ch)
    ch.queue_bind(q, x, "k")
    ch.queue_bind(q, x, "k")  # duplicate binding is idempotent
    ch.exchange_declare(x + ".f", "fanout", auto_delete=True)
    ch.queue_bind(q, x + ".f")
    ch.exchange_bind(x + ".f", x, "k")  # second path to the same queue
    ch.basic_publish(x, "k", b"once")
    assert drain(ch, q) == [b"once"]


def test_fanout_ignores_routing_key(ch):
    # PUB-1
    x = unique_name("fanout")
    ch.exchange_declare(x, "fanout", auto_delete=True)
    qs = [declare_queue(ch) for _ in range(3)]
    for i, q in enumerate(qs):
        ch.queue_bind(q, x, routing_key=f"ignored-{i}")
    ch.basic_publish(x, "whatever", b"all")
    assert [drain(ch, q) for q in qs] == [[b"all"]] * 3


# ------------------------------------------------------------------ topic

TOPIC_KEYS = ["a.b.c", "a.b", "a", "a.c", "a.b.b.c", "x.b.y", "a..c", ""]
TOPIC_EXPECT = {
    "a.*.c": {"a.b.c", "a..c"},
    "a.#": {"a.b.c", "a.b", "a", "a.c", "a.b.b.c", "a..c"},
    "#": set(TOPIC_KEYS),
    "*": {"a"},  # the empty key has zero words; "a..c" has an empty middle word
    "#.c": {"a.b.c", "a.c", "a.b.b.c", "a..c"},
    "a.#.c": {"a.b.c", "a.c", "a.b.b.c", "a..c"},
    "*.b.*": {"a.b.c", "x.b.y"},
    "a": {"a"},
    "*.*": {"a.b", "a.c"},
    "#.b.#": {"a.b.c", "a.b", "a.b.b.c", "x.b.y"},
}


def test_topic_star_and_hash(ch):
    # PUB-1: '*' is exactly one word, '#' zero or more words
    x = unique_name("topic")
    ch.exchange_declare(x, "topic", auto_delete=True)
    queues = {}
    for pattern in TOPIC_EXPECT:
        queues[pattern] = declare_queue(ch)
        ch.queue_bind(queues[pattern], x, pattern)
    for key in TOPIC_KEYS:
        ch.basic_publish(x, key, key.encode())
    got = {p: {b.decode() for b in drain(ch, q)} for p, q in queues.items()}
    assert got == TOPIC_EXPECT


# ------------------------------------------------------------------ headers

def test_headers_exchange_x_match_all(ch):
    # PUB-1
    x = unique_name("hdrs")
    ch.exchange_declare(x, "headers", auto_delete=True)
    q = declare_queue(ch)
    ch.queue_bind(q, x, arguments={"x-match": "all", "h1": "v1", "h2": "v2"})
    ch.basic_publish(x, "", b"both", properties=headers(h1="v1", h2="v2"))
    ch.basic_publish(x, "", b"extra", properties=headers(h1="v1", h2="v2", h3="x"))
    ch.basic_publish(x, "", b"one", properties=headers(h1="v1"))
    ch.basic_publish(x, "", b"wrong", properties=headers(h1="v1", h2="nope"))
    ch.basic_publish(x, "", b"none")
    assert drain(ch, q) == [b"both", b"extra"]


def test_headers_exchange_x_match_any(ch):
    # PUB-1
    x = unique_name("hdrs")
    ch.exchange_declare(x, "headers", auto_delete=True)
    q = declare_queue(ch)
    ch.queue_bind(q, x, arguments={"x-match": "any", "h1": "v1", "h2": "v2"})
    ch.basic_publish(x, "", b"h1", properties=headers(h1="v1"))
    ch.basic_publish(x, "", b"h2", properties=headers(h2="v2", other=1))
    ch.basic_publish(x, "", b"wrong", properties=headers(h1="zz"))
    ch.basic_publish(x, "", b"none")
    assert drain(ch, q) == [b"h1", b"h2"]


def test_headers_exchange_default_is_all_and_ignores_routing_key(ch):
    # PUB-1
    x = unique_name("hdrs")
    ch.exchange_declare(x, "headers", auto_delete=True)
    q = declare_queue(ch)
    ch.queue_bind(q, x, routing_key="ignored", arguments={"a": "1", "b": "2"})
    ch.basic_publish(x, "other", b"only-a", properties=headers(a="1"))
    ch.basic_publish(x, "other", b"a-and-b", properties=headers(a="1", b="2"))
    assert drain(ch, q) == [b"a-and-b"]


# ------------------------------------------------------------------ e2e, AE

def test_exchange_to_exchange_binding(ch):
    # PUB-1
    src, dst = unique_name("src"), unique_name("dst")
    ch.exchange_declare(src, "direct", auto_delete=False)
    ch.exchange_declare(dst, "fanout", auto_delete=True)
    q = declare_queue(ch)
    ch.queue_bind(q, dst)
    ch.exchange_bind(dst, src, routing_key="go")
    ch.basic_publish(src, "go", b"through")
    ch.basic_publish(src, "stop", b"blocked")
    assert drain(ch, q) == [b"through"]
    ch.exchange_unbind(dst, src, routing_key="go")
    with pytest.raises(UnroutableError):
        ch.basic_publish(src, "go", b"after-unbind", mandatory=True)
    assert drain(ch, q) == []
    ch.exchange_delete(src)


def test_exchange_bind_chain_of_three(ch):
    # PUB-1
    a, b, c = (unique_name(n) for n in "abc")
    ch.exchange_declare(a, "topic", auto_delete=True)
    ch.exchange_declare(b, "topic", auto_delete=True)
    ch.exchange_declare(c, "direct", auto_delete=True)
    ch.exchange_bind(b, a, "x.#")
    ch.exchange_bind(c, b, "x.y")
    q = declare_queue(ch)
    ch.queue_bind(q, c, "x.y")
    ch.basic_publish(a, "x.y", b"deep")
    ch.basic_publish(a, "x.z", b"stops-at-b")
    assert drain(ch, q) == [b"deep"]


def test_exchange_bind_to_missing_exchange_404(ch):
    # PUB-1
    x = unique_name("missing")
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.exchange_bind(x, "amq.direct", "k")
    assert (ei.value.reply_code, ei.value.reply_text) == (
        404, f"NOT_FOUND - no exchange '{x}' in vhost '/'")


def test_alternate_exchange_gets_unroutable(ch):
    # PUB-1
    x, ae = unique_name("main"), unique_name("ae")
    ch.exchange_declare(ae, "fanout", auto_delete=True)
    ch.exchange_declare(x, "direct", auto_delete=True, arguments={"alternate-exchange": ae})
    q_main, q_ae = declare_queue(ch), declare_queue(ch)
    ch.queue_bind(q_main, x, "known")
    ch.queue_bind(q_ae, ae)
    ch.basic_publish(x, "known", b"routed")
    ch.basic_publish(x, "unknown", b"to-ae", mandatory=True)  # AE routes it: no return
    assert drain(ch, q_main) == [b"routed"]
    assert drain(ch, q_ae) == [b"to-ae"]


def test_missing_alternate_exchange_means_unroutable(ch):
    # PUB-2
    x = unique_name("main")
    ch.exchange_declare(x, "direct", auto_delete=True,
                        arguments={"alternate-exchange": unique_name("absent")})
    with pytest.raises(UnroutableError) as ei:
        ch.basic_publish(x, "k", b"x", mandatory=True)
    assert ei.value.messages[0].method.reply_code == 312


# ------------------------------------------------------------------ mandatory

def test_mandatory_unroutable_returned_312_no_route(ch):
    # PUB-2 / CONF-4
    with pytest.raises(UnroutableError) as ei:
        ch.basic_publish("amq.direct", unique_name("nowhere"), b"back",
                         properties=pika.BasicProperties(message_id="m-1"), mandatory=True)
    (ret,) = ei.value.messages
    assert (ret.method.reply_code, ret.method.reply_text) == (312, "NO_ROUTE")
    assert ret.method.exchange == "amq.direct"
    assert ret.body == b"back" and ret.properties.message_id == "m-1"


def test_non_mandatory_unroutable_silently_dropped(ch):
    # PUB-2
    ch.basic_publish("amq.direct", unique_name("nowhere"), b"x")  # confirmed, no error
    assert ch.is_open


# ------------------------------------------------------------------ bind / unbind / delete

def test_queue_bind_to_missing_exchange_404(ch):
    # PUB-1
    q = declare_queue(ch)
    x = unique_name("missing")
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_bind(q, x, "k")
    assert (ei.value.reply_code, ei.value.reply_text) == (
        404, f"NOT_FOUND - no exchange '{x}' in vhost '/'")


def test_queue_bind_missing_queue_404(ch):
    # PUB-1
    q = unique_name("missing")
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.queue_bind(q, "amq.direct", "k")
    assert (ei.value.reply_code, ei.value.reply_text) == (
        404, f"NOT_FOUND - no queue '{q}' in vhost '/'")


def test_unbind_stops_routing(ch):
    # PUB-1
    x = unique_name("direct")
    ch.exchange_declare(x, "direct", auto_delete=False)
    q = declare_queue(ch)
    ch.queue_bind(q, x, "k")
    ch.basic_publish(x, "k", b"before")
    ch.queue_unbind(q, x, "k")
    ch.basic_publish(x, "k", b"after")
    assert drain(ch, q) == [b"before"]
    ch.exchange_delete(x)


def test_exchange_delete_if_unused_406(ch):
    # PUB-1
    x = unique_name("inuse")
    ch.exchange_declare(x, "direct", auto_delete=False)
    q = declare_queue(ch)
    ch.queue_bind(q, x, "k")
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.exchange_delete(x, if_unused=True)
    assert (ei.value.reply_code, ei.value.reply_text) == (
        406, f"PRECONDITION_FAILED - exchange '{x}' in vhost '/' in use")
    ch2 = ch.connection.channel()
    ch2.exchange_declare(x, passive=True)  # still there
    ch2.exchange_delete(x)
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch2.exchange_declare(x, passive=True)
    assert ei.value.reply_code == 404


def test_exchange_delete_if_unused_succeeds_without_bindings(ch):
    # PUB-1
    x = unique_name("unused")
    ch.exchange_declare(x, "fanout", auto_delete=False)
    ch.exchange_delete(x, if_unused=True)
    with pytest.raises(ChannelClosedByBroker) as ei:
        ch.exchange_declare(x, passive=True)
    assert ei.value.reply_code == 404


def test_exchange_delete_removes_its_bindings(ch):
    # PUB-1
    x = unique_name("gone")
    ch.exchange_declare(x, "direct", auto_delete=False)
    q = declare_queue(ch)
    ch.queue_bind(q, x, "k")
    ch.exchange_delete(x)
    ch.exchange_declare(x, "direct", auto_delete=False)  # same name, fresh: no bindings
    with pytest.raises(UnroutableError):
        ch.basic_publish(x, "k", b"x", mandatory=True)
    ch.exchange_delete(x)


def test_queue_delete_removes_its_bindings(ch):
    # PUB-1
    x = unique_name("direct")
    ch.exchange_declare(x, "direct", auto_delete=False)
    q = unique_name("tmp")
    ch.queue_declare(q)
    ch.queue_bind(q, x, "k")
    ch.queue_delete(q)
    with pytest.raises(UnroutableError):
        ch.basic_publish(x, "k", b"x", mandatory=True)
    ch.exchange_delete(x)


def test_auto_delete_exchange_deleted_when_last_binding_goes(ch):
    # PUB-1
    x = unique_name("autodel")
    ch.exchange_declare(x, "direct", auto_delete=True)
    q1, q2 = declare_queue(ch), declare_queue(ch)
    ch.queue_bind(q1, x, "k")
    ch.queue_bind(q2, x, "k")
    ch.queue_unbind(q1, x, "k")
    ch.exchange_declare(x, passive=True)  # one binding left
    ch.queue_unbind(q2, x, "k")
    conn = ch.connection

    def gone():
        try:
            conn.channel().exchange_declare(x, passive=True)
            return False
        except ChannelClosedByBroker as e:
            return e.reply_code == 404

    wait_until(gone, 5, message="auto-delete exchange survived the removal of its last binding")


def test_auto_delete_exchange_without_bindings_stays(ch):
    # PUB-1
    x = unique_name("autodel-never-bound")
    ch.exchange_declare(x, "direct", auto_delete=True)
    ch.exchange_declare(x, passive=True)


def test_routing_counts_via_declare_ok(ch):
    # PUB-1
    x = unique_name("fan")
    ch.exchange_declare(x, "fanout", auto_delete=True)
    q1, q2 = declare_queue(ch), declare_queue(ch)
    ch.queue_bind(q1, x)
    ch.queue_bind(q2, x)
    for i in range(5):
        ch.basic_publish(x, "", str(i).encode())
    assert (message_count(ch, q1), message_count(ch, q2)) == (5, 5)
