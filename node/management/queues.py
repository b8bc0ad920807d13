"""/api/queues: listing (every member's own, and queues whose home is down from the metadata),
declare, delete, purge, get, and a queue's bindings."""
from __future__ import annotations

from aiohttp import web
from pamqp import commands as spec

from . import inputs
from . import serializers as js
from .pagination import listing
from .responses import as_json, created, no_content, not_found
from .routes import Routes, log
from .samples import with_samples

ACKMODES = {"ack_requeue_true": ("reject", True), "ack_requeue_false": ("ack", False),
            "reject_requeue_true": ("reject", True), "reject_requeue_false": ("reject", False)}
MAX_GET = 1 << 20      # messages one POST .../get may ask for


class QueueRoutes(Routes):
    async def _queue_rows(self) -> list[dict]:
        rows = await self.rows("queues")
        seen = {(r["vhost"], r["name"]) for r in rows}
        for vname, vhost in list(self.broker.vhosts.items()):
            for queue in list(vhost.queues.values()):
                if (vname, queue.name) not in seen and queue.remote:
                    rows.append(js.down_queue_row(vname, queue, self.view.queue_status(vname, queue.name)))
        for row in rows:
            js.with_policy(row, self.broker.vhosts.get(row["vhost"]))
        return sorted(rows, key=lambda r: (r["vhost"], r["name"]))

    async def queues(self, request) -> web.Response:
        rows = self.visible(request, await self._queue_rows())
        return as_json(listing(request, with_samples(request, rows), ("vhost", "name")))

    async def queue(self, request) -> web.Response:
        vhost = self.vhost_of(request, act=False)
        name = request.match_info["name"]
        if name not in vhost.queues:
            raise not_found()
        for row in await self._queue_rows():
            if row["vhost"] == vhost.name and row["name"] == name:
                row["consumer_details"] = [c for c in self.own(request, await self.rows("consumers"))
                                           if c["queue"] == {"name": name, "vhost": vhost.name}]
                return as_json(with_samples(request, row))
        raise not_found()

    async def declare_queue(self, request) -> web.Response:
        vhost = self.vhost_of(request)
        name = self._name(request, what="queue name")
        data = await self.body(request)
        durable, auto_delete = inputs.flag(data, "durable", True), inputs.flag(data, "auto_delete", False)
        arguments = inputs.table(data, "arguments")
        existed = name in vhost.queues
        async with self.direct(request, vhost.name) as conn:
            channel = await conn.channel()
            await conn.call(channel, spec.Queue.Declare(
                queue=name, durable=durable, auto_delete=auto_delete, exclusive=False, arguments=arguments),
                spec.Queue.DeclareOk)
        log.info("queue declared through the management API", vhost=vhost.name, queue=name,
                 user=request["caller"].name)
        return no_content() if existed else created()

    async def delete_queue(self, request) -> web.Response:
        vhost = self.vhost_of(request)
        name = request.match_info["name"]
        if name not in vhost.queues:
            raise not_found()
        query = request.query
        async with self.direct(request, vhost.name) as conn:
            channel = await conn.channel()
            await conn.call(channel, spec.Queue.Delete(queue=name, if_unused=query.get("if-unused") == "true",
                                                       if_empty=query.get("if-empty") == "true"),
                            spec.Queue.DeleteOk)
        log.info("queue deleted through the management API", vhost=vhost.name, queue=name,
                 user=request["caller"].name)
        return no_content()

    async def purge_queue(self, request) -> web.Response:
        vhost = self.vhost_of(request)
        name = request.match_info["name"]
        if name not in vhost.queues:
            raise not_found()
        async with self.direct(request, vhost.name) as conn:
            channel = await conn.channel()
            await conn.call(channel, spec.Queue.Purge(queue=name), spec.Queue.PurgeOk)
        return no_content()

    async def get_messages(self, request) -> web.Response:
        vhost = self.vhost_of(request)
        name = request.match_info["name"]
        if name not in vhost.queues:
            raise not_found()
        data = await self.body(request)
        count = inputs.whole(data, "count", 1, 0, MAX_GET) or 0     # never None: it has a default
        requeue = inputs.flag(data, "requeue", True)
        ackmode = inputs.choice(data, "ackmode", "ack_requeue_true" if requeue else "ack_requeue_false",
                                tuple(ACKMODES))
        encoding = inputs.choice(data, "encoding", "auto", ("auto", "base64"))
        truncate = inputs.whole(data, "truncate", None, 0)
        action, requeue = ACKMODES[ackmode]
        out = []
        async with self.direct(request, vhost.name) as conn:
            channel = await conn.channel()
            tags = []
            for _ in range(max(0, count)):
                message = await conn.get(channel, name, no_ack=False)
                if message is None:
                    break
                tags.append(message.method.delivery_tag)
                out.append(js.got_message(message, encoding, truncate))
            if tags:
                if action == "ack":
                    conn._send(spec.Basic.Ack(delivery_tag=tags[-1], multiple=True), channel)
                else:
                    conn._send(spec.Basic.Nack(delivery_tag=tags[-1], multiple=True, requeue=requeue), channel)
                await conn.call(channel, spec.Channel.Close(200, "", 0, 0), spec.Channel.CloseOk)
        return as_json(out)

    async def queue_bindings(self, request) -> web.Response:
        vhost = self.vhost_of(request, act=False)
        name = request.match_info["name"]
        if name not in vhost.queues:
            raise not_found()
        rows = [b for b in js.bindings(vhost.name, vhost)
                if b["destination_type"] == "queue" and b["destination"] == name]
        return as_json(rows)
