"""`state.json`: per model, what runs on the board, since when, and the high-water mark.

Schema `edgetune.agent-state` version 1, canonical JSON, replaced atomically:
`{"schema", "schema_version", "models": {<model>: {"version", "since", "firmware", "previous",
"highest_installed"}}}`, and per model `"health"`, the last run of its health check (hooks.py's
`HookRun`), once it has one (a file without it reads as before).

`decisions.json` (schema `edgetune.agent-decisions` version 1, replaced atomically, under the
board's lock): `{"schema", "schema_version", "last_serial"}`, the highest serial of a signed
decision the board accepted; a decision whose serial is not above it is a replay, refused.

The `current` link is what the board runs; state.json describes it. A changing run switches
the link first and writes the state second, so a run killed between the two leaves a link the
state does not describe yet: `reconcile` completes the state from the link (the time it was
switched is the link's own mtime). The high-water mark never goes down: it is at least every
release ever placed on the board, so a replayed older (validly signed) version is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TypeVar

from edgetune.agent.errors import AgentError
from edgetune.agent.file_tree import FileTree
from edgetune.agent.hooks import HookRun
from edgetune.artifact_format.codec import (
    added_field,
    canonical_bytes,
    load_versioned,
    rule,
    to_json,
)
from edgetune.durable import write_atomic

STATE_SCHEMA = "edgetune.agent-state"
STATE_SCHEMA_VERSION = 1
DECISIONS_SCHEMA = "edgetune.agent-decisions"
DECISIONS_SCHEMA_VERSION = 1
T = TypeVar("T")


@dataclass(frozen=True)
class ModelState:
    version: int | None  # what `current` points to; None: no release active
    since: str | None  # UTC ISO 8601 time `version` became current
    firmware: str | None  # the firmware fingerprint at that time
    previous: int | None  # what was current before
    highest_installed: int  # installs below it are refused (`rollback` and --allow-downgrade excepted)
    health: HookRun | None = added_field()  # the last run of the model's health check (None: none yet)


def utc_iso(timestamp: float | None = None) -> str:
    moment = datetime.now(timezone.utc) if timestamp is None else datetime.fromtimestamp(timestamp, timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class AgentState:
    """state.json without its version keys."""

    models: Mapping[str, ModelState]


@dataclass(frozen=True)
class AcceptedDecisions:
    """decisions.json without its version keys."""

    last_serial: int = rule(minimum=0)


def load_state(layout: FileTree) -> dict[str, ModelState]:
    damaged = (
        "it is only replaced atomically, so the disk or someone else damaged it: restore it, or remove it to start over"
    )
    state = _read(layout.state, AgentState, STATE_SCHEMA, STATE_SCHEMA_VERSION, damaged)
    return dict(state.models) if state else {}


def _read(path: Path, cls: type[T], schema: str, version: int, damaged: str) -> T | None:
    """The record in `path`, None if there is none; a damaged file names what to do."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise AgentError(f"{path}: unreadable ({err.strerror}); {damaged}") from None
    try:
        return load_versioned(cls, data, str(path), schema, version, error=AgentError, reader="this agent")
    except AgentError as err:
        raise AgentError(f"{err}; {damaged}") from None


def save_state(layout: FileTree, models: dict[str, ModelState]) -> None:
    data = {"schema": STATE_SCHEMA, "schema_version": STATE_SCHEMA_VERSION, "models": to_json(models)}
    write_atomic(layout.state, canonical_bytes(data))


def activated(old: ModelState | None, version: int | None, firmware: str, since: str | None = None) -> ModelState:
    """The state of a model once `version` is current (None: deactivated)."""
    return ModelState(
        version=version,
        since=since or utc_iso(),
        firmware=firmware,
        previous=old.version if old else None,
        highest_installed=max(old.highest_installed if old else 0, version or 0),
        health=old.health if old else None,
    )


def reconcile(layout: FileTree, models: dict[str, ModelState], firmware: Callable[[], str]) -> dict[str, ModelState]:
    """The state as the links and releases on disk say it is (see the module docstring)."""
    result = dict(models)
    for model in sorted(set(models) | set(layout.models())):
        entry, link = models.get(model), layout.current_version(model)
        if entry is None and link is None and not layout.kept_versions(model):
            continue
        if entry is None or entry.version != link:
            since = layout.current_since(model) if link is not None else None
            entry = activated(entry, link, firmware(), utc_iso(since) if since else None)
        highest = max([entry.highest_installed, link or 0, *layout.kept_versions(model)])
        result[model] = replace(entry, highest_installed=highest)
    return result


def last_decision_serial(layout: FileTree) -> int:
    """The highest decision serial this board accepted (0: none yet)."""
    damaged = "the operator's `edgetune fleet reset-serial BOARD` writes it anew"
    accepted = _read(layout.decisions, AcceptedDecisions, DECISIONS_SCHEMA, DECISIONS_SCHEMA_VERSION, damaged)
    return accepted.last_serial if accepted else 0


def record_decision_serial(layout: FileTree, serial: int) -> None:
    """Remember `serial` as the highest accepted (the caller holds the board's lock)."""
    data = {"schema": DECISIONS_SCHEMA, "schema_version": DECISIONS_SCHEMA_VERSION, "last_serial": serial}
    write_atomic(layout.decisions, canonical_bytes(data))
