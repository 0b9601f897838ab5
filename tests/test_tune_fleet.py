"""`edgetune tune-fleet`, the job behind `make tune-fleet`, end to end on a simulated fleet of
its own (one board per class): boards created, tuned, artifacts built, signed and verifiable,
everything taken down; a second run with nothing left to do (every budget spent, every
artifact's inputs unchanged) says so, prints the table of the current versions and starts
nothing: no simulated board, no tracker, no rpc_server, the fleet's state file untouched; a
third, after a class's budget is raised, brings the fleet up again, tunes that class alone and
builds its new version. The first two runs' wall times are printed (`-s`); the second's is
bounded loosely (half the first's): it is mostly Python's and TVM's imports, which a loaded
machine stretches more than it stretches a run of many processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from support.sim_checks import leftovers

from edgetune.fleet.sim import plan_sim
from edgetune.fleet.state import state_path
from edgetune.inventory import load_fleet

REPO = Path(__file__).resolve().parents[1]


def tune_fleet(fleet_yaml: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edgetune", "tune-fleet", "-f", str(fleet_yaml)],
        cwd=fleet_yaml.parent,
        capture_output=True,
        text=True,
        timeout=900,
    )


def timed_tune_fleet(fleet_yaml: Path) -> tuple[subprocess.CompletedProcess, float]:
    """The run and its wall time in seconds. (Not its CPU time: the class processes are children
    of the tuner's fork server, which the run does not wait for, so a child's rusage misses them.)"""
    started = time.monotonic()
    run = tune_fleet(fleet_yaml)
    return run, time.monotonic() - started


@contextmanager
def watching(fleet):
    """What of the fleet appears on this host while the block runs, polled every 50 ms: its
    simulated boards' namespaces, its bridge, and any process naming its workdir (sshd, rpc_servers)
    or its tracker's address."""
    seen: set[str] = set()
    done = threading.Event()
    netns = {sim.netns for sim in plan_sim(fleet)}
    marks = (str(fleet.workdir), *(t.bind_host for t in fleet.trackers))

    def poll():
        while not done.is_set():
            names = set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()  # `ip netns list`'s
            seen.update(f"netns {name}" for name in netns & names)
            if Path(f"/sys/class/net/{fleet.sim.bridge}").exists():
                seen.add(f"bridge {fleet.sim.bridge}")
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                if "pytest" not in cmdline and "tune-fleet" not in cmdline and any(m in cmdline for m in marks):
                    seen.add(f"process {cmdline.strip()}")
            time.sleep(0.05)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        yield seen
    finally:
        done.set()
        poller.join()


def file_identity(path: Path) -> tuple[int, int] | None:
    """(inode, mtime in ns), None if missing: a state file rewritten (atomically) changes both."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def table_rows(stdout: str) -> dict[str, list[str]]:
    """The final table's rows by class (the fleet has one model, mlp)."""
    rows = [line.split() for line in stdout.splitlines() if line.startswith("mlp ") and not line.endswith(":")]
    return {row[1]: row for row in rows}


def one_board_per_class(fleet_yaml: Path) -> None:
    """Keep fast-1 and slow-1: the job does nothing for a class's second board that it does not
    do for its first."""
    lines = fleet_yaml.read_text().splitlines(keepends=True)
    fleet_yaml.write_text(
        "".join(line for line in lines if "{name: fast-2," not in line and "{name: slow-2," not in line)
    )


def raise_budget(fleet_yaml: Path, device_class: str, trials: int) -> None:
    """`device_class`'s budget raised to `trials`, and every task's cap from 8 to 16 trials."""
    text = fleet_yaml.read_text()
    assert "  max_trials_per_task: 8\n" in text
    fleet_yaml.write_text(
        text.replace(
            "  max_trials_per_task: 8\n",
            f"  max_trials_per_task: 16\n  trials_per_class_override: {{{device_class}: {trials}}}\n",
        )
    )


def test_tune_fleet_runs_the_whole_job_then_starts_nothing_when_nothing_is_left(spare_fleet_yaml):
    one_board_per_class(spare_fleet_yaml)
    fleet = load_fleet(spare_fleet_yaml)
    assert [(b.name, b.simulated.cpu_quota) for b in fleet.boards] == [("fast-1", 1.0), ("slow-1", 0.5)]
    first, first_s = timed_tune_fleet(spare_fleet_yaml)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    rows = table_rows(first.stdout)
    assert set(rows) == {"gw-fast", "gw-slow"}
    for row in rows.values():
        untuned_ms, tuned_ms = float(row[2]), float(row[3])
        assert tuned_ms < untuned_ms and row[-2:] == ["v1", "built"]
    assert leftovers(fleet) == []  # the fleet is left down

    for device_class in ("gw-fast", "gw-slow"):
        tarball = fleet.artifacts.dir / "mlp" / device_class / "v1.tar.gz"
        verify = subprocess.run(
            [sys.executable, "-m", "edgetune", "verify", str(tarball), "--public-key", str(fleet.artifacts.public_key)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert verify.returncode == 0 and "signature valid" in verify.stdout, verify.stdout + verify.stderr

    fleet_state = state_path(fleet, "fleet")
    before = (file_identity(fleet_state), file_identity(state_path(fleet, "sim")))
    assert (
        before[0] is not None and before[1] is None
    )  # the first run's fleet down wrote it; its sim down removed sim.json
    with watching(fleet) as seen:
        second, second_s = timed_tune_fleet(spare_fleet_yaml)
    print(
        f"\ntune-fleet: first run {first_s:.1f} s, the run with nothing to do {second_s:.1f} s: "
        f"{100 * second_s / first_s:.1f} % of the wall time"
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "nothing to do: every class's trial budget is spent" in second.stdout
    assert all(row[-2:] == ["v1", "unchanged"] for row in table_rows(second.stdout).values())
    assert set(table_rows(second.stdout)) == {"gw-fast", "gw-slow"}
    assert (
        "mlp on gw-fast: unchanged since v1" in second.stderr and "mlp on gw-slow: unchanged since v1" in second.stderr
    )
    assert seen == set()  # no namespace, bridge, sshd, tracker or rpc_server, at any moment
    for stage in ("== sim up", "== fleet up", "== tune", "== build", "== fleet down"):
        assert stage not in second.stderr
    assert (
        file_identity(fleet_state),
        file_identity(state_path(fleet, "sim")),
    ) == before  # not even read-modify-written
    assert leftovers(fleet) == []
    assert second_s < first_s / 2, (first_s, second_s)

    # a class's budget raised: the fleet comes up again, that class alone tunes, its pair alone is built
    from edgetune.pipeline.work import find_work

    done = {c.device_class: c.done for c in find_work(fleet).classes}
    raise_budget(spare_fleet_yaml, "gw-fast", done["gw-fast"] + 8)
    third = tune_fleet(spare_fleet_yaml)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert "nothing to do" not in third.stdout and "gw-fast: 8 trials left to tune" in third.stderr
    assert "== fleet up" in third.stderr and "gw-fast: 8 trials this run" in third.stderr, third.stderr[-4000:]
    assert "gw-slow: 0 trials this run" in third.stderr, third.stderr[-4000:]
    rows = table_rows(third.stdout)
    assert rows["gw-fast"][-2:] == ["v2", "built"] and rows["gw-slow"][-2:] == ["v1", "unchanged"]
    assert leftovers(fleet) == []
