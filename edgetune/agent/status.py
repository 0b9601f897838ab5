"""`status`: what runs on the board, since when, with which firmware, and what is kept."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgetune.agent.installation import Installation


@dataclass(frozen=True)
class ModelStatus:
    version: int | None  # the current release; None: none active
    since: str | None  # UTC ISO 8601
    firmware: str | None  # the firmware fingerprint when it became current
    previous: int | None
    highest_installed: int
    kept: tuple[int, ...]  # releases on the board, ascending

    def line(self) -> str:
        running = (
            f"v{self.version} since {self.since} (firmware then: {self.firmware})" if self.version else "none active"
        )
        kept = ", ".join(f"v{v}" for v in self.kept) or "-"
        return f"{running}; previous: {f'v{self.previous}' if self.previous else '-'}; kept: {kept}"


@dataclass(frozen=True)
class InstallationStatus:
    board: str
    device_class: str
    firmware: str  # the firmware fingerprint now
    models: dict[str, ModelStatus]

    def lines(self) -> list[str]:
        rows = [f"  {name}: {model.line()}" for name, model in sorted(self.models.items())]
        return [f"{self.board} ({self.device_class}), firmware: {self.firmware}", *(rows or ["  no model installed"])]


def status(root: Path) -> InstallationStatus:
    """The board's status (read-only: a run in progress is not disturbed)."""
    installation = Installation.open(root)
    state = installation.current_state()
    models = {
        name: ModelStatus(
            entry.version,
            entry.since,
            entry.firmware,
            entry.previous,
            entry.highest_installed,
            tuple(installation.tree.kept_versions(name)),
        )
        for name, entry in state.items()
    }
    return InstallationStatus(
        installation.config.board, installation.config.device_class, installation.firmware, models
    )
