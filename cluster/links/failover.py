"""What a node does while the master of a mirrored queue it links to may be failing over.

A pure machine, as `RaftMachine` is: the remote queue feeds it what it sees (a
stream to the master broke, calls that must wait, publishes held, the master
moved) and the time, and carries out the actions `tick` returns. One timer of
the remote queue drives it; nothing here touches a socket or the event loop,
so every path (the master answers again after a blip, a failover comes, none
comes in time) is a unit test.

RabbitMQ's mirrored-queue clients do the same: a call on a queue whose master
died waits for a mirror's promotion; publishes are confirmed by the new master.
"""
from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

BLIP = 1.0            # a master seen up again this long after its stream broke did not die
PARK_TIMEOUT = 10.0   # how long a call on a mirrored queue waits for a new master
TICK = 0.2            # how often the queue ticks the machine while it waits for something


class Phase(enum.Enum):
    SERVING = "serving"    # links may be opened to the master
    FAILING = "failing"    # a stream to it broke: no new link until a failover, or until it answers again


class Act(enum.Enum):
    RESUME = "resume"            # the old master answers again: held publishes, orphaned consumers and
                                 # parked calls go back to it
    FLUSH_HELD = "flush held"    # the master is known: held publishes go to it
    NACK_HELD = "nack held"      # no master came in time, or none can (the master is gone for longer
                                 # than a blip and no in-sync mirror is up): held publishes are nacked
    REPLAY_PARKED = "replay"     # the master is up: parked calls go to it
    GIVE_UP = "give up"          # a parked call waited too long (its token is in Action.token)


@dataclass(frozen=True)
class Action:
    act: Act
    token: int = 0


@dataclass
class FailoverWatch:
    phase: Phase = Phase.SERVING
    failing_since: float = 0.0
    held_since: float | None = None           # when the oldest publish still held began to wait
    deadlines: dict[int, float] = field(default_factory=dict)    # parked call -> when it gives up
    _tokens: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    # ---- what the queue saw ------------------------------------------------------------------
    def broke(self, now: float) -> bool:
        """A stream to the master broke. True if this starts a failing spell (tell the membership)."""
        if self.phase is Phase.FAILING:
            return False
        self.phase, self.failing_since = Phase.FAILING, now
        return True

    def moved(self) -> None:
        """A failover placed the master (the queue carries held and parked calls to it itself)."""
        self.phase, self.failing_since = Phase.SERVING, 0.0

    @property
    def failing(self) -> bool:
        """Must new calls wait? Until a failover, or until a tick finds the master answering
        again: that tick sends what waited first, so a channel's publishes keep their order."""
        return self.phase is Phase.FAILING

    def holding(self, now: float) -> None:
        if self.held_since is None:
            self.held_since = now

    def released(self) -> None:
        """Nothing is held any more."""
        self.held_since = None

    def park(self, now: float, timeout: float = PARK_TIMEOUT) -> int:
        token = next(self._tokens)
        self.deadlines[token] = now + max(0.0, timeout)
        return token

    def unpark(self, token: int) -> None:
        self.deadlines.pop(token, None)

    # ---- time passing ------------------------------------------------------------------------
    def waiting(self) -> bool:
        """Does the queue need ticks?"""
        return self.phase is Phase.FAILING or self.held_since is not None or bool(self.deadlines)

    def tick(self, now: float, master_up: bool, can_fail_over: bool) -> list[Action]:
        """What to do now, in order. `can_fail_over`: an in-sync mirror is up to take over."""
        actions: list[Action] = []
        if self.phase is Phase.FAILING:
            if now - self.failing_since > BLIP and master_up:     # a broken stream, not a dead node
                self.phase, self.failing_since = Phase.SERVING, 0.0
                actions.append(Action(Act.RESUME))
            elif self.held_since is not None and (now - self.held_since > PARK_TIMEOUT or
                                                  (not can_fail_over and now - self.failing_since > BLIP)):
                actions.append(Action(Act.NACK_HELD))   # a blip's publishes wait for the master either way
        else:
            if self.held_since is not None:
                actions.append(Action(Act.FLUSH_HELD))
            if self.deadlines and master_up:
                actions.append(Action(Act.REPLAY_PARKED))
        for token, deadline in list(self.deadlines.items()):
            if now >= deadline:
                actions.append(Action(Act.GIVE_UP, token))
        return actions
