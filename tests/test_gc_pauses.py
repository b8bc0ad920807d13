"""node/gc_pauses.py: a full garbage collection is timed, and a long one logged."""
from __future__ import annotations

import gc

from structlog.testing import capture_logs

from haremq.node.gc_pauses import GCPauses


def test_a_full_collection_is_counted_and_a_long_one_logged():
    pauses = GCPauses("n1", long_pause=0.0)     # every full pass counts as long here
    pauses.install()
    try:
        with capture_logs() as logs:
            gc.collect(1)                       # not a full pass: not counted
            assert pauses.full_passes == 0
            gc.collect()
    finally:
        pauses.remove()
    assert pauses.full_passes == 1 and pauses.longest > 0
    [line] = [e for e in logs if e["event"] == "a full garbage collection stopped the node"]
    assert line["log_level"] == "warning" and line["seconds"] >= 0 and line["allocated_blocks"] > 0
    gc.collect()
    assert pauses.full_passes == 1             # removed: no longer watching


def test_a_short_full_collection_is_not_logged():
    pauses = GCPauses("n1", long_pause=60.0)
    pauses.install()
    pauses.install()                            # once only
    try:
        with capture_logs() as logs:
            gc.collect()
    finally:
        pauses.remove()
    assert pauses.full_passes == 1 and not logs
