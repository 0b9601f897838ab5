"""The layout of a fleet's host-side `workdir` (fleet.yaml `workdir`, default `.edgetune`),
spelled in this one place (docs/artifacts.md):

- `databases/<class>/`: the class's tuning database (`edgetune.tune.database`);
- `reports/<class>/<model>/`: its tuning reports (`edgetune.tune.report`);
- `state/<name>.json`: what the host started and what the boards run (`edgetune.fleet.state`);
- `logs/`: the trackers' logs;
- `sim/<board>/`: a simulated board's sshd config, host key and firmware file;
- `deploy/tokens/`: the boards' download tokens, unless fleet.yaml puts them elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Workdir:
    root: Path

    def database(self, device_class: str) -> Path:
        return Path(self.root) / "databases" / device_class

    def reports(self, device_class: str) -> Path:
        return Path(self.root) / "reports" / device_class

    def report(self, device_class: str, model: str) -> Path:
        return self.reports(device_class) / model

    def state_file(self, name: str) -> Path:
        return Path(self.root) / "state" / f"{name}.json"

    @property
    def logs(self) -> Path:
        return Path(self.root) / "logs"

    def sim_board(self, board: str) -> Path:
        return Path(self.root) / "sim" / board

    @property
    def tokens(self) -> Path:
        return Path(self.root) / "deploy" / "tokens"
