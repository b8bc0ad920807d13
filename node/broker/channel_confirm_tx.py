"""The confirm and tx classes of a channel: publisher confirms and transactions (CONF-1, CONF-8).

A mixin of `Channel` (node/broker/channel.py); the channel's mode is normal,
confirm or tx, and switching between confirm and tx is refused.
"""
from __future__ import annotations

import enum
from typing import Callable

from pamqp import commands as cmd

from ..protocol.replies import ReplyCode, error
from .confirms import ConfirmTracker


class Mode(enum.Enum):
    NORMAL = "normal"
    CONFIRM = "confirm"
    TX = "tx"


class ConfirmTxMethods:
    # ---- confirm and tx classes ------------------------------------------------------------
    def _confirm_select(self, m) -> None:
        if self.mode is Mode.TX:
            raise error(ReplyCode.PRECONDITION_FAILED, "cannot switch from tx to confirm mode", m)
        if self.mode is Mode.NORMAL:
            self.mode = Mode.CONFIRM
            self.confirms = ConfirmTracker()
        self._reply(cmd.Confirm.SelectOk(), m.nowait)

    def _tx_select(self, m) -> None:
        if self.mode is Mode.CONFIRM:
            raise error(ReplyCode.PRECONDITION_FAILED, "cannot switch from confirm to tx mode", m)
        self.mode = Mode.TX
        self._reply(cmd.Tx.SelectOk())

    def _tx_commit(self, m) -> None:
        if self.mode is not Mode.TX:
            raise error(ReplyCode.PRECONDITION_FAILED, "channel is not transactional", m)
        publishes, self.tx_publishes = self.tx_publishes, []
        acks, self.tx_acks = self.tx_acks, []
        # numbers this commit's publishes until the next commit (none starts before commit-ok)
        self.tx_commit = commit = CommitWait()
        for exchange, message, props, mandatory in publishes:
            self._route_and_enqueue(exchange, message, props, mandatory)
        for kind, records, requeue in acks:
            self._settle(records, requeue=None if kind == "ack" else requeue)
        # CONF-8: commit-ok only once its writes are durable here, held by every in-sync mirror,
        # and safe on the home node of every queue homed elsewhere
        self._hold(cmd.Tx.CommitOk(), commit if commit.waiting or not commit.ok else None)

    def _tx_rollback(self, m) -> None:
        if self.mode is not Mode.TX:
            raise error(ReplyCode.PRECONDITION_FAILED, "channel is not transactional", m)
        self.tx_publishes = []
        acks, self.tx_acks = self.tx_acks, []
        if acks:
            self.deliveries.put_back([record for _kind, records, _requeue in acks for record in records])
        self._reply(cmd.Tx.RollbackOk())


class CommitWait:
    """One tx.commit's publishes, until every queue each reached reports it safe."""

    __slots__ = ("next_seq", "waiting", "ok", "_done")

    def __init__(self):
        self.next_seq = 0
        self.waiting: dict[int, int] = {}     # seq -> queues still to report it
        self.ok = True
        self._done: Callable[[bool], None] | None = None

    def publish(self, queues: int) -> int:
        self.next_seq += 1
        self.waiting[self.next_seq] = queues
        return self.next_seq

    def settled(self, seq: int, ok: bool) -> None:
        left = self.waiting.get(seq)
        if left is None:
            return
        self.ok = self.ok and ok
        if left > 1:
            self.waiting[seq] = left - 1
            return
        del self.waiting[seq]
        if not self.waiting:
            self._finish()

    def when_settled(self, done: Callable[[bool], None]) -> None:
        self._done = done
        if not self.waiting:
            self._finish()

    def _finish(self) -> None:
        if self._done is not None:
            done, self._done = self._done, None
            done(self.ok)
