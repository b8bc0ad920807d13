"""`haremq perf` against a real `haremq node`: summaries that add up, one-line errors.

No timing assertions: the machine is shared, only the bookkeeping is checked.
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from haremq.cluster.perf.amqp import URLError, parse_url, publish_template

HOST = "127.0.0.1"
REF_PORT = os.environ.get("HAREMQ_TEST_REF_PORT")   # run against a reference broker instead


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _haremq() -> list[str]:
    exe = shutil.which("haremq")
    return [exe] if exe else [sys.executable, "-c", "import sys; from haremq.cluster.cli import main; sys.exit(main())"]


def _port_open(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.2):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    """amqp:// URL of a fresh `haremq node` (own port, own data dir) for this module."""
    if REF_PORT:
        yield f"amqp://guest:guest@{HOST}:{REF_PORT}/%2F"
        return
    work = tmp_path_factory.mktemp("perf-node")
    for _attempt in range(3):           # a free port can be taken by another xdist worker meanwhile
        port = _free_port()
        log = open(work / "node.log", "ab")
        proc = subprocess.Popen([*_haremq(), "node", "--name", "perf", "--data-dir", str(work / "data"),
                                 "--amqp-port", str(port), "--bind", HOST],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline and not _port_open(port):
            time.sleep(0.05)
        if proc.poll() is None and _port_open(port):
            break
        proc.kill()
        proc.wait()
        log.close()
    else:
        pytest.fail(f"haremq node did not start: {(work / 'node.log').read_text()[-500:]}")
    yield f"amqp://guest:guest@{HOST}:{port}/%2F"
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    log.close()


def perf(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    return subprocess.run([*_haremq(), "perf", *args], capture_output=True, text=True, timeout=timeout)


def _queue(name: str) -> str:
    return f"perf.{name}.{os.getpid()}.{time.monotonic_ns()}"


def assert_adds_up(s: dict) -> None:
    assert s["sent"] > 0
    assert s["sent"] == s["confirmed"] + s["nacked"] + s["outstanding"]
    assert 0 <= s["consumed"] <= s["sent"]
    assert min(s["confirmed"], s["nacked"], s["returned"], s["outstanding"]) >= 0
    for key in ("confirm_latency_ms", "e2e_latency_ms"):
        lat = s[key]
        assert lat is not None, key
        assert 0 <= lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"], (key, lat)
    assert s["publish_rate"] > 0 and s["consume_rate"] > 0
    cpu = s["client_cpu"]
    assert {p["role"] for p in cpu["processes"]} == {"producer", "consumer"}
    assert all(p["cpu_s"] >= 0 and p["share_of_core"] >= 0 for p in cpu["processes"])
    assert cpu["total"]["cpu_s"] >= 0 and cpu["total"]["cores"] >= 0
    assert s["errors"] == []


def test_timed_persistent_run_adds_up(url, tmp_path):
    out = tmp_path / "out.json"
    r = perf("-h", url, "-x", "1", "-y", "1", "-s", "256", "-c", "100", "-q", "100", "-f", "persistent",
             "-u", _queue("timed"), "-z", "3", "--json", str(out))
    assert r.returncode == 0, r.stderr
    s = json.loads(out.read_text())
    assert_adds_up(s)
    assert s["confirmed"] > 0
    assert s["config"]["persistent"] and s["config"]["confirm"] == 100 and s["config"]["size"] == 256
    assert "Traceback" not in r.stderr
    assert "msg/s" in r.stderr               # the closing human summary


def test_queue_args_declare_the_queue_with_them(url, tmp_path):
    """PerfTest's -qa: a quorum queue (durable whatever -f says), its arguments as typed values."""
    import pika
    queue = _queue("qa")
    out = tmp_path / "qa.json"
    r = perf("-h", url, "-x", "1", "-y", "1", "-c", "10", "-C", "100", "-u", queue, "--json", str(out),
             "-qa", "x-queue-type=quorum,x-max-length=100000")
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["consumed"] == 100
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        # the same arguments again: equivalent, so declare-ok; another type would be 406
        conn.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum",
                                                                      "x-max-length": 100000})
        ch = conn.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as err:
            ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "classic"})
        assert err.value.reply_code == 406
    finally:
        conn.close()
    r = perf("-h", url, "-C", "1", "-qa", "x-queue-type")
    assert r.returncode == 2 and "key=value" in r.stderr and len(r.stderr.strip().splitlines()) <= 2, r.stderr


def test_message_count_run_is_drained(url, tmp_path):
    out = tmp_path / "count.json"
    r = perf("-h", url, "-x", "1", "-y", "1", "-s", "100", "-c", "50", "-q", "20", "-A", "5",
             "-u", _queue("count"), "-C", "500", "--json", str(out))
    assert r.returncode == 0, r.stderr
    s = json.loads(out.read_text())
    assert s["sent"] == 500 == s["consumed"]
    assert s["confirmed"] + s["nacked"] == 500 and s["outstanding"] == 0
    assert s["other_consumed"] == 0
    assert_adds_up(s)


def test_two_producers_two_consumers_autoack(url, tmp_path):
    out = tmp_path / "multi.json"
    r = perf("-h", url, "-h", url, "-x", "2", "-y", "2", "-a", "-c", "10", "-C", "300",
             "-u", _queue("multi"), "--json", str(out), "--delete-after")
    assert r.returncode == 0, r.stderr
    s = json.loads(out.read_text())
    assert s["sent"] == 600 == s["consumed"]
    assert len(s["client_cpu"]["processes"]) == 4
    assert_adds_up(s)


def _one_line_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


def test_unreachable_broker_is_one_line_error():
    line = _one_line_error(perf("-h", f"amqp://guest:guest@{HOST}:{_free_port()}/%2F", "-z", "1", timeout=30))
    assert "cannot connect" in line


@pytest.mark.parametrize("args, expect", [
    (["--no-such-flag"], "unrecognized arguments"),
    (["-x"], "expected one argument"),
    (["-f", "durable"], "invalid choice"),
    (["-h", "http://localhost/"], "bad URL"),
    (["-h", "amqp://localhost:99999/"], "bad URL"),
])
def test_bad_flag_or_url_is_one_line_error(args, expect):
    r = perf(*args, "-z", "1", timeout=30)
    assert expect in _one_line_error(r)


def test_bad_credentials_are_one_line_error(url):
    bad = url.replace("guest:guest@", "guest:wrong@")
    line = _one_line_error(perf("-h", bad, "-z", "1", timeout=30))
    assert "ACCESS_REFUSED" in line


def test_parse_url():
    u = parse_url("amqp://bob:s%40cret@example.org:5673/%2F")
    assert (u.user, u.password, u.host, u.port, u.vhost) == ("bob", "s@cret", "example.org", 5673, "/")
    u = parse_url("amqp://localhost")
    assert (u.user, u.password, u.port, u.vhost) == ("guest", "guest", 5672, "/")
    assert parse_url("amqp://h/prod").vhost == "prod"
    assert "s@cret" not in str(parse_url("amqp://bob:s%40cret@h/"))
    for bad in ("amqps://h/", "http://h/", "amqp:///", "amqp://h:x/"):
        with pytest.raises(URLError):
            parse_url(bad)


@pytest.mark.parametrize("size", [0, 5, 12, 4096, 10_000])
def test_publish_template_frames(size):
    """The hand-built frames: method, header, then the body split at frame_max."""
    head, tail = publish_template("q", size, persistent=True, mandatory=False, frame_max=4096)
    wire = head + (b"\x00" * 12 if size >= 12 else b"") + tail
    frames, off = [], 0
    while off < len(wire):
        ftype, n = wire[off], int.from_bytes(wire[off + 3:off + 7], "big")   # type, (channel), size
        assert wire[off + 7 + n] == 0xCE
        frames.append((ftype, n))
        off += 8 + n
    assert off == len(wire)
    assert [f for f, _ in frames[:2]] == [1, 2]
    bodies = [n for f, n in frames[2:]]
    assert all(f == 3 for f, _ in frames[2:]) and sum(bodies) == size
    assert all(n <= 4096 - 8 for n in bodies)


@pytest.mark.skipif(REF_PORT is not None, reason="times HareMQ's own steps")
@pytest.mark.parametrize("tool, steps", [
    ("confirm_breakdown", ["client -> node", "write + fdatasync", "node -> client"]),
    ("mirror_breakdown", ["master -> mirror", "mirror: sync", "master's own sync"]),
])
def test_breakdown_tools_time_every_step(tool, steps):
    # the benches wrap the node's own functions: a rename there must not leave them broken
    r = subprocess.run([sys.executable, "-m", f"haremq.bench.{tool}", "--messages", "200"],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    table = {line.split("  ")[0].strip() for line in r.stdout.splitlines()}
    for step in steps + ["round trip"]:
        assert step in table, r.stdout
