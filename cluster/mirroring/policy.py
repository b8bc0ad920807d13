"""Mirroring policy (MIR-1): which nodes mirror a queue, and the cluster's record of it.

The keys are RabbitMQ's classic-mirroring policy keys, so existing habits carry over:
`ha-mode` (all / exactly / nodes), `ha-params`, `ha-sync-mode` (manual /
automatic), `ha-promote-on-failure` and `ha-promote-on-shutdown`
(when-synced / always).

Placement is a pure function of the policy, the queue's home and the cluster's
members, so every node computes the same mirrors from the same metadata log.
`HAState` is what the log says about one queue: its home (master), epoch and
the mirrors that are synchronised, oldest first. Only the log changes it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

EPOCH_KEY_BITS = 40    # a master of epoch E numbers new messages from E << 40 (keys are uint64)

def mirror_nodes(definition: dict | None, home: str, members: list[str]) -> list[str]:
    """The nodes other than `home` that should hold a mirror, in a fixed order."""
    if not definition or "ha-mode" not in definition:
        return []
    ordered = sorted(members)
    if home in ordered:     # the nodes after the home, wrapping round: spreads mirrors of many queues
        i = ordered.index(home)
        ordered = ordered[i + 1:] + ordered[:i]
    mode = definition["ha-mode"]
    if mode == "all":
        return ordered
    if mode == "exactly":
        return ordered[:max(0, int(definition.get("ha-params", 1)) - 1)]
    wanted = set(definition.get("ha-params") or [])
    return [n for n in ordered if n in wanted]


QUORUM_DEFAULT_GROUP = 3      # RabbitMQ's default x-quorum-initial-group-size: up to three members
# what a quorum-declared queue is replicated with, no policy needed; a policy's ha- keys never
# apply to it (RabbitMQ applies them to classic queues only)
QUORUM_DEFAULTS = {"ha-sync-mode": "automatic", "ha-promote-on-failure": "when-synced",
                   "ha-promote-on-shutdown": "when-synced"}


def quorum_group(arguments: dict, home: str, members: list[str]) -> list[str]:
    """The members of a quorum-declared queue: the declaring node first, then the next ones,
    `x-quorum-initial-group-size` in all (default three, at most one per member)."""
    size = arguments.get("x-quorum-initial-group-size")
    size = size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else QUORUM_DEFAULT_GROUP
    return [home, *mirror_nodes({"ha-mode": "exactly", "ha-params": size}, home, members)]


@dataclass
class HAState:
    """One mirrored queue as the metadata log records it."""
    vhost: str
    name: str
    home: str
    epoch: int = 1
    definition: dict = field(default_factory=dict)
    mirrors: list[str] = field(default_factory=list)     # from the policy; not all synchronised
    synced: list[str] = field(default_factory=list)      # synchronised mirrors, oldest first
    durable: bool = False
    store_id: int = 0
    group: list[str] | None = None      # a quorum-declared queue's members, fixed at declaration

    def placement(self, members: list[str]) -> list[str]:
        """The mirrors: from the group for a quorum-declared queue, else from the policy."""
        if self.group is not None:
            return [n for n in self.group if n != self.home and n in members]
        return mirror_nodes(self.definition, self.home, members)

    @property
    def key(self) -> tuple[str, str]:
        return (self.vhost, self.name)

    @property
    def sync_mode(self) -> str:
        return self.definition.get("ha-sync-mode", "manual")

    @property
    def min_in_sync(self) -> int:
        """HareMQ's `ha-min-in-sync-mirrors`: below it, publishes are nacked, not confirmed."""
        return int(self.definition.get("ha-min-in-sync-mirrors", 0))

    def promote_rule(self, shutdown: bool) -> str:
        key = "ha-promote-on-shutdown" if shutdown else "ha-promote-on-failure"
        return self.definition.get(key, "when-synced")

    def successor(self, is_up, shutdown: bool = False) -> str | None:
        """The oldest synchronised mirror that is up (MIR-4); with promote=always, any mirror up."""
        for node in self.synced:
            if node != self.home and is_up(node):
                return node
        if self.promote_rule(shutdown) == "always":
            for node in self.mirrors:
                if node != self.home and is_up(node):
                    return node
        return None

    def as_json(self) -> dict:
        row = {"master": self.home, "epoch": self.epoch, "mirrors": list(self.mirrors),
               "synchronised_mirrors": list(self.synced)}
        if self.group is not None:
            row["members"] = list(self.group)
        return row
