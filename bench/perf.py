"""`python -m haremq.bench.perf`: `haremq perf`, the load tool, under the name bench/compare runs.

The tool lives with the `haremq` command, in cluster/perf/ (its package docstring says why).
"""
from __future__ import annotations

import sys

from haremq.cluster.perf.tool import _queue_op, main

__all__ = ["_queue_op", "main"]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
