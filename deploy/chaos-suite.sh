#!/usr/bin/env bash
# deploy/chaos-suite.sh: the mirrored-queue chaos suite (tests/test_chaos.py) for longer than CI
# runs it. Three local nodes, publishers with confirms and consumers on every node, SIGKILL of
# the current master and majority/minority partitions; prints the confirmed/consumed/lost tally.
#
#   deploy/chaos-suite.sh                 # 20 kill rounds, 10 partition rounds
#   deploy/chaos-suite.sh 50 20           # 50 kill rounds, 20 partition rounds
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
export HAREMQ_CHAOS_KILL_ROUNDS="${1:-20}"
export HAREMQ_CHAOS_PARTITION_ROUNDS="${2:-10}"
exec "${PYTHON:-python3}" -m pytest -p no:xdist -p no:cacheprovider -m chaos -s -q tests/test_chaos.py
