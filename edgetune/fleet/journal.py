"""The fleet's journal: what `fleet status`, rollouts and regression checks found, one JSON line
per event in `<fleet.workdir>/state/journal.jsonl`, appended and never rewritten.

Each line is `{"schema": "edgetune.journal-event", "schema_version": 1, "time": ISO 8601 UTC,
"kind": "status" | "rollout" | "regress", ...}` with the kind's own fields (`boards`, `outcomes`,
`verdicts`: lists of JSON records). It is what `edgetune report` draws the fleet's last status and
its history from. A line is written with one `write` on a file opened for appending, so a crash
leaves at worst a torn last line, which a reader skips and names.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from edgetune.inventory.schema import Fleet
from edgetune.inventory.workdir import Workdir

SCHEMA = "edgetune.journal-event"
SCHEMA_VERSION = 1
KINDS = ("status", "rollout", "regress")


def journal_path(fleet: Fleet) -> Path:
    return Workdir(fleet.workdir).state_file("journal").with_suffix(".jsonl")


def record_event(fleet: Fleet, kind: str, **fields: object) -> None:
    """Append one event of `kind` (its fields JSON values) to the fleet's journal."""
    if kind not in KINDS:
        raise ValueError(f"journal event kind {kind!r} is not one of {', '.join(KINDS)}")
    event = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **fields,
    }
    path = journal_path(fleet)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(event, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)


@dataclass(frozen=True)
class Journal:
    events: tuple[dict, ...]  # in the order written
    problems: tuple[str, ...]  # lines that could not be read, each named by file and line number


def read_journal(path: Path) -> Journal:
    """Every readable event of the journal at `path` (none if it does not exist); each line
    that is not an event of this schema is left out and named in `problems`."""
    try:
        lines = path.read_bytes().split(b"\n")
    except FileNotFoundError:
        return Journal((), ())
    except OSError as err:
        return Journal((), (f"{path}: cannot be read ({err.strerror})",))
    events, problems = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        problem = None
        try:
            event = json.loads(line)
        except ValueError:
            event, problem = None, "not JSON (a torn or edited line)"
        if event is not None:
            problem = _event_problem(event)
        if problem:
            problems.append(f"{path}: line {number}: {problem}; left out")
        else:
            events.append(event)
    return Journal(tuple(events), tuple(problems))


def _event_problem(event: object) -> str | None:
    if not isinstance(event, dict):
        return "not a JSON object"
    if event.get("schema") != SCHEMA or event.get("schema_version") != SCHEMA_VERSION:
        return f"not a {SCHEMA} version {SCHEMA_VERSION} event"
    if event.get("kind") not in KINDS:
        return f"kind {event.get('kind')!r} is not one of {', '.join(KINDS)}"
    if not isinstance(event.get("time"), str):
        return "'time' is not a string"
    return None
