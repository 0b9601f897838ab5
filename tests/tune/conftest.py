"""Fixtures of the tuning tests: `loopback`, a TVM tracker with rpc_servers on 127.0.0.1 that
the test can kill (loopback_boards.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fleet_marker import starts_fleet  # noqa: E402
from loopback_boards import Loopback  # noqa: E402  (importable once this folder is on the path)


@pytest.fixture
@starts_fleet
def loopback(tmp_path):
    boards = Loopback(tmp_path)
    try:
        yield boards
    finally:
        boards.close()
