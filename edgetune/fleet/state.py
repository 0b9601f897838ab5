"""What the host started, kept as versioned JSON under `<fleet.workdir>/state/`, replaced atomically.

`fleet.json` (schema `edgetune.fleet-state`) holds a `FleetState`: trackers and rpc_servers we
started, with the boards' firmware fingerprints; `sim.json` (`edgetune.sim-state`) the simulated
boards' sshd PIDs; `deployed.json` (`edgetune.deployed`) which artifact version of each model
each board runs (written by rollouts and by the server from the boards' reports, shown by `fleet
status`); `assigned.json` (`edgetune.assigned`) the version the last rollout of each model
assigned each board (what the board's pull timer installs); `reported/<board>.json`
(`edgetune.board-report`) what the board last reported to the server, and when: a file a board,
so a report costs the same in a fleet of any size. Each is schema_version 1 and
decoded by the schema codec, so a damaged or edited file is refused naming the field; files
written before they carried the version keys are read as version 1 (the same shape). A reader
never sees a half-written file, and a missing file is an empty state.
"""

from __future__ import annotations

import fcntl
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, TypeVar

from edgetune.artifact_format.codec import (
    FrozenMap,
    canonical_bytes,
    load_versioned,
    to_json,
)
from edgetune.durable import write_atomic
from edgetune.errors import FleetError
from edgetune.inventory.schema import Fleet
from edgetune.inventory.workdir import Workdir

STATE_SCHEMA_VERSION = 1
_RECORD_LOCK = threading.Lock()
UNKNOWN = "unknown"  # in deployed.json: the rollout could not read back what the board runs
State = TypeVar("State", "FleetState", "SimState", "DeployedState", "AssignedState")


@dataclass(frozen=True)
class TrackerRecord:
    """A tracker we started: where boards and runners reach it, and its process group."""

    name: str
    host: str  # its public address
    port: int
    pid: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class TunnelRecord:
    """The keeper of a board's SSH transport (fleet/tunnel.py) on this host."""

    pid: int
    address: str  # this host's side of the RPC forward: the address the tracker lists the board under
    rpc_port: int  # the rpc_server's port, on the board's loopback and on `address` alike
    tracker_port: int  # the board's loopback port that leads to the tracker


@dataclass(frozen=True)
class BoardRecord:
    """An rpc_server we started on a board, and what the board said about itself then."""

    pid: int
    tracker: str  # the tracker address it registers with, host:port
    key: str
    python_version: str
    tvm_version: str
    firmware: str
    rpc_address: str = ""  # the address the tracker lists it under ("": written before this was kept)
    tunnel: TunnelRecord | None = None  # its SSH transport's keeper (None: the direct transport)


@dataclass(frozen=True)
class FleetState:
    SCHEMA: ClassVar[str] = "edgetune.fleet-state"
    FILE: ClassVar[str] = "fleet"

    trackers: Mapping[str, TrackerRecord] = field(default_factory=FrozenMap)
    boards: Mapping[str, BoardRecord] = field(default_factory=FrozenMap)


@dataclass(frozen=True)
class SimState:
    SCHEMA: ClassVar[str] = "edgetune.sim-state"
    FILE: ClassVar[str] = "sim"

    sshd_pids: Mapping[str, int] = field(default_factory=FrozenMap)  # board -> its sshd's process group


@dataclass(frozen=True)
class DeployedState:
    SCHEMA: ClassVar[str] = "edgetune.deployed"
    FILE: ClassVar[str] = "deployed"

    boards: Mapping[str, Mapping[str, int | str]] = field(
        default_factory=FrozenMap
    )  # board -> model -> version or UNKNOWN


@dataclass(frozen=True)
class AssignedState:
    SCHEMA: ClassVar[str] = "edgetune.assigned"
    FILE: ClassVar[str] = "assigned"

    boards: Mapping[str, Mapping[str, int]] = field(default_factory=FrozenMap)  # board -> model -> version


@dataclass(frozen=True)
class BoardReport:
    """What a board's agent last reported to the server (`POST /v1/boards/<board>/status`)."""

    received: str  # UTC ISO 8601, by the server's clock
    firmware: str
    models: Mapping[str, int | None] = field(
        default_factory=FrozenMap
    )  # model -> the version it runs (None: none active)
    errors: Mapping[str, str] = field(default_factory=FrozenMap)  # model -> why its last pull did not install it


REPORT_SCHEMA = "edgetune.board-report"
REPORTS_DIR = "reported"  # under state/: <board>.json each


def state_path(fleet: Fleet, name: str) -> Path:
    return Workdir(fleet.workdir).state_file(name)


def load_fleet_state(fleet: Fleet) -> FleetState:
    return read_state(fleet, FleetState)


def save_fleet_state(fleet: Fleet, state: FleetState) -> None:
    write_state(fleet, state)


def load_sim_pids(fleet: Fleet) -> dict[str, int]:
    """Simulated board -> the process group of the sshd `sim up` started for it."""
    return dict(read_state(fleet, SimState).sshd_pids)


def save_sim_pids(fleet: Fleet, pids: Mapping[str, int]) -> None:
    write_state(fleet, SimState(FrozenMap(pids)))


def load_deployed(fleet: Fleet) -> dict[str, dict[str, int | str]]:
    """board -> model -> the artifact version it runs (as last read back by a rollout), or UNKNOWN."""
    return {board: dict(models) for board, models in read_state(fleet, DeployedState).boards.items()}


def record_deployed(fleet: Fleet, board: str, model: str, version: int | str | None) -> None:
    """Record that `board` runs `version` of `model` (None: no release of it; UNKNOWN: not known).
    Any other value is refused before anything is written: the record stays readable."""
    if not (version is None or version == UNKNOWN or (type(version) is int and version >= 1)):
        raise FleetError(f"{board}: {version!r} is not a version of {model} (a positive integer, None or {UNKNOWN!r})")
    _record(fleet, DeployedState, board, model, version)


def load_assigned(fleet: Fleet) -> dict[str, dict[str, int]]:
    """board -> model -> the version the last rollout of the model assigned it."""
    return {board: dict(models) for board, models in read_state(fleet, AssignedState).boards.items()}


def record_assigned(fleet: Fleet, board: str, model: str, version: int | None) -> None:
    """Assign `version` of `model` to `board` (None: no assignment: its pull leaves the model alone)."""
    if not (version is None or (type(version) is int and version >= 1)):
        raise FleetError(f"{board}: {version!r} is not a version of {model} to assign (a positive integer or None)")
    _record(fleet, AssignedState, board, model, version)


def load_reported(fleet: Fleet) -> dict[str, BoardReport]:
    """board -> what it last reported (boards that never reported are absent)."""
    directory = _reports_dir(fleet)
    paths = sorted(directory.glob("*.json")) if directory.is_dir() else []
    return {path.stem: _read_report(path) for path in paths}


def record_reported(fleet: Fleet, board: str, report: BoardReport) -> None:
    """Keep `report` as `board`'s latest, and what it runs in deployed.json where that changed
    (deployed.json is read through a cache and rewritten only then: a report of a board that
    runs what was recorded costs one small file, whatever the fleet's size)."""
    path = _reports_dir(fleet) / f"{board}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(
        path,
        canonical_bytes({"schema": REPORT_SCHEMA, "schema_version": STATE_SCHEMA_VERSION, **to_json(report)}) + b"\n",
    )
    recorded = _deployed_cached(fleet).get(board, {})
    for model, version in report.models.items():
        if recorded.get(model) != version:
            record_deployed(fleet, board, model, version)


def _reports_dir(fleet: Fleet) -> Path:
    return state_path(fleet, DeployedState.FILE).parent / REPORTS_DIR


def _read_report(path: Path) -> BoardReport:
    try:
        data = path.read_bytes()
    except OSError as err:
        raise FleetError(f"{path}: cannot be read ({err.strerror})") from None
    return load_versioned(BoardReport, data, str(path), REPORT_SCHEMA, STATE_SCHEMA_VERSION, error=FleetError)


_DEPLOYED_SEEN: dict[Path, tuple[tuple[int, int, int], dict[str, dict[str, int | str]]]] = {}


def _deployed_cached(fleet: Fleet) -> dict[str, dict[str, int | str]]:
    """load_deployed, read again only when the file changed (the server's many reports)."""
    path = state_path(fleet, DeployedState.FILE)
    try:
        st = path.stat()
    except FileNotFoundError:
        return {}
    identity = (st.st_ino, st.st_size, st.st_mtime_ns)
    seen = _DEPLOYED_SEEN.get(path)
    if seen is None or seen[0] != identity:
        seen = (identity, load_deployed(fleet))
        _DEPLOYED_SEEN[path] = seen
    return seen[1]


def _record(fleet: Fleet, kind: type[DeployedState] | type[AssignedState], board: str, model: str, version) -> None:
    """Set (None: remove) `board`'s entry for `model` in the board -> model -> version file of `kind`."""
    with _locked(fleet, kind):
        boards = {name: dict(models) for name, models in read_state(fleet, kind).boards.items()}
        models = {m: v for m, v in boards.get(board, {}).items() if m != model}
        if version is not None:
            models[model] = version
        boards[board] = models
        write_state(fleet, kind(FrozenMap(boards)))


@contextmanager
def _locked(fleet: Fleet, kind: type) -> Iterator[None]:
    """One writer at a time of the state file of `kind`, threads and processes alike (the
    rollout, the server, `fleet status`)."""
    path = state_path(fleet, kind.FILE)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _RECORD_LOCK, open(path.with_name(f".{kind.FILE}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def read_state(fleet: Fleet, kind: type[State]) -> State:
    """The state file of `kind`, empty if there is none; a damaged one is a FleetError."""
    path = state_path(fleet, kind.FILE)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return kind()
    except OSError as err:
        raise FleetError(f"{path}: cannot be read ({err.strerror})") from None
    try:
        return load_versioned(
            kind, data, str(path), kind.SCHEMA, STATE_SCHEMA_VERSION, error=FleetError, unversioned_is_current=True
        )
    except FleetError as err:
        raise FleetError(
            f"{err}; edgetune replaces it atomically, so it was damaged or edited: repair it, "
            "or remove it (what it recorded is then forgotten)"
        ) from None


def write_state(fleet: Fleet, state: FleetState | SimState | DeployedState | AssignedState) -> None:
    path = state_path(fleet, state.FILE)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"schema": state.SCHEMA, "schema_version": STATE_SCHEMA_VERSION, **to_json(state)}
    write_atomic(path, canonical_bytes(data) + b"\n")
