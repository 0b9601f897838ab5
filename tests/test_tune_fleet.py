"""`edgetune tune-fleet`, the job behind `make tune-fleet`, end to end on a simulated fleet of
its own (one board per class): boards created, tuned, artifacts built, signed and verifiable,
everything taken down; a second run reuses the databases and artifacts: no trial, no build, no
board timed. (Its wall time is not compared with the first's: both pay the same start-up of the
fleet and of the imports, about 27 s of the second's 27-28 s and the first's 55 s here, so their
ratio said more about the machine's load than about the job.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from edgetune.inventory import load_fleet

from sim_checks import leftovers

REPO = Path(__file__).resolve().parents[1]


def tune_fleet(fleet_yaml: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edgetune", "tune-fleet", "-f", str(fleet_yaml)],
        cwd=fleet_yaml.parent, capture_output=True, text=True, timeout=900,
    )


def table_rows(stdout: str) -> dict[str, list[str]]:
    """The final table's rows by class (the fleet has one model, mlp)."""
    rows = [line.split() for line in stdout.splitlines() if line.startswith("mlp ") and not line.endswith(":")]
    return {row[1]: row for row in rows}


def one_board_per_class(fleet_yaml: Path) -> None:
    """Keep fast-1 and slow-1: the job does nothing for a class's second board that it does not
    do for its first."""
    lines = fleet_yaml.read_text().splitlines(keepends=True)
    fleet_yaml.write_text("".join(line for line in lines if "{name: fast-2," not in line and "{name: slow-2," not in line))


def test_tune_fleet_runs_the_whole_job_and_is_idempotent(spare_fleet_yaml):
    one_board_per_class(spare_fleet_yaml)
    fleet = load_fleet(spare_fleet_yaml)
    assert [(b.name, b.simulated.cpu_quota) for b in fleet.boards] == [("fast-1", 1.0), ("slow-1", 0.5)]
    first = tune_fleet(spare_fleet_yaml)
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
            capture_output=True, text=True, timeout=120,
        )
        assert verify.returncode == 0 and "signature valid" in verify.stdout, verify.stdout + verify.stderr

    second = tune_fleet(spare_fleet_yaml)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "gw-fast: 0 trials this run" in second.stderr and "gw-slow: 0 trials this run" in second.stderr
    assert all(row[-2:] == ["v1", "unchanged"] for row in table_rows(second.stdout).values())
    assert "measuring on" in first.stderr and "measuring on" not in second.stderr  # nothing built, nothing timed
    assert leftovers(fleet) == []
