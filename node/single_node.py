"""The cluster side of a node on its own: a cluster of one.

A node always has a cluster side (node/app.py's `ClusterSide`); this one has no
members to wait for, so it serves AMQP as soon as it starts, and management
reads it as a cluster of one (node/management/single_node.py). A member of a
cluster gets cluster/node.py's `ClusterNode` instead.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from .management.single_node import SingleNodeView

if TYPE_CHECKING:
    from .broker.broker import Broker
    from .management.cluster_view import ClusterView
    from .server import AMQPServer


class SingleNode:
    def __init__(self, broker: Broker) -> None:
        self._view = SingleNodeView(broker)

    @property
    def management_view(self) -> ClusterView:
        return self._view

    async def start(self, amqp: AMQPServer, stop_node: Callable[[str], None]) -> None:
        """Serve at once: there is no majority to wait for (`stop_node` is never needed)."""
        await amqp.resume()

    async def stop(self) -> None:
        return None
