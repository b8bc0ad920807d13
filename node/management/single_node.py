"""The cluster view of a node on its own: a cluster of one (node/management/cluster_view.py).

Its only member is itself, up and never paused; no queue is mirrored; every
listing is what this node holds, and a change applies here at once, as
`haremq ctl` would make it on this node.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ..broker.broker import BrokerError
from ..broker.commands import admin_method
from .cluster_view import AdminRefused, Member, Placement
from .views import close_local, local_rows, node_json

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from ..broker.broker import Broker
    from ..broker.ports import QueuePort
    from .cluster_view import ClusterView


class SingleNodeView:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def members(self) -> list[Member]:
        return [Member(self.broker.node_name, up=True, paused=False, is_self=True)]

    @property
    def paused(self) -> bool:
        return False

    def node_fields(self) -> dict[str, Any]:
        return {}

    def placements(self) -> list[Placement]:
        return []

    def queue_status(self, vhost: str, name: str) -> dict[str, Any]:
        return {}

    async def rows(self, kind: str) -> list[dict[str, Any]]:
        return local_rows(self.broker, self, kind)

    async def node_rows(self) -> list[dict[str, Any]]:
        return [node_json(self.broker, self)]

    async def close_connection(self, name: str, reason: str) -> bool:
        return close_local(self.broker, name, reason)

    async def admin_call(self, method: str, *args: Any) -> Any:
        call = admin_method(self.broker, method)
        if call is None:
            raise AdminRefused(f"this node does not support '{method}'")
        try:
            return call(*args)
        except (BrokerError, ValueError, KeyError) as exc:
            raise AdminRefused(str(exc)) from None

    def metric_families(self, queues: Sequence[tuple[str, QueuePort]], per_queue: bool) -> Iterable[Metric]:
        return ()


if TYPE_CHECKING:
    def _is_a_cluster_view(view: SingleNodeView) -> ClusterView:
        return view     # mypy (`make lint`) fails here unless SingleNodeView is a ClusterView
