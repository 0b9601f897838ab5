"""`state.json`: per model, what runs on the board, since when, and the high-water mark.

Schema `edgetune.agent-state` version 1, canonical JSON, replaced atomically:
`{"schema", "schema_version", "models": {<model>: {"version", "since", "firmware", "previous",
"highest_installed"}}}`.

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

import json
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Callable

from edgetune.agent.errors import AgentError
from edgetune.agent.layout import Layout
from edgetune.artifact_format.codec import canonical_bytes, from_json, to_json
from edgetune.durable import write_atomic
from edgetune.errors import ArtifactError

STATE_SCHEMA = "edgetune.agent-state"
STATE_SCHEMA_VERSION = 1
DECISIONS_SCHEMA = "edgetune.agent-decisions"
DECISIONS_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class ModelState:
    version: int | None  # what `current` points to; None: no release active
    since: str | None  # UTC ISO 8601 time `version` became current
    firmware: str | None  # the firmware fingerprint at that time
    previous: int | None  # what was current before
    highest_installed: int  # installs below it are refused (`rollback` and --allow-downgrade excepted)


def utc_iso(timestamp: float | None = None) -> str:
    moment = datetime.now(timezone.utc) if timestamp is None else datetime.fromtimestamp(timestamp, timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def load_state(layout: Layout) -> dict[str, ModelState]:
    try:
        raw = json.loads(layout.state.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise AgentError(f"{layout.state}: unreadable ({err}); it is only replaced atomically, so the disk "
                         "or someone else damaged it: restore it, or remove it to start over") from None
    if not isinstance(raw, dict) or (raw.get("schema"), raw.get("schema_version")) != (STATE_SCHEMA, STATE_SCHEMA_VERSION):
        raise AgentError(f"{layout.state}: not an {STATE_SCHEMA} version {STATE_SCHEMA_VERSION} file")
    models = raw.get("models")
    if not isinstance(models, dict):
        raise AgentError(f"{layout.state}: models: expected an object")
    try:
        return {name: from_json(ModelState, entry) for name, entry in models.items()}
    except ArtifactError as err:
        raise AgentError(f"{layout.state}: {err}") from None


def save_state(layout: Layout, models: dict[str, ModelState]) -> None:
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
    )


def reconcile(layout: Layout, models: dict[str, ModelState], firmware: Callable[[], str]) -> dict[str, ModelState]:
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


def last_decision_serial(layout: Layout) -> int:
    """The highest decision serial this board accepted (0: none yet)."""
    try:
        raw = json.loads(layout.decisions.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        return 0
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise AgentError(f"{layout.decisions}: unreadable ({err}); restore it, or remove it to accept the "
                         "server's next decision whatever its serial") from None  # fmt: skip
    if not isinstance(raw, dict) or (raw.get("schema"), raw.get("schema_version")) != (DECISIONS_SCHEMA, DECISIONS_SCHEMA_VERSION):
        raise AgentError(f"{layout.decisions}: not an {DECISIONS_SCHEMA} version {DECISIONS_SCHEMA_VERSION} file")
    serial = raw.get("last_serial")
    if not isinstance(serial, int) or isinstance(serial, bool) or serial < 0:
        raise AgentError(f"{layout.decisions}: last_serial: expected a serial number")
    return serial


def record_decision_serial(layout: Layout, serial: int) -> None:
    """Remember `serial` as the highest accepted (the caller holds the board's lock)."""
    data = {"schema": DECISIONS_SCHEMA, "schema_version": DECISIONS_SCHEMA_VERSION, "last_serial": serial}
    write_atomic(layout.decisions, canonical_bytes(data))
