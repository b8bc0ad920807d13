#!/usr/bin/env bash
# deploy/nemesis.sh: long randomized fault schedules on a local three-node cluster (tests/nemesis.py):
# SIGKILL of masters, members and the metadata leader (some left down), SIGSTOP/SIGCONT, a member
# cut off, a bridge, whole-cluster restarts, under confirmed publishers and acking consumers on
# every node. Prints each run's tally and a table; exits 1 if a confirmed message was lost.
#
#   deploy/nemesis.sh                    # one random seed, 200 faults
#   deploy/nemesis.sh 200 7 8 9          # 200 faults for each of seeds 7, 8 and 9
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
faults="${1:-200}"
shift || true
seeds=()
for seed in "$@"; do seeds+=(--seed "$seed"); done
exec "${PYTHON:-python3}" -m tests.nemesis --faults "$faults" "${seeds[@]}"
