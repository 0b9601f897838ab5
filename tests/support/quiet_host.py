"""`quiet_host()`: the machine's cores to one test while it times something it compares.

Under `make test` the pytest-xdist workers share this machine's cores, and a test that times
a kernel or a board while another worker compiles or tunes measures that work too (a tuned
build measured 1.4x slower than the untuned one beside it, a board 1.33x "faster" than its
baseline). Every test holds the session's CPU lock shared while it runs; `quiet_host()` makes it
exclusive, so the other workers finish the tests they are in and start no other until the timing
is done; a module-scoped fixture inside `quiet_host()` keeps it so from the module's first test
to its last (the others wait once, not before each test). A gate lock keeps the others' next
tests from overtaking a waiting exclusive taker. No lock is ever waited for while another is
held but the gate, so two workers asking for quiet at once take turns. A worker at low priority
(the background worker's tests that start no fleet, tests/support/worker_groups.py) takes no part:
it gets a core only when the timing's processes leave it idle. A fleet test runs at normal
priority (tests/support/worker_priority.py). Without xdist, `quiet_host()` does nothing.
"""

from __future__ import annotations

import fcntl
from contextlib import contextmanager
from pathlib import Path

import pytest

from support.worker_priority import at_low_priority, normal_for_fleet

_LOCKS_KEY = "edgetune_locks_dir"


class _CpuLock:
    def __init__(self, directory: Path):
        self._main = open(directory / "cpu.lock", "a+")
        self._gate = open(directory / "cpu-gate.lock", "a+")
        self._quiet_depth = 0
        self._shared = False

    def _take(self, mode: int) -> None:
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._main, mode)
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)

    def share(self) -> None:
        """At the start of each test (a no-op while a module holds the host quiet, or at low priority)."""
        if self._quiet_depth == 0 and not at_low_priority():
            self._take(fcntl.LOCK_SH)
            self._shared = True

    def release(self) -> None:
        """At the end of each test (a no-op while a module holds the host quiet)."""
        if self._quiet_depth == 0 and self._shared:
            fcntl.flock(self._main, fcntl.LOCK_UN)
            self._shared = False

    @contextmanager
    def exclusive(self):
        if self._quiet_depth == 0:
            self.release()
            self._take(fcntl.LOCK_EX)
        self._quiet_depth += 1
        try:
            yield
        finally:
            self._quiet_depth -= 1
            if self._quiet_depth == 0:
                fcntl.flock(self._main, fcntl.LOCK_UN)
                self.share()


_lock: _CpuLock | None = None


def configure_locks(config: pytest.Config) -> None:
    """In an xdist worker: open the session's CPU lock in the directory the controller named."""
    global _lock
    directory = getattr(config, "workerinput", {}).get(_LOCKS_KEY)
    if directory:
        _lock = _CpuLock(Path(directory))


def name_locks_dir(node, directory: str) -> None:
    """In the controller, for each worker it starts."""
    node.workerinput[_LOCKS_KEY] = directory


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if _lock is None:
        yield
        return
    normal_for_fleet(item)
    _lock.share()
    try:
        yield
    finally:
        _lock.release()


@contextmanager
def quiet_host():
    """No other test runs on this machine inside (under xdist); the test's own processes do."""
    if _lock is None:
        yield
        return
    with _lock.exclusive():
        yield
