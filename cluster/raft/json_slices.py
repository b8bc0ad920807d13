"""JSON of a large document (a metadata snapshot) written a slice at a time.

`json.dumps` is one call into C that holds the GIL until it returns: run in a
thread over 100,000 queues and as many bindings it still stopped the event
loop for a second or more, long enough for the other members to miss this
node's answers to their pings and count it down. Here every long list is
encoded `SLICE` items per call, and between two calls the loop gets the GIL
back. The bytes are the ones `json.dumps(doc, separators=(",", ":"))` gives.
"""
from __future__ import annotations

import json
from functools import partial

SLICE = 2_000          # list items per json.dumps call: a few milliseconds each

_dumps = partial(json.dumps, separators=(",", ":"))


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
