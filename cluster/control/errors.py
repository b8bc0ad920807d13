"""The error a `haremq ctl` command answers with: apart from the commands, so the modules
that serve them (server.py, operations.py, quorum.py) and the gRPC servicer share it
without importing each other."""
from __future__ import annotations

from haremq.node.broker.commands import AdminCallError


class ControlError(AdminCallError):
    """A command failed for a reason the operator should read."""
