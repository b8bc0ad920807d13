"""The broker-cluster seam is explicit: every implementation of a port in node/broker/ports.py
(and of what a node asks of its cluster side, and ctl of the cluster port) still has each of
its methods (no sockets: the classes themselves are read)."""
from __future__ import annotations

import inspect

import pytest

from haremq.cluster.control_client import ControlClient
from haremq.cluster.node import ClusterNode
from haremq.cluster.queue_service import LinkChannel
from haremq.cluster.remote_queue import RemoteQueue, _NodeItself
from haremq.node.broker.channel import Channel
from haremq.node.broker.metadata import LocalMetadata
from haremq.node.broker.ports import ConsumerChannel, MetadataPort, QueuePort, RemoteCaller
from haremq.node.app import ClusterSide
from haremq.node.broker.queue import Queue
from haremq.node.ctl import ControlPort

IMPLEMENTATIONS = [
    (MetadataPort, ClusterNode), (MetadataPort, LocalMetadata),
    (QueuePort, Queue), (QueuePort, RemoteQueue),
    (ConsumerChannel, Channel), (ConsumerChannel, LinkChannel),
    (RemoteCaller, Channel), (RemoteCaller, _NodeItself),
    (ClusterSide, ClusterNode), (ControlPort, ControlClient),
]


def members(port) -> dict:
    return {name: value for name, value in vars(port).items()
            if inspect.isfunction(value) or isinstance(value, property)}


@pytest.mark.parametrize("port,cls", IMPLEMENTATIONS, ids=[f"{p.__name__}-{c.__name__}" for p, c in IMPLEMENTATIONS])
def test_an_implementation_has_every_member_of_its_port(port, cls):
    for name, wanted in members(port).items():
        found = inspect.getattr_static(cls, name, None)
        assert found is not None, f"{cls.__name__} lacks {port.__name__}.{name}"
        if inspect.isfunction(wanted):
            assert callable(found) and not isinstance(found, property), f"{cls.__name__}.{name} is not a method"
            if inspect.iscoroutinefunction(wanted):
                assert inspect.iscoroutinefunction(found), f"{cls.__name__}.{name} must be async"
