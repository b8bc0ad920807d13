"""A single node's metadata on disk (node/store/meta.py): a log of changes plus snapshots.

Each change is one record appended to the log, whatever else exists; a snapshot is taken
off the event loop once the log file in use is full, and a restart loads the snapshot and
replays only the log after it. What a crash can leave (a change logged and no snapshot yet,
a snapshot written and the files it covers not yet removed, a torn last record) loads as the
changes that were acknowledged; a snapshot as earlier HareMQ wrote it (meta.bin, rewritten
whole at every change) still loads.
"""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pika
import pytest

from haremq.node.broker.auth import hash_password
from haremq.node.protocol.tables import encode_table
from haremq.node.store import meta
from haremq.node.store.store import MessageStore, StoreError
from tests.conftest import IS_REF, pika_conn
from tests.inprocess import InProcessNode

pytestmark = pytest.mark.skipif(IS_REF, reason="reads a HareMQ node's data directory")

QUEUE_ARGS = encode_table({})


def queue_change(name: str, queue_id: int, vhost: str = "/") -> bytes:
    return meta.record({"op": "queue", "vhost": vhost,
                        "queue": {"name": name, "id": queue_id, "auto_delete": False, "arguments": QUEUE_ARGS}})


def delete_change(name: str, vhost: str = "/") -> bytes:
    return meta.record({"op": "queue.delete", "vhost": vhost, "name": name})


async def durable(store: MessageStore) -> None:
    done = asyncio.get_running_loop().create_future()
    store.when_durable(lambda ok: done.set_result(ok))
    assert await done


def log_changes(directory: Path, changes, close: bool = True, batch: int = 20):
    """Open a store, log the changes (made durable `batch` at a time), close it; its Snapshotter."""
    async def run():
        store = MessageStore(directory)
        store.open()
        for i, change in enumerate(changes):
            store.log_meta(change)
            if i % batch == batch - 1:
                await durable(store)
        await durable(store)
        if close:
            await store.close()
        else:        # a crash: nothing after the last sync, the snapshot thread left as it is
            store._writer.stop()
        return store._snapshots
    return asyncio.run(run())


def queues_after_restart(directory: Path) -> tuple[list[str], "object"]:
    async def run():
        store = MessageStore(directory)
        recovered = store.open()
        await store.close()
        return recovered
    recovered = asyncio.run(run())
    names = [q["name"] for q in (recovered.meta or {"vhosts": {}})["vhosts"].get("/", {}).get("queues", [])]
    return names, recovered


def wait_for(predicate, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


# ---- the log ----------------------------------------------------------------------------------------
def test_a_change_appends_one_record_whatever_exists(tmp_path):
    # declaring the 3,000th queue writes what declaring the first did: one record, no snapshot
    changes = [queue_change(f"q{i:05d}", i + 1) for i in range(3000)]
    log_changes(tmp_path, changes, batch=200)
    assert not (tmp_path / meta.SNAPSHOT).exists()
    files = meta.log_numbers(tmp_path)
    assert files == [1]
    size = meta.log_path(tmp_path, 1).stat().st_size
    assert size == sum(meta.HEADER.size + len(c) for c in changes)
    names, recovered = queues_after_restart(tmp_path)
    assert names == [f"q{i:05d}" for i in range(3000)]
    assert recovered.meta["next_queue_id"] == 3001 and recovered.meta_replayed == 3000


def test_a_full_log_is_snapshotted_and_a_restart_replays_only_the_tail(tmp_path, monkeypatch):
    monkeypatch.setattr(meta, "LOG_MIN", 4096)
    changes = [queue_change(f"q{i:04d}", i + 1) for i in range(400)]
    changes += [delete_change(f"q{i:04d}") for i in range(0, 400, 2)]
    snapshots = log_changes(tmp_path, changes)
    assert snapshots.snapshots >= 1
    covered = json.loads((tmp_path / meta.SNAPSHOT).read_bytes().split(b"\n", 1)[0])["log"]
    assert covered == snapshots.covered
    # the files the snapshot covers are gone; what is left is the tail after it
    left = meta.log_numbers(tmp_path)
    assert left and min(left) == covered + 1
    tail = sum(len(meta.scan(meta.log_path(tmp_path, n).read_bytes())[0]) for n in left)
    names, recovered = queues_after_restart(tmp_path)
    assert names == [f"q{i:04d}" for i in range(1, 400, 2)]
    assert recovered.meta_replayed == tail < len(changes)
    # the snapshot holds what existed as of the log it covers, not the history: a record per queue,
    # no deleted queue
    changes = [json.loads(line) for line in (tmp_path / meta.SNAPSHOT).read_bytes().splitlines()[1:]]
    queues = [c["queue"]["name"] for c in changes if c["op"] == "queue"]
    assert len(queues) == len(set(queues)) > 0 and all(c["op"] in ("vhost", "queue") for c in changes)


def test_a_crash_between_changes_and_their_snapshot_loses_nothing(tmp_path, monkeypatch):
    # the log files fill up, but no snapshot gets written before the crash
    monkeypatch.setattr(meta, "LOG_MIN", 2048)
    monkeypatch.setattr(meta.Snapshotter, "_take", lambda self, number: None)
    changes = [queue_change(f"q{i:04d}", i + 1) for i in range(200)]
    log_changes(tmp_path, changes, close=False)
    assert not (tmp_path / meta.SNAPSHOT).exists() and len(meta.log_numbers(tmp_path)) > 2
    monkeypatch.undo()
    monkeypatch.setattr(meta, "LOG_MIN", 2048)

    async def restart():
        store = MessageStore(tmp_path)
        recovered = store.open()
        # the full files left behind are snapshotted at start, off the loop
        await asyncio.to_thread(wait_for, lambda: store._snapshots.snapshots >= 1)
        await store.close()
        return recovered
    recovered = asyncio.run(restart())
    assert [q["name"] for q in recovered.meta["vhosts"]["/"]["queues"]] == [f"q{i:04d}" for i in range(200)]
    assert (tmp_path / meta.SNAPSHOT).exists() and len(meta.log_numbers(tmp_path)) == 1
    names, _ = queues_after_restart(tmp_path)
    assert names == [f"q{i:04d}" for i in range(200)]


def test_a_crash_after_a_snapshot_before_its_files_go_replays_nothing_twice(tmp_path, monkeypatch):
    monkeypatch.setattr(meta, "LOG_MIN", 2048)
    covered_files = {}
    take = meta.Snapshotter._take

    def keeping_a_copy(self, number):
        for n in meta.log_numbers(tmp_path):
            if n <= number:
                covered_files[n] = meta.log_path(tmp_path, n).read_bytes()
        take(self, number)
    monkeypatch.setattr(meta.Snapshotter, "_take", keeping_a_copy)
    log_changes(tmp_path, [queue_change(f"q{i:04d}", i + 1) for i in range(60)]
                + [delete_change(f"q{i:04d}") for i in range(60)]
                + [queue_change(f"q{i:04d}", 100 + i) for i in range(0, 60, 7)])
    covered = json.loads((tmp_path / meta.SNAPSHOT).read_bytes().split(b"\n", 1)[0])["log"]
    assert covered > 1 and all(n > covered for n in meta.log_numbers(tmp_path))
    for n, data in covered_files.items():    # as if the crash came before they were removed
        meta.log_path(tmp_path, n).write_bytes(data)
    names, recovered = queues_after_restart(tmp_path)
    assert names == [f"q{i:04d}" for i in range(0, 60, 7)]
    assert [q["id"] for q in recovered.meta["vhosts"]["/"]["queues"]] == [100 + i for i in range(0, 60, 7)]
    assert all(n > covered for n in meta.log_numbers(tmp_path))


def test_a_torn_last_record_is_dropped_and_the_log_goes_on_after_it(tmp_path):
    log_changes(tmp_path, [queue_change(f"q{i}", i + 1) for i in range(10)])
    path = meta.log_path(tmp_path, 1)
    data = path.read_bytes()
    path.write_bytes(data[:-7])             # the last write, cut short by a crash
    names, recovered = queues_after_restart(tmp_path)
    assert names == [f"q{i}" for i in range(9)]
    assert recovered.meta_replayed == 9
    assert path.stat().st_size == len(data) - (meta.HEADER.size + len(queue_change("q9", 10)))
    log_changes(tmp_path, [queue_change("after", 50)])
    names, _ = queues_after_restart(tmp_path)
    assert names == [f"q{i}" for i in range(9)] + ["after"]


def test_a_damaged_record_before_valid_ones_refuses_to_start(tmp_path):
    log_changes(tmp_path, [queue_change(f"q{i}", i + 1) for i in range(10)])
    path = meta.log_path(tmp_path, 1)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))

    async def run():
        MessageStore(tmp_path).open()
    with pytest.raises(StoreError, match="corrupt record in metadata log .* --skip-corrupt"):
        asyncio.run(run())


def test_a_log_file_missing_after_the_snapshot_refuses_to_start(tmp_path, monkeypatch):
    monkeypatch.setattr(meta, "LOG_MIN", 1024)
    monkeypatch.setattr(meta.Snapshotter, "_take", lambda self, number: None)
    log_changes(tmp_path, [queue_change(f"q{i:04d}", i + 1) for i in range(100)], close=False)
    numbers = meta.log_numbers(tmp_path)
    meta.log_path(tmp_path, numbers[1]).unlink()

    async def run():
        MessageStore(tmp_path).open()
    with pytest.raises(StoreError, match="is missing"):
        asyncio.run(run())


def test_an_unbind_names_the_binding_whatever_the_order_of_its_arguments(tmp_path):
    def binding(args: dict) -> dict:
        return {"source": "x", "destination": "q", "kind": "queue", "routing_key": "k",
                "arguments": encode_table(args)}
    log_changes(tmp_path, [
        queue_change("q", 1),
        meta.record({"op": "exchange", "vhost": "/", "exchange": {"name": "x", "type": "headers",
                                                                "auto_delete": False, "internal": False,
                                                                "arguments": QUEUE_ARGS}}),
        meta.record({"op": "bind", "vhost": "/", "binding": binding({"x-match": "all", "a": 1})}),
        meta.record({"op": "bind", "vhost": "/", "binding": binding({"b": 2})}),
        meta.record({"op": "unbind", "vhost": "/", "binding": binding({"a": 1, "x-match": "all"})}),
    ])
    _names, recovered = queues_after_restart(tmp_path)
    assert [b["arguments"] for b in recovered.meta["vhosts"]["/"]["bindings"]] == [encode_table({"b": 2})]



def test_a_deleted_vhost_goes_with_everything_in_it(tmp_path):
    log_changes(tmp_path, [
        meta.record({"op": "vhost", "vhost": "v"}),
        queue_change("q", 1, vhost="v"),
        meta.record({"op": "policies", "vhost": "v", "policies": []}),
        meta.record({"op": "vhost.delete", "vhost": "v"}),
        delete_change("q", vhost="v"),          # nothing is brought back by a later removal
        queue_change("kept", 2),
    ])
    _names, recovered = queues_after_restart(tmp_path)
    assert "v" not in recovered.meta["vhosts"] and recovered.meta["next_queue_id"] == 3

# ---- a node ------------------------------------------------------------------------------------------
def declare_some(node) -> None:
    ch = pika_conn(node).channel()
    ch.exchange_declare("ml.x", "topic", durable=True)
    ch.exchange_declare("ml.h", "headers", durable=True, arguments={"alternate-exchange": "ml.x"})
    for i in range(30):
        ch.queue_declare(f"ml.q{i}", durable=True, arguments={"x-max-length": i + 1})
        ch.queue_bind(f"ml.q{i}", "ml.x", f"k.{i}")
    ch.queue_bind("ml.q0", "ml.h", "", arguments={"x-match": "any", "a": 1, "b": "two"})
    ch.exchange_bind("ml.h", "ml.x", "to.h")
    for i in range(0, 30, 3):
        ch.queue_delete(f"ml.q{i}")
    ch.queue_unbind("ml.q1", "ml.x", "k.1")
    ch.confirm_delivery()
    for i in range(1, 30, 3):
        ch.basic_publish("", f"ml.q{i}", b"kept %d" % i, properties=pika.BasicProperties(delivery_mode=2))
    ch.connection.close()


def definitions(node) -> dict:
    data = node.call(node.broker.export_definitions)
    data.pop("rabbitmq_version", None)
    data.pop("rabbit_version", None)
    return data


@pytest.mark.parametrize("log_min", [1 << 20, 1024], ids=["log only", "snapshots"])
def test_a_node_restarts_with_what_it_had(tmp_path, monkeypatch, log_min):
    monkeypatch.setattr(meta, "LOG_MIN", log_min)
    with InProcessNode(tmp_path) as node:
        node.call(node.broker.add_vhost, "other")
        node.call(node.broker.add_user, "bob", "pw", ["monitoring"])
        node.call(node.broker.set_permissions, "bob", "other", ".*", "", ".*")
        node.call(node.broker.set_policy, "/", "lim", "^ml\\.", {"max-length": 100}, "queues", 1)
        declare_some(node)
        before = definitions(node)
        snapshots = node.node.store.meta_stats["snapshots"]
    assert (snapshots > 0) == (log_min == 1024)
    with InProcessNode(tmp_path) as node:
        assert definitions(node) == before
        ch = pika_conn(node).channel()
        for i in range(1, 30, 3):
            method, _props, body = ch.basic_get(f"ml.q{i}", auto_ack=True)
            assert body == b"kept %d" % i
        # queue ids are never given twice: a new queue does not take a deleted one's messages
        ch.queue_declare("ml.new", durable=True)
        assert ch.queue_declare("ml.new", passive=True).method.message_count == 0


def test_a_data_directory_written_before_the_log_loads(tmp_path):
    # meta.bin as HareMQ wrote it before the metadata log: one JSON document, version 1
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    args = encode_table({"x-max-length": 5})
    old = {"version": 1, "vhosts": {
        "/": {"exchanges": [{"name": "old.x", "type": "direct", "auto_delete": False, "internal": False,
                             "arguments": QUEUE_ARGS}],
              "queues": [{"name": "old.q", "id": 3, "auto_delete": False, "arguments": args},
                         {"name": "old.empty", "id": 4, "auto_delete": False, "arguments": QUEUE_ARGS}],
              "bindings": [{"source": "old.x", "destination": "old.q", "kind": "queue", "routing_key": "rk",
                            "arguments": QUEUE_ARGS}],
              "policies": [{"vhost": "/", "name": "p", "pattern": "^old\\.", "apply-to": "queues",
                            "definition": {"max-length": 9}, "priority": 0}]},
        "v2": {"exchanges": [], "queues": [], "bindings": [], "policies": []}},
        "next_queue_id": 5,
        "users": [{"name": "guest", "password_hash": hash_password("guest"),
                   "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": ["administrator"]},
                  {"name": "old-user", "password_hash": hash_password("pw"),
                   "hashing_algorithm": "rabbit_password_hashing_sha256", "tags": []}],
        "permissions": [{"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}]}

    async def old_messages():   # the message log of that node: two messages on queue 3
        store = MessageStore(data_dir)
        store.open()
        for body in (b"one", b"two"):
            store.enqueue(3, b"\x00", b"\x05old.q", b"\x00\x00", body)     # no properties
        await durable(store)
        await store.close()
    asyncio.run(old_messages())
    for path in data_dir.glob("meta*"):
        path.unlink()
    (data_dir / "meta.bin").write_bytes(json.dumps(old, separators=(",", ":")).encode())
    with InProcessNode(tmp_path) as node:
        assert node.call(lambda: node.broker.users.get("old-user")) is not None
        node.call(node.broker.set_user_tags, "old-user", ["monitoring"])
        ch = pika_conn(node).channel()
        assert ch.queue_declare("old.q", passive=True).method.message_count == 2
        assert node.call(lambda: node.broker.vhosts["/"].queues["old.q"].store_id) == 3
        assert "v2" in node.broker.vhosts and node.broker.vhosts["/"].policies["p"].definition == {"max-length": 9}
        ch.confirm_delivery()
        ch.basic_publish("old.x", "rk", b"three", properties=pika.BasicProperties(delivery_mode=2))
        ch.queue_declare("new.q", durable=True)
        assert ch.queue_declare("new.q", passive=True).method.message_count == 0
        assert node.call(lambda: node.broker.vhosts["/"].queues["new.q"].store_id) == 5
    with InProcessNode(tmp_path) as node:
        assert node.call(lambda: list(node.broker.users.get("old-user").tags)) == ["monitoring"]
        ch = pika_conn(node).channel()
        got = [ch.basic_get("old.q", auto_ack=True)[2] for _ in range(3)]
        assert got == [b"one", b"two", b"three"]
        assert ch.queue_declare("new.q", passive=True).method.message_count == 0
        assert "old.empty" in node.broker.vhosts["/"].queues


def test_exclusive_queues_are_not_written(tmp_path):
    # as RabbitMQ keeps them in RAM tables: they die with their connection, so nothing is logged,
    # and their declare-ok waits for no write
    with InProcessNode(tmp_path) as node:
        store = node.node.store
        ch = pika_conn(node).channel()
        ch.exchange_declare("ex.x", "direct", durable=True)
        size = sum(meta.log_path(store.data_dir, n).stat().st_size for n in meta.log_numbers(store.data_dir))
        name = ch.queue_declare("", durable=True, exclusive=True).method.queue
        ch.queue_bind(name, "ex.x", "rk")
        ch.queue_bind(name, "amq.topic", "#")
        ch.queue_declare("ex.named", durable=True, exclusive=True)
        ch.queue_bind("ex.named", "ex.x", "rk")
        ch.queue_delete("ex.named")
        assert node.call(lambda: store.meta_pending) is False
        after = sum(meta.log_path(store.data_dir, n).stat().st_size for n in meta.log_numbers(store.data_dir))
        assert after == size
        ch.queue_declare("ex.durable", durable=True)     # what is written, for contrast
        ch.connection.close()
    text = b"".join(meta.log_path(tmp_path / "data", n).read_bytes() for n in meta.log_numbers(tmp_path / "data"))
    assert name.encode() not in text and b"ex.named" not in text and b"ex.durable" in text


@pytest.mark.parametrize("logged", ["permissions", "users"])
def test_users_and_permissions_each_come_back_when_only_one_was_logged(tmp_path, logged):
    """Each record stands for its own list: a logged permissions change with no users change (a
    vhost given to guest), or a users change with no permissions change (a new user), restores
    that list and leaves the other as the broker already has it."""
    perms = [{"user": "guest", "vhost": "v", "configure": ".*", "write": ".*", "read": ".*"}]
    users = [{"name": "bob", "password_hash": "x", "hashing_algorithm": "rabbit_password_hashing_sha256",
              "tags": []}]
    change = {"op": "permissions", "permissions": perms} if logged == "permissions" else \
        {"op": "users", "users": users}
    log_changes(tmp_path, [meta.record(change)])
    _names, recovered = queues_after_restart(tmp_path)
    snapshot = recovered.meta
    assert snapshot[logged] == (perms if logged == "permissions" else users)
    assert ("users" if logged == "permissions" else "permissions") not in snapshot


def test_a_record_decodes_as_json_loads_decodes_it_and_bad_ones_fail_as_they_did():
    """`MetaState` decodes records on a fast path; what it does not take whole goes to json.loads."""
    state = meta.MetaState()
    good = [b'{"op":"queue","vhost":"/","queue":{"name":"q\\u00e9","id":7,"arguments":"AAAAAA=="}}',
            '{"op":"vhost","vhost":"caf\u00e9"}'.encode(), b' {"op":"vhost","vhost":"a"}', b'[1, 2]']
    for raw in good:
        assert state._decode(raw) == json.loads(raw)
    for raw in (b'{"op":"x"} extra', b'', b'{"op":', b'\xff\xfe'):
        with pytest.raises(ValueError) as fast:
            state._decode(raw)
        with pytest.raises(ValueError) as slow:
            json.loads(raw)
        assert type(fast.value) is type(slow.value) and str(fast.value) == str(slow.value)
