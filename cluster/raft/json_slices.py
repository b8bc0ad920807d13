"""JSON of a large document (a metadata snapshot) written a slice at a time.

`json.dumps` is one call into C that holds the GIL until it returns: run in a
thread over 100,000 queues and as many bindings it still stopped the event
loop for a second or more, long enough for the other members to miss this
node's answers to their pings and count it down. Here every long list is
encoded `SLICE` items per call, and between two calls the loop gets the GIL
back. The bytes are the ones `json.dumps(doc, separators=(",", ":"))` gives.

A long list may also be given as `Rows` (columns, made into rows a slice at a
time as they are encoded): the rows then live for one slice only. Captured as
100,000 row tuples on the loop, they outlived two collections and counted
towards the garbage collector's full pass, which at 100,000 queues (1.6
million objects) stopped the node for more than a second.
"""
from __future__ import annotations

import json
from functools import partial
from typing import Callable, Sequence

SLICE = 2_000          # list items per json.dumps call: a few milliseconds each

_dumps = partial(json.dumps, separators=(",", ":"))


class Rows:
    """A list of `length` rows kept as columns: `make(start, stop)` gives rows start..stop-1, a list."""

    def __init__(self, length: int, make: Callable[[int, int], list[object]]):
        self.length = length
        self.make = make

    @classmethod
    def of(cls, columns: Sequence[Sequence[object]], row: Callable[..., object] | None = None) -> "Rows":
        """Rows zipped from equally long columns, each made by `row(*fields)` (a tuple if None)."""
        length = len(columns[0]) if columns else 0

        def make(start: int, stop: int) -> list[object]:
            fields = zip(*(column[start:stop] for column in columns))
            return list(fields) if row is None else [row(*f) for f in fields]
        return cls(length, make)

    def __len__(self) -> int:
        return self.length


def dumps_in_slices(doc: object) -> bytes:
    parts: list[str] = []
    _write(doc, parts)
    return "".join(parts).encode()


def _write(value: object, parts: list[str]) -> None:
    if isinstance(value, dict):
        parts.append("{")
        for i, (key, item) in enumerate(value.items()):
            parts.append(f"{',' if i else ''}{_dumps(str(key))}:")
            _write(item, parts)
        parts.append("}")
    elif isinstance(value, Rows):
        parts.append("[")
        for start in range(0, len(value), SLICE):
            rows = value.make(start, min(start + SLICE, len(value)))
            parts.append(("," if start else "") + _dumps(rows)[1:-1])
        parts.append("]")
    elif isinstance(value, (list, tuple)) and len(value) > SLICE:
        parts.append("[")
        for start in range(0, len(value), SLICE):
            parts.append(("," if start else "") + _dumps(list(value[start:start + SLICE]))[1:-1])
        parts.append("]")
    elif isinstance(value, (list, tuple)) and any(isinstance(item, (dict, list, tuple)) for item in value):
        parts.append("[")
        for i, item in enumerate(value):
            if i:
                parts.append(",")
            _write(item, parts)
        parts.append("]")
    else:
        parts.append(_dumps(value))
