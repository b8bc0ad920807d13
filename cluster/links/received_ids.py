"""Publish ids a queue's master received over queue links lately.

A publisher's node whose link to the master broke sends again what it did not see confirmed.
When the master only blipped (its node lives on), those go to the same master, which may hold
them already: it confirms them once safe instead of queueing them twice, a copy its consumers
could not tell apart from the first (delivered without the redelivered flag). After a failover
the promoted mirror's ids do the same (cluster/mirroring/manager.py `adopted`).
"""
from __future__ import annotations

from weakref import WeakKeyDictionary

KEEP = 100_000        # ids per queue, at most: as many as a publisher's node holds for a failover
KEEP_FOR = 60.0       # seconds: a publisher's node sends its unconfirmed ones again well within


class ReceivedIds:
    """By queue object: a queue deleted (or deposed, its successor a new object) takes its ids
    with it."""

    def __init__(self):
        self._by_queue: WeakKeyDictionary = WeakKeyDictionary()

    def add(self, queue, publish_id: int, now: float) -> None:
        ids = self._by_queue.get(queue)
        if ids is None:
            ids = self._by_queue[queue] = {}
        ids[publish_id] = now
        if len(ids) > KEEP:
            del ids[next(iter(ids))]
        while ids:                       # the oldest first: insertion order is arrival order
            oldest = next(iter(ids))
            if now - ids[oldest] < KEEP_FOR:
                break
            del ids[oldest]

    def seen(self, queue, publish_id: int, now: float) -> bool:
        ids = self._by_queue.get(queue)
        if not ids:
            return False
        at = ids.get(publish_id)
        return at is not None and now - at < KEEP_FOR
