"""Who owns a background task: one TaskGroup per owner (a node, its store, its resource
monitor and statistics, its cluster side, Raft, membership, mirroring, direct-reply senders,
a link or mirror stream's handler), which keeps each task while it runs and cancels and
awaits them all when the owner closes.

No task is started and forgotten: asyncio keeps only a weak reference to a task, and a
task nobody awaits can neither be stopped in order nor report how it failed.
"""
from __future__ import annotations

import asyncio
from typing import Coroutine

import structlog


class TaskGroup:
    def __init__(self, owner: str):
        self.owner = owner
        self._tasks: set[asyncio.Task] = set()
        self.log = structlog.get_logger("haremq.tasks").bind(owner=owner)

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.log.error("background task failed", error=repr(task.exception()))

    async def wait(self) -> None:
        """Wait until every task has ended by itself (work that must finish, such as a
        channel closing gracefully), but the one waiting, if it is one of them."""
        current = asyncio.current_task()
        await asyncio.gather(*(task for task in self._tasks if task is not current), return_exceptions=True)

    async def close(self) -> None:
        """Cancel every task still running and wait until each has ended (but the one
        closing it, if it is one of them)."""
        current = asyncio.current_task()
        tasks = [task for task in self._tasks if task is not current]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
