"""rabbitpy scenarios, run as `python tests/rabbitpy_client.py SCENARIO URL` with rabbitpy on
PYTHONPATH. rabbitpy 3 needs pamqp 4 while the broker pins pamqp 3, so it lives in its own
directory (.tools/rabbitpy, filled by `make test`) and runs in a subprocess. Prints one JSON line."""
import json
import sys
import uuid

import rabbitpy


def roundtrip(url):
    with rabbitpy.Connection(url) as conn, conn.channel() as ch:
        q = rabbitpy.Queue(ch, exclusive=True)
        q.declare()
        rabbitpy.Message(ch, b"hello", {"content_type": "text/plain"}).publish("", q.name)
        m = q.get()
        return {"body": m.body.decode(), "content_type": m.properties["content_type"]}


def confirms(url):
    with rabbitpy.Connection(url) as conn, conn.channel() as ch:
        ch.enable_publisher_confirms()
        q = rabbitpy.Queue(ch, exclusive=True)
        q.declare()
        acked = [rabbitpy.Message(ch, b"%d" % i).publish("", q.name) for i in range(20)]
        return {"acked": all(acked), "count": len(q)}


def large(url):
    body = b"L" * (3 * 131072 + 17)
    with rabbitpy.Connection(url) as conn, conn.channel() as ch:
        q = rabbitpy.Queue(ch, exclusive=True)
        q.declare()
        rabbitpy.Message(ch, body).publish("", q.name)
        m = q.get()
        return {"size": len(m.body), "same": m.body == body}


def refused_login(url):
    try:
        with rabbitpy.Connection(url.replace("guest:guest@", "guest:wrong@")):
            return {"refused": False}
    except rabbitpy.exceptions.AMQPAccessRefused as exc:
        return {"refused": True, "error": type(exc).__name__, "text": str(exc)}


def queue_deleted_under_consumer(url):
    name = f"rabbitpy.{uuid.uuid4().hex[:10]}"
    with rabbitpy.Connection(url) as conn, conn.channel() as ch:
        q = rabbitpy.Queue(ch, name)
        q.declare()
        rabbitpy.Message(ch, b"one").publish("", name)
        got = []
        try:
            for message in q.consume():
                got.append(message.body.decode())
                message.ack()
                with conn.channel() as other:
                    rabbitpy.Queue(other, name).delete()
        except rabbitpy.exceptions.RemoteCancellationException:   # basic.cancel from the broker
            return {"got": got, "cancelled": True}
        return {"got": got, "cancelled": False}


if __name__ == "__main__":
    print(json.dumps(globals()[sys.argv[1]](sys.argv[2])))
