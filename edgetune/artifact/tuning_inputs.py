"""What an artifact takes from tuning: a snapshot of the class database and the tuning report.

The build works on a snapshot (the class database's files, copied records first and repaired:
`tune.database.snapshot`), never on the live database, so the artifact is built
from exactly the records it ships and whose digest it states, even if tuning appends to the
class database meanwhile.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from edgetune.artifact_format.manifest import TuningStats
from edgetune.errors import ArtifactError, TuneError
from edgetune.inventory.schema import Fleet
from edgetune.inventory.workdir import Workdir
from edgetune.tune import database as tune_db
from edgetune.tune.report import read_summary

SUMMARY_NAME = "summary.json"


def snapshot_database(fleet: Fleet, device_class: str, dest: Path) -> Path:
    """Copy the class database's workload and record files to `dest`; ArtifactError if the
    class has none yet."""
    live = tune_db.ClassDatabasePaths.of(fleet.workdir, device_class)
    if not live.tuning_record.is_file() or live.tuning_record.stat().st_size == 0:
        raise ArtifactError(
            f"class {device_class} has no tuning database ({live.directory} has no records): "
            f"run `edgetune tune -f {fleet.path}` first"
        )
    dest.mkdir(parents=True)
    return tune_db.snapshot(live, dest).directory


def build_records(snapshot_dir: Path) -> tune_db.BuildRecords:
    """The records a build of the snapshot applies (`tune.database.open_for_build`): the
    artifact's build and `edgetune profile`'s rebuild of its kernels apply the same ones."""
    return tune_db.open_for_build(tune_db.ClassDatabasePaths(snapshot_dir))


def report_dir(fleet: Fleet, device_class: str, model: str) -> Path:
    return Workdir(fleet.workdir).report(device_class, model)


def copy_report(fleet: Fleet, device_class: str, model: str, dest: Path) -> TuningStats:
    """Copy the tuning report of (model, class) to `dest` and return its tuning stats
    (zero trials when the model was never tuned on that class: its kernels then have no
    record, which the build flags)."""
    source = report_dir(fleet, device_class, model)
    if not (source / SUMMARY_NAME).is_file():
        return TuningStats(trials=0, tuning_time_s=0.0)
    shutil.copytree(source, dest)
    try:
        summary = read_summary(dest / SUMMARY_NAME)
    except TuneError as err:
        raise ArtifactError(str(err)) from None
    return TuningStats(trials=summary.trials, tuning_time_s=summary.tuning_time_s)
