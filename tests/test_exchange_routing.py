"""Unit tests for node.broker.exchange (PUB-1): pure, no sockets."""

import pytest

from haremq.node.broker import exchange as exmod
from haremq.node.broker.exchange import (
    TOPIC_CACHE_SIZE,
    BindingArgumentError,
    Exchange,
    ExchangeType,
    route,
)


class Q:
    """Opaque queue stand-in; identity-hashed like the real queue objects."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Q({self.name})"


def registry(*exchanges):
    table = {x.name: x for x in exchanges}
    return table.get


def no_lookup(_name):
    return None


# ------------------------------------------------------------------ types


def test_exchange_type_coerced_from_string():
    x = Exchange("x", "topic")
    assert x.type is ExchangeType.TOPIC
    assert x.type == "topic"


def test_exchange_is_identity_hashed():
    a, b = Exchange("x", "direct"), Exchange("x", "direct")
    assert a != b
    assert len({a, b}) == 2


def test_direct_exact_key():
    x = Exchange("d", ExchangeType.DIRECT)
    q1, q2, q3 = Q(1), Q(2), Q(3)
    x.bind(q1, "a", None)
    x.bind(q2, "a", None)
    x.bind(q3, "b", None)
    assert x.match("a", None) == [q1, q2]
    assert x.match("b", None) == [q3]
    assert x.match("A", None) == []
    assert x.match("", None) == []
    x.bind(q3, "", None)
    assert x.match("", None) == [q3]


def test_direct_is_a_dict_lookup():
    x = Exchange("d", "direct")
    for i in range(1000):
        x.bind(Q(i), f"k{i}", None)
    assert set(x._direct) == {f"k{i}" for i in range(1000)}
    assert [q.name for q in x.match("k500", None)] == [500]


def test_direct_order_follows_first_bind_of_destination():
    x = Exchange("d", "direct")
    q1, q2 = Q(1), Q(2)
    x.bind(q1, "other", None)
    x.bind(q2, "k", None)
    x.bind(q1, "k", None)  # q1 was bound to this exchange first
    assert x.match("k", None) == [q1, q2]


def test_fanout_ignores_key():
    x = Exchange("f", "fanout")
    q1, q2 = Q(1), Q(2)
    x.bind(q1, "", None)
    x.bind(q2, "whatever", None)
    x.bind(q2, "again", None)
    assert x.match("anything", None) == [q1, q2]
    assert x.match("", {"a": 1}) == [q1, q2]
    x.unbind(q2, "whatever", None)
    assert x.match("k", None) == [q1, q2]
    x.unbind(q2, "again", None)
    assert x.match("k", None) == [q1]


# ------------------------------------------------------------------ topic

TOPIC_CASES = [
    # pattern, routing key, expected
    ("a.b.c", "a.b.c", True),
    ("a.b.c", "a.b", False),
    ("a.b.c", "a.b.c.d", False),
    ("a.*.c", "a.b.c", True),
    ("a.*.c", "a.c", False),
    ("a.*.c", "a.b.b.c", False),
    ("*", "a", True),
    ("*", "a.b", False),
    ("*", "", False),          # "" is zero words in RabbitMQ
    ("*", ".", False),         # two empty words
    ("*.*", ".", True),
    ("*", "*", True),          # literal '*' word in the routing key
    ("#", "", True),
    ("#", "a", True),
    ("#", "a.b.c", True),
    ("#", ".", True),
    ("", "", True),
    ("", "a", False),
    ("a", "", False),
    ("#.#", "", True),
    ("a.#", "a", True),        # '#' matches zero words
    ("a.#", "a.b", True),
    ("a.#", "a.b.c", True),
    ("a.#", "b.a", False),
    ("a.#", "", False),
    ("#.a", "a", True),
    ("#.a", "x.y.a", True),
    ("#.a", "a.x", False),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("a.#.b", "a.x.y", False),
    ("#.b.#", "b", True),
    ("#.b.#", "a.b.c", True),
    ("#.b.#", "a.c", False),
    ("*.#", "", False),
    ("*.#", "a", True),
    ("#.*", "a.b", True),
    ("#.*", "", False),
    ("a.*.#", "a", False),
    ("a.*.#", "a.b", True),
    ("a.*.#", "a.b.c.d", True),
    ("a..b", "a..b", True),    # empty words are words
    ("a.*.b", "a..b", True),
    ("a.b", "a..b", False),
    ("a.", "a.", True),
    ("a.*", "a.", True),
    ("a", "a.", False),
    (".a", ".a", True),
    ("*.a", ".a", True),
    ("#.#.#.x", "x", True),
    ("#.#.#.x", "a.b.c.d.e.f.g.x", True),
    ("#.#.#.x", "a.b.c.d.e.f.g.y", False),
    ("a#", "a#", True),        # '#' inside a word is literal
    ("a#", "ab", False),
    ("a*", "ab", False),
    ("A.b", "a.b", False),     # case sensitive
    ("stock.usd.nyse", "stock.usd.nyse", True),
    ("*.orange.*", "quick.orange.rabbit", True),
    ("*.*.rabbit", "lazy.orange.male.rabbit", False),
    ("lazy.#", "lazy.orange.male.rabbit", True),
]


@pytest.mark.parametrize("pattern,key,expected", TOPIC_CASES)
def test_topic_table(pattern, key, expected):
    x = Exchange("t", "topic")
    q = Q("q")
    x.bind(q, pattern, None)
    assert x.match(key, None) == ([q] if expected else [])


@pytest.mark.parametrize("pattern,key,expected", TOPIC_CASES)
def test_topic_table_with_neighbours(pattern, key, expected):
    # Same table inside a populated trie so shared prefixes are exercised.
    x = Exchange("t", "topic")
    others = [Q(p) for p in ("zz.top", "a.zz", "#.zz", "*.*.*.*.*.*.*.*.*.*.zz")]
    for o in others:
        x.bind(o, o.name, None)
    q = Q("q")
    x.bind(q, pattern, None)
    assert (q in x.match(key, None)) is expected


def test_topic_same_queue_two_patterns_gets_one_copy():
    x = Exchange("t", "topic")
    q = Q("q")
    x.bind(q, "a.*", None)
    x.bind(q, "#.b", None)
    x.bind(q, "a.b", None)
    assert x.match("a.b", None) == [q]


def test_topic_results_in_bind_order():
    x = Exchange("t", "topic")
    qs = [Q(i) for i in range(5)]
    patterns = ["#", "a.b", "*.b", "a.#", "a.*"]
    for q, p in zip(qs, patterns):
        x.bind(q, p, None)
    assert x.match("a.b", None) == qs


def test_topic_unbind_prunes_trie():
    x = Exchange("t", "topic")
    q = Q("q")
    x.bind(q, "a.b.c", None)
    x.bind(q, "a.#", None)
    x.unbind(q, "a.b.c", None)
    assert list(x._topic_root.children) == ["a"]
    assert list(x._topic_root.children["a"].children) == ["#"]
    x.unbind(q, "a.#", None)
    assert x._topic_root.children == {}
    assert x.match("a.b.c", None) == []


def test_topic_multiple_routing_keys_union():
    x = Exchange("t", "topic")
    q1, q2 = Q(1), Q(2)
    x.bind(q1, "a.*", None)
    x.bind(q2, "b.*", None)
    assert x.match(["b.x", "a.x", "a.y"], None) == [q1, q2]


# ------------------------------------------------------------ topic cache


def count_trie_calls(monkeypatch):
    calls = []
    real = exmod._trie_match

    def spy(root, words):
        calls.append(words)
        return real(root, words)

    monkeypatch.setattr(exmod, "_trie_match", spy)
    return calls


def test_topic_cache_hit_does_not_rerun_matcher_with_1000_bindings(monkeypatch):
    x = Exchange("t", "topic")
    queues = [Q(i) for i in range(1000)]
    for i, q in enumerate(queues):
        x.bind(q, f"svc{i}.*.event", None)
    hot = Q("hot")
    x.bind(hot, "#.event", None)
    calls = count_trie_calls(monkeypatch)

    first = x.match("svc7.eu.event", None)
    assert first == [queues[7], hot]
    for _ in range(1000):
        assert x.match("svc7.eu.event", None) == first
    assert len(calls) == 1
    # The cached result must not be mutated by callers.
    first.clear()
    assert x.match("svc7.eu.event", None) == [queues[7], hot]
    assert len(calls) == 1


def test_topic_cache_invalidated_on_bind_and_unbind(monkeypatch):
    x = Exchange("t", "topic")
    q1, q2 = Q(1), Q(2)
    x.bind(q1, "a.*", None)
    calls = count_trie_calls(monkeypatch)
    assert x.match("a.b", None) == [q1]
    assert x.match("a.b", None) == [q1]
    assert len(calls) == 1

    assert x.bind(q2, "#", None)
    assert x.match("a.b", None) == [q1, q2]
    assert len(calls) == 2

    assert x.unbind(q1, "a.*", None)
    assert x.match("a.b", None) == [q2]
    assert len(calls) == 3

    assert x.unbind_all(q2) == 1
    assert x.match("a.b", None) == []
    assert len(calls) == 4

    # A no-op bind/unbind does not throw the cache away.
    x.bind(q1, "z", None)
    x.match("a.b", None)
    calls.clear()
    assert not x.bind(q1, "z", None)
    assert not x.unbind(q2, "nope", None)
    x.match("a.b", None)
    assert calls == []


def test_topic_cache_is_bounded():
    x = Exchange("t", "topic")
    x.bind(Q("q"), "#", None)
    for i in range(TOPIC_CACHE_SIZE + 500):
        x.match(f"k.{i}", None)
    assert len(x._topic_cache) == TOPIC_CACHE_SIZE
    assert "k.0" not in x._topic_cache
    assert f"k.{TOPIC_CACHE_SIZE + 499}" in x._topic_cache


def test_topic_cache_is_lru(monkeypatch):
    x = Exchange("t", "topic")
    x.bind(Q("q"), "#", None)
    x.match("hot", None)
    for i in range(TOPIC_CACHE_SIZE + 10):
        x.match("hot", None)  # keep it recently used
        x.match(f"cold.{i}", None)
    assert "hot" in x._topic_cache


def _reference_topic_match(pattern_words, key_words):
    if not pattern_words:
        return not key_words
    head, rest = pattern_words[0], pattern_words[1:]
    if head == "#":
        return any(_reference_topic_match(rest, key_words[i:])
                   for i in range(len(key_words) + 1))
    if not key_words:
        return False
    if head == "*" or head == key_words[0]:
        return _reference_topic_match(rest, key_words[1:])
    return False


def _words(s):
    return s.split(".") if s else []


def test_topic_trie_agrees_with_reference_matcher():
    import random

    rng = random.Random(1234)
    alphabet = ["a", "b", "", "*", "#"]
    patterns = sorted({".".join(rng.choice(alphabet) for _ in range(rng.randint(0, 4)))
                       for _ in range(300)})
    keys = sorted({".".join(rng.choice(["a", "b", ""]) for _ in range(rng.randint(0, 5)))
                   for _ in range(300)})
    x = Exchange("t", "topic")
    queues = {p: Q(p) for p in patterns}
    for p, q in queues.items():
        x.bind(q, p, None)
    for key in keys:
        expected = [queues[p] for p in patterns
                    if _reference_topic_match(_words(p), _words(key))]
        assert x.match(key, None) == expected, key


def test_topic_many_hashes_long_key_terminates():
    x = Exchange("t", "topic")
    q = Q("q")
    x.bind(q, ".".join(["#"] * 12) + ".z", None)
    key = ".".join(["a"] * 60)
    assert x.match(key, None) == []
    assert x.match(key + ".z", None) == [q]


# ---------------------------------------------------------------- headers


def hx(binding_args):
    x = Exchange("h", "headers")
    q = Q("q")
    x.bind(q, "", binding_args)
    return x, q


HEADERS_CASES = [
    # binding args, message headers, expected
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "x"}, True),
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "x", "c": 3}, True),
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1}, False),
    ({"x-match": "all", "a": 1, "b": "x"}, {"a": 1, "b": "y"}, False),
    ({"a": 1, "b": "x"}, {"a": 1, "b": "x"}, True),      # default is all
    ({"a": 1, "b": "x"}, {"a": 1}, False),
    ({"x-match": "any", "a": 1, "b": "x"}, {"b": "x"}, True),
    ({"x-match": "any", "a": 1, "b": "x"}, {"a": 2, "b": "y"}, False),
    ({"x-match": "any", "a": 1, "b": "x"}, {}, False),
    ({"x-match": "any", "a": 1, "b": "x"}, None, False),
    # no (non-x) binding args: all matches everything, any matches nothing
    ({}, None, True),
    ({"x-match": "all"}, {"k": 1}, True),
    ({"x-match": "any"}, {"k": 1}, False),
    ({"x-match": "all", "x-foo": "bar"}, {}, True),
    ({"x-match": "any", "x-foo": "bar"}, {"x-foo": "bar"}, False),
    # x- arguments ignored unless -with-x
    ({"x-match": "all", "a": 1, "x-foo": "bar"}, {"a": 1}, True),
    ({"x-match": "all-with-x", "a": 1, "x-foo": "bar"}, {"a": 1}, False),
    ({"x-match": "all-with-x", "a": 1, "x-foo": "bar"}, {"a": 1, "x-foo": "bar"}, True),
    ({"x-match": "any-with-x", "x-foo": "bar"}, {"x-foo": "bar"}, True),
    ({"x-match": "any-with-x", "x-foo": "bar"}, {"x-foo": "baz"}, False),
    ({"x-match": "any", "x-foo": "bar", "a": 1}, {"x-foo": "bar"}, False),
    ({"x-match": "all-with-x"}, {}, True),                 # x-match itself never counts
    ({"x-match": "any-with-x"}, {"x-match": "any-with-x"}, False),
    # void binding value: presence only
    ({"a": None}, {"a": "anything"}, True),
    ({"a": None}, {"a": None}, True),
    ({"a": None}, {"b": 1}, False),
    ({"x-match": "any", "a": None, "b": 2}, {"a": 0}, True),
    # value typing
    ({"a": 1}, {"a": "1"}, False),
    ({"a": "1"}, {"a": 1}, False),
    ({"a": 1}, {"a": 1.0}, True),          # Erlang == on numbers
    ({"a": True}, {"a": 1}, False),        # booleans are not integers
    ({"a": 1}, {"a": True}, False),
    ({"a": True}, {"a": True}, True),
    ({"a": "x"}, {"a": b"x"}, True),       # longstr vs byte array payload
    ({"a": "x"}, {"a": None}, False),
    ({"a": {"n": 1}}, {"a": {"n": 1}}, True),
    ({"a": [1, 2]}, {"a": [1, 2]}, True),
    ({"a": [1, 2]}, {"a": [2, 1]}, False),
]


@pytest.mark.parametrize("args,headers,expected", HEADERS_CASES)
def test_headers_table(args, headers, expected):
    x, q = hx(args)
    assert x.match("ignored", headers) == ([q] if expected else [])


def test_headers_routing_key_ignored():
    x, q = hx({"a": 1})
    assert x.match("", {"a": 1}) == [q]
    assert x.match("anything", {"a": 1}) == [q]


def test_headers_x_match_as_bytes_accepted():
    x, q = hx({"x-match": b"any", "a": 1, "b": 2})
    assert x.match("", {"b": 2}) == [q]


@pytest.mark.parametrize("bad", ["some", "ALL", "", 1, True])
def test_headers_invalid_x_match_rejected(bad):
    x = Exchange("h", "headers")
    with pytest.raises(BindingArgumentError):
        x.bind(Q("q"), "", {"x-match": bad})
    assert not x.has_bindings()


def test_x_match_not_validated_on_other_types():
    x = Exchange("d", "direct")
    assert x.bind(Q("q"), "k", {"x-match": "bogus"})


def test_headers_same_queue_two_bindings_one_copy():
    x = Exchange("h", "headers")
    q = Q("q")
    x.bind(q, "", {"a": 1})
    x.bind(q, "", {"b": 2})
    assert x.match("", {"a": 1, "b": 2}) == [q]
    x.unbind(q, "", {"a": 1})
    assert x.match("", {"a": 1, "b": 2}) == [q]
    assert x.match("", {"a": 1}) == []


# --------------------------------------------------------------- bindings


def test_bind_idempotent_and_identity_triple():
    x = Exchange("d", "direct")
    q = Q("q")
    assert x.bind(q, "k", None) is True
    assert x.bind(q, "k", {}) is False             # None == {} arguments
    assert x.bind(q, "k", {"a": 1}) is True        # different args: new binding
    assert x.bind(q, "k", {"a": True}) is True     # typed: True is not 1
    assert x.bind(q, "k", {"a": 1}) is False
    assert x.bind(q, "k2", None) is True
    assert len(x.bindings()) == 4
    assert x.match("k", None) == [q]


def test_binding_args_order_insensitive():
    x = Exchange("h", "headers")
    q = Q("q")
    assert x.bind(q, "", {"x-match": "any", "a": 1, "b": {"c": 1, "d": 2}})
    assert not x.bind(q, "", {"b": {"d": 2, "c": 1}, "a": 1, "x-match": "any"})
    assert x.unbind(q, "", {"a": 1, "x-match": "any", "b": {"d": 2, "c": 1}})
    assert not x.has_bindings()


def test_bindings_listing_in_bind_order():
    x = Exchange("t", "topic")
    q1, q2 = Q(1), Q(2)
    x.bind(q1, "a", None)
    x.bind(q2, "b", {"x": 1})
    assert x.bindings() == [(q1, "a", {}), (q2, "b", {"x": 1})]
    # Caller mutation of the argument dict does not reach the binding.
    args = {"k": 1}
    x.bind(q1, "c", args)
    args["k"] = 2
    assert x.bindings()[-1] == (q1, "c", {"k": 1})


def test_unbind_returns_whether_it_existed():
    x = Exchange("d", "direct")
    q = Q("q")
    x.bind(q, "k", {"a": 1})
    assert x.unbind(q, "k", None) is False
    assert x.unbind(Q("other"), "k", {"a": 1}) is False
    assert x.unbind(q, "k", {"a": 1}) is True
    assert x.unbind(q, "k", {"a": 1}) is False
    assert not x.has_bindings()
    assert x.match("k", None) == []
    assert x._direct == {}


def test_direct_unbind_one_of_two_args_keeps_route():
    x = Exchange("d", "direct")
    q = Q("q")
    x.bind(q, "k", {"a": 1})
    x.bind(q, "k", {"a": 2})
    x.unbind(q, "k", {"a": 1})
    assert x.match("k", None) == [q]
    x.unbind(q, "k", {"a": 2})
    assert x.match("k", None) == []


@pytest.mark.parametrize("kind", list(ExchangeType))
def test_unbind_all(kind):
    x = Exchange("x", kind)
    q1, q2 = Q(1), Q(2)
    x.bind(q1, "a", None)
    x.bind(q1, "b", None)
    x.bind(q1, "a", {"z": 1})
    x.bind(q2, "a", None)
    assert x.unbind_all(q1) == 3
    assert x.unbind_all(q1) == 0
    assert x.bindings() == [(q2, "a", {})]
    assert x.has_bindings()
    assert q1 not in x.match("a", {"z": 1})
    assert q1 not in x.match("b", {"z": 1})
    assert x.unbind_all(q2) == 1
    assert not x.has_bindings()
    assert x.match("a", {}) == []


def test_rebound_destination_goes_to_the_end():
    x = Exchange("f", "fanout")
    q1, q2 = Q(1), Q(2)
    x.bind(q1, "", None)
    x.bind(q2, "", None)
    x.unbind(q1, "", None)
    x.bind(q1, "", None)
    assert x.match("", None) == [q2, q1]


def test_alternate_exchange_property():
    assert Exchange("x", "direct").alternate_exchange is None
    assert Exchange("x", "direct", arguments={"alternate-exchange": "ae"}).alternate_exchange == "ae"
    assert Exchange("x", "direct", arguments={"alternate-exchange": b"ae"}).alternate_exchange == "ae"
    assert Exchange("x", "direct", arguments=None).arguments == {}


# ---------------------------------------------------------------- routing


def test_route_plain():
    x = Exchange("d", "direct")
    q = Q("q")
    x.bind(q, "k", None)
    assert route(x, "k", None, no_lookup) == [q]
    assert route(x, "nope", None, no_lookup) == []


def test_route_e2e_chain():
    a = Exchange("a", "direct")
    b = Exchange("b", "topic")
    c = Exchange("c", "fanout")
    qb, qc = Q("qb"), Q("qc")
    a.bind(b, "k.x", None)
    b.bind(qb, "k.*", None)
    b.bind(c, "#", None)
    c.bind(qc, "", None)
    assert route(a, "k.x", None, no_lookup) == [qb, qc]
    assert route(a, "k.y", None, no_lookup) == []


def test_route_e2e_cycle_is_safe():
    a = Exchange("a", "fanout")
    b = Exchange("b", "fanout")
    q = Q("q")
    a.bind(b, "", None)
    b.bind(a, "", None)
    b.bind(q, "", None)
    a.bind(a, "", None)  # self-binding
    assert route(a, "k", None, no_lookup) == [q]
    assert route(b, "k", None, no_lookup) == [q]


def test_route_dedupes_queue_reached_twice():
    a = Exchange("a", "fanout")
    b = Exchange("b", "fanout")
    c = Exchange("c", "fanout")
    q, r = Q("q"), Q("r")
    a.bind(b, "", None)
    a.bind(c, "", None)
    a.bind(q, "", None)
    b.bind(q, "", None)
    c.bind(q, "", None)
    c.bind(r, "", None)
    assert route(a, "", None, no_lookup) == [q, r]


def test_route_diamond_exchange_visited_once(monkeypatch):
    a = Exchange("a", "fanout")
    b = Exchange("b", "fanout")
    c = Exchange("c", "fanout")
    d = Exchange("d", "fanout")
    a.bind(b, "", None)
    a.bind(c, "", None)
    b.bind(d, "", None)
    c.bind(d, "", None)
    d.bind(Q("q"), "", None)
    visits = []
    real = Exchange.match

    def spy(self, rk, headers=None):
        visits.append(self.name)
        return real(self, rk, headers)

    monkeypatch.setattr(Exchange, "match", spy)
    assert len(route(a, "", None, no_lookup)) == 1
    assert sorted(visits) == ["a", "b", "c", "d"]


def test_route_alternate_exchange():
    main = Exchange("main", "direct", arguments={"alternate-exchange": "ae"})
    ae = Exchange("ae", "fanout")
    q, unrouted = Q("q"), Q("unrouted")
    main.bind(q, "k", None)
    ae.bind(unrouted, "", None)
    lookup = registry(main, ae)
    assert route(main, "k", None, lookup) == [q]          # routed: AE unused
    assert route(main, "other", None, lookup) == [unrouted]


def test_route_missing_alternate_exchange_is_ignored():
    main = Exchange("main", "direct", arguments={"alternate-exchange": "gone"})
    assert route(main, "k", None, registry(main)) == []


def test_route_alternate_that_routes_nowhere_follows_its_own_ae():
    main = Exchange("main", "direct", arguments={"alternate-exchange": "ae1"})
    ae1 = Exchange("ae1", "direct", arguments={"alternate-exchange": "ae2"})
    ae2 = Exchange("ae2", "fanout")
    lookup = registry(main, ae1)
    assert route(main, "k", None, lookup) == []          # ae1 routes nowhere, ae2 missing
    q = Q("q")
    ae2.bind(q, "", None)
    assert route(main, "k", None, registry(main, ae1, ae2)) == [q]


def test_route_alternate_cycle_is_safe():
    a = Exchange("a", "direct", arguments={"alternate-exchange": "b"})
    b = Exchange("b", "direct", arguments={"alternate-exchange": "a"})
    self_ae = Exchange("s", "direct", arguments={"alternate-exchange": "s"})
    assert route(a, "k", None, registry(a, b)) == []
    assert route(self_ae, "k", None, registry(self_ae)) == []


def test_route_ae_of_exchange_reached_through_e2e():
    src = Exchange("src", "fanout")
    mid = Exchange("mid", "direct", arguments={"alternate-exchange": "ae"})
    ae = Exchange("ae", "fanout")
    q = Q("q")
    src.bind(mid, "", None)
    ae.bind(q, "", None)
    assert route(src, "k", None, registry(src, mid, ae)) == [q]


def test_route_ae_not_used_when_exchange_matched_only_exchanges():
    # RabbitMQ consults the AE only when the exchange's own match is empty.
    src = Exchange("src", "fanout", arguments={"alternate-exchange": "ae"})
    dead_end = Exchange("dead", "direct")
    ae = Exchange("ae", "fanout")
    ae.bind(Q("q"), "", None)
    src.bind(dead_end, "", None)
    assert route(src, "k", None, registry(src, dead_end, ae)) == []


def test_route_ae_and_e2e_reach_same_queue_once():
    main = Exchange("main", "direct", arguments={"alternate-exchange": "ae"})
    ae = Exchange("ae", "fanout")
    other = Exchange("other", "fanout")
    q = Q("q")
    ae.bind(other, "", None)
    ae.bind(q, "", None)
    other.bind(q, "", None)
    assert route(main, "k", None, registry(main, ae, other)) == [q]


def test_route_headers_through_e2e():
    src = Exchange("src", "topic")
    h = Exchange("h", "headers")
    q = Q("q")
    src.bind(h, "orders.#", None)
    h.bind(q, "", {"x-match": "any", "region": "eu"})
    assert route(src, "orders.new", {"region": "eu"}, no_lookup) == [q]
    assert route(src, "orders.new", {"region": "us"}, no_lookup) == []
    assert route(src, "orders.new", None, no_lookup) == []


def test_route_order_is_breadth_first_bind_order():
    a = Exchange("a", "fanout")
    b = Exchange("b", "fanout")
    q1, q2, q3 = Q(1), Q(2), Q(3)
    a.bind(b, "", None)
    a.bind(q1, "", None)
    b.bind(q3, "", None)
    b.bind(q2, "", None)
    assert route(a, "", None, no_lookup) == [q1, q3, q2]
    assert route(a, "", None, no_lookup) == [q1, q3, q2]


def test_route_after_destination_exchange_unbound():
    a = Exchange("a", "fanout")
    b = Exchange("b", "fanout")
    q = Q("q")
    a.bind(b, "", None)
    b.bind(q, "", None)
    assert route(a, "", None, no_lookup) == [q]
    assert a.unbind_all(b) == 1
    assert route(a, "", None, no_lookup) == []


def test_route_multiple_routing_keys_and_ae():
    # CC/BCC style: AE only when none of the keys match.
    x = Exchange("x", "direct", arguments={"alternate-exchange": "ae"})
    ae = Exchange("ae", "fanout")
    q1, q2, qa = Q(1), Q(2), Q("ae")
    x.bind(q1, "a", None)
    x.bind(q2, "b", None)
    ae.bind(qa, "", None)
    lookup = registry(x, ae)
    assert route(x, ["b", "a", "b"], None, lookup) == [q1, q2]
    assert route(x, ["zz", "b"], None, lookup) == [q2]
    assert route(x, ["zz", "yy"], None, lookup) == [qa]
