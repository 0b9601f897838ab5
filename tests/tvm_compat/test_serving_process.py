"""edgetune.tvm_compat.serving_process: TVM's rpc_server and tracker serve from a pool worker."""

from __future__ import annotations

import psutil
import pytest
from tvm.rpc.tracker import Tracker


def _listener(port: int) -> int:
    """The PID of the process listening on 127.0.0.1:`port`."""
    return next(c.pid for c in psutil.net_connections("tcp") if c.status == "LISTEN" and c.laddr.port == port)


@pytest.mark.xfail(strict=True, reason="TVM 0.27: rpc.Server serves from a PopenWorker, a second process")
def test_an_rpc_server_serves_from_the_process_that_starts_it(rpc_server):
    assert _listener(rpc_server.port) == psutil.Process().pid


@pytest.mark.xfail(strict=True, reason="TVM 0.27: rpc.Tracker serves from a PopenWorker, a second process")
def test_a_tracker_serves_from_the_process_that_starts_it():
    tracker = Tracker("127.0.0.1", port=9700, port_end=9790)
    try:
        assert _listener(tracker.port) == psutil.Process().pid
    finally:
        tracker.terminate()
