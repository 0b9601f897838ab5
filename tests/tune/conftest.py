"""Fixtures of the tuning tests: `loopback`, a TVM tracker with rpc_servers on 127.0.0.1 that
the test can kill (loopback_boards.py)."""

from __future__ import annotations

import pytest
from support.fleet_marker import starts_fleet
from support.loopback_boards import Loopback


@pytest.fixture
@starts_fleet
def loopback(tmp_path):
    boards = Loopback(tmp_path)
    try:
        yield boards
    finally:
        boards.close()
