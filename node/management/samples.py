"""RabbitMQ's sampled history in `*_details`, for the requests that ask for it.

A request with `lengths_age`, `msg_rates_age`, `data_rates_age` or `node_stats_age` (RabbitMQ's
management UI sends them for its charts) gets, in every `X_details` beside `rate`, `samples`
(`{"sample": value, "timestamp": ms}`, newest first), `avg` and `avg_rate`: the UI draws its
charts from them and fails on a page whose details lack them. HareMQ keeps no per-object
history of counts (only rates, from counters sampled every 5 s: stats.py), so the one sample
is the current value and `avg_rate` is the current rate: the UI's legends show the numbers
and its charts start empty, rather than drawing a past HareMQ did not record. Without those
parameters nothing is added, so other tools get the same JSON as before."""
from __future__ import annotations

import time

AGES = ("lengths_age", "msg_rates_age", "data_rates_age", "node_stats_age")


def asked(request) -> bool:
    return any(key in request.query for key in AGES)


def with_samples(request, data):
    """`data` (a dict or a list of them), with samples in its details if the request asks for them."""
    if not asked(request):
        return data
    now = int(time.time() * 1000)
    for row in data if isinstance(data, list) else [data]:
        if isinstance(row, dict):
            _fill(row, now)
    return data


def _fill(obj: dict, now: int) -> None:
    for key, value in list(obj.items()):
        if not isinstance(value, dict):
            continue
        if key.endswith("_details"):
            if "samples" not in value:
                current = obj.get(key[: -len("_details")])
                if not isinstance(current, (int, float)) or isinstance(current, bool):
                    current = 0
                rate = value.setdefault("rate", 0.0)
                value.update(samples=[{"sample": current, "timestamp": now}], avg=current, avg_rate=rate)
        else:
            _fill(value, now)
