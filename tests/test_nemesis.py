"""Short randomized fault schedules on every push (tests/nemesis.py): two seeds fixed, and one
that changes every day (the same in every xdist worker); a failure names its seed, and
HAREMQ_NEMESIS_SEEDS=SEED reruns it exactly. `deploy/nemesis.sh` runs long ones."""
from __future__ import annotations

import json
import os
import time

import pytest

from tests import nemesis
from tests.conftest import IS_REF

pytestmark = [pytest.mark.skipif(IS_REF, reason="kills cluster node processes"), pytest.mark.nemesis]

FAULTS = int(os.environ.get("HAREMQ_NEMESIS_FAULTS", "10"))
SEEDS = [int(s) for s in os.environ.get("HAREMQ_NEMESIS_SEEDS", "").split(",") if s] or \
    [11, 29, int(time.strftime("%Y%m%d"))]


@pytest.mark.timeout(300 + 40 * FAULTS)
@pytest.mark.parametrize("seed", SEEDS)
def test_nemesis_loses_no_confirmed_message(tmp_path, seed):
    tally = nemesis.run(seed, FAULTS, tmp_path)
    print(f"nemesis seed {seed}:", json.dumps(tally, sort_keys=True))
    print(nemesis.table([tally]))
    found = nemesis.violations(tally)
    assert not found, f"seed {seed} (rerun: HAREMQ_NEMESIS_SEEDS={seed}): " + "; ".join(found)
    assert tally["settled"], f"seed {seed}: the cluster never settled after the schedule"
