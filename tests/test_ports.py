"""The broker-cluster seam is explicit: every implementation of a port in node/broker/ports.py
(and of what a node asks of its cluster side, and ctl of the cluster port) still has each of
its methods (no sockets: the classes themselves are read)."""
from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

import pytest

from haremq.cluster.control.client import ControlClient
from haremq.cluster.links.home import LinkChannel
from haremq.cluster.node import ClusterNode
from haremq.node.broker.node_itself import NodeItself
from haremq.cluster.links.remote_queue import RemoteQueue
from haremq.node.broker.channel import Channel
from haremq.node.broker.metadata import LocalMetadata
from haremq.node.broker.ports import ConsumerChannel, MetadataPort, QueuePort, RemoteCaller
from haremq.node.app import ClusterSide
from haremq.node.broker.queue import Queue
from haremq.node.ctl import ControlPort
from haremq.node.single_node import SingleNode

IMPLEMENTATIONS: list[tuple[type, type]] = [
    (MetadataPort, ClusterNode), (MetadataPort, LocalMetadata),
    (QueuePort, Queue), (QueuePort, RemoteQueue),
    (ConsumerChannel, Channel), (ConsumerChannel, LinkChannel),
    (RemoteCaller, Channel), (RemoteCaller, NodeItself),
    (ClusterSide, ClusterNode), (ClusterSide, SingleNode), (ControlPort, ControlClient),
]


if TYPE_CHECKING:
    # Not run: mypy (`make lint`) reads it, and each assignment fails unless the class has every
    # member of its port with types that fit.
    def _each_is_its_port(cluster_node: ClusterNode, local: LocalMetadata, queue: Queue, remote: RemoteQueue,
                          channel: Channel, link: LinkChannel, itself: NodeItself, single: SingleNode) -> None:
        metadata: list[MetadataPort] = [cluster_node, local]
        sides: list[ClusterSide] = [cluster_node, single]
        queues: list[QueuePort] = [queue, remote]
        consumer_channels: list[ConsumerChannel] = [channel, link]
        callers: list[RemoteCaller] = [channel, itself]
        del metadata, sides, queues, consumer_channels, callers


MISSING = object()


def members(port: type) -> dict[str, Any]:
    return {name: value for name, value in vars(port).items()
            if inspect.isfunction(value) or isinstance(value, property)}


def assigned_in_init(cls: type, name: str) -> bool:
    """An attribute a port reads as a property may be a plain one set by the constructor."""
    init = getattr(cls, "__init__", None)
    return inspect.isfunction(init) and name in init.__code__.co_names


@pytest.mark.parametrize("port,cls", IMPLEMENTATIONS, ids=[f"{p.__name__}-{c.__name__}" for p, c in IMPLEMENTATIONS])
def test_an_implementation_has_every_member_of_its_port(port: type, cls: type) -> None:
    for name, wanted in members(port).items():
        found = inspect.getattr_static(cls, name, MISSING)
        if found is MISSING and isinstance(wanted, property) and assigned_in_init(cls, name):
            continue
        assert found is not MISSING, f"{cls.__name__} lacks {port.__name__}.{name}"
        if inspect.isfunction(wanted):
            assert callable(found) and not isinstance(found, property), f"{cls.__name__}.{name} is not a method"
            if inspect.iscoroutinefunction(wanted):
                assert inspect.iscoroutinefunction(found), f"{cls.__name__}.{name} must be async"
