"""`haremq ctl watch`: a live view of the cluster, redrawn every second.

Members up, down or paused, and every queue with its master, mirrors (synchronised
ones marked, sync progress shown), epoch, message and consumer counts and rates.
Killing a master shows here as it happens: the node goes down, a mirror becomes
master and the epoch goes up.
"""
from __future__ import annotations

import asyncio
import time

from rich.console import Group
from rich.live import Live
from rich.table import Table


def _members_table(status: dict | None, error: str | None) -> Table:
    table = Table(title="members" + (f" (via {status['node']})" if status else ""), expand=True)
    for column in ("node", "state", "address", "last seen"):
        table.add_column(column)
    if status is None:
        table.add_row("?", f"[red]unreachable: {error}", "", "")
        return table
    for m in status["members"]:
        if not m["up"]:
            state = "[red]down"
        elif m.get("paused"):
            state = "[yellow]paused"
        else:
            state = "[green]up"
        seen = "" if m.get("self") else (f"{m['last_seen_s']} s ago" if m.get("last_seen_s") is not None else "never")
        table.add_row(m["name"], state, m["address"], seen)
    table.caption = (f"majority: {status['majority']}  leader: {status.get('leader') or '-'}  "
                     f"alarms: {', '.join(status['alarms']) or 'none'}")
    return table


def _queues_table(queues: list, rates: dict) -> Table:
    table = Table(title="queues", expand=True)
    for column in ("vhost", "name", "master", "epoch", "mirrors", "state", "messages", "unacked", "consumers",
                   "in+out msg/s"):
        table.add_column(column)
    for q in queues:
        state = q.get("state", "running")
        table.add_row(q["vhost"], q["name"], q["node"], str(q.get("epoch") or "-"), _mirrors(q),
                      "[red]down" if state == "down" else state,
                      str(q["messages"]), str(q["messages_unacknowledged"]), str(q["consumers"]),
                      f"{rates.get((q['vhost'], q['name']), 0):.0f}")
    return table


def _mirrors(q: dict) -> str:
    """hare2 (synced), hare3 (syncing 4000/100000) ..."""
    synced = set(q.get("synchronised_mirrors") or [])
    progress = q.get("sync_progress") or {}
    parts = []
    for node in q.get("mirrors") or []:
        if node in synced:
            parts.append(f"{node} [green](synced)")
        elif node in progress:
            parts.append(f"{node} [yellow](syncing {progress[node]})")
        else:
            parts.append(f"{node} [yellow](not synced)")
    return ", ".join(parts) or "-"


async def watch(node: str, client, interval: float, control, once: bool = False) -> None:
    """control(node, client, command, arguments, timeout): node/ctl.py's call to the cluster port."""
    previous: dict = {}
    last = time.monotonic()
    if once:   # one frame on stdout, for scripts and tests
        status = queues = error = None
        try:
            status = await control(node, client, "cluster_status", {}, 2.0)
            queues = await control(node, client, "list_queues", {}, 2.0)
        except Exception as exc:  # noqa: BLE001
            error = str(exc)
        from rich.console import Console
        Console(width=200).print(Group(_members_table(status, error), _queues_table(queues or [], {})))
        return
    with Live(refresh_per_second=4, screen=False) as live:
        while True:
            status = queues = error = None
            try:
                status = await control(node, client, "cluster_status", {}, 2.0)
                queues = await control(node, client, "list_queues", {}, 2.0)
            except Exception as exc:  # noqa: BLE001 - the view shows the problem and goes on
                error = str(exc)
            now = time.monotonic()
            rates = {}
            counts = {}
            for q in queues or []:
                key = (q["vhost"], q["name"])
                if q["messages"] is None:
                    continue
                counts[key] = q["messages"]
                if key in previous:
                    rates[key] = abs(q["messages"] - previous[key]) / max(now - last, 1e-6)
            previous, last = counts, now
            live.update(Group(_members_table(status, error), _queues_table(queues or [], rates)))
            await asyncio.sleep(interval)
