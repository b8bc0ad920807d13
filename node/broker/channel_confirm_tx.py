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
        self.tx_replicas = {}
        self.tx_remote = remote = RemoteWait()
        for exchange, message, props, mandatory in publishes:
            self._route_and_enqueue(exchange, message, props, mandatory)
        replicas, self.tx_replicas = self.tx_replicas, None
        for kind, records, requeue in acks:
            self._settle(records, requeue=None if kind == "ack" else requeue)
        # CONF-8: commit-ok only once its writes are durable here, held by every in-sync mirror,
        # and safe on the home node of every queue homed elsewhere
        self._hold(cmd.Tx.CommitOk(), tuple(replicas.items()), remote)

    def _tx_rollback(self, m) -> None:
        if self.mode is not Mode.TX:
            raise error(ReplyCode.PRECONDITION_FAILED, "channel is not transactional", m)
        self.tx_publishes = []
        acks, self.tx_acks = self.tx_acks, []
        if acks:
            restored = dict(self.unacked)
            for _kind, records, _requeue in acks:
                for record in records:
                    restored[record.tag] = record
            self.unacked = dict(sorted(restored.items()))
        self._reply(cmd.Tx.RollbackOk())


class RemoteWait:
    """One tx.commit's publishes to queues homed on other nodes, until each home reports them."""

    __slots__ = ("seqs", "ok", "_done")

    def __init__(self):
        self.seqs: set[int] = set()
        self.ok = True
        self._done: Callable[[bool], None] | None = None

    def settled(self, seqs, ok: bool) -> None:
        self.seqs.difference_update(seqs)
        self.ok = self.ok and ok
        if not self.seqs:
            self._finish()

    def when_settled(self, done: Callable[[bool], None]) -> None:
        self._done = done
        if not self.seqs:
            self._finish()

    def _finish(self) -> None:
        if self._done is not None:
            done, self._done = self._done, None
            done(self.ok)
