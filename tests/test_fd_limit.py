"""A node raises its open-files soft limit to the hard one at start (RabbitMQ's `ulimit -n`
advice, taken by the node itself): every connection is a file descriptor."""
from __future__ import annotations

import resource
import sys

import pytest

from tests.conftest import IS_REF, Node

pytestmark = pytest.mark.skipif(IS_REF or not sys.platform.startswith("linux"),
                                reason="starts a node process and reads its /proc limits")

SOFT = 512


class LowLimitNode(Node):
    """Started with a soft limit of SOFT open files, as a shell's `ulimit -Sn 512` would."""

    def argv(self):
        lower = ("import os, resource, sys; hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; "
                 f"resource.setrlimit(resource.RLIMIT_NOFILE, ({SOFT}, hard)); os.execv(sys.argv[1], sys.argv[1:])")
        return [sys.executable, "-c", lower, *super().argv()]


def open_files(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/limits") as fh:
        for line in fh:
            if line.startswith("Max open files"):
                soft, hard = line.split()[3:5]
                return int(soft), int(hard)
    raise AssertionError("no open-files limit in /proc")


def test_a_node_raises_its_open_files_soft_limit_to_the_hard_one(tmp_path):
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard <= SOFT:
        pytest.skip(f"the hard limit here is {hard}: nothing to raise")
    node = LowLimitNode("hare-fds", tmp_path).start()
    try:
        assert open_files(node.proc.pid) == (hard, hard)
        started = next(line for line in node.log_path.read_text().splitlines() if "node started" in line)
        assert f"open_files={hard}" in started
    finally:
        node.stop()
