"""`sync`: what a board's pull timer runs. It installs the versions the fleet assigned this board,
then reports what the board runs to the server.

For each model that the server says the last rollout assigned this board (`GET
/v1/boards/<board>/assigned`) at a version other than its current one, `sync` runs an install of
that version with every check an install has: the signed decision, the manifest against the
pinned keys, the reference check, the model's hooks and health gate. A version below the newest
installed is refused as in any install (a deliberate downgrade is a rollout's). Then the board's
status, and why each model it could not install failed, go to `POST /v1/boards/<board>/status`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgetune.agent.errors import AgentError
from edgetune.agent.guard import SwitchGuard
from edgetune.agent.install import ChangeRecord, install
from edgetune.agent.installation import Installation
from edgetune.agent.status import InstallationStatus, status
from edgetune.artifact_format.codec import to_json

REPORT_SCHEMA = "edgetune.pull-report"
REPORT_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class PullReport:
    """What the board tells the server after a sync: the body of its POST, versioned
    (`REPORT_SCHEMA`; the server decodes it with this type and refuses another version)."""

    status: InstallationStatus
    errors: dict[str, str]  # model -> why its assigned version could not be installed

    def body(self) -> dict:
        return {"schema": REPORT_SCHEMA, "schema_version": REPORT_SCHEMA_VERSION, **to_json(self)}


@dataclass(frozen=True)
class SyncRecord:
    board: str
    changes: tuple[ChangeRecord, ...]  # the installs it ran
    reported: bool
    error: str | None = None  # why the server could not be asked or told

    @property
    def ok(self) -> bool:
        return self.error is None and all(change.ok for change in self.changes)

    def lines(self) -> list[str]:
        done = [f"{c.model}: {c.result} v{c.to_version}" + (f" ({c.error})" if c.error else "") for c in self.changes]
        told = "reported to the server" if self.reported else f"not reported: {self.error}"
        return [*(done or ["every assigned version runs"]), told]


def sync(root: Path, deadline_s: float | None = None) -> SyncRecord:
    """Install what is assigned and not running (each install under `deadline_s`), then report."""
    installation = Installation.open(root)
    board, server = installation.config.board, installation.server()
    try:
        assigned = server.assigned(board)
    except AgentError as err:
        return SyncRecord(board, (), False, f"asking the server what this board runs: {err}")
    running = status(root).models
    changes = tuple(
        install(root, model, version, guard=SwitchGuard(deadline_s))
        for model, version in sorted(assigned.items())
        if model not in running or running[model].version != version
    )
    report = PullReport(status(root), {c.model: c.error or c.result for c in changes if not c.ok})
    try:
        server.report(board, report.body())
    except AgentError as err:
        return SyncRecord(board, changes, False, f"reporting to the server: {err}")
    return SyncRecord(board, changes, True)
