"""What the host started, kept as JSON under `<fleet.workdir>/state/`, replaced atomically.

`fleet.json` holds a `FleetState` (trackers and rpc_servers we started, with the boards'
firmware fingerprints); `sim.json` the simulated boards' sshd PIDs; `deployed.json` which
artifact version of each model each board runs (written by rollouts, shown by `fleet status`). A reader never sees a
half-written file, and a missing file is an empty state.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from edgetune.durable import write_atomic
from edgetune.inventory.schema import Fleet
from edgetune.inventory.workdir import Workdir


_DEPLOYED_LOCK = threading.Lock()
UNKNOWN = "unknown"  # in deployed.json: the rollout could not read back what the board runs


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
class BoardRecord:
    """An rpc_server we started on a board, and what the board said about itself then."""

    pid: int
    tracker: str  # the tracker address it registers with, host:port
    key: str
    python_version: str
    tvm_version: str
    firmware: str


@dataclass(frozen=True)
class FleetState:
    trackers: Mapping[str, TrackerRecord] = field(default_factory=dict)
    boards: Mapping[str, BoardRecord] = field(default_factory=dict)


def state_path(fleet: Fleet, name: str) -> Path:
    return Workdir(fleet.workdir).state_file(name)


def load_fleet_state(fleet: Fleet) -> FleetState:
    data = read_state(state_path(fleet, "fleet"))
    return FleetState(
        trackers={k: TrackerRecord(**v) for k, v in data.get("trackers", {}).items()},
        boards={k: BoardRecord(**v) for k, v in data.get("boards", {}).items()},
    )


def save_fleet_state(fleet: Fleet, state: FleetState) -> None:
    data = {
        "trackers": {k: dataclasses.asdict(v) for k, v in state.trackers.items()},
        "boards": {k: dataclasses.asdict(v) for k, v in state.boards.items()},
    }
    write_state(state_path(fleet, "fleet"), data)


def load_deployed(fleet: Fleet) -> dict[str, dict[str, int | str]]:
    """board -> model -> the artifact version it runs (as last read back by a rollout), or UNKNOWN."""
    return read_state(state_path(fleet, "deployed")).get("boards", {})


def record_deployed(fleet: Fleet, board: str, model: str, version: int | str | None) -> None:
    """Record that `board` runs `version` of `model` (None: no release of it; UNKNOWN: not known)."""
    path = state_path(fleet, "deployed")
    path.parent.mkdir(parents=True, exist_ok=True)
    with _DEPLOYED_LOCK, open(path.with_name(".deployed.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        boards = read_state(path).get("boards", {})
        models = {m: v for m, v in boards.get(board, {}).items() if m != model}
        if version is not None:
            models[model] = version
        boards[board] = models
        write_state(path, {"boards": boards})


def read_state(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}


def write_state(path: Path, state: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, (json.dumps(state, indent=2, sort_keys=True) + "\n").encode("utf-8"))
