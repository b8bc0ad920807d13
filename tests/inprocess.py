"""A HareMQ node run inside the test process, on its own event loop thread.

For the few tests that must reach into a running node (change a threshold,
add a user without `haremq ctl`) while real clients talk to it over TCP:

    with InProcessNode(tmp_path, vm_memory_high_watermark="0.9") as n:
        n.call(n.broker.add_user, "bob", "pw")       # runs on the node's loop
        pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", n.port))
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from pathlib import Path

from haremq.cluster.assembly import build_node
from haremq.node.app import Node, NodeConfig


class InProcessNode:
    host = "127.0.0.1"

    def __init__(self, workdir: Path, **config):
        config.setdefault("name", "inproc")
        config.setdefault("amqp_port", 0)
        self.config = NodeConfig(data_dir=Path(workdir) / "data", **config)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.node: Node | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None

    @property
    def broker(self):
        return self.node.broker

    @property
    def port(self) -> int:
        return self.node.amqp.port

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def start(self) -> "InProcessNode":
        started: concurrent.futures.Future = concurrent.futures.Future()

        async def main():
            self.loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                self.node = build_node(self.config)
                await self.node.start()
            except BaseException as exc:  # noqa: BLE001 - reported to the starting thread
                started.set_exception(exc)
                return
            started.set_result(None)
            await self._stop.wait()
            await self.node.stop()

        self._thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
        self._thread.start()
        started.result(30)
        return self

    def call(self, fn, *args, timeout: float = 10.0, **kwargs):
        """Run fn(*args) on the node's loop and return its result (or raise its exception);
        a coroutine function is awaited there."""
        async def run():
            result = fn(*args, **kwargs)
            return await result if asyncio.iscoroutine(result) else result
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def stop(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(30)
        self._thread = None

    def __enter__(self) -> "InProcessNode":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
