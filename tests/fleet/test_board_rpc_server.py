"""The rpc_server `fleet up` runs on a board (edgetune.fleet.board_rpc_server), here on loopback:
it serves MetaSchedule's measurements with TVM's runtime library alone."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from support.fleet_marker import starts_fleet
from support.loopback_boards import Loopback
from tvm import rpc

KEY = "gw"


@pytest.fixture
@starts_fleet
def board(tmp_path):
    boards = Loopback(tmp_path)
    try:
        boards.start_board("b1", KEY)
        boards.wait_registered(1)
        yield boards
    finally:
        boards.close()


def test_a_session_fills_measured_arguments_as_tvm_does(board):
    """MetaSchedule's runner fills every argument of a measured kernel with
    `tvm.contrib.random.random_fill_for_measure`, which TVM's runtime library lacks."""
    session = rpc.connect_tracker("127.0.0.1", board.port).request(KEY, session_timeout=30)
    fill = session.get_function("tvm.contrib.random.random_fill_for_measure")
    floats = tvm.runtime.empty((64, 64), "float32", session.cpu())
    integers = tvm.runtime.empty((1000,), "int8", session.cpu())
    fill(floats)
    fill(integers)
    values, counts = floats.numpy(), integers.numpy()
    assert values.min() >= 1.0 and values.max() < 10.0 and len(np.unique(values)) > 1000
    assert set(np.unique(counts)) == set(range(10))
