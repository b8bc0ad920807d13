"""/api/health/checks and /api/aliveness-test: RabbitMQ's health checks."""
from __future__ import annotations

from aiohttp import web
from pamqp import commands as spec

from .responses import as_json
from .routes import Routes


class HealthRoutes(Routes):
    async def alarms(self, request) -> web.Response:
        found = [{"node": self.broker.node_name, "resource": _resource(a)} for a in sorted(self.broker.alarms)]
        for node, names in sorted(self.broker.peer_alarms.items()):
            found += [{"node": node, "resource": _resource(a)} for a in sorted(names)]
        if found:
            return as_json({"status": "failed", "reason": "There are alarms in effect in the cluster",
                            "alarms": found}, 503)
        return as_json({"status": "ok"})

    async def local_alarms(self, request) -> web.Response:
        found = [{"node": self.broker.node_name, "resource": _resource(a)} for a in sorted(self.broker.alarms)]
        if found:
            return as_json({"status": "failed", "reason": "There are alarms in effect on the node",
                            "alarms": found}, 503)
        return as_json({"status": "ok"})

    async def ok_check(self, request) -> web.Response:
        return as_json({"status": "ok"})

    async def aliveness(self, request) -> web.Response:
        """Declare the queue `aliveness-test`, publish a message to it and get it back."""
        vhost = self.vhost_of(request)
        async with self.direct(request, vhost.name) as conn:
            channel = await conn.channel(confirm=True)
            await conn.call(channel, spec.Queue.Declare(queue="aliveness-test", durable=False),
                            spec.Queue.DeclareOk)
            await conn.publish(channel, "", "aliveness-test", b"test_message", spec.Basic.Properties())
            message = await conn.get(channel, "aliveness-test", no_ack=True)
        if message is None or message.body != b"test_message":
            return as_json({"status": "failed", "reason": "the test message did not come back"}, 503)
        return as_json({"status": "ok"})


def _resource(alarm: str) -> str:
    return "disk" if alarm.startswith("disk") else alarm
