"""CPU quotas for simulated boards through cgroups, on v1 (cpu controller) and v2 (cpu.max).

A board's cgroup holds its sshd, so every session and rpc_server on the board inherits the
quota. `cpu_quota` is a fraction of one core: 0.25 -> 25 ms of CPU per 100 ms period.
"""

from __future__ import annotations

import time
from pathlib import Path

from edgetune.fleet.errors import SimError

ROOT = Path("/sys/fs/cgroup")
PERIOD_US = 100_000
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
    path = cgroup_dir(name)
    quota_us = max(1000, round(cpu_quota * PERIOD_US))
    if is_v2():
        (ROOT / "cgroup.subtree_control").write_text("+cpu")
        path.mkdir(exist_ok=True)
        (path / "cpu.max").write_text(f"{quota_us} {PERIOD_US}")
    else:
        path.mkdir(exist_ok=True)
        (path / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (path / "cpu.cfs_quota_us").write_text(str(quota_us))
    (path / "cgroup.procs").write_text(str(pid))
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
