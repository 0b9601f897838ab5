"""CPU quotas for simulated boards through cgroups, on v1 (cpu controller) and v2 (cpu.max).

A board's cgroup holds its sshd, so every session and rpc_server on the board inherits the
quota. `cpu_quota` is a fraction of one core: 0.25 -> 2.5 ms of CPU per 10 ms period. A real
board's CPU is its own, so a board's cgroup also gets the largest CPU weight there is: whatever
else runs on this host (tuning, builds, other tests) yields to it, and its timing stays that of
its quota instead of following the host's load.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

from edgetune.fleet.errors import SimError

ROOT = Path("/sys/fs/cgroup")
WEIGHT_V2, SHARES_V1 = 10_000, 262_144  # the largest cpu.weight and cpu.shares (defaults 100, 1024)
PERIOD_US = 10_000  # short periods: a throttled board runs evenly slower, not in 100 ms bursts
MIN_QUOTA_US = 1000  # the kernel's smallest quota
EMPTY_TIMEOUT_S = 5.0


def is_v2() -> bool:
    return (ROOT / "cgroup.controllers").exists()


def available() -> bool:
    if is_v2():
        return "cpu" in (ROOT / "cgroup.controllers").read_text().split()
    return (ROOT / "cpu" / "cpu.cfs_quota_us").exists()


def cgroup_dir(name: str) -> Path:
    return ROOT / name if is_v2() else ROOT / "cpu" / name


def apply_quota(name: str, cpu_quota: float, pid: int) -> Path:
    """Create (or reuse) cgroup `name` limited to `cpu_quota` cores and move `pid` into it."""
    path = limit_quota(name, cpu_quota)
    (path / "cgroup.procs").write_text(str(pid))
    return path


def limit_quota(name: str, cpu_quota: float) -> Path:
    """Create cgroup `name`, or change its limit, to `cpu_quota` cores: its processes stay as they
    are (a process moved in by pid may have exited by the time it is written)."""
    path = cgroup_dir(name)
    period_us = max(PERIOD_US, math.ceil(MIN_QUOTA_US / cpu_quota))  # longer only below a tenth of a core
    quota_us = max(MIN_QUOTA_US, round(cpu_quota * period_us))
    if is_v2():
        (ROOT / "cgroup.subtree_control").write_text("+cpu")
        path.mkdir(exist_ok=True)
        (path / "cpu.max").write_text(f"{quota_us} {period_us}")
        (path / "cpu.weight").write_text(str(WEIGHT_V2))
    else:
        path.mkdir(exist_ok=True)
        (path / "cpu.cfs_period_us").write_text(str(period_us))
        (path / "cpu.cfs_quota_us").write_text(str(quota_us))
        (path / "cpu.shares").write_text(str(SHARES_V1))
    return path


def member_pids(name: str) -> list[int]:
    procs = cgroup_dir(name) / "cgroup.procs"
    return [int(line) for line in procs.read_text().split()] if procs.exists() else []


def remove(name: str) -> bool:
    """Remove the cgroup once its processes are gone (the caller killed them); False if absent."""
    path = cgroup_dir(name)
    if not path.exists():
        return False
    deadline = time.monotonic() + EMPTY_TIMEOUT_S
    while True:
        try:
            path.rmdir()
            return True
        except OSError as err:
            if time.monotonic() > deadline:
                raise SimError(f"cannot remove cgroup {path}: {err} (processes left: {member_pids(name)})") from None
            time.sleep(0.1)
