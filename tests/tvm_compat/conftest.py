"""Fixtures of the TVM compat tests: Python with some of TVM's modules made unimportable, and a
TVM rpc_server on loopback."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator

import pytest
from tvm import rpc

BLOCKER = """
import importlib.abc, sys

class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in BLOCKED:
            raise ImportError(f"{name} is blocked by the test")
        return None

BLOCKED = set(sys.argv[1:])
sys.meta_path.insert(0, Blocked())
"""


@pytest.fixture
def python_without() -> Callable[[str, list[str]], subprocess.CompletedProcess]:
    """Run `code` in a fresh Python whose imports of the modules `blocked` raise ImportError."""

    def run(code: str, blocked: list[str]) -> subprocess.CompletedProcess:
        program = BLOCKER + textwrap.dedent(code)
        return subprocess.run([sys.executable, "-c", program, *blocked], capture_output=True, text=True, timeout=120)

    return run


@pytest.fixture
def rpc_server() -> Iterator[rpc.Server]:
    """TVM's rpc_server on loopback, key "k", without a tracker."""
    server = rpc.Server(host="127.0.0.1", port=9610, port_end=9690, key="k")
    try:
        yield server
    finally:
        server.terminate()


def pytest_collection_modifyitems(config, items):
    """Every test here runs TVM itself (marker `tvm`: left out of `make test-unit`)."""
    here = config.rootpath / "tests" / "tvm_compat"
    for item in items:
        if item.path.is_relative_to(here):
            item.add_marker(pytest.mark.tvm)
