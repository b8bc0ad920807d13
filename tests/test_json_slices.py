"""cluster/raft/json_slices.py: a large snapshot encoded a slice at a time gives the bytes
json.dumps gives, and gives the event loop turns while a thread encodes it."""
from __future__ import annotations

import asyncio
import json

from haremq.cluster.raft import json_slices
from haremq.cluster.raft.json_slices import SLICE, dumps_in_slices


def whole(doc) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def test_the_bytes_are_json_dumps_bytes_for_every_shape():
    rows = [(f"q{i}", True, False, None, {"x-max-length": i}, "hare1", i) for i in range(2 * SLICE + 7)]
    docs = [
        {}, [], {"a": []}, {"a": [[]]}, [{}], "ü\n\"", 3.5, None, True,
        {"vhosts": [{"name": "/", "queues": rows, "bindings": []}, {"name": "ä/x", "queues": rows[:3]}]},
        {"ha": rows[:SLICE], "more": rows[:SLICE + 1], "nested": [[rows[:2], {"k": rows}], 1]},
        {1: "a key json.dumps turns into a string"},
    ]
    for doc in docs:
        assert dumps_in_slices(doc) == whole(doc), doc if len(str(doc)) < 200 else "a large doc"
        assert json.loads(dumps_in_slices(doc)) == json.loads(whole(doc))


def test_a_thread_encoding_a_large_snapshot_lets_the_loop_run(monkeypatch):
    """Each json.dumps call holds the GIL until it returns; a whole 100,000-row list in one call
    left the loop no turn at all while it ran. In slices the loop ticks in between."""
    monkeypatch.setattr(json_slices, "SLICE", 50)
    doc = {"queues": [(f"meta.{i:06d}", True, False, None, None, "hare1", i) for i in range(200_000)]}
    calls = []
    real = json_slices._dumps

    def counted(value):
        calls.append(len(value) if isinstance(value, list) else 0)
        return real(value)
    monkeypatch.setattr(json_slices, "_dumps", counted)

    async def encode_while_ticking() -> tuple[bytes, int]:
        ticks = 0
        task = asyncio.ensure_future(asyncio.to_thread(dumps_in_slices, doc))
        while not task.done():
            ticks += 1
            await asyncio.sleep(0)
        return await task, ticks
    body, ticks = asyncio.run(encode_while_ticking())
    assert body == whole(doc)
    assert max(calls) <= 50                     # no call was handed more than a slice
    assert ticks > 1                            # and the loop ran while the thread encoded


def test_rows_kept_as_columns_encode_as_the_list_of_rows():
    """A snapshot's queues are captured as columns and made into rows a slice at a time."""
    from haremq.cluster.raft.json_slices import Rows
    names = [f"q{i}" for i in range(2 * SLICE + 3)]
    flags = [i % 2 == 0 for i in range(len(names))]
    rows = list(zip(names, flags))
    for n in (0, 1, SLICE, len(names)):
        doc = {"queues": Rows.of([names[:n], flags[:n]]), "after": [1]}
        assert dumps_in_slices(doc) == whole({"queues": rows[:n], "after": [1]})
    made = Rows.of([names, flags], lambda name, flag: [name.upper(), not flag])
    assert dumps_in_slices(made) == whole([[name.upper(), not flag] for name, flag in rows])
    assert made.make(0, len(made)) == [[name.upper(), not flag] for name, flag in rows]
    assert dumps_in_slices(Rows.of([])) == b"[]"
