"""Publisher confirm bookkeeping for one channel (CONF-2, CONF-3, CONF-7).

A publish is confirmed when every queue it reached has reported it safe
(immediately for a transient message in memory; after fsync, or after every
mirror, when a store or a mirror set delays the signal). A single refusal
turns the confirm into a nack. Settled sequence numbers are gathered and
sent at the next flush, coalesced the way RabbitMQ does it: everything below
the lowest still-unsettled number goes as one `multiple=true` ack.
"""
from __future__ import annotations


class ConfirmTracker:
    __slots__ = ("next_seq", "_waiting", "_acks", "_nacks", "confirmed")

    def __init__(self) -> None:
        self.next_seq = 1
        self._waiting: dict[int, int] = {}   # seq -> signals still to come (insertion = seq order)
        self._acks: list[int] = []
        self._nacks: list[int] = []
        self.confirmed = 0                   # acks sent so far (management API, /metrics)

    def publish(self, signals: int) -> int:
        """Number the next publish; it needs `signals` safe reports before its ack."""
        seq = self.next_seq
        self.next_seq += 1
        if signals > 0:
            self._waiting[seq] = signals
        else:
            self._acks.append(seq)
        return seq

    def settle(self, seq: int, ok: bool = True) -> None:
        """One target queue reports the message safe (ok) or refused (not ok)."""
        remaining = self._waiting.get(seq)
        if remaining is None:
            return   # already nacked
        if not ok:
            del self._waiting[seq]
            self._nacks.append(seq)
        elif remaining == 1:
            del self._waiting[seq]
            self._acks.append(seq)
        else:
            self._waiting[seq] = remaining - 1

    @property
    def ready(self) -> bool:
        return bool(self._acks or self._nacks)

    @property
    def unconfirmed(self) -> int:
        return len(self._waiting)

    def flush(self) -> list[tuple[int, bool, bool]]:
        """The (tag, multiple, nack) confirms to send now."""
        if not self._acks and not self._nacks:
            return []
        acks = sorted(self._acks)
        nacks = sorted(self._nacks)
        self.confirmed += len(acks)
        self._acks.clear()
        self._nacks.clear()
        out = [(seq, False, True) for seq in nacks]
        if not acks:
            return out
        cutoff = next(iter(self._waiting)) if self._waiting else acks[-1] + 1
        if nacks:
            cutoff = min(cutoff, nacks[0])
        below = 0
        while below < len(acks) and acks[below] < cutoff:
            below += 1
        if below:
            out.append((acks[below - 1], below > 1, False))
        out.extend((seq, False, False) for seq in acks[below:])
        return out
