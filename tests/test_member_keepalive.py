"""The members' gRPC server takes the keepalive pings its clients send (cluster/membership/members.py
SERVER_OPTIONS). With gRPC's server defaults it allowed one ping without data every 5 minutes
and answered the third with GOAWAY "too_many_pings": an idle connection between two members was
dropped every few seconds, and the next call had to dial again."""
from __future__ import annotations

import asyncio
import socket
import time

import grpc

from haremq.cluster.membership.members import CHANNEL_OPTIONS
from tests.inprocess import InProcessNode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_idle_connection_to_a_member_stays_open(tmp_path):
    cluster_port = free_port()
    with InProcessNode(tmp_path, cluster_port=cluster_port):
        async def watch() -> list[str]:
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{cluster_port}", options=CHANNEL_OPTIONS)
            try:
                await asyncio.wait_for(channel.channel_ready(), 10)
                states = [channel.get_state().name]
                deadline = time.monotonic() + 6.0          # six keepalive pings, no calls
                while (left := deadline - time.monotonic()) > 0:
                    try:
                        await asyncio.wait_for(channel.wait_for_state_change(channel.get_state()), left)
                    except asyncio.TimeoutError:
                        break
                    states.append(channel.get_state().name)
                return states
            finally:
                await channel.close()
        assert asyncio.run(watch()) == ["READY"]
