"""`edgetune rollout`: roll one model's artifact over the fleet in stages, over SSH.

Plan (pure, `plan_rollout`): the targeted boards (a class, or all), each with the version it
must run (`--version`, else what the server offers it: its pin or the newest), split into a
canary set and batches. Execution (`rollout`): the server must answer; each stage's boards are
provisioned and run `agent install` in parallel; the board agent installs only after the
reference check passes, so a failed board stays on its previous release. After a stage, if a
canary failed or failures exceed `max_failed_pct` of the boards tried so far, the rollout stops
and every board it changed is rolled back (`agent rollback --to <its previous version>`);
boards not reached are `skipped`. Each board's outcome is a record; the deployed version of
each board is written to the fleet state (`fleet status` shows it).
"""

from __future__ import annotations

import json
import logging
import math
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from edgetune.artifact.store import ArtifactStore
from edgetune.deploy.offer import offer
from edgetune.deploy.remote import RemoteAgent
from edgetune.deploy.tokens import ensure_token
from edgetune.errors import DeployError
from edgetune.fleet.parallel import for_each_board
from edgetune.fleet.ssh import BoardSession
from edgetune.fleet.state import load_deployed, record_deployed
from edgetune.inventory.schema import Board, Fleet

DEFAULT_TIMEOUT_S = 300.0

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Target:
    board: Board
    version: int


@dataclass(frozen=True)
class RolloutPlan:
    model: str
    stages: tuple[tuple[Target, ...], ...]  # the canary first (if any), then the batches
    canary: int  # how many boards the first stage holds when it is a canary
    explicit_version: bool  # the operator named the version: it may be older than a board's
    max_failed_pct: float
    timeout_s: float

    @property
    def targets(self) -> tuple[Target, ...]:
        return tuple(t for stage in self.stages for t in stage)

    def to_json(self) -> dict:
        return {"model": self.model, "canary": self.canary, "max_failed_pct": self.max_failed_pct,
                "stages": [[{"board": t.board.name, "version": t.version} for t in s] for s in self.stages]}  # fmt: skip


@dataclass(frozen=True)
class BoardOutcome:
    board: str
    device_class: str
    model: str
    from_version: int | None
    to_version: int
    result: str  # installed | unchanged | failed | rolled_back | skipped
    error: str | None = None

    @property
    def runs_target(self) -> bool:
        return self.result in ("installed", "unchanged")


@dataclass(frozen=True)
class RolloutResult:
    plan: RolloutPlan
    outcomes: tuple[BoardOutcome, ...]
    stopped: str | None  # why the rollout stopped early, None if it went through

    @property
    def ok(self) -> bool:
        return self.stopped is None and all(o.runs_target for o in self.outcomes)

    def records(self) -> list[dict]:
        """One JSON record per board: board, class, model, from_version, to_version, result, error."""
        return [{("class" if k == "device_class" else k): v for k, v in vars(o).items()} for o in self.outcomes]


def plan_rollout(
    fleet: Fleet,
    model: str,
    classes: Sequence[str] = (),
    version: int | None = None,
    canary: int = 1,
    batch: int = 0,
    max_failed_pct: float = 0.0,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> RolloutPlan:
    """Which boards get which version, in which stages (nothing is contacted)."""
    _check_settings(fleet, model, classes, canary, batch, max_failed_pct, timeout_s)
    store = ArtifactStore(fleet.artifacts.dir)
    boards = [b for b in fleet.boards if not classes or b.device_class in classes]
    targets = [Target(b, offer(fleet, store, b, model, version).version) for b in boards]
    canary_set, rest = targets[:canary], targets[canary:]
    size = batch or len(rest) or 1
    stages = ([tuple(canary_set)] if canary_set else []) + [tuple(rest[i : i + size]) for i in range(0, len(rest), size)]
    return RolloutPlan(model, tuple(stages), len(canary_set), version is not None, max_failed_pct, timeout_s)


def rollout(fleet: Fleet, plan: RolloutPlan, progress: Progress = log.info) -> RolloutResult:
    """Carry out `plan`; stop and roll back at the threshold (see the module docstring)."""
    check_server(fleet)
    public_key = fleet.artifacts.public_key.read_bytes()
    before = load_deployed(fleet)
    outcomes: dict[str, BoardOutcome] = {}
    stopped = None
    for index, stage in enumerate(plan.stages):
        kind = "canary" if index == 0 and plan.canary else f"batch {index + (0 if plan.canary else 1)}"
        progress(f"{kind}: {', '.join(t.board.name for t in stage)}")
        results = for_each_board([t.board for t in stage], lambda board: _install(fleet, plan, stage, board, public_key, before))
        for target in stage:
            outcome = results.succeeded.get(target.board.name) or _outcome(plan, target, before, "failed", results.failed[target.board.name])
            outcomes[target.board.name] = outcome
            progress(f"  {outcome.board}: {outcome.result}" + (f" ({outcome.error})" if outcome.error else ""))
        stopped = _stop_reason(plan, list(outcomes.values()), canary_stage=(index == 0 and plan.canary > 0))
        if stopped:
            progress(f"stopping: {stopped}; rolling back the boards this rollout changed")
            outcomes.update(_roll_back(fleet, plan, outcomes, progress))
            break
    for target in plan.targets:
        if target.board.name not in outcomes:
            outcomes[target.board.name] = _outcome(plan, target, before, "skipped", "the rollout stopped before this board")
    return RolloutResult(plan, tuple(outcomes[t.board.name] for t in plan.targets), stopped)


def check_server(fleet: Fleet) -> None:
    """The artifact server must answer before any board is touched."""
    url = f"{fleet.deploy.url}/v1/health"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            if json.loads(response.read()).get("ok") is True:
                return
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise DeployError(f"the artifact server does not answer at {url} ({err}): start it with `edgetune serve -f {fleet.path}`") from None
    raise DeployError(f"{url} is not an edgetune artifact server")


def _install(fleet: Fleet, plan: RolloutPlan, stage, board: Board, public_key: bytes, before) -> BoardOutcome:
    target = next(t for t in stage if t.board.name == board.name)
    with BoardSession(board) as session:
        agent = RemoteAgent(session, fleet)
        agent.provision(ensure_token(fleet, board), public_key)
        downgrade = ["--allow-downgrade"] if plan.explicit_version else []
        record = agent.call("install", "--model", plan.model, "--version", str(target.version), *downgrade, timeout_s=plan.timeout_s)
    from_version = record.get("from_version") if isinstance(record.get("from_version"), int) else None
    result = record.get("result")
    outcome = BoardOutcome(board.name, board.device_class, plan.model, from_version, target.version,
                           result if result in ("installed", "unchanged") else "failed", record.get("error"))  # fmt: skip
    if outcome.runs_target:
        record_deployed(fleet, board.name, plan.model, target.version)
    return outcome


def _roll_back(fleet: Fleet, plan: RolloutPlan, outcomes: dict[str, BoardOutcome], progress: Progress) -> dict[str, BoardOutcome]:
    changed = [o for o in outcomes.values() if o.result == "installed"]
    boards = {b.name: b for b in fleet.boards}

    def back(board: Board) -> BoardOutcome:
        outcome = outcomes[board.name]
        to = "none" if outcome.from_version is None else str(outcome.from_version)
        with BoardSession(board) as session:
            record = RemoteAgent(session, fleet).call("rollback", "--model", plan.model, "--to", to, timeout_s=plan.timeout_s)
        if record.get("result") not in ("rolled_back", "deactivated", "unchanged"):
            raise DeployError(f"{board.name}: rollback to {to} failed: {record.get('error')}")
        record_deployed(fleet, board.name, plan.model, outcome.from_version)
        return replace(outcome, result="rolled_back", error=f"rolled back to {'no release' if to == 'none' else 'v' + to}")

    results = for_each_board([boards[o.board] for o in changed], back)
    for name, reason in results.failed.items():
        progress(f"  {reason}")
    rolled = dict(results.succeeded)
    rolled.update({name: replace(outcomes[name], error=f"still on v{outcomes[name].to_version}: {reason}") for name, reason in results.failed.items()})
    return rolled


def _stop_reason(plan: RolloutPlan, outcomes: list[BoardOutcome], canary_stage: bool) -> str | None:
    failed = [o for o in outcomes if o.result == "failed"]
    if not failed:
        return None
    if canary_stage:
        return f"{len(failed)} of {len(outcomes)} canary board(s) failed"
    allowed = math.floor(len(plan.targets) * plan.max_failed_pct / 100)
    if len(failed) > allowed:
        return f"{len(failed)} board(s) failed, more than --max-failed {plan.max_failed_pct:g}% of {len(plan.targets)} allows ({allowed})"
    return None


def _outcome(plan: RolloutPlan, target: Target, before, result: str, error: str) -> BoardOutcome:
    current = before.get(target.board.name, {}).get(plan.model)
    return BoardOutcome(target.board.name, target.board.device_class, plan.model, current, target.version, result, error)


def _check_settings(fleet, model, classes, canary, batch, max_failed_pct, timeout_s) -> None:
    if fleet.deploy is None:
        raise DeployError(f"{fleet.path} has no 'deploy' section (bind, url): add one to roll out artifacts")
    known = [c.name for c in fleet.device_classes]
    unknown = [c for c in classes if c not in known]
    if unknown:
        raise DeployError(f"unknown device class {', '.join(unknown)} (known: {', '.join(known)})")
    if canary < 0 or batch < 0:
        raise DeployError("--canary and --batch must be zero or more")
    if not 0 <= max_failed_pct <= 100 or not math.isfinite(max_failed_pct):
        raise DeployError(f"--max-failed must be a percentage between 0 and 100, got {max_failed_pct}")
    if not timeout_s > 0 or not math.isfinite(timeout_s):
        raise DeployError(f"--timeout-s must be a positive number of seconds, got {timeout_s}")
