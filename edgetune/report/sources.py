"""Everything the dashboard shows, read from disk and nothing else: the fleet state
(`deployed.json`, `fleet.json`), the journal (last `fleet status`, rollouts, regression checks),
the tuning reports (`summary.json`) and run logs (`runs.jsonl`) of each class, and the artifact
store (manifests, their signatures and the tuning reports they ship). Reading never raises for a
damaged or unreadable file: what can be read is kept, and each problem is kept as a line naming
the file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edgetune.artifact.store import ArtifactStore
from edgetune.artifact_format.manifest import REPORT_DIR, SIGNATURE_NAME, Manifest
from edgetune.artifact_format.signing import Signature
from edgetune.errors import EdgetuneError
from edgetune.fleet.journal import Journal, journal_path, read_journal
from edgetune.fleet.state import BoardReport, FleetState, load_deployed, load_fleet_state, load_reported
from edgetune.inventory.schema import Fleet
from edgetune.inventory.workdir import Workdir
from edgetune.tune.budget import Throughput
from edgetune.tune.database import ClassDatabasePaths, throughput
from edgetune.tune.report import TuningSummary, read_summary


@dataclass(frozen=True)
class Version:
    """One stored artifact version, as its manifest and signature say."""

    model: str
    device_class: str
    version: int
    manifest: Manifest
    key_id: str | None  # of the key that signed it (None: the signature file is unreadable)
    summary: TuningSummary | None = None  # the tuning report it ships (None: none, or unreadable)


@dataclass
class Sources:
    fleet: Fleet
    deployed: dict[str, dict[str, int | str]] = field(default_factory=dict)  # board -> model -> version
    reported: dict[str, BoardReport] = field(default_factory=dict)  # board -> what its pull timer last reported
    fleet_state: FleetState = field(default_factory=FleetState)
    journal: Journal = field(default_factory=lambda: Journal((), ()))
    summaries: dict[tuple[str, str], TuningSummary] = field(default_factory=dict)  # (class, model) -> summary.json
    throughputs: dict[str, Throughput | None] = field(default_factory=dict)  # class -> its runs' rate
    versions: list[Version] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def events(self, kind: str) -> list[dict]:
        return [e for e in self.journal.events if e["kind"] == kind]


def read_sources(fleet: Fleet) -> Sources:
    sources = Sources(fleet)
    sources.deployed = _attempt(sources, "state/deployed.json", {}, load_deployed, fleet)
    sources.reported = _attempt(sources, "state/reported/", {}, load_reported, fleet)
    sources.fleet_state = _attempt(sources, "state/fleet.json", FleetState(), load_fleet_state, fleet)
    sources.journal = read_journal(journal_path(fleet))
    sources.problems += sources.journal.problems
    workdir = Workdir(fleet.workdir)
    for device_class in fleet.device_classes:
        paths = ClassDatabasePaths.of(fleet.workdir, device_class.name)
        sources.throughputs[device_class.name] = _attempt(sources, paths.runs, None, throughput, paths)
        for model in fleet.models:
            path = workdir.report(device_class.name, model.name) / "summary.json"
            if path.exists():
                summary = _attempt(sources, path, None, read_summary, path)
                if summary is not None:
                    sources.summaries[(device_class.name, model.name)] = summary
    sources.versions = _stored_versions(fleet, sources)
    return sources


def input_files(fleet: Fleet) -> list[Path]:
    """The files the dashboard is drawn from (their change is what makes a served page stale)."""
    workdir = Workdir(fleet.workdir)
    state = Path(fleet.workdir) / "state"
    files = [*state.glob("*.json"), journal_path(fleet), Path(fleet.artifacts.dir) / "index.json"]
    for device_class in fleet.device_classes:
        files.append(ClassDatabasePaths.of(fleet.workdir, device_class.name).runs)
        files += workdir.reports(device_class.name).glob("*/summary.json")
    return files


def _stored_versions(fleet: Fleet, sources: Sources) -> list[Version]:
    store = ArtifactStore(fleet.artifacts.dir)
    found = []
    for model in fleet.models:
        for device_class in fleet.device_classes:
            numbers = _attempt(
                sources,
                store.class_dir(model.name, device_class.name),
                [],
                store.versions,
                model.name,
                device_class.name,
            )
            for number in numbers:
                stored = _attempt(
                    sources,
                    f"{model.name}/{device_class.name}/v{number}",
                    None,
                    store.get,
                    model.name,
                    device_class.name,
                    number,
                )
                if stored is None:
                    continue
                signature = _attempt(sources, stored.path / SIGNATURE_NAME, None, _signature, stored)
                summary_path = stored.path / REPORT_DIR / "summary.json"
                summary = (
                    _attempt(sources, summary_path, None, read_summary, summary_path) if summary_path.exists() else None
                )
                key_id = signature.key_id if signature else None
                found.append(Version(model.name, device_class.name, number, stored.manifest, key_id, summary))
    return found


def _signature(stored) -> Signature:
    return Signature.from_bytes(stored.read(SIGNATURE_NAME), str(stored.path / SIGNATURE_NAME))


def _attempt(sources: Sources, where: str | Path, fallback, read, *args):
    """`read(*args)`, or `fallback` with the error, naming `where` (a file), kept in `sources.problems`."""
    try:
        return read(*args)
    except EdgetuneError as err:
        sources.problems.append(str(err))
    except OSError as err:
        sources.problems.append(f"{where}: cannot be read ({err.strerror})")
    except (ValueError, TypeError, AttributeError) as err:  # JSON lines of the wrong shape (runs.jsonl)
        sources.problems.append(f"{where}: not in the expected format ({err})")
    return fallback
