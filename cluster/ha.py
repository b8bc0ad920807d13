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
        return {"master": self.home, "epoch": self.epoch, "mirrors": list(self.mirrors),
                "synchronised_mirrors": list(self.synced)}
