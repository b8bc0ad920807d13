"""RabbitMQ's sorting, filtering and paging of a listing (`?sort=`, `sort_reverse`, `page`,
`page_size`, `name`, `use_regex`), as rabbit_mgmt_util applies them.

RabbitMQ's management UI asks for queues, exchanges, connections and channels a page at a
time and reads the page's envelope (`items`, `page_count`, `filtered_count`, ...); a tool that
asks without `page` gets the plain list, as before. A bad parameter is a 400 with RabbitMQ's
error names (`invalid_pagination_parameters`, `page_out_of_range`), never a 500."""
from __future__ import annotations

import re

from .responses import HTTPError

MAX_PAGE_SIZE = 500
DEFAULT_PAGE_SIZE = 100


def listing(request, rows: list[dict], default_sort: tuple[str, ...] = ()) -> list[dict] | dict:
    """The rows as the request asks for them: sorted, then (with `page`) filtered by name and
    cut to one page inside RabbitMQ's envelope."""
    query = request.query
    rows = ordered(rows, default_sort, query.get("sort"), query.get("sort_reverse") == "true")
    if "page" not in query:
        return rows
    page, size = _whole(query, "page", None), _whole(query, "page_size", DEFAULT_PAGE_SIZE)
    if page is None or size is None or page < 1 or not 0 < size <= MAX_PAGE_SIZE:
        raise HTTPError(400, "invalid_pagination_parameters",
                        f"Invalid pagination parameters: page number {query.get('page')}, "
                        f"page size {query.get('page_size')}")
    filtered = by_name(rows, query.get("name", ""), query.get("use_regex") == "true")
    start = (page - 1) * size
    if start > len(filtered):
        raise HTTPError(400, "page_out_of_range", f"Page out of range, page: {page} page size: {size}, "
                        f"len: {len(filtered)}")
    items = filtered[start:start + size]
    return {"total_count": len(rows), "item_count": len(items), "filtered_count": len(filtered),
            "page": page, "page_size": size, "page_count": (len(filtered) + size - 1) // size, "items": items}


def ordered(rows: list[dict], default_sort: tuple[str, ...], sort: str | None, reverse: bool) -> list[dict]:
    """Sorted by `sort` (a dotted key, e.g. `message_stats.publish_details.rate`) then the
    default keys; `sort=` (empty) keeps the rows as they are, as in RabbitMQ."""
    if sort == "":
        return rows
    keys = ([sort] if sort else []) + [k for k in default_sort if k != sort]
    if not keys:
        return rows[::-1] if reverse else rows
    out = sorted(rows, key=lambda row: [_term(_dotted(row, k)) for k in keys])
    return out[::-1] if reverse else out


def by_name(rows: list[dict], name: str, use_regex: bool) -> list[dict]:
    """Rows whose name holds `name` (case-insensitive), or matches it as a regular expression."""
    if not name:
        return rows
    if use_regex:
        try:
            pattern = re.compile(name, re.IGNORECASE)
        except re.error as exc:
            raise HTTPError(400, "bad_request", f"invalid regular expression: {exc}") from None
        return [r for r in rows if pattern.search(str(r.get("name", "")))]
    needle = name.lower()
    return [r for r in rows if needle in str(r.get("name", "")).lower()]


def _dotted(row, key: str):
    value = row
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return 0 if value is None else value       # RabbitMQ: "nothing" sorts as 0


def _term(value) -> tuple:
    """Erlang's order across types, which RabbitMQ's sort follows: numbers, then atoms
    (true, false, null), then maps, lists and strings."""
    if isinstance(value, bool):
        return (1, str(value))
    if isinstance(value, (int, float)):
        return (0, value)
    if isinstance(value, str):
        return (4, value)
    return (2 if isinstance(value, dict) else 3, repr(value))


def _whole(query, key: str, default: int | None) -> int | None:
    text = query.get(key)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        return None
