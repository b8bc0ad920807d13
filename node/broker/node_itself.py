"""The node as a publisher of its own: the channel behind what it publishes itself.

When the node dead-letters into a queue (one homed on another node included),
the queue is published to as by a client channel's publish; this is the
channel it publishes on behalf of (a `RemoteCaller`, as `ports.py` names it):
no client, no confirms, nothing to deliver. A dead-letter forwarder that wants
confirms (deadletter.py) is one with those answered.
"""
from __future__ import annotations


class NodeItself:
    """The node as a publisher of its own (dead-lettering into a queue homed elsewhere):
    a channel with no client, no confirms and nothing to deliver to."""

    id = 0
    key = ""
    closed = False
    confirms = None

    @property
    def session(self):
        return self

    def note_confirms(self, _channel) -> None:
        return None

    def remote_settled(self, _seqs, _ok) -> None:
        return None

    def publish_settled(self, _ok, _seq) -> None:
        return None

    def linked_to(self, _queue) -> None:
        return None

    def fail_channel(self, _channel_id, _err) -> None:
        return None

    def wakeup(self) -> None:
        return None

    def deliver_from_home(self, _consumer, _entry) -> None:
        return None

    def republish(self, queue, message, _seq) -> None:
        queue.publish(message)

    def get_again(self, _name, _no_ack) -> None:
        return None      # it publishes only: no basic.get waits for a failover

    def consumer_cancelled_by_broker(self, _consumer) -> None:
        return None


NODE_ITSELF = NodeItself()
