"""The master's memory of publish ids its queue links brought (cluster/links/received_ids.py)."""
from __future__ import annotations

import gc

from haremq.cluster.links import received_ids
from haremq.cluster.links.received_ids import ReceivedIds


class _Queue:
    pass


def test_ids_are_kept_for_a_while_and_up_to_a_bound_per_queue(monkeypatch):
    monkeypatch.setattr(received_ids, "KEEP", 3)
    ids, queue, other = ReceivedIds(), _Queue(), _Queue()
    for n, publish_id in enumerate((11, 12, 13, 14)):
        ids.add(queue, publish_id, 100.0 + n)
    assert [ids.seen(queue, i, 104.0) for i in (11, 12, 13, 14)] == [False, True, True, True]   # the oldest went
    assert not ids.seen(other, 12, 104.0)                                # per queue
    assert not ids.seen(queue, 14, 103.0 + received_ids.KEEP_FOR)         # too long ago
    ids.add(queue, 15, 101.0 + received_ids.KEEP_FOR)                     # adding drops the stale
    assert list(ids._by_queue[queue]) == [13, 14, 15]
    del queue
    gc.collect()
    assert len(ids._by_queue) == 0                                        # a queue gone takes its ids
