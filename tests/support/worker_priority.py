"""The test workers' CPU priority under `make test`: the background worker
(tests/support/worker_groups.py) runs at the lowest, and a fleet test at normal priority, which
the boards and servers it starts inherit. A worker at low priority takes no part in
`quiet_host()`'s lock (tests/support/quiet_host.py)."""

from __future__ import annotations

import os

import pytest

BACKGROUND_NICE = 19  # the lowest priority: a nice-0 process gets about 70x its CPU share


def lower_to_background() -> None:
    os.nice(BACKGROUND_NICE)


def at_low_priority() -> bool:
    return os.getpriority(os.PRIO_PROCESS, 0) > 0


def can_return_to_normal() -> bool:
    """Whether a worker at low priority may raise its priority again: as root only (a fleet needs
    root anyway)."""
    return os.geteuid() == 0


def normal_for_fleet(item: pytest.Item) -> None:
    """Before a fleet test starts anything: back to normal priority, if lowered."""
    if item.get_closest_marker("fleet") and at_low_priority():
        os.setpriority(os.PRIO_PROCESS, 0, 0)
