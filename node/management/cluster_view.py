"""What the management side reads of the cluster a node is in, as one typed port.

The HTTP API, the web view's timeline (stats.py) and /metrics are written
against `ClusterView` and never touch the cluster's objects. A node is handed
one of two implementations when its management side is built (node/app.py):

- node.management.single_node.SingleNodeView: a node on its own, a cluster of
  one (itself, up, never paused; no mirrored queues; listings are its own);
- cluster.control.management_view.ClusterManagementView: a member of a cluster
  (membership, the metadata log's leader, mirroring, and the control calls
  that ask every member for its part).

Where a cluster adds to an answer (a member's links and Raft state in
/api/nodes, the members that did not answer, the cluster's series in
/metrics), the view gives the addition and a single node gives none, so each
answer stays what RabbitMQ's single node or cluster would give.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Protocol, Sequence

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from ..broker.ports import QueuePort

class AdminRefused(Exception):
    """A change to users, vhosts, permissions or policies the node refused; the text is the
    reason the API answers with (400)."""


@dataclass(frozen=True)
class Member:
    """A member of the cluster as this node sees it."""
    name: str
    up: bool
    paused: bool | None      # None: down, so not known
    is_self: bool

    @property
    def state(self) -> str:
        """As the timeline words it: paused, up or down."""
        return "paused" if self.paused else ("up" if self.up else "down")


@dataclass(frozen=True)
class Placement:
    """Where a mirrored (or quorum) queue's master is, as the metadata log records it."""
    vhost: str
    name: str
    home: str
    epoch: int

    @property
    def key(self) -> tuple[str, str]:
        return (self.vhost, self.name)


class ClusterView(Protocol):
    # ---- members ------------------------------------------------------------------------------
    def members(self) -> list[Member]:
        """Every member, this node first (a single node: only itself)."""
        ...

    @property
    def paused(self) -> bool:
        """True while this node cannot see a majority of the cluster (pause-minority)."""
        ...

    def node_fields(self) -> dict[str, Any]:
        """What the cluster adds to this node's /api/nodes row (its pause, its links to the
        others, its Raft state); nothing on a single node."""
        ...

    # ---- queues -------------------------------------------------------------------------------
    def placements(self) -> list[Placement]:
        """The mirrored queues and their masters, in the order the log recorded them."""
        ...

    def queue_status(self, vhost: str, name: str) -> dict[str, Any]:
        """A mirrored queue's master, mirrors and sync state (cluster/mirroring/manager.py's `status`),
        as serializers.mirroring_fields reads it; empty for a queue that is not mirrored."""
        ...

    # ---- listings and changes across the cluster ----------------------------------------------
    async def rows(self, kind: str) -> list[dict[str, Any]]:
        """Rows of one kind (views.KINDS) from every member that is up, each listing its own."""
        ...

    async def node_rows(self) -> list[dict[str, Any]]:
        """/api/nodes: a row per member, sorted by name; a member that did not answer is listed
        as not running."""
        ...

    async def close_connection(self, name: str, reason: str) -> bool:
        """Close the client connection of that name on whichever member it is connected to
        (320 CONNECTION_FORCED); False if none had it."""
        ...

    async def admin_call(self, method: str, *args: Any) -> Any:
        """A change to users, vhosts, permissions or policies as `haremq ctl` makes it (through
        the metadata log in a cluster); raises AdminRefused."""
        ...

    # ---- /metrics -----------------------------------------------------------------------------
    def metric_families(self, queues: Sequence[tuple[str, QueuePort]], per_queue: bool) -> Iterable[Metric]:
        """The cluster's series (members seen up, pause, Raft, mirrors, epochs, sync progress)
        for the queues homed here; none on a single node."""
        ...
