"""edgetune.tvm_compat.tracker_client: TVM's tracker client stalls on Nagle's algorithm;
edgetune's asks the same tracker without it."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from tvm import rpc
from tvm.rpc.tracker import Tracker

from edgetune.fleet.tracker import read_summary


@pytest.fixture
def tracker() -> Iterator[Tracker]:
    tracker = Tracker(host="127.0.0.1", port=9710, port_end=9790, silent=True)
    try:
        yield tracker
    finally:
        tracker.terminate()


@pytest.mark.xfail(strict=True, reason="TVM 0.27: its tracker client writes length and body apart without TCP_NODELAY")
def test_tvms_tracker_client_sends_without_delay(tracker):
    session = rpc.connect_tracker("127.0.0.1", tracker.port)
    try:
        assert session._sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        session.close()


def test_edgetunes_client_sees_a_server_register_with_tvms_tracker(tracker):
    server = rpc.Server(
        host="127.0.0.1",
        port=9610,
        port_end=9690,
        key="k",
        tracker_addr=("127.0.0.1", tracker.port),
        custom_addr="127.0.0.1",
    )
    try:
        deadline = time.monotonic() + 20.0
        while not read_summary("127.0.0.1", tracker.port).registered("k", "127.0.0.1"):
            assert time.monotonic() < deadline, "the server never showed in the tracker's summary"
            time.sleep(0.2)
    finally:
        server.terminate()
